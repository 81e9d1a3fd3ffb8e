"""Plain-text tables for `speclab analyze` (the JSON holds everything; these are for reading)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[fmt(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in cells:
        out.append(
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        )
    return "\n".join(out)


def format_tables(a: dict[str, Any]) -> str:
    parts: list[str] = []
    acc = a.get("acceptance") or []
    if acc:
        parts.append("Acceptance length per position (positions 1..n-1; acc_len = accepted + 1)")
        parts.append(
            text_table(
                [
                    "workload",
                    "method",
                    "k",
                    "reqs",
                    "mean",
                    "std",
                    "p5",
                    "p50",
                    "p95",
                    "req-std",
                    ">=5",
                    "top10%",
                ],
                [
                    [
                        e["workload"],
                        e["method"],
                        e["k_max"],
                        e["n_requests"],
                        e["mean"],
                        e["std"],
                        e["p5"],
                        e["p50"],
                        e["p95"],
                        e["per_request"]["std"],
                        e["heavy_tail"]["share_ge_burst"],
                        e["heavy_tail"]["top10_share"],
                    ]
                    for e in acc
                ],
            )
        )
        parts.append("")
        parts.append("Acceptance along the output (mean acc_len per normalised position bin, 0 -> 1)")
        parts.append(
            text_table(
                ["workload", "method", "k"] + [f"b{i}" for i in range(acc[0]["position_curve"]["n_bins"])],
                [[e["workload"], e["method"], e["k_max"], *e["position_curve"]["mean"]] for e in acc],
            )
        )
        parts.append("")
    obs = a.get("observed") or []
    if obs:
        parts.append("Engine-observed acceptance length per step (bench meta; proposal steps only)")
        parts.append(
            text_table(
                ["workload", "method", "k", "reqs", "steps", "mean", "std", "p50", "p95"],
                [
                    [
                        o["workload"],
                        o["method"],
                        o["k"],
                        o["n_requests"],
                        o["n_steps"],
                        o["mean"],
                        o["std"],
                        o["p50"],
                        o["p95"],
                    ]
                    for o in obs
                ],
            )
        )
        parts.append("")
    ov = a.get("overlap") or {}
    if ov.get("groups"):
        parts.append(f"Prompt-output overlap vs advantage (overlap: {ov['overlap_source']})")
        parts.append(
            text_table(
                ["workload", "free", "model", "reqs", "overlap", "adv", "free wins", "pearson", "crossover"],
                [
                    [
                        g["workload"],
                        g["free_method"],
                        g["model_method"],
                        g["n"],
                        g["mean_overlap"],
                        g["mean_advantage"],
                        g["share_free_wins"],
                        g["pearson"],
                        g["crossover_overlap"],
                    ]
                    for g in ov["groups"]
                ],
            )
        )
        parts.append("")
    og = a.get("oracle_gap") or {}
    if og.get("status") == "ok" and og.get("rows"):
        parts.append(f"Oracle gap (speedup; cost model: {og.get('cost_model')})")
        parts.append(
            text_table(
                [
                    "workload",
                    "batching",
                    "bs",
                    "measured",
                    "best method",
                    "oracle single",
                    "policy",
                    "combine",
                    "gap",
                ],
                [
                    [
                        r["workload"],
                        r["batching"],
                        r["batch_size"],
                        r["best_measured"],
                        r["best_measured_method"],
                        r["oracle_best_single"],
                        r["oracle_best_single_policy"],
                        r["oracle_combine"],
                        r["gap_combine"],
                    ]
                    for r in og["rows"]
                ],
            )
        )
        parts.append("")
    elif og:
        parts.append(f"Oracle gap: {og.get('status')} ({og.get('reason')})")
    for w in (a.get("warnings") or []) + (og.get("warnings") or []):
        parts.append(f"warning: {w}")
    return "\n".join(parts).rstrip() + "\n"
