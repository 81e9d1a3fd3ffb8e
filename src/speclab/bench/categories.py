"""Per-category breakdown of a cell whose prompts span several categories (a mixed workload, or a file
workload whose lines name their own categories).

Every request keeps its own category: in its trace record (RequestTrace.category) and in the row's
`per_category` table, {category: {num_requests, output_tokens, mean_acceptance_length,
acceptance_rate_per_pos, mean_tokens_per_step}}. Throughput and speedup are the cell's only: the categories
share one engine batch, so its time cannot be split between them."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

from speclab.engine.protocol import CellResult


@lru_cache(maxsize=64)
def _categories(
    workload: str, num_prompts: int, seed: int, source: str | None
) -> tuple[tuple[str, str], ...]:
    from speclab.workloads import get_workload, load_workload
    from speclab.workloads.base import OWN_CATEGORIES

    if get_workload(workload).kind not in OWN_CATEGORIES:
        return ()
    return tuple(
        (p.id, p.category) for p in load_workload(workload, limit=num_prompts, seed=seed, source=source)
    )


def prompt_categories(spec: Any, workload: str) -> dict[str, str]:
    """prompt id -> category for a workload whose prompts keep their own categories (mix, file); empty for
    any other workload (every prompt has the workload's category). The same draw the bench renders."""
    try:
        pairs = _categories(workload, spec.num_prompts, spec.seed, spec.workload_sources.get(workload))
    except Exception:  # the cell's own category stands in (the row says nothing per category)
        return {}
    return dict(pairs)


def category_breakdown(
    res: CellResult, categories: dict[str, str], is_baseline: bool
) -> dict[str, Any] | None:
    """The row's per_category table (see the module docstring); None unless the cell's requests span two or
    more categories. Acceptance figures come from each request's own per-step counts."""
    from speclab.bench.results import acceptance_stats

    if res.status != "ok" or not categories:
        return None
    groups: dict[str, list[Any]] = {}
    for r in res.requests:
        groups.setdefault(categories.get(r.id, "other"), []).append(r)
    if len(groups) < 2:
        return None
    out: dict[str, Any] = {}
    for cat in sorted(groups):
        reqs = groups[cat]
        entry: dict[str, Any] = {
            "num_requests": sum(1 for r in reqs if not r.copy),
            "output_tokens": sum(len(r.output_token_ids) for r in reqs),
            "mean_acceptance_length": None,
            "acceptance_rate_per_pos": [],
            "mean_tokens_per_step": None,
        }
        if not is_baseline:
            mean_len, per_pos, tps = acceptance_stats(replace(res, requests=reqs, spec_counters=None))
            entry.update(
                mean_acceptance_length=mean_len, acceptance_rate_per_pos=per_pos, mean_tokens_per_step=tps
            )
        out[cat] = entry
    return out


def category_lines(rows: list[dict[str, Any]]) -> list[str]:
    """`bench show`'s per-category table of the ok cells that have one (empty if none has)."""
    split = [r for r in rows if r.get("status") == "ok" and r.get("per_category")]
    if not split:
        return []
    head = ("workload", "batching", "B", "entry", "category", "requests", "out tok", "acc len", "tok/step")
    body = []
    for r in split:
        for cat, v in r["per_category"].items():
            acc, tps = v.get("mean_acceptance_length"), v.get("mean_tokens_per_step")
            body.append((
                str(r.get("workload")), str(r.get("batching")), str(r.get("batch_size")),
                str(r.get("label") or r.get("method")), cat, str(v.get("num_requests")), str(v.get("output_tokens")),
                "-" if acc is None else f"{acc:.2f}", "-" if tps is None else f"{tps:.2f}",
            ))  # fmt: skip
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    out = [
        "per category (cells whose prompts span several categories; throughput and speedup are the cell's: "
        "its categories share one engine batch)"
    ]
    out += [
        "  " + "  ".join(c.ljust(w) for c, w in zip(x, widths, strict=True)).rstrip() for x in [head, *body]
    ]
    return out
