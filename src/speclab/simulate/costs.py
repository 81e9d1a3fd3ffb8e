"""Timing of a simulated run: the engine-step schedule of every request (replicate, static or continuous
batching) and the cost of every engine step under the cost model, summed per global step with bincount
(kv tokens, verified tokens, drafting terms, overheads). Request latencies are differences of the cumulative
step-time sum. The step tables it times come from fast.py (or coupled.py); reference.py restates the same
rules one step at a time (the tests compare the two)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np

from speclab.costmodel.model import CostModel
from speclab.errors import ConfigError
from speclab.policy.core import Policy
from speclab.simulate.fast import BATCHING_MODES, StepTable, TraceArrays


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
        draft = _draft_charges(st, policy, ta, cm, keys, G, sch.start, spec_max, spec_sum, lookup_base, kv, vt,
                               nreq, draft_kv)  # fmt: skip
    # sampled requests (temperature > 0) in each step, and the draft tokens they verify: running ones
    # (s_run, s_spec) and with the step's prefills (s_req); what the sampled overhead terms charge
    s_run = s_req = s_spec = np.zeros(G)
    drafter = bool(policy.methods)  # an engine with a drafter (its sampled requests cost more)
    if ta.sampled is not None and cm.samples_cost:
        sf = ta.sampled.astype(np.float64)
        s_run = c * np.bincount(keys, weights=sf[st.req], minlength=G)
        s_req = s_run + c * np.bincount(sch.start, weights=sf, minlength=G)
        s_spec = np.bincount(keys, weights=spec_sum * sf[st.req], minlength=G)
    base_overhead = np.asarray(
        cm.overhead_time(nreq, spec, s_req, s_spec, drafter), dtype=np.float64
    ) * np.ones(G)
    overhead = base_overhead.copy()
    if switch_overhead and st.switched.any():
        overhead += switch_overhead * (np.bincount(keys[st.switched], minlength=G) > 0)
    step_t = verify + draft + overhead
    cum = np.cumsum(step_t)
    end = sch.start + st.n_steps
    latency = cum[end] - cum[sch.start] + step_t[sch.start]
    full_s, full_tokens, busy_s = 0.0, 0, 0.0
    if batching == "continuous":
        full_s, full_tokens, busy_s = _steady_window(
            st, ta, cm, sch, keys, end, batch_size, c, step_t, npre, nrun, spec, verify, verify_dec,
            base_overhead, pre_tok, (s_run, s_spec, drafter),
        )  # fmt: skip
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


def _draft_charges(
    st: StepTable,
    policy: Policy,
    ta: TraceArrays,
    cm: CostModel,
    keys: np.ndarray,
    G: int,
    start: np.ndarray,
    spec_max: np.ndarray,
    spec_sum: np.ndarray,
    lookup_base: np.ndarray,
    kv: np.ndarray,
    vt: np.ndarray,
    nreq: np.ndarray,
    draft_kv: str,
) -> np.ndarray:
    """Drafting time per global step under speclab's rules: each method charged as its cost form says
    (lookups as a fraction of the decode forward, per probed request for probes; a drafter's passes shared
    by the step's requests). `keys`: each step-table row's global step; `start`: each request's prefill step."""
    draft = np.zeros(G)
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
            draft += forwards_charge(cost, passes, np.bincount(start, minlength=G) > 0, policy, kv, vt, nreq)
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
    return draft


def _steady_window(
    st: StepTable,
    ta: TraceArrays,
    cm: CostModel,
    sch: Schedule,
    keys: np.ndarray,
    end: np.ndarray,
    batch_size: int,
    c: int,
    step_t: np.ndarray,
    npre: np.ndarray,
    nrun: np.ndarray,
    spec: np.ndarray,
    verify: np.ndarray,
    verify_dec: np.ndarray,
    base_overhead: np.ndarray,
    pre_tok: np.ndarray,
    sampled_run: tuple[np.ndarray, np.ndarray, bool] | None = None,
) -> tuple[float, int, float]:
    """Continuous batching's steady state: the simulated time (each prefill charged over its request's
    tokens), the tokens produced and the plain time of the steps where every slot is busy."""
    G = len(step_t)
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
    pcost = prefill_charges(cm, npre, nrun, spec, verify, verify_dec, base_overhead, sampled_run)
    # each request's share of its prefill step's charge: by prompt tokens (evenly where they are 0)
    own = pre_tok[sch.start]
    share = np.where(own > 0, c * ta.prompt_len / np.maximum(own, 1), 1.0 / npre[sch.start])
    per_req = pcost[sch.start] * share
    in_win = np.bincount(st.req, weights=st.produced * full[keys], minlength=ta.n) + full[sch.start]
    full_s = float((step_t - pcost)[full].sum() + (per_req * in_win / ta.out_len).sum())
    return full_s, full_tokens, busy_s


def prefill_charges(
    cm: CostModel,
    npre: np.ndarray,
    nrun: np.ndarray,
    spec: np.ndarray,
    verify: np.ndarray,
    verify_dec: np.ndarray,
    overhead: np.ndarray,
    sampled_run: tuple[np.ndarray, np.ndarray, bool] | None = None,
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
    exactly their share: 0.985x with 4 passes. verify_dec: each step's target forward without its prefills;
    sampled_run: the running sampled requests and their draft tokens per step, and whether the engine runs
    a drafter (no sampled request where None)."""
    s_run, s_spec, drafter = sampled_run if sampled_run is not None else (0, 0, False)
    dec = np.asarray(cm.overhead_time(nrun, spec, s_run, s_spec, drafter))
    dec_o = np.where(nrun > 0, dec * np.ones(len(npre)), 0.0)
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
