"""The report's sections, top to bottom; each returns its HTML as a list of chunks (one line each in the file).

Every section reads the same `ReportData` (report.data); a missing input gives a labelled "Missing input"
box, not an empty plot. One short function per report section, in page order (SECTIONS at the end); the
sections on replayed traces and the simulator are in report.analysis_sections.
"""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any

from speclab.analyze.results import config_files
from speclab.analyze.tables import pluck
from speclab.bench.noise import describe
from speclab.bench.rows import entry_labels
from speclab.bench.show import contention_note
from speclab.report import figures as F
from speclab.report.analysis_sections import acceptance, adaptive, oracle, overlap
from speclab.report.categories import section as per_category
from speclab.report.data import ReportData
from speclab.report.drafters import section as drafters
from speclab.report.html import esc, figure_or_missing, missing, table
from speclab.report.recommend import CANNOT_TELL, MARGINAL, headline, stops_paying
from speclab.report.sampling import has_sampling
from speclab.report.temperature import section as temperature
from speclab.report.temperature import summary_lines as temperature_summary

__all__ = ["NAV", "SECTIONS", "TEMPERATURE_LINK", "ReportData"]

NAV = (
    '<nav><a href="#summary">Summary</a><a href="#speedup">Speedup</a><a href="#recommend">Recommendations</a>'
    '<a href="#time">Time split</a><a href="#memory">Memory</a><a href="#acceptance">Acceptance</a>'
    '<a href="#overlap">Overlap</a><a href="#oracle">Oracle gap</a><a href="#adaptive">Adaptive</a><a href="#validation">Validation</a>'
    '<a href="#latency">Latency vs load</a><a href="#inputs">Inputs</a></nav>'
)
# (old, new) for NAV where the report has a temperature section
TEMPERATURE_LINK = (
    '<a href="#recommend">Recommendations</a>',
    '<a href="#recommend">Recommendations</a><a href="#temperature">Temperature</a>',
)


def _greedy_note(d: ReportData) -> list[str]:
    """Where the run also has sampled cells: this section reads the T = 0 cells only."""
    if not has_sampling(d.all_rows):
        return []
    return [
        '<p class="warn">T = 0 (greedy) cells only: the cells at other temperatures are in the Temperature '
        "section.</p>"
    ]


def summary(d: ReportData) -> list[str]:
    h = ['<h2 id="summary">Summary: does SD help here?</h2><div class="headline"><ul>']
    h += [f"<li>{esc(line)}</li>" for line in headline(d.recs)]
    h += [f"<li><b>{esc(line)}</b></li>" for line in temperature_summary(d)]
    if d.rows is None:
        h.append("<li><b>No bench run was given: every speedup here is simulated.</b></li>")
    if d.gap.get("status") == "ok":
        gaps = [g for g in d.gap.get("rows", []) if g.get("gap_combine")]
        if gaps:
            g = max(gaps, key=lambda g: g["gap_combine"])
            h.append(
                f"<li>Largest oracle gap: at batch {g['batch_size']} on {esc(g['workload'])} the oracle-combine "
                f"bound is {g['oracle_combine']:.2f}x vs {g['best_measured']:.2f}x measured "
                f"({g['gap_combine']:.2f}x headroom).</li>"
            )
    h.append("</ul></div>")
    if d.rows is None:
        h.append(missing("No bench run (--run): no measured speedups, time split or memory; only simulated."))
    else:
        failed = [r for r in d.rows if r.get("status") != "ok"]
        if failed:
            h.append(
                f'<p class="warn">{len(failed)} cell(s) failed; they are listed in the results table.</p>'
            )
        h += _noise(d.rows, d.noise)
    return h


