"""Mixed workloads: the prompts of several workloads in given proportions, interleaved in arrival order.

A sweep names one with a `mix` table of workload = share (the shares sum to 1):

    mix = { offline-code-edit = 0.4, offline-chat = 0.4, offline-math = 0.2 }   # a workload named "mix"

    [workloads.traffic]                                                          # or under a name of its own
    mix = { offline-code-edit = 0.5, my-log = 0.5 }    # my-log: a [workloads.my-log] file table above it

Of N prompts, each part gets its share rounded by largest remainder (ties to the part listed first), so the
counts add up to N; part w's prompts are load_workload(w, count, seed), the same draw as a cell of w alone.
Arrival order interleaves the parts smoothly: the i-th prompt comes from the part furthest behind its share
of the first i prompts (ties to the part listed first), so every prefix, and hence every batch a continuous
engine admits, holds the parts close to their proportions. Every prompt keeps its own category (a file
part's lines keep theirs), so results, traces and reports break a mixed cell down per category.
"""

from __future__ import annotations

import math
from typing import Any

from speclab.workloads.base import Prompt, WorkloadError, WorkloadInfo

MIX_KEY = "mix"
SUM_TOLERANCE = 1e-6


def parse_mix(table: Any, where: str, known: set[str] | None = None) -> dict[str, float]:
    """A mix table checked: {workload: share}, two or more parts, each share in (0, 1], the shares summing
    to 1. `known`: workload names a part may also be (the sweep's file tables). Raises WorkloadError (one
    line) naming the fault."""
    if not isinstance(table, dict) or len(table) < 2:
        raise WorkloadError(f"{where}: mix: expected a table of two or more workload = share entries")
    out: dict[str, float] = {}
    for name, share in table.items():
        if isinstance(share, bool) or not isinstance(share, int | float) or not math.isfinite(share):
            raise WorkloadError(f"{where}: mix.{name}: the share must be a number, got {share!r}")
        if not 0 < share <= 1:
            raise WorkloadError(f"{where}: mix.{name}: the share must be in (0, 1], got {share!r}")
        if name not in (known or set()):
            from speclab.workloads.registry import get_workload

            try:
                info = get_workload(name)
            except WorkloadError as exc:
                raise WorkloadError(f"{where}: mix.{name}: {exc}") from None
            if info.kind == "mix":
                raise WorkloadError(f"{where}: mix.{name}: a mix cannot contain another mix")
        out[name] = float(share)
    total = sum(out.values())
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise WorkloadError(f"{where}: mix: the shares sum to {total:g}, expected 1")
    return out


def mix_counts(shares: dict[str, float], n: int) -> dict[str, int]:
    """Prompts per part out of n: largest remainder (ties to the part listed first); the counts sum to n."""
    raw = {w: s * n for w, s in shares.items()}
    counts = {w: math.floor(v) for w, v in raw.items()}
    order = sorted(shares, key=lambda w: (-(raw[w] - counts[w]), list(shares).index(w)))
    for w in order[: n - sum(counts.values())]:
        counts[w] += 1
    return counts


def interleave(counts: dict[str, int]) -> list[str]:
    """The part each arriving prompt comes from: at every position the part furthest behind its share of the
    prompts so far (ties to the part listed first)."""
    n = sum(counts.values())
    names = list(counts)
    taken = dict.fromkeys(names, 0)
    out = []
    for i in range(1, n + 1):
        left = [w for w in names if taken[w] < counts[w]]
        w = max(left, key=lambda x: (counts[x] * i / n - taken[x], -names.index(x)))
        taken[w] += 1
        out.append(w)
    return out


def build_mix(name: str, shares: dict[str, float], limit: int | None, seed: int) -> list[Prompt]:
    """The mix's prompts in arrival order (see the module docstring); limit None: 100 prompts."""
    from speclab.workloads.registry import load_workload

    n = 100 if limit is None else limit
    counts = mix_counts(shares, n)
    pools: dict[str, list[Prompt]] = {}
    for w, c in counts.items():
        pools[w] = load_workload(w, limit=c, seed=seed) if c else []
        if len(pools[w]) < c:
            raise WorkloadError(f"{name}: part {w} has {len(pools[w])} prompt(s), the mix needs {c}")
    out, seen = [], set()
    for w in interleave(counts):
        p = pools[w].pop(0)
        p.meta = {**p.meta, "mix_part": w}
        if p.id in seen:  # two parts with the same prompt: keep both, apart
            p.id = f"{w}:{p.id}"
        seen.add(p.id)
        p.workload = name
        out.append(p)
    return out


def register_mix(name: str, shares: dict[str, float]) -> WorkloadInfo:
    """Register (or re-register) the mix under `name` (a built-in workload's name is refused)."""
    from speclab.workloads.registry import _REGISTRY, discover, register_workload

    discover()
    old = _REGISTRY.get(name)
    if old is not None and old.info.kind != "mix":
        raise WorkloadError(f"{name!r} is already a workload; give the mix another name")
    parts = ", ".join(f"{w} {s:g}" for w, s in shares.items())
    info = WorkloadInfo(name=name, category="other", kind="mix", description=f"mixed workload: {parts}")
    frozen = dict(shares)
    register_workload(info, lambda limit, seed, source: build_mix(name, frozen, limit, seed), replace=True)
    return info
