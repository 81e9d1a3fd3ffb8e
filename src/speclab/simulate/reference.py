"""The reference simulator: a plain per-step Python loop over engine steps and running requests, applying
the same rules as the vectorised simulator (fast.py) one step at a time, the way the study's simulator does.
It exists to check the fast simulator (tests assert both agree) and as the benchmark's baseline. Slow."""

from __future__ import annotations

from collections import deque

import numpy as np

from speclab.costmodel.model import CostModel
from speclab.errors import ConfigError
from speclab.policy.core import Policy, PolicyContext, StepOutcome, StepView
from speclab.simulate.costs import Timing, forwards_charge
from speclab.simulate.fast import TraceArrays, check_decision, check_probed, heuristic_flags, probed_flags


class _Req:
    __slots__ = ("q", "i", "pos", "steps", "prev", "start_time", "pre_cost", "in_win")

    def __init__(self, q: int, n: int) -> None:
        self.q = q  # instance (admission order; continuous steady state re-admits requests)
        self.i = q % n  # the request (trace) it runs
        self.pos = 1  # position 0 is produced by prefill
        self.steps = 0
        self.prev = -2
        self.start_time = 0.0
        self.pre_cost = 0.0  # what its prefill added to its step (costs.prefill_charges)
        self.in_win = 0  # its tokens produced in the steady window


