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


def observed_rows(obs: Sequence[dict[str, Any]]) -> list[list[Any]]:
    """The columns of `observed` entries, as both the text tables and the HTML report show them: workload,
    method (the sweep entry's label where the run's results named it: entries may share method and k), k,
    requests, steps, mean, std, p50, p95."""
    return [
        [
            e["workload"],
            e.get("label") or e["method"],
            *(e[k] for k in ("k", "n_requests", "n_steps", "mean", "std", "p50", "p95")),
        ]
        for e in obs
    ]


def pluck(records: Sequence[dict[str, Any]], keys: str) -> list[list[Any]]:
    """One row per record with the values of the space-separated `keys`; "a.b" reads record["a"]["b"]."""

    def get(record: Any, key: str) -> Any:
        for part in key.split("."):
            record = record[part]
        return record

    return [[get(r, k) for k in keys.split()] for r in records]


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
                pluck(
                    acc,
                    "workload method k_max n_requests mean std p5 p50 p95 per_request.std "
                    "heavy_tail.share_ge_burst heavy_tail.top10_share",
                ),
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
                observed_rows(obs),
            )
        )
        parts.append("")
    ov = a.get("overlap") or {}
    if ov.get("groups"):
        parts.append(f"Prompt-output overlap vs advantage (overlap: {ov['overlap_source']})")
        parts.append(
            text_table(
                ["workload", "free", "model", "reqs", "overlap", "adv", "free wins", "pearson", "crossover"],
                pluck(
                    ov["groups"],
                    "workload free_method model_method n mean_overlap mean_advantage share_free_wins pearson "
                    "crossover_overlap",
                ),
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
                pluck(
                    og["rows"],
                    "workload batching batch_size best_measured best_measured_method oracle_best_single "
                    "oracle_best_single_policy oracle_combine gap_combine",
                ),
            )
        )
        parts.append("")
    elif og:
        parts.append(f"Oracle gap: {og.get('status')} ({og.get('reason')})")
    for w in (a.get("warnings") or []) + (og.get("warnings") or []):
        parts.append(f"warning: {w}")
    return "\n".join(parts).rstrip() + "\n"
