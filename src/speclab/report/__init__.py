"""`speclab report`: one self-contained HTML file (PNGs embedded as base64) plus the same PNGs beside it.

Inputs, each optional but at least one needed: a bench run (RUN/results.jsonl, RUN/traces, RUN/timings.csv),
a trace store, an analysis JSON from `speclab analyze`. Whatever is missing gets a labelled section saying
so, instead of an empty plot.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from speclab.analyze.results import config_files, method_label, read_results
from speclab.analyze.tables import OBSERVED_KEYS, fmt, pluck
from speclab.atomic import atomic_write_bytes, atomic_write_text
from speclab.errors import SpeclabError
from speclab.report import figures as F
from speclab.report.recommend import MARGINAL, headline, recommendations

__all__ = ["build_report"]

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;background:#fff}
main{max-width:1500px;margin:0 auto;padding:16px 28px 60px}
h1{font-size:1.6em;margin:.4em 0 .1em} h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:2em}
.sub{color:#666;margin:0 0 1em}
.headline{background:#f3f7ff;border-left:5px solid #3b6fd6;padding:10px 18px;margin:1em 0}
.headline li{margin:.25em 0}
.missing{background:#fff6e5;border-left:5px solid #e0a030;padding:8px 14px;margin:.8em 0}
.warn{color:#8a5a00}
table{border-collapse:collapse;font-size:12.5px;margin:.5em 0}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f4f4f4;position:sticky;top:0} td.l,th.l{text-align:left}
tr.off td{background:#fdecec} tr.marginal td{background:#fff8e0} tr.failed td{color:#a00}
.pair{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start}
.pair>figure{flex:1.4 1 700px;min-width:480px} .pair>.tbl{flex:1 1 480px;overflow:auto;max-height:760px}
figure{margin:.6em 0} figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:13px;max-width:1100px}
pre{background:#f7f7f7;padding:8px 12px;overflow:auto;font-size:12px;max-height:400px}
nav a{margin-right:14px}
"""


def _readable(path: Path) -> None:
    """atomic_path's temp files are 0600; a report is meant to be shared: apply the usual umask."""
    mask = os.umask(0)
    os.umask(mask)
    path.chmod(0o666 & ~mask)


def _e(x: Any) -> str:
    return html.escape(str(x))


def _f(v: Any, digits: int = 2) -> str:
    return _e(fmt(v, digits))


def _table(
    headers: list[str], rows: list[list[Any]], left: int = 1, row_classes: list[str] | None = None
) -> str:
    head = "".join(f'<th class="{"l" if i < left else ""}">{_e(h)}</th>' for i, h in enumerate(headers))
    body = []
    for j, r in enumerate(rows):
        cls = f' class="{row_classes[j]}"' if row_classes and row_classes[j] else ""
        tds = "".join(f'<td class="{"l" if i < left else ""}">{_f(c)}</td>' for i, c in enumerate(r))
        body.append(f"<tr{cls}>{tds}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _figure(fig: F.Figure) -> str:
    b64 = base64.b64encode(fig.png).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{b64}" alt="{_e(fig.title)}" data-file="{_e(fig.name)}">'
        f"<figcaption><b>{_e(fig.title)}</b> ({_e(fig.name)}). {_e(fig.caption)}</figcaption></figure>"
    )


def _missing(text: str) -> str:
    return f'<div class="missing"><b>Missing input.</b> {_e(text)}</div>'


def _split_pct(ts: dict[str, Any] | None) -> list[float | None]:
    """propose, verify and other as % of their sum (None each where unknown or zero)."""
    parts = ("propose", "verify", "other")
    if not isinstance(ts, dict):
        return [None] * len(parts)
    secs = [float(ts.get(k) or 0) for k in parts]
    total = sum(secs)
    return [100.0 * v / total if total else None for v in secs]