def reference_timing(  # long: mirrors costs.step_costs line by line; split, the match is harder to check
    ta: TraceArrays,
    policy: Policy,
    cm: CostModel,
    batching: str,
    batch_size: int,
    draws: np.ndarray | None,
    switch_overhead: float,
    heuristic: bool,
    draft_kv: str = "batch",
    study: bool = False,
    gen: np.random.RandomState | None = None,
    match_p: np.ndarray | None = None,
    passes: int = 1,
) -> Timing:
    """study: the study's step rules (replicate only): one more KV token per request, drafting charged per
    copy and averaged (the study's per-request latency), n-gram misses drawn from `gen` one copy at a time
    where the heuristic applies (with match_p per request) instead of from `draws`. passes (continuous only):
    admit the request list that many times over, each admission a new request (its own policy state)."""
    extra = 1 if study else 0
    policy.begin(PolicyContext(num_requests=ta.n * passes, batch_size=batch_size, k_max=dict(ta.k_max)))
    copies = batch_size if batching == "replicate" else 1
    latency = np.zeros(ta.n)
    batch_of = np.zeros(ta.n, dtype=np.int64)
    acc = {m: ta.acc[m].tolist() for m in policy.methods}
    nprop = {m: (None if ta.nprop[m] is None else ta.nprop[m]) for m in policy.methods}
    prompt = ta.prompt_len.tolist()
    smp = [False] * ta.n if ta.sampled is None or not cm.samples_cost else ta.sampled.tolist()
    drafter = bool(policy.methods)  # an engine with a drafter (its sampled requests cost more)
    out_len = ta.out_len.tolist()
    off = ta.off.tolist()
    tot = {
        "verify": 0.0,
        "propose": 0.0,
        "overhead": 0.0,
        "steps": 0,
        "produced": 0,
        "rsteps": 0,
        "rej": 0,
        "full_s": 0.0,
        "full_tok": 0,
        "busy_s": 0.0,
    }

    admitted: list[_Req] = []  # every request prefilled (the steady state's prefill charges)

    def run(
        order: list[int], slots: int
    ) -> float:  # long: one engine step per iteration, as written in costs.py (the loop the study describes)
        """Run requests through `slots` slots (admitting in order as slots free); returns the makespan."""
        waiting = deque(order)
        running: list[_Req] = []
        now = 0.0
        busy = min(slots, len(order))
        while waiting or running:
            new: list[_Req] = []
            while waiting and len(running) + len(new) < slots:
                new.append(_Req(waiting.popleft(), ta.n))
            full = len(running) + len(new) >= busy
            # decisions for the running requests (not the ones being prefilled in this step)
            ridx = np.array([r.i for r in running], dtype=np.int64)
            qidx = np.array([r.q for r in running], dtype=np.int64)
            pos = np.array([r.pos for r in running], dtype=np.int64)
            fi = ta.off[ridx] + pos if len(running) else np.zeros(0, dtype=np.int64)
            nrun = len(running)
            live = policy.uses_occupancy
            view = StepView(
                qidx,
                pos,
                np.array([r.steps for r in running], dtype=np.int64),
                {m: (None if nprop[m] is None else nprop[m][fi]) for m in policy.methods},
                {m: ta.acc[m][fi] for m in policy.methods} if policy.oracle else None,
                np.full(nrun, copies * (nrun + len(new)), dtype=np.int64) if live else None,
                np.full(nrun, copies * sum(prompt[r.i] + r.pos - 1 + extra for r in running), dtype=np.int64)
                if live
                else None,
                {m: (ta.acc[m], fi, ta.nprop[m]) for m in policy.probes},
            )
            view.one_batch = batching != "replicate"  # replicate: each request an engine of its own
            meth, k = policy.decide(view)
            meth = np.asarray(meth, dtype=np.int64)
            k = np.asarray(k, dtype=np.int64)
            check_decision(policy, ta, meth, k, len(running))
            check_probed(policy, view, meth, k)
            probed = probed_flags(view)  # rows whose probes ran (a gated policy's choice)
            a_arr = np.array(
                [
                    acc[policy.methods[m]][off[r.i] + r.pos] if m >= 0 else 1
                    for r, m in zip(running, meth.tolist(), strict=True)
                ],
                dtype=np.int64,
            )
            cand = heuristic_flags(policy, ta, meth, k, a_arr, heuristic).tolist()
            kv = 0
            vtok = 0
            spec_tok = 0  # draft tokens verified in this step
            s_spec = 0  # of them, those of sampled requests (temperature > 0)
            switched = False
            per_method: dict[str, list[tuple[int, int, int]]] = {}  # method -> [(spec, spec*copies, own kv)]
            prod_raw_l = []
            matched_l: list[int] = []
            step_tok = copies * len(new)  # each prefill produces the first token
            for j, r in enumerate(running):
                m, kk, a = int(meth[j]), int(k[j]), int(a_arr[j])
                kv += copies * (prompt[r.i] + r.pos - 1 + extra)
                matched = copies
                if cand[j] and gen is not None and match_p is not None:
                    matched = int((gen.random_sample(copies) < match_p[r.i]).sum())  # copies in order
                elif cand[j] and draws is not None:
                    matched = int(draws[off[r.i] + r.pos])  # copies whose n-gram lookup found a match
                vtok += (copies - matched) + matched * (kk + 1)
                spec_tok += matched * kk
                s_spec += matched * kk if smp[r.i] else 0
                matched_l.append(matched)
                if m >= 0:
                    name = policy.charge_as or policy.methods[m]
                    per_method.setdefault(name, []).append(
                        (kk if matched > 0 else 0, kk * matched, prompt[r.i] + r.pos - 1)
                    )
                if r.prev != -2 and r.prev != m:
                    switched = True
                prod_raw = min(a, kk + 1)
                prod_raw_l.append(prod_raw)
                prod = min(prod_raw, out_len[r.i] - r.pos)
                tot["produced"] += copies * prod
                step_tok += copies * prod
                tot["rej"] += (copies - matched) + matched * (kk + 1) - copies * prod
                tot["rsteps"] += copies
            for r in new:
                vtok += copies * prompt[r.i]
            nreq = copies * (len(running) + len(new))
            s_run = copies * sum(smp[r.i] for r in running)  # sampled requests, for the overhead
            s_req = s_run + copies * sum(smp[r.i] for r in new)
            verify = cm.target_time(kv, vtok, nreq + spec_tok)
            # the forward without this step's prefills: a lookup's charge and the steady state's prefill
            # charges (costs.step_costs)
            pre = copies * sum(prompt[r.i] for r in new)
            nrun = copies * len(running)
            verify_dec = float(cm.target_time(kv, vtok - pre, nrun + spec_tok)) if nrun else 0.0
            lookup_base = verify_dec if new else verify
            draft = 0.0
            if study:
                draft = sum(
                    _study_copy_drafts(policy, cm, int(meth[j]), int(k[j]), int(a_arr[j]), matched_l[j], copies,
                                       prompt[r.i] + r.pos, out_len[r.i] - r.pos, verify, bool(probed[j]))
                    for j, r in enumerate(running)
                )  # fmt: skip
                per_method = {}
            if running and not study:  # probes run at every step of every running request
                for name in policy.probes:
                    per_method.setdefault(name, []).append((0, 0, 0))
            if not study:
                for name in {policy.charge_as or m for m in policy.methods}:
                    form = cm.draft_for(name).form
                    # a model drafter the engine runs at k = 0 too (one pass), and a "forwards" drafter in a
                    # step of prefills only
                    always = running and policy.drafter_always_runs and form != "verify_fraction"
                    if always or (new and form == "forwards"):
                        per_method.setdefault(name, [])
            for name in sorted(per_method):
                cost = cm.draft_for(name)
                items = per_method[name]
                mx = max((it[0] for it in items), default=0)
                always = bool(running) and policy.drafter_always_runs and cost.form != "verify_fraction"
                passes = max(mx, 1) if always else mx
                if cost.form == "forwards":
                    draft += float(
                        forwards_charge(cost, np.array(passes), np.array(bool(new)), policy, kv, vtok, nreq)
                    )
                elif cost.form == "verify_fraction" and name in policy.probes:
                    # a lookup's cost is per request: the share of running requests it probed
                    draft += cost.fraction * lookup_base * float(probed.mean()) if running else 0.0
                elif cost.form == "verify_fraction":
                    draft += cost.fraction * lookup_base if mx > 0 else 0.0
                elif cost.form == "linear":
                    # per request kv*kv_tokens + num_spec*spec + const; the step pays the max over requests
                    # (only the constant where the always-run forward is the step's only drafting)
                    draft += max(
                        (cost.kv * (kv if draft_kv == "batch" else own) + cost.num_spec * s + cost.const
                         for s, _, own in items),
                        default=cost.const + (cost.kv * kv if draft_kv == "batch" else 0.0),
                    )  # fmt: skip
                else:
                    draft += sum(cost.kv * kv + cost.const for _ in range(passes)) + cost.num_spec * sum(
                        it[1] for it in items
                    )
            overhead = float(cm.overhead_time(nreq, spec_tok, s_req, s_spec, drafter))
            overhead += switch_overhead if switched and switch_overhead else 0.0
            dt = verify + draft + overhead
            tot["verify"] += verify
            tot["propose"] += draft
            tot["overhead"] += overhead
            tot["steps"] += 1
            # the steady state charges each prefill over its request's tokens (costs.prefill_charges)
            pcost = 0.0
            if new:
                dec_o = float(cm.overhead_time(nrun, spec_tok, s_run, s_spec, drafter)) if nrun else 0.0
                dec = verify_dec + dec_o
                pcost = verify + float(cm.overhead_time(nreq, spec_tok, s_req, s_spec, drafter)) - dec
                for r in new:
                    r.pre_cost = pcost * (copies * prompt[r.i] / pre if pre > 0 else 1.0 / len(new))
                    admitted.append(r)
            if full:
                tot["full_s"] += dt - pcost
                tot["busy_s"] += dt
                tot["full_tok"] += step_tok
                for j, r in enumerate(running):
                    r.in_win += copies * min(prod_raw_l[j], out_len[r.i] - r.pos)
                for r in new:
                    r.in_win += copies
            start = now
            now += dt
            if len(running):
                policy.observe(StepOutcome(req=qidx, method=meth, k=k, accepted=np.array(prod_raw_l) - 1))
            still: list[_Req] = []
            for j, r in enumerate(running):
                r.pos += min(prod_raw_l[j], out_len[r.i] - r.pos)
                r.steps += 1
                r.prev = int(meth[j])
                if r.pos >= out_len[r.i]:
                    if r.q < ta.n:
                        latency[r.i] = now - r.start_time
                else:
                    still.append(r)
            running = still
            for r in new:
                r.start_time = start
                if out_len[r.i] <= 1:  # prefill produced its only token
                    if r.q < ta.n:
                        latency[r.i] = now - start
                else:
                    running.append(r)
        return now

    total = 0.0
    if batching == "replicate":
        for i in range(ta.n):
            batch_of[i] = i
            total += run([i], 1)
    elif batching == "static":
        for b, s in enumerate(range(0, ta.n, batch_size)):
            chunk = list(range(s, min(s + batch_size, ta.n)))
            batch_of[chunk] = b
            total += run(chunk, len(chunk))
    else:
        total = run(list(range(ta.n * passes)), batch_size)
        tot["full_s"] += sum(r.pre_cost * r.in_win / (copies * out_len[r.i]) for r in admitted)
    return Timing(
        latency=latency,
        batch=batch_of,
        tokens=copies * ta.out_len,
        verify_s=tot["verify"],
        propose_s=tot["propose"],
        overhead_s=tot["overhead"],
        total_s=total,
        steps=tot["steps"],
        produced=tot["produced"],
        request_steps=tot["rsteps"],
        rejected=tot["rej"],
        full_s=tot["full_s"] if batching == "continuous" else 0.0,
        full_tokens=tot["full_tok"] if batching == "continuous" else 0,
        busy_s=tot["busy_s"] if batching == "continuous" else 0.0,
    )