def _noise(rows: list[dict[str, Any]], noise: dict[str, Any] | None) -> list[str]:
    """How often each cell was measured, the machine's A/A noise the verdicts use, and the contention flag:
    cells that ran while other processes competed for the CPUs (their speedups may be biased, and verdicts
    resting on them say "cannot tell")."""
    out = []
    ok = [r for r in rows if r.get("status") == "ok"]
    reps = sorted({int(r.get("repeats") or 1) for r in ok})
    if reps and reps != [1]:
        out.append(
            f"<p>Each cell was measured {'/'.join(map(str, reps))} times, interleaved with its no-SD baseline; "
            "throughputs are medians and speedups are medians of matched pairs (repeat i of SD over repeat i "
            "of no SD).</p>"
        )
    elif ok:
        out.append("<p>Each cell was measured once (no repeats): a verdict rests on a single run.</p>")
    if ok:
        out.append(f"<p><b>Noise:</b> {esc(_noise_line(noise))}</p>")
    note = contention_note(ok)
    if note:
        out.append(f'<p class="warn"><b>Contention:</b> {esc(note)}.</p>')
    return out


def _noise_line(noise: dict[str, Any] | None) -> str:
    rule = (
        "a verdict (use SD, SD off) needs quiet matched pairs beyond this machine's noise: at least 3 all on "
        "one side of 1.00x, or a 95% interval from the machine's A/A noise that clears 1.00x; else cannot tell"
    )
    if noise is None:
        return (
            f"{rule}. This run has no A/A noise measurement (RUN/noise.json: `speclab demo` measures it, or "
            "python benchmarks/host_noise.py --save RUN), so only the 3-pair rule decides."
        )
    return f"{rule}. Measured for this run: {describe(noise)}."


def _split_pct(ts: dict[str, Any] | None) -> list[float | None]:
    """propose, verify and other as % of their sum (None each where unknown or zero)."""
    parts = ("propose", "verify", "other")
    if not isinstance(ts, dict):
        return [None] * len(parts)
    secs = [float(ts.get(k) or 0) for k in parts]
    total = sum(secs)
    return [100.0 * v / total if total else None for v in secs]


RESULTS_HEADERS = [
    "workload",
    "method",
    "batch",
    "speedup",
    "tok/s",
    "mean acc",
    "propose %",
    "verify %",
    "other %",
    "peak RSS GiB",
    "lossless",
    "batching",
    "status",
]


def results_table(rows: list[dict[str, Any]]) -> str:
    """Every results row (failed cells too), named by its sweep entry; slower-than-no-SD rows in red."""
    labelled = sorted(
        zip(entry_labels(rows), rows, strict=True),
        key=lambda lr: (
            str(lr[1].get("workload")),
            str(lr[1].get("batching")),
            int(lr[1].get("batch_size") or 0),
            lr[1].get("method") != "none",
            lr[0],
        ),
    )
    out, classes = [], []
    for label, r in labelled:
        mem = r.get("memory") if isinstance(r.get("memory"), dict) else {}
        rss = mem.get("peak_rss_bytes")
        sp = r.get("speedup")
        status = r.get("status")
        out.append(
            [
                r.get("workload"),
                label,
                r.get("batch_size"),
                sp,
                r.get("throughput_tok_s"),
                r.get("mean_acceptance_length"),
                *_split_pct(r.get("time_split_s")),
                None if rss is None else rss / F.GIB,
                r.get("lossless"),
                r.get("batching"),
                status if status == "ok" else f"{status}: {str(r.get('error'))[:40]}",
            ]
        )
        classes.append(
            "failed" if status != "ok" else ("off" if isinstance(sp, int | float) and sp < 1 else "")
        )
    return table(RESULTS_HEADERS, out, left=2, row_classes=classes)


def speedup(d: ReportData) -> list[str]:
    """The speedup plot beside the results table, so each plotted point can be checked against a number."""
    h = ['<h2 id="speedup">Speedup vs batch size, and the results table</h2>', *_greedy_note(d)]
    h.append('<div class="pair">')
    h.append(figure_or_missing(d.figs["speedup"], "No speedup data to plot."))
    if d.rows is not None:
        h.append(
            f'<div class="tbl"><b>Results table</b> (RUN/results.jsonl, {len(d.rows)} rows; red: slower '
            f"than no SD)" + results_table(d.rows) + "</div>"
        )
    h.append("</div>")
    if d.gap.get("status") != "ok":
        h.append(
            missing(f"Oracle bounds not drawn: {d.gap.get('reason', 'no analysis with an oracle gap')}.")
        )
    return h