def _results_table(rows: list[dict[str, Any]]) -> str:
    rows = sorted(
        rows,
        key=lambda r: (
            str(r.get("workload")),
            str(r.get("batching")),
            int(r.get("batch_size") or 0),
            r.get("method") != "none",
            method_label(r),
        ),
    )
    out, classes = [], []
    for r in rows:
        mem = r.get("memory") if isinstance(r.get("memory"), dict) else {}
        rss = mem.get("peak_rss_bytes")
        sp = r.get("speedup")
        out.append(
            [
                r.get("workload"),
                method_label(r),
                r.get("batch_size"),
                sp,
                r.get("throughput_tok_s"),
                r.get("mean_acceptance_length"),
                *_split_pct(r.get("time_split_s")),
                None if rss is None else rss / F.GIB,
                r.get("lossless"),
                r.get("batching"),
                r.get("status")
                if r.get("status") == "ok"
                else f"{r.get('status')}: {str(r.get('error'))[:40]}",
            ]
        )
        classes.append(
            "failed" if r.get("status") != "ok" else ("off" if isinstance(sp, int | float) and sp < 1 else "")
        )
    return _table(
        [
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
        ],
        out,
        left=2,
        row_classes=classes,
    )


def _run_config(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """Distinct values of the columns that describe how the cells were run."""
    keys = ("target", "dtype", "seed", "max_tokens", "num_prompts", "batching", "method_options")
    out = []
    for k in keys:
        vals = sorted({json.dumps(r.get(k), sort_keys=True) for r in rows if k in r})
        if vals:
            out.append([k, ", ".join(v.strip('"') for v in vals)])
    return out


def build_report(
    out_dir: str | Path,
    run: str | Path | None = None,
    traces: str | Path | None = None,
    analysis: str | Path | dict[str, Any] | None = None,
    title: str | None = None,
    cost_model: str | None = None,
    command: str | None = None,
) -> Path:
    """Write OUT/report.html and OUT/*.png; returns the HTML path."""
    run_path = Path(run) if run else None
    warnings: list[str] = []
    rows = read_results(run_path, warnings) if run_path else None
    if traces is None and run_path is not None and (run_path / "traces").exists():
        traces = run_path / "traces"
    if isinstance(analysis, str | Path):
        try:
            analysis = json.loads(Path(analysis).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SpeclabError(f"{analysis}: cannot read analysis JSON: {exc}") from None
    if analysis is None and traces is not None:
        from speclab.analyze import analyze

        analysis = analyze(
            traces,
            run=run_path,
            cost_model=cost_model,
            command="computed by this `speclab report` run (in process)",
        )
    if rows is None and analysis is None:
        raise SpeclabError("nothing to report: give --run RUN, --traces STORE or --analysis FILE")
    analysis = analysis or {}
    acc = analysis.get("acceptance") or []
    gap = analysis.get("oracle_gap") or {}
    overlap = analysis.get("overlap") or {}

    recs = recommendations(rows, gap)
    figs = {
        "speedup": F.speedup_vs_batch(rows, gap),
        "time": F.time_split(rows),
        "memory": F.memory(rows),
        "hist": F.acceptance_hist(acc),
        "position": F.acceptance_position(acc),
        "spread": F.per_request_spread(acc),
        "overlap": F.overlap_advantage(overlap),
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for fig in figs.values():
        if fig is not None:
            atomic_write_bytes(out_dir / fig.name, fig.png)
            _readable(out_dir / fig.name)

    title = title or "speclab report"
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    h: list[str] = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body><main>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="sub">Generated {now} by speclab. Run: {_e(run_path or "none")}; traces: {_e(traces or "none")}.</p>',
        '<nav><a href="#summary">Summary</a><a href="#speedup">Speedup</a><a href="#recommend">Recommendations</a>'
        '<a href="#time">Time split</a><a href="#memory">Memory</a><a href="#acceptance">Acceptance</a>'
        '<a href="#overlap">Overlap</a><a href="#oracle">Oracle gap</a><a href="#inputs">Inputs</a></nav>',
    ]

    # --- summary ----------------------------------------------------------------------------------------
    h.append('<h2 id="summary">Summary: does SD help here?</h2><div class="headline"><ul>')
    h += [f"<li>{_e(line)}</li>" for line in headline(recs)]
    if rows is None:
        h.append("<li><b>No bench run was given: every speedup here is simulated.</b></li>")
    if gap.get("status") == "ok":
        gaps = [g for g in gap.get("rows", []) if g.get("gap_combine")]
        if gaps:
            g = max(gaps, key=lambda g: g["gap_combine"])
            h.append(
                f"<li>Largest oracle gap: at batch {g['batch_size']} on {_e(g['workload'])} the oracle-combine "
                f"bound is {g['oracle_combine']:.2f}x vs {g['best_measured']:.2f}x measured "
                f"({g['gap_combine']:.2f}x headroom).</li>"
            )
    h.append("</ul></div>")
    if rows is None:
        h.append(
            _missing("No bench run (--run): no measured speedups, time split or memory; only simulated.")
        )
    else:
        failed = [r for r in rows if r.get("status") != "ok"]
        if failed:
            h.append(
                f'<p class="warn">{len(failed)} cell(s) failed; they are listed in the results table.</p>'
            )

    # --- speedup + results table side by side ---------------------------------------------------------
    h.append('<h2 id="speedup">Speedup vs batch size, and the results table</h2>')
    h.append('<div class="pair">')
    h.append(_figure(figs["speedup"]) if figs["speedup"] else _missing("No speedup data to plot."))
    if rows is not None:
        h.append(
            f'<div class="tbl"><b>Results table</b> (RUN/results.jsonl, {len(rows)} rows; red: slower '
            f"than no SD)" + _results_table(rows) + "</div>"
        )
    h.append("</div>")
    if gap.get("status") != "ok":
        h.append(_missing(f"Oracle bounds not drawn: {gap.get('reason', 'no analysis with an oracle gap')}."))

    # --- recommendations ---------------------------------------------------------------------------------
    h.append('<h2 id="recommend">Recommendation: best method and k per workload and batch size</h2>')
    h.append(
        f"<p>From measured cells where the bench ran that batch size, else from simulated fixed-k policies "
        f"(source column). Best speedup &lt; 1.00: <b>SD off</b>; 1.00 to {MARGINAL:.2f}: marginal (within "
        "noise, consider off). Oracles are bounds and never recommended.</p>"
    )
    if recs:
        h.append(
            _table(
                [
                    "workload",
                    "batching",
                    "batch",
                    "recommend",
                    "speedup",
                    "verdict",
                    "runner-up",
                    "its speedup",
                    "source",
                ],
                pluck(
                    recs,
                    "workload batching batch_size recommend best_speedup verdict runner_up runner_up_speedup "
                    "source",
                ),
                left=2,
                row_classes=[{"SD off": "off", "marginal": "marginal"}.get(r["verdict"], "") for r in recs],
            )
        )
    else:
        h.append(_missing("No speedup data: no recommendation."))

    # --- time split, memory -------------------------------------------------------------------------------
    h.append('<h2 id="time">Time split</h2>')
    h.append(
        _figure(figs["time"]) if figs["time"] else _missing("No time_split_s in the results (no bench run).")
    )
    h.append('<h2 id="memory">Memory</h2>')
    h.append(_figure(figs["memory"]) if figs["memory"] else _missing("No memory columns (no bench run)."))

    # --- acceptance ---------------------------------------------------------------------------------------
    h.append('<h2 id="acceptance">Acceptance</h2>')
    if acc:
        h.append(
            "<p>Per output position 1..n-1 of the replayed traces (acc_len = accepted drafts + 1). "
            "&ge;5: share of positions accepting 5 or more; top10%: share of accepted tokens from the 10% "
            "longest positions; req-std: std of per-request means.</p>"
        )
        h.append(
            _table(
                [
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
                    "&ge;5",
                    "p95/p50",
                    "top10%",
                    "proposal rate",
                ],
                pluck(
                    acc,
                    "workload method k_max n_requests n_positions mean std p5 p50 p95 per_request.std "
                    "heavy_tail.share_ge_burst heavy_tail.p95_over_p50 heavy_tail.top10_share proposal_rate",
                ),
                left=2,
            ).replace("&amp;ge;5", "&ge;5")
        )
        for key in ("hist", "position", "spread"):
            if figs[key]:
                h.append(_figure(figs[key]))
    else:
        h.append(
            _missing(
                "No replayed trace store (--traces, or RUN/traces filled by `speclab trace`): no "
                "acceptance statistics, histograms or position curves."
            )
        )
    obs = analysis.get("observed") or []
    if obs:
        h.append(
            "<p><b>Engine-observed</b> acceptance length per executed step (bench meta; steps with a "
            "proposal only):</p>"
        )
        h.append(
            _table(
                ["workload", "method", "k", "requests", "steps", "mean", "std", "p50", "p95"],
                pluck(obs, OBSERVED_KEYS),
                left=2,
            )
        )

    # --- overlap ------------------------------------------------------------------------------------------
    h.append('<h2 id="overlap">Prompt-output overlap vs n-gram advantage</h2>')
    if overlap.get("groups"):
        h.append(
            f"<p>Overlap statistic: {_e(overlap.get('overlap_source'))}. Crossover: overlap where the "
            "linear fit of the advantage crosses 0 (the study saw n-gram win above ~0.6 BLEU-4).</p>"
        )
        h.append(
            _table(
                [
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
                ],
                pluck(
                    overlap["groups"],
                    "workload free_method model_method n mean_overlap mean_advantage share_free_wins pearson "
                    "spearman crossover_overlap",
                ),
                left=3,
            )
        )
        if figs["overlap"]:
            h.append(_figure(figs["overlap"]))
    else:
        h.append(
            _missing(
                "Needs traces with token ids and both a model-free (ngram/suffix) and a model-drafter "
                "method per request."
            )
        )

    # --- oracle gap ---------------------------------------------------------------------------------------
    h.append('<h2 id="oracle">Oracle gap: measured vs simulated bounds</h2>')
    if gap.get("status") == "ok" and gap.get("rows"):
        h.append(
            f"<p>Simulated with speclab.simulate (cost model: {_e(gap.get('cost_model'))}; up to "
            f"{_e(gap.get('max_requests'))} requests per workload, seed {_e(gap.get('seed'))}). gap = bound / "
            "best measured.</p>"
        )
        h.append(
            _table(
                [
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
                ],
                pluck(
                    gap["rows"],
                    "workload batching batch_size best_measured best_measured_method oracle_best_single "
                    "oracle_best_single_policy oracle_combine gap_single gap_combine",
                ),
                left=2,
            )
        )
    else:
        h.append(_missing(f"No oracle gap: {gap.get('reason', 'no analysis')}."))

    # --- inputs and commands --------------------------------------------------------------------------------
    h.append('<h2 id="inputs">Inputs, commands and configuration</h2>')
    cmd = command or shlex.join(["speclab", *sys.argv[1:]])
    h.append(f"<p>This report: <code>{_e(cmd)}</code></p>")
    gen = (analysis.get("generated_by") or {}).get("command")
    if gen:
        h.append(f"<p>Analysis: <code>{_e(gen)}</code></p>")
    if analysis.get("inputs"):
        h.append(f"<pre>{_e(json.dumps(analysis['inputs'], indent=1))}</pre>")
    if rows:
        h.append("<p>Run configuration (distinct values in the results):</p>")
        h.append(_table(["column", "values"], _run_config(rows), left=2))
    if run_path:
        for name, text in config_files(run_path).items():
            h.append(f"<p>RUN/{_e(name)}:</p><pre>{_e(text)}</pre>")
    all_warn = warnings + list(analysis.get("warnings") or []) + list(gap.get("warnings") or [])
    if all_warn:
        h.append(
            "<p><b>Warnings</b></p><ul>"
            + "".join(f'<li class="warn">{_e(w)}</li>' for w in all_warn)
            + "</ul>"
        )
    h.append("</main></body></html>")

    path = out_dir / "report.html"
    atomic_write_text(path, "\n".join(h) + "\n")
    _readable(path)
    return path
