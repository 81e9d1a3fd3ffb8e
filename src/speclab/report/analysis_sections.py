"""The report's sections on the replayed traces and the simulator: acceptance, prompt-output overlap, the
oracle gap and adaptive speculation (each returns its HTML as a list of chunks, as in `report.sections`)."""

from __future__ import annotations

import json

from speclab.analyze.tables import observed_rows, pluck
from speclab.report.data import ReportData
from speclab.report.html import Html, esc, figure, figure_or_missing, missing, table

ACCEPTANCE_HEADERS = ["workload", "method", "k", "requests", "positions", "mean", "std", "p5", "p50", "p95",
                      "req-std", Html("&ge;5"), "p95/p50", "top10%", "proposal rate"]  # fmt: skip


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


def adaptive(d: ReportData) -> list[str]:
    """Adaptive speculation: per trace set, simulated speedup by batch size for no SD, the best
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
