"""vLLM's own adaptive baseline: a batch-size schedule for k (`num_speculative_tokens_per_batch_size` in
vLLM 0.32's speculative config, "dynamic speculative decoding").

vLLM's scheduler looks k up by the number of requests scheduled in the step (prefills included) and passes it
to the proposer (n-gram, suffix, EAGLE, draft model); one k for every request of the step, one method for
the whole server. The policy `schedule:METHOD:B1=K1,B2=K2,...` applies such a schedule in the simulator: k
= K_i for live occupancy >= B_i (the first entry must be B1 = 1; K = 0 = no speculation at that size).
`derive_schedule` picks, per batch size, the k that simulates fastest on the user's own traces, and
`vllm_config` prints it as a ready-to-paste speculative config.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from speclab.costmodel.model import CostModel
from speclab.errors import ConfigError
from speclab.methods.catalog import MODEL_FREE
from speclab.simulate.policies import Policy, StepView, _int, _method, register_policy
from speclab.traces.model import RequestTrace


class BatchSchedule(Policy):
    def decide(self, view: StepView) -> tuple[np.ndarray, np.ndarray]:
        starts, ks = self.extra["starts"], self.extra["ks"]
        k = ks[np.searchsorted(starts, view.occupancy, side="right") - 1]
        npr = view.num_proposed(self.methods[0])
        if npr is not None:
            k = np.minimum(k, npr)
        meth = np.where(k > 0, 0, -1)
        return meth.astype(np.int64), k.astype(np.int64)


def parse_schedule(text: str, spec: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        b, eq, k = part.partition("=")
        if not eq:
            raise ConfigError(f"policy {spec!r}: schedule entries are B=K, got {part!r}")
        out.append((_int(b.strip(), "B", spec, 1), _int(k.strip(), "K", spec, 0)))
    out.sort()
    if out[0][0] != 1 or len({b for b, _ in out}) != len(out):
        raise ConfigError(f"policy {spec!r}: the schedule must start at B=1 and name each B once")
    return out


def _schedule(spec: str, args: list[str], opts: dict) -> Policy:
    if len(args) != 2:
        raise ConfigError(f"policy {spec!r}: expected schedule:METHOD:B1=K1,B2=K2,...")
    m = _method(args[0], spec)
    sched = parse_schedule(args[1], spec)
    canon = f"schedule:{m}:" + ",".join(f"{b}={k}" for b, k in sched)
    return BatchSchedule(
        spec=canon, methods=(m,), uses_batch_size=True, uses_occupancy=True,
        extra={"starts": np.array([b for b, _ in sched]), "ks": np.array([k for _, k in sched])},
    )  # fmt: skip


register_policy(
    "schedule",
    "schedule:METHOD:B1=K1,B2=K2,...",
    "vLLM's batch-size schedule for k: k = Ki while the live batch holds >= Bi requests (0 = off)",
    _schedule,
)


def derive_schedule(
    traces: list[RequestTrace], cm: CostModel | str, method: str, batch_sizes: list[int], kmax: int = 8,
    **opts: Any,
) -> tuple[list[tuple[int, int]], dict[int, float]]:  # fmt: skip
    """Per batch size, the k (0 = no SD) whose fixed policy simulates fastest (continuous batching, steady
    state); returns the schedule as (B, k) change points and the speedup at each batch size."""
    from speclab.simulate.api import simulate

    kmax = min(kmax, min(t.methods[method].k_max for t in traces))
    pols = [f"fixed:{method}:{k}" for k in range(1, kmax + 1)]
    res = simulate(traces, cm, pols, "continuous", list(batch_sizes), **opts)
    best: dict[int, tuple[int, float]] = {}
    for r in res:
        k = int(r.policy.rsplit(":", 1)[1])
        if r.speedup > best.get(r.batch_size, (0, 1.0))[1]:
            best[r.batch_size] = (k, r.speedup)
    pts: list[tuple[int, int]] = []
    for b in sorted(batch_sizes):
        k = best.get(b, (0, 1.0))[0]
        if not pts or pts[-1][1] != k:
            # the change point sits where the batch size grows past the previous measured one
            pts.append((1 if not pts else b, k))
    if pts[0][0] != 1:
        pts[0] = (1, pts[0][1])
    return pts, {b: best.get(b, (0, 1.0))[1] for b in sorted(batch_sizes)}


def schedule_spec(method: str, pts: list[tuple[int, int]]) -> str:
    return f"schedule:{method}:" + ",".join(f"{b}={k}" for b, k in pts)


def vllm_config(method: str, pts: list[tuple[int, int]], max_batch: int) -> dict[str, Any]:
    """The speculative config for vLLM 0.32: inclusive (start, end, k) ranges covering 1..max_batch;
    num_speculative_tokens = the largest k (vLLM clamps the schedule to it and refuses 0 there)."""
    ranges = []
    for i, (b, k) in enumerate(pts):
        end = pts[i + 1][0] - 1 if i + 1 < len(pts) else max(max_batch, b)
        ranges.append([b, end, k])
    cfg: dict[str, Any] = {
        "method": method,
        "num_speculative_tokens": max(1, max(k for _, k in pts)),
        "num_speculative_tokens_per_batch_size": ranges,
    }
    if method in MODEL_FREE and method == "ngram":
        cfg.update(prompt_lookup_min=3, prompt_lookup_max=7)  # the study's lookup window
    return cfg


def recommend(
    traces: list[RequestTrace], cm: CostModel | str, batch_sizes: list[int], kmax: int = 8, **opts: Any
) -> dict[str, Any]:
    """For each method all traces hold, derive its schedule; recommend the one with the best mean speedup
    over the batch sizes. Returns {method, schedule policy, speedups, vllm speculative config, others}."""
    methods = sorted(set.intersection(*(set(t.methods) for t in traces)))
    if not methods:
        raise ConfigError("the traces hold no method in common to recommend")
    found = {}
    for m in methods:
        pts, sp = derive_schedule(traces, cm, m, batch_sizes, kmax, **opts)
        found[m] = (pts, sp, float(np.mean(list(sp.values()))))
    m = max(found, key=lambda x: found[x][2])
    pts, sp, _ = found[m]
    return {
        "method": m,
        "policy": schedule_spec(m, pts),
        "speedup": sp,
        "speculative_config": vllm_config(m, pts, max(batch_sizes)),
        "others": {x: {"policy": schedule_spec(x, v[0]), "mean_speedup": v[2]} for x, v in found.items()},
    }


def config_json(rec: dict[str, Any]) -> str:
    return json.dumps(rec["speculative_config"])
