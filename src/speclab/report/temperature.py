"""The report's temperature section: speedup and acceptance against temperature per configuration and batch
size (a table and two figures), the verdicts per temperature and what they say in words. Shown only when the
run has sampled cells or more than one setting (`report.sampling.has_sampling`)."""

from __future__ import annotations

from typing import Any

from speclab.analyze.tables import pluck
from speclab.report.data import ReportData
from speclab.report.html import esc, figure_or_missing, table
from speclab.report.recommend import CANNOT_TELL
from speclab.report.sampling import (
    cells,
    has_sampling,
    is_greedy,
    recs_per_setting,
    sentences,
    setting,
    setting_label,
)

CELL_HEADERS = [
    "workload",
    "batching",
    "batch",
    "temperature",
    "configuration",
    "speedup",
    "spread",
    "verdict",
    "mean acc",
    "acceptance per position",
    "output check",
    "flag",
]
CELL_KEYS = "workload batching batch_size setting configuration speedup spread verdict mean_acc acc_per_pos check flag"
EXPECTED_HEADER = "expected acc"  # after "mean acc", where a cell has the replay's expectation


def cell_table(cs: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """The cells table's headers and rows; with an "expected acc" column beside the engine's mean acceptance
    length where any cell has one (RUN/expected_acceptance.json)."""
    headers, body = list(CELL_HEADERS), pluck(cs, CELL_KEYS)
    if any(c.get("expected_acc") is not None for c in cs):
        at = headers.index("mean acc") + 1
        headers.insert(at, EXPECTED_HEADER)
        for row, c in zip(body, cs, strict=True):
            row.insert(at, c.get("expected_acc"))
    return headers, body


def _row_class(c: dict[str, Any]) -> str:
    if c["flag"]:
        return "failed"
    return {"slower": "off", "unsure": "marginal"}.get(c["status"], "")


def settings_line(rows: list[dict[str, Any]]) -> str:
    """ "T = 0, T = 0.7, as logged": the settings measured, in order."""
    return ", ".join(setting_label(s) for s in sorted({setting(r) for r in rows}))


def summary_lines(d: ReportData) -> list[str]:
    """What the summary says about sampled cells (nothing for a greedy-only run)."""
    rows = d.all_rows or []
    if not has_sampling(rows):
        return []
    cs = cells(rows, d.noise)
    flagged = [c for c in cs if c["flag"] and c["status"] != "failed"]
    if any(is_greedy(r) for r in rows):
        out = [
            f"This run measured several sampling settings ({settings_line(rows)}): the summary, tables, plots "
            "and verdicts above and below are T = 0 only; every setting is in the Temperature section."
        ]
    else:
        out = [
            f"This run has no T = 0 cell ({settings_line(rows)} only): the greedy sections have nothing to "
            "show, and every measured figure is in the Temperature section."
        ]
    if flagged:
        out.append(
            f"{len(flagged)} sampled cell(s) are flagged as an engine fault (their speedups do not show what "
            "a correct sampler would give): see the Temperature section."
        )
    return out


def section(d: ReportData) -> list[str]:
    rows = d.all_rows or []
    if not has_sampling(rows):
        return []
    cs = cells(rows, d.noise)
    h = [
        '<h2 id="temperature">Speedup and acceptance against temperature</h2>',
        f"<p>Settings measured: {esc(settings_line(rows))}. Each SD cell's speedup is over the no-SD cell with "
        "the same temperature, top-p, top-k and sampling mode (and the same per-request seeds). Verdicts use "
        "the same noise rule as the recommendation table: quiet matched pairs all on one side of 1.00x (3 or "
        "more), or an interval from the machine's A/A noise clear of 1.00x; else "
        f"<b>{CANNOT_TELL}</b>. The greedy sections of this report (speedup, recommendation, time split, "
        "memory, latency) show the T = 0 cells only.</p>",
    ]
    flagged = [c for c in cs if c["flag"]]
    if flagged:
        h.append(
            f'<p class="warn"><b>{len(flagged)} cell(s) flagged</b> (red rows in the table, red crosses in the '
            "plot):</p><ul>"
            + "".join(
                f'<li class="warn">{esc(c["workload"])}, batch {c["batch_size"]}, {esc(c["setting"])}, '
                f"{esc(c['configuration'])}: <b>{esc(c['flag'])}</b></li>"
                for c in flagged
            )
            + "</ul>"
        )
    own = [r for r in rows if r.get("sampling") == "as-logged" and r.get("status") == "ok"]
    if own:
        h.append(
            "<p>As-logged cells: "
            + esc(
                ", ".join(
                    f"{r.get('label') or r.get('method')} B={r.get('batch_size')} on {r.get('workload')}: "
                    f"{r.get('requests_own_settings')} of {r.get('num_prompts')} requests with their "
                    "own logged settings"
                    for r in own[:8]
                )
            )  # fmt: skip
            + "</p>"
        )
    server_sampled = [r for r in d.server_rows_all or [] if not is_greedy(r)]
    if server_sampled:
        h.append(
            f'<p class="warn">{len(server_sampled)} server-mode cell(s) at other settings than T = 0 are not '
            "shown in this report (the latency section is T = 0 only).</p>"
        )
    h += _recommendations(rows, d.noise, cs)
    h.append(figure_or_missing(d.figs.get("temp_speedup"), "No finished SD cell with a speedup to plot."))
    headers, body = cell_table(cs)
    h.append(
        '<div class="tbl"><b>Cells by temperature</b> (red: slower than no SD or flagged; amber: cannot '
        "tell; acceptance per position: the engine's acceptance rate at draft positions 1, 2, ..."
        + (
            "; expected acc: the mean acceptance length a correct sampler gives along the cell's own outputs, "
            "replayed by <code>speclab trace crosscheck RUN --expected</code>, beside the engine's mean acc"
            if EXPECTED_HEADER in headers
            else ""
        )
        + ")"
        + table(headers, body, left=5, row_classes=[_row_class(c) for c in cs])
        + "</div>"
    )
    h.append(
        figure_or_missing(
            d.figs.get("temp_acceptance"), "No cell carries the engine's acceptance per position."
        )
    )
    return h


def _recommendations(
    rows: list[dict[str, Any]], noise: dict[str, Any] | None, cs: list[dict[str, Any]]
) -> list[str]:
    recs = recs_per_setting(rows, noise)
    h = ["<h3>Recommendations per temperature</h3>"]
    if recs:
        keys = "workload batching batch_size setting recommend best_speedup verdict spread why"
        headers = ["workload", "batching", "batch", "temperature", "recommend", "speedup", "verdict", "spread",
                   "why"]  # fmt: skip
        classes = [
            {"SD off": "off", "marginal": "marginal", CANNOT_TELL: "marginal"}.get(r["verdict"], "")
            for r in recs
        ]
        h.append(table(headers, pluck(recs, keys), left=4, row_classes=classes))
    words = sentences(cs)
    if words:
        h.append(
            "<p>Each configuration across temperatures, in words: it pays (or does not) at a temperature only "
            f"where the noise supports it, else {CANNOT_TELL}.</p>"
        )
        h.append(
            table(
                ["workload", "batching", "batch", "configuration", "across temperatures"],
                pluck(words, "workload batching batch_size configuration says"),
                left=5,
            )
        )
    return h