def _study_copy_drafts(
    policy: Policy, cm: CostModel, m: int, k: int, a: int, matched: int, copies: int, kv_req: int, left: int,
    verify: float, probed: bool = True,
) -> float:  # fmt: skip
    """The study's drafting charge for one request's copies, copy by copy as its per-request loop does, then
    the mean over copies (each copy's latency carries its own drafting). kv_req: one copy's KV before the
    step; left: tokens it still has to produce. Copies 0..matched-1 are the ones whose lookup matched (only
    their count matters)."""
    name = None if m < 0 else policy.charge_as or policy.methods[m]
    ran = probed or name in policy.probes  # a gated policy pays for the rows it probed (or drafted from)
    probe = sum(cm.draft_for(p).fraction * verify for p in policy.probes if p != name) if ran else 0.0
    if m < 0:
        return probe
    if name in policy.probes:  # every copy ran the lookup: charged in full
        return cm.draft_for(name).fraction * verify + probe
    return probe + _copy_drafts(policy, cm, m, k, a, matched, copies, kv_req, left, verify)


def _copy_drafts(
    policy: Policy, cm: CostModel, m: int, k: int, a: int, matched: int, copies: int, kv_req: int, left: int,
    verify: float,
) -> float:  # fmt: skip
    cost = cm.draft_for(policy.charge_as or policy.methods[m])
    if cost.form == "forwards":
        raise ConfigError(f"cost model {cm.name!r}: drafting form 'forwards' has no study-rules charge")
    total = 0.0
    running_kv = copies * kv_req
    prod = min(a, k + 1)
    for j in range(copies):
        if cost.form == "verify_fraction":
            drafts = policy.charge_as is not None or (k > 0 and j < matched)
            total += cost.fraction * verify if drafts else 0.0
        elif cost.form == "linear":
            total += cost.kv * running_kv + cost.num_spec * (k + 1) + cost.const
        else:
            total += k * (cost.kv * copies * kv_req + cost.const) + cost.num_spec * k * matched
        # this copy's update of the loop's running KV count: produce, or free everything when it finishes
        running_kv += -kv_req if prod >= left else prod
    return total / copies
