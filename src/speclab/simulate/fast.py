"""The fast, vectorised simulator.

Two phases, both vectorised with numpy across requests:

1. Step table (per policy): every request's sequence of SD steps -- position, method, drafts proposed k,
   tokens produced -- advancing all requests together one step index at a time (loop over the step index,
   never over requests). A request's steps do not depend on the other requests in its batch: a policy
   decides per request from that request's own trace/history (see policies.py), and produced =
   min(acc_len[pos], k + 1) needs nothing else.
2. Timing (per batching mode and batch size): assign every request step to a global engine step (its batch's
   or slot's start + 1 + step index; the start step is the request's prefill), then sum per global step with
   bincount: kv tokens, verified tokens, drafting terms (max/any via maximum.at), overheads. Request
   latencies are differences of the cumulative step-time sum.

Memory is O(total trace positions): the step table has at most one row per output position.

Size: about 540 lines; the step table, the schedulers and the timing are the simulator's rules in one place,
mirrored step for step by reference.py (tests compare the two), so they stay together. Policies that must
see the live batch run through coupled.py, which reuses the timing here.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from speclab.costmodel.model import CostModel
from speclab.errors import ConfigError, TraceError
from speclab.simulate.policies import Policy, PolicyContext, StepOutcome, StepView
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


@dataclass
class Schedule:
    start: np.ndarray  # per request: global step of its prefill
    batch: np.ndarray  # per request: batch id (study aggregation); continuous = 0
    num_steps: int  # global engine steps


def schedule(n_steps: np.ndarray, batching: str, batch_size: int) -> Schedule:
    n = len(n_steps)
    if batching == "replicate":
        length = n_steps + 1
        start = np.cumsum(length) - length
        return Schedule(start=start, batch=np.arange(n), num_steps=int(length.sum()))
    if batching == "static":
        batch = np.arange(n) // batch_size
        nb = int(batch[-1]) + 1 if n else 0
        blen = np.zeros(nb, dtype=np.int64)
        np.maximum.at(blen, batch, n_steps + 1)
        bstart = np.cumsum(blen) - blen
        return Schedule(start=bstart[batch], batch=batch, num_steps=int(blen.sum()))
    if batching == "continuous":
        # B slots; a request occupies its slot from its prefill step through its last SD step; the slot
        # takes the next request (in order) at the following step, as vLLM's scheduler admits on free slots.
        start = np.zeros(n, dtype=np.int64)
        free = [0] * min(batch_size, n)
        heapq.heapify(free)
        for i, ns in enumerate(n_steps.tolist()):
            g = heapq.heappop(free)
            start[i] = g
            heapq.heappush(free, g + ns + 1)
        return Schedule(
            start=start, batch=np.zeros(n, dtype=np.int64), num_steps=int(max(free) if free else 0)
        )
    raise ConfigError(f"unknown batching {batching!r} (use {', '.join(BATCHING_MODES)})")


@dataclass
class Timing:
    latency: np.ndarray  # per request (prefill step through its last step)
    batch: np.ndarray
    tokens: np.ndarray  # per request, all copies
    verify_s: float
    propose_s: float
    overhead_s: float
    total_s: float
    steps: int
    produced: int  # tokens produced by SD steps (all copies)
    request_steps: int  # SD steps summed over requests (all copies)
    rejected: int
    # continuous batching: simulated time and tokens produced in the steps where every slot is busy
    full_s: float = 0.0  # ... with each prefill charged over its request's tokens (prefill_charges)
    full_tokens: int = 0
    busy_s: float = 0.0  # the simulated time of the steps where every slot is busy (the tail's complement)


def step_costs(
    st: StepTable,
    policy: Policy,
    ta: TraceArrays,
    cm: CostModel,
    batching: str,
    batch_size: int,
    draws: np.ndarray | None,
    switch_overhead: float,
    draft_kv: str = "batch",
    study: bool = False,
) -> Timing:
    """Time every global step and every request. draft_kv: the kv_tokens a "linear" drafting term sees --
    "batch" (the batch's kv, as the target forward; default) or "request" (the drafting request's own).
    study: the study's rules (replicate batching only; see study_draft): a request holds one more KV token
    (prompt + produced), and drafting is charged per request copy, averaged over the copies."""
    c = batch_size if batching == "replicate" else 1
    extra = 1 if study else 0
    sch = schedule(st.n_steps, batching, batch_size)
    G = sch.num_steps
    keys = sch.start[st.req] + 1 + st.t
    # verify tokens and draft sizes across the request's copies (the miss heuristic can split copies)
    if draws is not None and st.cand.any():
        mc = np.where(st.cand, draws[ta.off[st.req] + st.pos], c)
    else:
        mc = np.full(len(st.req), c, dtype=np.int64)
    vtok = (c - mc) + mc * (st.k + 1)
    spec_max = np.where(mc > 0, st.k, 0)
    spec_sum = st.k * mc
    kv = np.bincount(keys, weights=c * (ta.prompt_len[st.req] + st.pos - 1 + extra), minlength=G)
    vt = np.bincount(keys, weights=vtok, minlength=G) + np.bincount(
        sch.start, weights=c * ta.prompt_len, minlength=G
    )
    # requests scheduled in each step (running and prefilling, every copy) and draft tokens verified
    nreq = c * (np.bincount(keys, minlength=G) + np.bincount(sch.start, minlength=G))
    spec = np.bincount(keys, weights=spec_sum, minlength=G)
    verify = cm.target_time(kv, vt, nreq + spec)
    # the same forward without the step's prefills (continuous batching mixes them in): what a lookup's
    # fraction is charged on (it runs over the running requests' context, not over prompts being
    # prefilled), and the steady state's prefill charges
    npre = np.bincount(sch.start, minlength=G)
    pre_tok = np.bincount(sch.start, weights=c * ta.prompt_len, minlength=G)
    nrun = nreq - c * npre
    verify_dec = np.where(
        nrun > 0, np.asarray(cm.target_time(kv, vt - pre_tok, nrun + spec)) * np.ones(G), 0.0
    )
    lookup_base = np.where(npre > 0, verify_dec, verify)
    draft = np.zeros(G)
    if study and policy.methods:
        draft = np.bincount(keys, weights=study_draft(st, policy, ta, cm, c, mc, verify[keys]), minlength=G)
    elif policy.methods:
        charge = np.array([policy.charge_as or m for m in policy.methods])
        for name in sorted(set(charge.tolist()) | set(policy.probes)):
            cost = cm.draft_for(name)
            sel = np.isin(st.meth, np.flatnonzero(charge == name))
            ks, sm = keys[sel], spec_max[sel]
            if cost.form == "verify_fraction":
                if name in policy.probes:  # the lookup runs at every step, for every request it probes
                    draft += cost.fraction * lookup_base * probe_share(st, keys, G)
                    continue
                anyd = np.bincount(ks[sm > 0], minlength=G) > 0
                draft += np.where(anyd, cost.fraction * lookup_base, 0.0)
                continue
            mx = np.zeros(G, dtype=np.int64)
            np.maximum.at(mx, ks, sm)
            # passes the drafter runs: the most drafts asked for, at least one at every step with a running
            # request where the engine runs it anyway (policy.drafter_always_runs)
            always = policy.drafter_always_runs & (np.bincount(keys, minlength=G) > 0)
            passes = np.where(always, np.maximum(mx, 1), mx)
            if cost.form == "forwards":
                draft += forwards_charge(
                    cost, passes, np.bincount(sch.start, minlength=G) > 0, policy, kv, vt, nreq
                )
                continue
            if cost.form == "linear" and draft_kv == "request":
                own = cost.kv * (ta.prompt_len[st.req[sel]] + st.pos[sel] - 1) + cost.num_spec * sm
                best = np.full(G, -np.inf)
                np.maximum.at(best, ks, own)
                # a step where only the always-run forward happens: its constant part
                draft += np.where(np.isfinite(best), best + cost.const, np.where(always, cost.const, 0.0))
            elif cost.form == "linear":
                used = (np.bincount(ks, minlength=G) > 0) | always
                draft += np.where(used, cost.kv * kv + cost.num_spec * mx + cost.const, 0.0)
            else:  # chained
                draft += passes * (cost.kv * kv + cost.const) + cost.num_spec * np.bincount(
                    ks, weights=spec_sum[sel], minlength=G
                )
    base_overhead = np.asarray(cm.overhead_time(nreq, spec), dtype=np.float64) * np.ones(G)
    overhead = base_overhead.copy()
    if switch_overhead and st.switched.any():
        overhead += switch_overhead * (np.bincount(keys[st.switched], minlength=G) > 0)
    step_t = verify + draft + overhead
    cum = np.cumsum(step_t)
    end = sch.start + st.n_steps
    latency = cum[end] - cum[sch.start] + step_t[sch.start]
    full_s, full_tokens, busy_s = 0.0, 0, 0.0
    if batching == "continuous":
        # a request holds its slot from its prefill step through its last step
        d = np.zeros(G + 1, dtype=np.int64)
        np.add.at(d, sch.start, 1)
        np.add.at(d, end + 1, -1)
        full = np.cumsum(d)[:G] >= min(batch_size, ta.n)
        tok = np.bincount(keys, weights=c * st.produced, minlength=G) + npre
        full_tokens = int(round(tok[full].sum()))
        busy_s = float(step_t[full].sum())
        # each request's prefill is charged over its output tokens (prefill_charges): the window cuts through
        # the requests in progress at its end, whose prefills it holds but not all their tokens
        pcost = prefill_charges(cm, npre, nrun, spec, verify, verify_dec, base_overhead)
        # each request's share of its prefill step's charge: by prompt tokens (evenly where they are 0)
        own = pre_tok[sch.start]
        share = np.where(own > 0, c * ta.prompt_len / np.maximum(own, 1), 1.0 / npre[sch.start])
        per_req = pcost[sch.start] * share
        in_win = np.bincount(st.req, weights=st.produced * full[keys], minlength=ta.n) + full[sch.start]
        full_s = float((step_t - pcost)[full].sum() + (per_req * in_win / ta.out_len).sum())
    return Timing(
        latency=latency,
        batch=sch.batch,
        tokens=c * ta.out_len,
        verify_s=float(verify.sum()),
        propose_s=float(draft.sum()),
        overhead_s=float(overhead.sum()),
        total_s=float(step_t.sum()),
        steps=G,
        produced=int(c * st.produced.sum()),
        request_steps=int(c * len(st.req)),
        rejected=int(vtok.sum() - c * st.produced.sum()),
        full_s=full_s,
        full_tokens=full_tokens,
        busy_s=busy_s,
    )


def prefill_charges(
    cm: CostModel,
    npre: np.ndarray,
    nrun: np.ndarray,
    spec: np.ndarray,
    verify: np.ndarray,
    verify_dec: np.ndarray,
    overhead: np.ndarray,
) -> np.ndarray:
    """The steady state's prefill accounting (continuous batching): per step, what its prefills add, the
    target forward and the per-request overhead with them less without them (a step of prefills only: all
    of it; drafting charges stay with the step). npre / nrun: requests prefilled / running in each step;
    overhead: each step's overhead with its prefills (no switching charge).

    Why: the steady window ends at the first step with a free slot, cutting through the B requests then in
    progress; it holds their prefills but only part of their tokens, while it starts with B fresh requests
    (all prefills and all tokens inside). Where SD spreads the requests' ends apart, the window so holds
    about B / 2 prefills too many for its tokens: a bias against every SD policy that shrinks only as
    1 / passes (real math replay, B = 16, CPU model: adaptive-gated 0.966x with 4 passes, 0.985x with
    40; docs/simulator.md). Charging each prefill over its request's tokens, the window's own tokens carry
    exactly their share: 0.985x with 4 passes. verify_dec: each step's target forward without its prefills."""
    dec_o = np.where(nrun > 0, np.asarray(cm.overhead_time(nrun, spec)) * np.ones(len(npre)), 0.0)
    return np.where(npre > 0, (verify - verify_dec) + (overhead - dec_o), 0.0)


