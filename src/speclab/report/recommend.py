"""Recommendation table: best method and k per (workload, batching, batch size), or "SD off".

Logic (also in docs/report.md):
1. Measured first. Among the bench's SD cells for that workload, batching and batch size (status ok, speedup
   not null), take the highest speedup. If it is >= 1.0, recommend that sweep entry (by its label, so two
   entries with the same method and k but other options are two candidates); if it is < 1.0, the
   recommendation is "SD off" (every SD configuration measured there was slower than no SD).
2. Else simulated. Where the bench has no SD cell but the analysis simulated that batch size, use the best
   *fixed* policy (fixed:METHOD:K; oracles are bounds, not deployable) by the same rule.
3. A best speedup in [1.00, 1.05) is flagged "marginal": within run-to-run noise, SD may not be worth it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from speclab.bench.rows import entry_labels

MARGINAL = 1.05


def _verdict(best: float) -> str:
    if best < 1.0:
        return "SD off"
    return "marginal" if best < MARGINAL else "use SD"


def _rec(key: tuple[str, str, int], ranked: list[tuple[float, str]], source: str) -> dict[str, Any]:
    """One recommendation row from (speedup, label) candidates sorted best first."""
    best, label = ranked[0]
    runner_up = ranked[1] if len(ranked) > 1 else (None, None)
    return {
        "workload": key[0],
        "batching": key[1],
        "batch_size": key[2],
        "verdict": _verdict(best),
        "recommend": label if best >= 1.0 else "SD off",
        "best_method": label,
        "best_speedup": best,
        "runner_up": runner_up[1],
        "runner_up_speedup": runner_up[0],
        "source": source,
        "candidates": len(ranked),
    }


def recommendations(
    rows: list[dict[str, Any]] | None, oracle_gap: dict[str, Any] | None
) -> list[dict[str, Any]]:
    recs: dict[tuple[str, str, int], dict[str, Any]] = {}
    rows = rows or []
    labels = entry_labels(rows)  # keyed by sweep entry: same method and k with other options stay apart
    ok = [(label, r) for label, r in zip(labels, rows, strict=True) if r.get("status") == "ok"]
    multi_target = len({r.get("target") for _, r in ok}) > 1
    cells: dict[tuple[str, str, int], list[tuple[float, str]]] = defaultdict(list)
    for label, r in ok:
        if r.get("method") in (None, "none") or r.get("speedup") is None:
            continue
        wl = str(r.get("workload"))
        if multi_target:
            wl = f"{wl} [{r.get('target')}]"
        cells[(wl, str(r.get("batching", "replicate")), int(r["batch_size"]))].append(
            (float(r["speedup"]), label)
        )
    for key, vals in cells.items():
        recs[key] = _rec(key, sorted(vals, reverse=True), "measured")
    for g in (oracle_gap or {}).get("rows") or []:
        key = (str(g["workload"]), str(g["batching"]), int(g["batch_size"]))
        if key in recs:
            continue
        fixed = sorted(
            (
                (v, p.split(":", 1)[1].replace(":", "@k"))
                for p, v in (g.get("simulated") or {}).items()
                if p.startswith("fixed:")
            ),
            reverse=True,
        )
        if fixed:
            recs[key] = _rec(key, fixed, "simulated")
    return [recs[k] for k in sorted(recs)]


def headline(recs: list[dict[str, Any]]) -> list[str]:
    """A few plain sentences for the top of the report."""
    if not recs:
        return ["No speedup data (neither bench cells nor simulated fixed policies): no recommendation."]
    on = [r for r in recs if r["verdict"] == "use SD"]
    off = [r for r in recs if r["verdict"] == "SD off"]
    marginal = [r for r in recs if r["verdict"] == "marginal"]
    best = max(recs, key=lambda r: r["best_speedup"])
    lines = [
        f"SD helps (>= {MARGINAL:.2f}x) in {len(on)} of {len(recs)} (workload, batch size) cells, is marginal in "
        f"{len(marginal)} and should be off in {len(off)}.",
        f"Largest speedup: {best['best_speedup']:.2f}x with {best['best_method']} on {best['workload']} at batch "
        f"{best['batch_size']} ({best['source']}).",
    ]
    by_wl: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        by_wl[r["workload"]].append(r)
    for wl, rs in sorted(by_wl.items()):
        parts = [
            f"batch {r['batch_size']}: {r['recommend']} ({r['best_speedup']:.2f}x{', sim' if r['source'] != 'measured' else ''})"
            for r in sorted(rs, key=lambda r: (r["batching"], r["batch_size"]))
        ]
        lines.append(f"{wl}: " + "; ".join(parts) + ".")
    return lines