def recommend(d: ReportData) -> list[str]:
    h = [
        '<h2 id="recommend">Recommendation: best method and k per workload and batch size</h2>',
        f"<p>From measured cells where the bench ran that batch size, else from simulated fixed-k policies "
        f"(source column). A measured verdict needs quiet matched pairs beyond this machine's noise (3 all on "
        f"one side of 1.00x, or an interval from its A/A noise clear of 1.00x: the summary's Noise line); "
        f"else <b>{CANNOT_TELL}</b>, with what was measured and how many more repeats would decide (why "
        f"column). Best supported speedup &lt; 1.00: <b>SD off</b>; 1.00 to {MARGINAL:.2f}: marginal (faster "
        "beyond the noise, by under 5%). Oracles are bounds and never recommended.</p>",
        *_greedy_note(d),
    ]
    if not d.recs:
        return h + [missing("No speedup data: no recommendation.")]
    headers = [
        "workload",
        "batching",
        "batch",
        "recommend",
        "speedup",
        "verdict",
        "runner-up",
        "its speedup",
        "source",
        "spread",
        "why",
    ]
    keys = (
        "workload batching batch_size recommend best_speedup verdict runner_up runner_up_speedup source "
        "spread why"
    )
    classes = [
        {"SD off": "off", "marginal": "marginal", CANNOT_TELL: "marginal"}.get(r["verdict"], "")
        for r in d.recs
    ]
    h.append(table(headers, pluck(d.recs, keys), left=2, row_classes=classes))
    return h + _stops_paying(d.rows, d.noise)


def _stops_paying(rows: list[dict[str, Any]] | None, noise: dict[str, Any] | None) -> list[str]:
    """Per measured SD configuration: up to which batch size it pays, and where it stops (same noise rule)."""
    found = stops_paying(rows or [], noise)
    if not found:
        return []
    return [
        "<h3>Where each configuration stops paying</h3><p>Measured cells only; a batch size counts as paying "
        "where the noise supports a speedup above 1.00x (as above).</p>",
        table(
            ["workload", "batching", "configuration", "measured speedup by batch size", "verdict"],
            pluck(found, "workload batching method measured says"),
            left=5,
        ),
    ]


def time_and_memory(d: ReportData) -> list[str]:
    return [
        '<h2 id="time">Time split</h2>',
        *_greedy_note(d),
        figure_or_missing(d.figs["time"], "No time_split_s in the results (no bench run)."),
        '<h2 id="memory">Memory</h2>',
        figure_or_missing(d.figs["memory"], "No memory columns (no bench run)."),
    ]