def forwards_charge(
    cost: Any, mx: np.ndarray, prefill: np.ndarray, policy: Policy, kv: Any, vt: Any, nreq: Any
) -> np.ndarray:
    """Drafting of the "forwards" form per step (costmodel.model.DraftCost): the drafter runs `passes`
    forwards, the most drafts any request of the step asks for; a step whose only work is prefills still
    runs the policy's largest k (the engine's drafter proposes for a request right after its prefill)."""
    passes = np.where((mx == 0) & prefill, int(policy.extra.get("max_k") or 0), mx).astype(np.float64)
    t = passes * (cost.kv * kv + cost.const) + cost.batched * (vt + np.maximum(passes - 1, 0) * nreq)
    return np.where(passes > 0, t, 0.0)


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
                 prompt_len=np.tile(ta.prompt_len, passes), out_len=out_len, off=off)  # fmt: skip
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


def probe_share(st: StepTable, keys: np.ndarray, G: int) -> np.ndarray:
    """Per global step: the share of its running requests whose probes ran (1 where every request's did;
    0 in steps of prefills only). A lookup's cost is per request, so a gated policy pays for the rows it
    probed (StepView.probed)."""
    rows = np.bincount(keys, minlength=G)
    if st.probed is None:
        return (rows > 0).astype(float)
    return np.bincount(keys, weights=st.probed.astype(float), minlength=G) / np.maximum(rows, 1)


