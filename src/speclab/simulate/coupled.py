"""Step tables for policies that read the live batch (Policy.uses_occupancy).

fast.run_steps computes each request's steps on its own, which is exact only while a request's decisions do
not depend on its batch mates. A policy that reads StepView.occupancy / batch_kv does depend on them in
static and continuous batching (B > 1): who else is running, and how much KV they hold, changes with every
admission and finish. Here the requests run together, one engine step at a time (vectorised across the
running requests, never a loop over requests), admitted exactly as costs.schedule admits them, so that
costs.step_costs can time the resulting table unchanged and the reference loop (which is coupled by
construction) gives the same figures.
"""

from __future__ import annotations

import numpy as np

from speclab.policy.core import Policy, PolicyContext, StepOutcome
from speclab.simulate.fast import (
    StepTable,
    TraceArrays,
    check_probes,
    decide_step,
    heuristic_flags,
    make_view,
    probed_flags,
    repeat_requests,
)


def run_steps_coupled(
    ta: TraceArrays,
    policy: Policy,
    batching: str,
    batch_size: int,
    heuristic: bool,
    study: bool = False,
    passes: int = 1,
) -> tuple[TraceArrays, StepTable]:
    """All requests (continuous: the list admitted `passes` times, instance q running request q mod n) through
    `batch_size` slots. Returns the (repeated) trace arrays and the step table, rows keyed by instance.
    The shipped rule runs compiled where numba is installed (compiled.py: the same table)."""
    from speclab.simulate.compiled import run_steps_compiled

    out = run_steps_compiled(ta, policy, batching, batch_size, study, passes)
    if out is not None:
        return out
    check_probes(policy)
    n = ta.n
    N = n * passes
    tx, _ = repeat_requests(ta, None, passes)
    policy.begin(PolicyContext(num_requests=N, batch_size=batch_size, k_max=dict(ta.k_max)))
    extra = 1 if study else 0
    pos = np.ones(N, dtype=np.int64)
    n_steps = np.zeros(N, dtype=np.int64)
    prev = np.full(N, -2, dtype=np.int64)
    stack = np.stack([ta.acc[m] for m in policy.methods]) if policy.methods else None
    cols: dict[str, list[np.ndarray]] = {
        c: [] for c in ("req", "t", "pos", "meth", "k", "acc", "prod", "sw", "cand", "probed")
    }
    running = np.zeros(0, dtype=np.int64)
    nxt = 0
    while True:
        if batching == "continuous":
            take = min(batch_size - len(running), N - nxt)
        else:  # static: the next batch once the previous one is done
            take = min(batch_size, N - nxt) if len(running) == 0 else 0
        new = np.arange(nxt, nxt + take, dtype=np.int64)
        nxt += take
        if len(running) == 0 and len(new) == 0:
            break
        if len(running):
            i = running % n
            p = pos[running]
            m_occ = np.full(len(running), len(running) + len(new), dtype=np.int64)
            kv = np.full(len(running), int((ta.prompt_len[i] + p - 1 + extra).sum()), dtype=np.int64)
            view, fi = make_view(ta, policy, running, i, p, n_steps[running], m_occ, kv)
            view.one_batch = True
            meth, k, a, prod_raw, prod = decide_step(ta, policy, view, fi, stack, i, p)
            pv = prev[running]
            for c, v in (("req", running), ("t", n_steps[running]), ("pos", p), ("meth", meth), ("k", k),
                         ("acc", a), ("prod", prod), ("sw", (pv != -2) & (pv != meth)),
                         ("cand", heuristic_flags(policy, ta, meth, k, a, heuristic)),
                         ("probed", probed_flags(view))):  # fmt: skip
                cols[c].append(v)
            policy.observe(StepOutcome(req=running, method=meth, k=k, accepted=prod_raw - 1))
            prev[running] = meth
            pos[running] = p + prod
            n_steps[running] += 1
            running = running[pos[running] < ta.out_len[i]]
        # requests prefilled in this step run from the next one (a one-token output ends at its prefill)
        running = np.concatenate([running, new[ta.out_len[new % n] > 1]])

    def cat(c: str, dtype=np.int64) -> np.ndarray:
        return np.concatenate(cols[c]).astype(dtype) if cols[c] else np.zeros(0, dtype=dtype)

    st = StepTable(
        req=cat("req"), t=cat("t"), pos=cat("pos"), meth=cat("meth"), k=cat("k"), acc=cat("acc"),
        produced=cat("prod"), switched=cat("sw", bool), cand=cat("cand", bool), n_steps=n_steps,
        probed=cat("probed", bool),
    )  # fmt: skip
    return tx, st