def validation(d: ReportData) -> list[str]:
    """Simulated beside measured, per cell (RUN/validation.json from `speclab validate`, else computed here
    with the cost model fitted from RUN/timings.csv)."""
    h = ['<h2 id="validation">Validation: the simulator against the measured cells</h2>']
    if d.run_path is None:
        return h + [missing("No bench run (--run): nothing to validate against.")]
    from speclab.errors import SpeclabError
    from speclab.validate import VALIDATION_JSON, validate_run

    path = d.run_path / VALIDATION_JSON
    try:
        v = json.loads(path.read_text()) if path.is_file() else validate_run(d.run_path).to_dict()
    except (SpeclabError, OSError, ValueError) as exc:
        return h + [missing(f"No validation: {exc}")]
    if not v.get("cells"):
        return h + [missing("No cell of this run has a trace part to simulate.")]
    s = v.get("summary") or {}
    mae = s.get("mean_abs_speedup_err")
    h.append(
        f"<p>Every cell simulated from its own requests and the acceptance the engine observed (cost model: "
        f"{esc(v.get('cost_model'))}; {'from ' + esc(path.name) if path.is_file() else 'computed for this report'}"
        f"). Mean absolute error of the predicted speedup: <b>{'-' if mae is None else f'{100 * mae:.1f}%'}</b> "
        f"over {esc(s.get('sd_cells'))} SD cell(s), {esc(s.get('cells_over_10pct'))} above 10%. Equal step "
        "counts mean the steps were reproduced and any error is time per step (cost model or load).</p>"
    )
    if s.get("contended_cells"):
        h.append(
            f'<p class="warn">{esc(s["contended_cells"])} cell(s) finished with a load average above the core '
            "count: their measured times, and so these errors, reflect the machine as much as the simulator.</p>"
        )
    keys = (
        "label workload batching batch_size measured_tok_s predicted_tok_s measured_speedup predicted_speedup "
        "speedup_err measured_steps predicted_steps loadavg_1m note"
    )
    headers = ["entry", "workload", "batching", "batch", "measured tok/s", "predicted tok/s", "measured x",
               "predicted x", "error", "steps", "sim steps", "load", "note"]  # fmt: skip
    cells = [
        {**c, "speedup_err": None if c.get("speedup_err") is None else f"{100 * c['speedup_err']:+.1f}%"}
        for c in v.get("cells") or []
    ]
    return h + [table(headers, pluck(cells, keys), left=3)]


def _run_config(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """Distinct values of the columns that describe how the cells were run (the sampling columns too where
    the run has sampled cells)."""
    keys: tuple[str, ...] = (
        "target",
        "dtype",
        "seed",
        "max_tokens",
        "num_prompts",
        "batching",
        "method_options",
    )
    if has_sampling(rows):
        keys += ("sampling", "temperature", "top_p", "top_k")
    out = []
    for k in keys:
        vals = sorted({json.dumps(r.get(k), sort_keys=True) for r in rows if k in r})
        if vals:
            out.append([k, ", ".join(v.strip('"') for v in vals)])
    return out


def inputs(d: ReportData) -> list[str]:
    """The commands, the run's recorded configuration files and every warning."""
    h = ['<h2 id="inputs">Inputs, commands and configuration</h2>']
    cmd = d.command or shlex.join(["speclab", *sys.argv[1:]])
    h.append(f"<p>This report: <code>{esc(cmd)}</code></p>")
    gen = (d.analysis.get("generated_by") or {}).get("command")
    if gen:
        h.append(f"<p>Analysis: <code>{esc(gen)}</code></p>")
    if d.analysis.get("inputs"):
        h.append(f"<pre>{esc(json.dumps(d.analysis['inputs'], indent=1))}</pre>")
    if d.rows:
        h.append("<p>Run configuration (distinct values in the results):</p>")
        h.append(table(["column", "values"], _run_config(d.all_rows or d.rows), left=2))
    if d.run_path:
        for name, text in config_files(d.run_path).items():
            h.append(f"<p>RUN/{esc(name)}:</p><pre>{esc(text)}</pre>")
    all_warn = list(d.analysis.get("warnings") or []) + list(d.gap.get("warnings") or [])
    if all_warn:
        h.append(
            "<p><b>Warnings</b></p><ul>"
            + "".join(f'<li class="warn">{esc(w)}</li>' for w in all_warn)
            + "</ul>"
        )
    return h


def latency(d: ReportData) -> list[str]:
    """Server mode: TTFT / TPOT against request rate or concurrency, with and without SD."""
    from speclab.report.latency import section

    return section(d.server_rows, d.figs.get("latency"), (d.rows or []) + (d.server_rows or []))


# The report's sections in page order (the nav bar above links to their ids).
SECTIONS = (
    summary,
    speedup,
    recommend,
    temperature,
    per_category,
    time_and_memory,
    acceptance,
    drafters,
    overlap,
    oracle,
    adaptive,
    validation,
    latency,
    inputs,
)
