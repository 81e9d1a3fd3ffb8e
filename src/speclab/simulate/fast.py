"""The fast, vectorised simulator.

Two phases, both vectorised with numpy across requests:

1. Step table (per policy): every request's sequence of SD steps -- position, method, drafts proposed k,
   tokens produced -- advancing all requests together one step index at a time (loop over the step index,
   never over requests). A request's steps do not depend on the other requests in its batch: a policy
   decides per request from that request's own trace/history (see speclab.policy), and produced =
   min(acc_len[pos], k + 1) needs nothing else.
2. Timing (per batching mode and batch size, costs.py): assign every request step to a global engine step
   (its batch's or slot's start + 1 + step index; the start step is the request's prefill), then sum per
   global step with bincount.

Memory is O(total trace positions): the step table has at most one row per output position. reference.py
mirrors both phases step for step (tests compare the two). Policies that must see the live batch run
through coupled.py, which builds the step table itself and reuses the timing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from speclab.costmodel.model import CostModel
from speclab.errors import ConfigError, TraceError
from speclab.policy.core import Policy, PolicyContext, StepOutcome, StepView
from speclab.simulate.sampled import is_sampled
from speclab.traces.model import RequestTrace

BATCHING_MODES = ("replicate", "static", "continuous")
# continuous batching's steady state: requests each slot serves on average in the measured run (see
# steady_passes and docs/simulator.md)
STEADY_REQUESTS_PER_SLOT = 4
STEADY_LONGEST = 8
STEADY_MAX_POSITIONS = 2_000_000


@dataclass
class TraceArrays:
    """Traces flattened for the simulator: per request lengths, and per method one flat array over all
    output positions (request i's positions are off[i] .. off[i+1]-1)."""

    ids: list[str]
    workloads: list[str]
    prompt_len: np.ndarray
    out_len: np.ndarray
    off: np.ndarray
    acc: dict[str, np.ndarray]
    nprop: dict[str, np.ndarray | None]
    k_max: dict[str, int]
    notes: list[str] = field(default_factory=list)
    sampled: np.ndarray | None = None  # per request: sampled (temperature > 0), sampled.is_sampled

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def total_positions(self) -> int:
        return int(self.off[-1])


def method_lengths(traces: list[RequestTrace], methods: set[str] | tuple[str, ...]) -> np.ndarray:
    """Per request, the output length a simulation over `methods` uses: each method's trace has its own
    length (its own run); several methods = the shortest (their traces exist together only over that prefix);
    no method (the baseline alone) = the record's output_len."""
    for m in sorted(methods):
        missing = [t.id for t in traces if m not in t.methods]
        if missing:
            raise TraceError(
                f"request {missing[0]!r} (and {len(missing) - 1} more) has no trace for method {m!r}"
                if len(missing) > 1
                else f"request {missing[0]!r} has no trace for method {m!r}"
            )
    if not methods:
        return np.array([t.output_len for t in traces], dtype=np.int64)
    return np.array([min(len(t.methods[m].acc_len) for m in methods) for t in traces], dtype=np.int64)


def prepare(traces: list[RequestTrace], methods: set[str], shift: bool = False) -> TraceArrays:
    """Flatten traces for `methods`, each request at its method_lengths() length (requests of length 0 are
    dropped). shift: the study's reading, where the first step after prefill reads acc_len[0] (produced - 1)
    instead of acc_len[1]: the arrays move one position later, so position p holds acc_len[p - 1]."""
    notes: list[str] = []
    lengths = method_lengths(traces, methods)
    keep = np.flatnonzero(lengths > 0)
    kept = [traces[i] for i in keep]
    if len(kept) < len(traces):
        notes.append(f"skipped {len(traces) - len(kept)} request(s) with no output tokens")
    if not kept:
        raise TraceError("no requests with output tokens to simulate")
    out_len = lengths[keep]
    off = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum(out_len, out=off[1:])

    def flat(arrs: list[np.ndarray], fill: int) -> np.ndarray:
        if shift:
            arrs = [np.concatenate([[fill], a[: n - 1]]) for a, n in zip(arrs, out_len.tolist(), strict=True)]
        else:
            arrs = [a[:n] for a, n in zip(arrs, out_len.tolist(), strict=True)]
        return np.concatenate(arrs).astype(np.int64)

    acc: dict[str, np.ndarray] = {}
    nprop: dict[str, np.ndarray | None] = {}
    k_max: dict[str, int] = {}
    for m in sorted(methods):
        acc[m] = flat([t.methods[m].acc_len for t in kept], 1)
        k_max[m] = min(int(t.methods[m].k_max) for t in kept)
        if all(t.methods[m].num_proposed is not None for t in kept):
            nprop[m] = flat([t.methods[m].num_proposed for t in kept], 0)
        else:
            nprop[m] = None
            if any(t.methods[m].num_proposed is not None for t in kept):
                notes.append(
                    f"{m}: proposal counts recorded for only some requests; treated as unknown for all"
                )
    return TraceArrays(
        ids=[t.id for t in kept],
        workloads=[t.workload for t in kept],
        prompt_len=np.array([t.prompt_len for t in kept], dtype=np.int64),
        out_len=out_len,
        off=off,
        acc=acc,
        nprop=nprop,
        k_max=k_max,
        notes=notes,
        sampled=np.array([is_sampled(t) for t in kept], dtype=bool),
    )


@dataclass
class StepTable:
    """One row per request step (SD step after prefill), in step-index-major order."""

    req: np.ndarray
    t: np.ndarray  # step index within the request (0 = first step after prefill)
    pos: np.ndarray  # output position at the start of the step (>= 1)
    meth: np.ndarray  # index into policy.methods, -1 = none
    k: np.ndarray  # drafts proposed (before the miss heuristic)
    acc: np.ndarray  # acc_len of the chosen method at pos (1 for none)
    produced: np.ndarray  # tokens produced, capped at the tokens the request still has to produce
    switched: np.ndarray  # bool: method differs from the request's previous step
    cand: np.ndarray  # bool: the n-gram miss heuristic may turn this proposal into a miss
    n_steps: np.ndarray  # per request
    # bool per row: the policy's probes ran at this step (StepView.probed; None = at every step)
    probed: np.ndarray | None = None


def check_decision(policy: Policy, ta: TraceArrays, meth: np.ndarray, k: np.ndarray, n: int) -> None:
    if meth.shape != (n,) or k.shape != (n,):
        raise ConfigError(f"policy {policy.spec}: decide() must return two arrays of length {n}")
    if n == 0:
        return
    if k.min() < 0:
        raise ConfigError(f"policy {policy.spec}: proposed a negative number of drafts")
    if meth.min() < -1 or meth.max() >= len(policy.methods):
        raise ConfigError(f"policy {policy.spec}: method index out of range")
    for j, m in enumerate(policy.methods):
        sel = meth == j
        if sel.any() and k[sel].max() > ta.k_max[m]:
            raise ConfigError(
                f"policy {policy.spec}: proposes k={int(k[sel].max())} drafts with {m}, more than the traces "
                f"record (k_max={ta.k_max[m]}); the trace cannot tell what would be accepted"
            )
    if (k[meth < 0] > 0).any():
        raise ConfigError(f"policy {policy.spec}: proposes drafts without a method")


def check_probed(policy: Policy, view: StepView, meth: np.ndarray, k: np.ndarray) -> None:
    """A gated policy (StepView.probed) drafts from a lookup only where it ran it."""
    if view.probed is None:
        return
    if view.probed.shape != meth.shape:
        raise ConfigError(f"policy {policy.spec}: StepView.probed must have one flag per row")
    lookup = np.isin(meth, [j for j, m in enumerate(policy.methods) if m in policy.probes]) & (k > 0)
    if (lookup & ~view.probed).any():
        raise ConfigError(f"policy {policy.spec}: drafts from a lookup at a step where it did not run it")


def probed_flags(view: StepView) -> np.ndarray:
    return np.ones(len(view), bool) if view.probed is None else view.probed


def heuristic_flags(
    policy: Policy, ta: TraceArrays, meth: np.ndarray, k: np.ndarray, a: np.ndarray, on: bool
):
    """Where the study's miss heuristic applies: n-gram proposals of a non-oracle policy where the trace has no
    proposal counts and acc_len is 1 (a lookup that found nothing and one that was fully rejected look the same)."""
    if (
        not on
        or not policy.heuristic_ok
        or "ngram" not in policy.methods
        or ta.nprop.get("ngram") is not None
    ):
        return np.zeros(len(meth), dtype=bool)
    j = policy.methods.index("ngram")
    return (meth == j) & (a == 1) & (k > 0)


def make_view(
    ta: TraceArrays, policy: Policy, req: np.ndarray, i: np.ndarray, p: np.ndarray, steps: np.ndarray,
    occ: np.ndarray | None = None, kv: np.ndarray | None = None,
) -> tuple[StepView, np.ndarray]:  # fmt: skip
    """The StepView of running requests `req` (trace indices i) at positions p; returns (view, flat index)."""
    fi = ta.off[i] + p
    nprop = {m: (None if ta.nprop[m] is None else ta.nprop[m][fi]) for m in policy.methods}
    oracle = {m: ta.acc[m][fi] for m in policy.methods} if policy.oracle else None
    past = {m: (ta.acc[m], fi, ta.nprop[m]) for m in policy.probes}
    if not policy.uses_occupancy:
        occ = kv = None
    return StepView(req, p, steps, nprop, oracle, occ, kv, past), fi


def check_probes(policy: Policy, cm: CostModel | None = None) -> None:
    for m in policy.probes:
        if m not in policy.methods:
            raise ConfigError(f"policy {policy.spec}: probe {m!r} is not one of its methods")
        if cm is not None and cm.draft_for(m).form != "verify_fraction":
            raise ConfigError(
                f"policy {policy.spec}: only model-free (verify_fraction) methods can be probes"
            )


def decide_step(
    ta: TraceArrays,
    policy: Policy,
    view: Any,
    fi: np.ndarray,
    stack: np.ndarray | None,
    req: np.ndarray,
    p: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One step's decisions for the requests `req` at positions `p`: (method index, k, acceptance at the
    position, tokens produced before and after the cap at the request's end). Shared by run_steps and the
    coupled (live-batch) loop in coupled.py."""
    meth, k = policy.decide(view)
    meth = np.asarray(meth, dtype=np.int64)
    k = np.asarray(k, dtype=np.int64)
    check_decision(policy, ta, meth, k, len(req))
    check_probed(policy, view, meth, k)
    if stack is not None:
        a = np.where(meth >= 0, stack[np.maximum(meth, 0), fi], 1)
    else:
        a = np.ones(len(req), dtype=np.int64)
    prod_raw = np.minimum(a, k + 1)
    return meth, k, a, prod_raw, np.minimum(prod_raw, ta.out_len[req] - p)


def run_steps(
    ta: TraceArrays, policy: Policy, batch_size: int, heuristic: bool, batching: str = "", study: bool = False
) -> StepTable:
    """Every request's steps, each request on its own. A policy that reads the live batch (uses_occupancy)
    can run this way only where its batch is itself: replicate batching (its B copies) or B = 1."""
    coupled = policy.uses_occupancy and batching != "replicate" and batch_size > 1
    if coupled:
        raise ConfigError(f"policy {policy.spec}: reads the live batch; use run_steps_coupled")
    check_probes(policy)
    c = batch_size if batching == "replicate" else 1
    policy.begin(PolicyContext(num_requests=ta.n, batch_size=batch_size, k_max=dict(ta.k_max)))
    n = ta.n
    pos = np.ones(n, dtype=np.int64)
    n_steps = np.zeros(n, dtype=np.int64)
    prev = np.full(n, -2, dtype=np.int64)
    active = np.flatnonzero(ta.out_len > 1)
    stack = np.stack([ta.acc[m] for m in policy.methods]) if policy.methods else None
    cols: dict[str, list[np.ndarray]] = {
        c: [] for c in ("req", "t", "pos", "meth", "k", "acc", "prod", "sw", "cand", "probed")
    }
    while active.size:
        p = pos[active]
        occ = np.full(len(active), c, dtype=np.int64)
        kv = c * (ta.prompt_len[active] + p - 1 + (1 if study else 0))
        view, fi = make_view(ta, policy, active, active, p, n_steps[active], occ, kv)
        meth, k, a, prod_raw, prod = decide_step(ta, policy, view, fi, stack, active, p)
        pv = prev[active]
        cols["req"].append(active)
        cols["t"].append(n_steps[active])
        cols["pos"].append(p)
        cols["meth"].append(meth)
        cols["k"].append(k)
        cols["acc"].append(a)
        cols["prod"].append(prod)
        cols["sw"].append((pv != -2) & (pv != meth))
        cols["cand"].append(heuristic_flags(policy, ta, meth, k, a, heuristic))
        cols["probed"].append(probed_flags(view))
        policy.observe(StepOutcome(req=active, method=meth, k=k, accepted=prod_raw - 1))
        prev[active] = meth
        pos[active] = p + prod
        n_steps[active] += 1
        active = active[pos[active] < ta.out_len[active]]

    def cat(c: str, dtype=np.int64) -> np.ndarray:
        return np.concatenate(cols[c]).astype(dtype) if cols[c] else np.zeros(0, dtype=dtype)

    return StepTable(
        req=cat("req"),
        t=cat("t"),
        pos=cat("pos"),
        meth=cat("meth"),
        k=cat("k"),
        acc=cat("acc"),
        produced=cat("prod"),
        switched=cat("sw", bool),
        cand=cat("cand", bool),
        n_steps=n_steps,
        probed=cat("probed", bool),
    )


def baseline_steps(ta: TraceArrays) -> StepTable:
    """`none` without the loop: output_len - 1 decode steps of one token each."""
    n_steps = np.maximum(ta.out_len - 1, 0)
    req = np.repeat(np.arange(ta.n), n_steps)
    start = np.repeat(np.cumsum(n_steps) - n_steps, n_steps)
    t = np.arange(len(req)) - start
    one = np.ones(len(req), dtype=np.int64)
    return StepTable(
        req=req,
        t=t,
        pos=t + 1,
        meth=-one,
        k=0 * one,
        acc=one,
        produced=one,
        switched=np.zeros(len(req), bool),
        cand=np.zeros(len(req), bool),
        n_steps=n_steps,
    )


def miss_draws(ta: TraceArrays, match_p: np.ndarray, batching: str, batch_size: int, seed: int) -> np.ndarray:
    """The study's n-gram miss heuristic, drawn once per (request, output position): how many of the
    request's copies find an n-gram match there (replicate: Binomial(B, match_p) copies; otherwise 0/1).
    Each position is visited at most once per request, so this equals drawing at each step; drawing per
    position lets every policy and the reference loop see the same draws (common random numbers)."""
    rng = np.random.default_rng([seed, batch_size, BATCHING_MODES.index(batching)])
    p = np.repeat(match_p, ta.out_len)
    if batching == "replicate":
        return rng.binomial(batch_size, p).astype(np.int64)
    return (rng.random(len(p)) < p).astype(np.int64)


def study_miss_draws(
    st: StepTable, ta: TraceArrays, match_p: np.ndarray, batch_size: int, gen: np.random.RandomState
) -> np.ndarray:
    """The study's own miss draws, value for value (replicate batching): `random.random()` once per copy at
    every step where the heuristic applies (acc 1), request after request in batch order, step by step,
    copies in order; a copy finds a match where the draw is < match_p. `gen` continues the study's generator
    after its sampling (study.miss_generator). Returns matched copies per (request, output position)."""
    order = np.lexsort((st.t, st.req))
    rows = order[st.cand[order]]
    u = gen.random_sample(len(rows) * batch_size).reshape(len(rows), batch_size)
    out = np.zeros(ta.total_positions, dtype=np.int64)
    out[ta.off[st.req[rows]] + st.pos[rows]] = (u < match_p[st.req[rows], None]).sum(axis=1)
    return out


def steady_passes(out_len: np.ndarray, batch_size: int) -> tuple[int, bool]:
    """How many times a continuous run admits the request list over to measure its steady state: enough that
    every slot serves STEADY_REQUESTS_PER_SLOT requests on average, and that the measured window lasts
    STEADY_LONGEST times as long as the longest request (a long request occupies a slot for its whole life:
    in a server's steady state long requests hold slots in proportion to their tokens, and a window shorter
    than their life under-counts them). Capped at STEADY_MAX_POSITIONS simulated positions; returns
    (passes, capped)."""
    n, total, longest = len(out_len), int(out_len.sum()), int(out_len.max())
    need = max(STEADY_REQUESTS_PER_SLOT * batch_size / n, STEADY_LONGEST * batch_size * longest / total, 1.0)
    cap = max(1, STEADY_MAX_POSITIONS // max(total, 1))
    passes = int(np.ceil(need))
    return min(passes, cap), passes > cap


def repeat_requests(ta: TraceArrays, st: StepTable | None, passes: int) -> tuple[TraceArrays, StepTable]:
    """The request list admitted `passes` times over (instance q is request q mod n): a request's steps do
    not depend on its batch mates, so each instance repeats its request's step rows (st None: only the
    trace arrays, for coupled.run_steps_coupled)."""
    if passes == 1:
        return ta, st  # type: ignore[return-value]
    n = ta.n
    out_len = np.tile(ta.out_len, passes)
    off = np.zeros(len(out_len) + 1, dtype=np.int64)
    np.cumsum(out_len, out=off[1:])
    tx = replace(ta, ids=ta.ids * passes, workloads=ta.workloads * passes,
                 prompt_len=np.tile(ta.prompt_len, passes), out_len=out_len, off=off,
                 sampled=None if ta.sampled is None else np.tile(ta.sampled, passes))  # fmt: skip
    if st is None:
        return tx, st  # type: ignore[return-value]
    rep = np.repeat(np.arange(passes), len(st.req)) * n
    sx = StepTable(
        req=np.tile(st.req, passes) + rep,
        **{
            f: np.tile(getattr(st, f), passes)
            for f in ("t", "pos", "meth", "k", "acc", "produced", "switched", "cand")
        },
        n_steps=np.tile(st.n_steps, passes),
        probed=None if st.probed is None else np.tile(st.probed, passes),
    )
    return tx, sx