def study_draft(
    st: StepTable, policy: Policy, ta: TraceArrays, cm: CostModel, c: int, mc: np.ndarray, verify: np.ndarray
) -> np.ndarray:
    """The study's drafting charge per request step (replicate: one request's c copies per step), as the mean
    over the copies of each copy's own drafting time (its latency carries its own, not the batch's maximum):
    n-gram = fraction * verify for a copy that drafts (0 where L = 1), combine charged as n-gram at every
    step; EAGLE (linear) = kv * kv + num_spec * L + const with L = k + 1 (the bonus included), charged at
    every step, with kv the running count of the study's per-request loop: copy j sees what copies 0..j-1
    produced (or freed, when they finished) in this step, a mean of delta * (c - 1) / 2."""
    charge = [policy.charge_as or m for m in policy.methods]
    out = np.zeros(len(st.req))
    kv_req = ta.prompt_len[st.req] + st.pos  # one request's KV before the step (prompt + produced)
    for j, name in enumerate(charge):
        cost = cm.draft_for(name)
        sel = st.meth == j
        if cost.form == "verify_fraction":
            share = 1.0 if policy.charge_as else np.where(st.k[sel] > 0, mc[sel], 0) / c
            out[sel] = cost.fraction * verify[sel] * share
        elif cost.form == "linear":
            prod = np.minimum(st.acc[sel], st.k[sel] + 1)
            done = st.pos[sel] + prod >= ta.out_len[st.req[sel]]
            delta = np.where(done, -kv_req[sel], prod)
            kv = c * kv_req[sel] + delta * (c - 1) / 2
            out[sel] = cost.kv * kv + cost.num_spec * (st.k[sel] + 1) + cost.const
        elif cost.form == "forwards":
            raise ConfigError(
                f"cost model {cm.name!r}: drafting form 'forwards' ({name}) has no study-rules charge; "
                "simulate without the study's rules"
            )
        else:  # chained: the study has no such form; its per-step charge for the copies
            out[sel] = (
                st.k[sel] * (cost.kv * c * kv_req[sel] + cost.const) + cost.num_spec * st.k[sel] * mc[sel]
            )
    if policy.probes:  # every copy runs the probes' lookups, the chosen one's included (charged in full)
        same = np.isin(st.meth, [j for j, ch in enumerate(charge) if ch in policy.probes])
        f = sum(cm.draft_for(name).fraction for name in policy.probes) * verify
        if st.probed is not None:  # a gated policy pays for the rows it probed (a drafting lookup ran)
            f = np.where(st.probed | same, f, 0.0)
        out = np.where(same, f, out + f)
    return out
