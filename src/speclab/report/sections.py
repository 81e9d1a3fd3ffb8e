"""The report's sections, top to bottom; each returns its HTML as a list of chunks (one line each in the file).

Every section reads the same `ReportData`; a missing input gives a labelled "Missing input" box, not an
empty plot.

Size: about 470 lines; one short function per report section, in page order (SECTIONS at the end).
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speclab.analyze.results import config_files
from speclab.analyze.tables import observed_rows, pluck
from speclab.bench.rows import entry_labels
from speclab.report import figures as F
from speclab.report.html import Html, esc, figure, figure_or_missing, missing, table
from speclab.report.recommend import CANNOT_TELL, MARGINAL, headline, stops_paying


@dataclass
class ReportData:
    """Everything the sections read: the inputs, the analysis and what was computed from them."""

    rows: list[dict[str, Any]] | None  # RUN/results.jsonl, None without a bench run
    run_path: Path | None
    traces: str | Path | None
    analysis: dict[str, Any]
    recs: list[dict[str, Any]]
    figs: dict[str, F.Figure | None]
    command: str | None = None  # this report's command line (default: the process's argv)
    server_rows: list[dict[str, Any]] | None = None  # server-mode cells of the run (speclab.server)

    @property
    def acc(self) -> list[dict[str, Any]]:
        return self.analysis.get("acceptance") or []

    @property
    def gap(self) -> dict[str, Any]:
        return self.analysis.get("oracle_gap") or {}

    @property
    def overlap(self) -> dict[str, Any]:
        return self.analysis.get("overlap") or {}


NAV = (
    '<nav><a href="#summary">Summary</a><a href="#speedup">Speedup</a><a href="#recommend">Recommendations</a>'
    '<a href="#time">Time split</a><a href="#memory">Memory</a><a href="#acceptance">Acceptance</a>'
    '<a href="#overlap">Overlap</a><a href="#oracle">Oracle gap</a><a href="#adaptive">Adaptive</a><a href="#validation">Validation</a>'
    '<a href="#latency">Latency vs load</a><a href="#inputs">Inputs</a></nav>'
)


def summary(d: ReportData) -> list[str]:
    h = ['<h2 id="summary">Summary: does SD help here?</h2><div class="headline"><ul>']
    h += [f"<li>{esc(line)}</li>" for line in headline(d.recs)]
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
        h += _noise(d.rows)
    return h


def _noise(rows: list[dict[str, Any]]) -> list[str]:
    """How often each cell was measured, and the contention flag: cells that ran while other processes
    competed for the CPUs (their speedups may be biased, and verdicts resting on them say "cannot tell")."""
    from speclab.bench.show import contention_note

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
    note = contention_note(ok)
    if note:
        out.append(f'<p class="warn"><b>Contention:</b> {esc(note)}.</p>')
    return out


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
    h = ['<h2 id="speedup">Speedup vs batch size, and the results table</h2>', '<div class="pair">']
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
        f"(source column). Best speedup &lt; 1.00: <b>SD off</b>; 1.00 to {MARGINAL:.2f}: marginal (within "
        f"noise, consider off); <b>{CANNOT_TELL}</b>: the measured spread straddles 1.00x or the runs were "
        "contended (why column). Oracles are bounds and never recommended.</p>",
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
    return h + _stops_paying(d.rows)


def _stops_paying(rows: list[dict[str, Any]] | None) -> list[str]:
    """Per measured SD configuration: up to which batch size it pays, and where it stops (same noise rule)."""
    found = stops_paying(rows or [])
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
        figure_or_missing(d.figs["time"], "No time_split_s in the results (no bench run)."),
        '<h2 id="memory">Memory</h2>',
        figure_or_missing(d.figs["memory"], "No memory columns (no bench run)."),
    ]


ACCEPTANCE_HEADERS = [
    "workload",
    "method",
    "k",
    "requests",
    "positions",
    "mean",
    "std",
    "p5",
    "p50",
    "p95",
    "req-std",
    Html("&ge;5"),
    "p95/p50",
    "top10%",
    "proposal rate",
]


def acceptance(d: ReportData) -> list[str]:
    """Replayed acceptance statistics and figures, then the engine-observed acceptance."""
    h = ['<h2 id="acceptance">Acceptance</h2>']
    if d.acc:
        h.append(
            "<p>Per output position 1..n-1 of the replayed traces (acc_len = accepted drafts + 1). "
            "&ge;5: share of positions accepting 5 or more; top10%: share of accepted tokens from the 10% "
            "longest positions; req-std: std of per-request means.</p>"
        )
        keys = (
            "workload method k_max n_requests n_positions mean std p5 p50 p95 per_request.std "
            "heavy_tail.share_ge_burst heavy_tail.p95_over_p50 heavy_tail.top10_share proposal_rate"
        )
        h.append(table(ACCEPTANCE_HEADERS, pluck(d.acc, keys), left=2))
        h += [figure(fig) for key in ("hist", "position", "spread") if (fig := d.figs[key])]
    else:
        h.append(
            missing(
                "No replayed trace store (--traces, or RUN/traces filled by `speclab trace`): no "
                "acceptance statistics, histograms or position curves."
            )
        )
    obs = d.analysis.get("observed") or []
    if obs:
        h.append(
            "<p><b>Engine-observed</b> acceptance length per executed step (bench meta; steps with a "
            "proposal only):</p>"
        )
        headers = ["workload", "method", "k", "requests", "steps", "mean", "std", "p50", "p95"]
        h.append(table(headers, observed_rows(obs), left=2))
    return h


def overlap(d: ReportData) -> list[str]:
    h = ['<h2 id="overlap">Prompt-output overlap vs n-gram advantage</h2>']
    if not d.overlap.get("groups"):
        return h + [
            missing(
                "Needs traces with token ids and both a model-free (ngram/suffix) and a model-drafter "
                "method per request."
            )
        ]
    h.append(
        f"<p>Overlap statistic: {esc(d.overlap.get('overlap_source'))}. Crossover: overlap where the "
        "linear fit of the advantage crosses 0 (the study saw n-gram win above ~0.6 BLEU-4).</p>"
    )
    headers = [
        "workload",
        "free",
        "model",
        "requests",
        "mean overlap",
        "mean advantage",
        "free wins",
        "pearson",
        "spearman",
        "crossover",
    ]
    keys = (
        "workload free_method model_method n mean_overlap mean_advantage share_free_wins pearson "
        "spearman crossover_overlap"
    )
    h.append(table(headers, pluck(d.overlap["groups"], keys), left=3))
    if d.figs["overlap"]:
        h.append(figure(d.figs["overlap"]))
    return h


def oracle(d: ReportData) -> list[str]:
    h = ['<h2 id="oracle">Oracle gap: measured vs simulated bounds</h2>']
    gap = d.gap
    if gap.get("status") != "ok" or not gap.get("rows"):
        return h + [missing(f"No oracle gap: {gap.get('reason', 'no analysis')}.")]
    h.append(
        f"<p>Simulated with speclab.simulate (cost model: {esc(gap.get('cost_model'))}; up to "
        f"{esc(gap.get('max_requests'))} requests per workload, seed {esc(gap.get('seed'))}). gap = bound / "
        "best measured.</p>"
    )
    headers = [
        "workload",
        "batching",
        "batch",
        "best measured",
        "method",
        "best single oracle",
        "policy",
        "oracle-combine",
        "gap single",
        "gap combine",
    ]
    keys = (
        "workload batching batch_size best_measured best_measured_method oracle_best_single "
        "oracle_best_single_policy oracle_combine gap_single gap_combine"
    )
    return h + [table(headers, pluck(gap["rows"], keys), left=2)]


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
    """Distinct values of the columns that describe how the cells were run."""
    keys = ("target", "dtype", "seed", "max_tokens", "num_prompts", "batching", "method_options")
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
        h.append(table(["column", "values"], _run_config(d.rows), left=2))
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


def adaptive(d: ReportData) -> list[str]:
    """Adaptive speculation (issue 12): per trace set, simulated speedup by batch size for no SD, the best
    static (method, k), the oracles, vLLM's derived batch-size schedule and the online policies; reads
    analysis["adaptive"] = speclab.simulate.adaptive.evaluate.run()'s result and figs["adaptive_eval"]."""
    h = ['<h2 id="adaptive">Adaptive speculation (simulated)</h2>']
    ev = d.analysis.get("adaptive") or {}
    if not ev.get("rows"):
        return h + [missing("No adaptive evaluation (python -m speclab.simulate.adaptive.evaluate).")]
    h.append(f"<p>Cost model {esc(ev.get('cost_model'))}; {esc(ev.get('batching'))}.</p>")
    for s in ev.get("summary", []):
        rs = [r for r in ev["rows"] if r["set"] == s["set"]]
        sizes = sorted({r["batch_size"] for r in rs})
        body = []
        for pol in dict.fromkeys(r["policy"] if r["role"] != "best static" else "best static" for r in rs):
            sel = [r for r in rs if (r["role"] == "best static") == (pol == "best static")
                   and (pol == "best static" or r["policy"] == pol)]  # fmt: skip
            sp = {r["batch_size"]: r for r in sel}
            cells = [f"{sp[b]['speedup']:.2f}x" + (f" ({sp[b]['policy']})" if pol == "best static" else "")
                     if b in sp else "-" for b in sizes]  # fmt: skip
            body.append(["no SD" if pol == "none" else pol, *cells])
        h.append(f"<h3>{esc(s['set'])}</h3>")
        h.append(table(["policy", *[f"B={b}" for b in sizes]], body))
        h.append(f"<p>vLLM schedule: <code>{esc(json.dumps(s.get('vllm_config')))}</code></p>")
    return h + [figure_or_missing(d.figs.get("adaptive_eval"), "No adaptive evaluation plot.")]


def latency(d: ReportData) -> list[str]:
    """Server mode: TTFT / TPOT against request rate or concurrency, with and without SD."""
    from speclab.report.latency import section

    return section(d.server_rows, d.figs.get("latency"), (d.rows or []) + (d.server_rows or []))


# The report's sections in page order (the nav bar above links to their ids).
SECTIONS = (
    summary,
    speedup,
    recommend,
    time_and_memory,
    acceptance,
    overlap,
    oracle,
    adaptive,
    validation,
    latency,
    inputs,
)
