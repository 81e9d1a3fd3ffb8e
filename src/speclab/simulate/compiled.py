"""The shipped online policy's coupled loop, compiled (numba), where the rule needs nothing the compiled
restatement lacks; elsewhere, or without numba, coupled.run_steps_coupled runs the numpy implementation.

Covered: `adaptive` and `adaptive-gated` whose probes cost less than GATE_MIN_COST of the verify (so the
gate never skips a probe: every cost model shipped for a GPU), under the linear target form, in static
or continuous batching (the coupled loop's modes). The compiled loop (rule_kernel.coupled_loop) returns the
same step table as the numpy loop and leaves the policy's estimates (s, f, cal, pending) as it would;
tests/test_compiled_policy.py runs both and compares them.
"""

from __future__ import annotations

import os

import numpy as np

from speclab.costmodel.forms import TargetCost
from speclab.policy.adaptive import COPY_PRIOR
from speclab.policy.core import Policy, PolicyContext
from speclab.policy.goodput import PASS_GRID
from speclab.policy.pooling import HINDSIGHT, RATE_WINDOW
from speclab.policy.rules import AdaptiveGated, AdaptiveRule
from speclab.simulate import rule_kernel
from speclab.simulate.fast import StepTable, TraceArrays, check_probes, repeat_requests

# False: always the numpy loop (the tests compare the two; SPECLAB_COMPILED=0 in the environment: a run
# that should not compile, e.g. once after an install where ~20 s of compiling would outweigh the run)
ENABLED = os.environ.get("SPECLAB_COMPILED", "1") != "0"
FORMS = {"verify_fraction": rule_kernel.VERIFY_FRACTION, "chained": rule_kernel.CHAINED,
         "forwards": rule_kernel.FORWARDS, "linear": rule_kernel.LINEAR}  # fmt: skip
_OWN = ("decide", "observe", "gate", "gate_done", "survival", "calibrated", "predict", "learn")


def available() -> bool:
    """Whether numba imports, so the kernel is compiled (it is an optional dependency)."""
    return rule_kernel.numba is not None


def covers(policy: Policy) -> bool:
    """Whether the compiled loop restates `policy` exactly (after policy.begin: its cost model is bound)."""
    if not (ENABLED and available() and type(policy) in (AdaptiveRule, AdaptiveGated)):
        return False
    if any(name in vars(policy) for name in _OWN) or not policy.methods or policy.heuristic_ok:
        return False  # a patched instance (the tests spy on decide)
    cm = policy.cm
    return (
        not policy.gating
        and type(cm.target) is TargetCost
        and all(cm.draft_for(m).form in FORMS for m in policy.methods)
    )


def run_steps_compiled(
    ta: TraceArrays, policy: Policy, batching: str, batch_size: int, study: bool, passes: int
) -> tuple[TraceArrays, StepTable] | None:
    """run_steps_coupled's result from the compiled loop, or None where it does not cover the policy."""
    check_probes(policy)
    n = ta.n
    N = n * passes
    policy.begin(PolicyContext(num_requests=N, batch_size=batch_size, k_max=dict(ta.k_max)))
    if not covers(policy):
        return None
    p: AdaptiveRule = policy  # type: ignore[assignment]
    tx, _ = repeat_requests(ta, None, passes)
    cm, ms = p.cm, p.methods
    acc = np.stack([ta.acc[m] for m in ms]).astype(np.int64)
    npr = np.stack([np.zeros_like(ta.acc[m]) if ta.nprop[m] is None else ta.nprop[m] for m in ms])
    has_npr = np.array([ta.nprop[m] is not None for m in ms])
    # per method and flat position, how many positions before it matched a first draft, are known, offered
    flags = np.stack([acc >= 2, acc >= 1, npr > 0], axis=1)
    ctype = np.int32 if acc.shape[1] < 2**31 else np.int64
    counts = np.zeros(flags.shape[:2] + (acc.shape[1] + 1,), ctype)
    np.cumsum(flags, axis=2, dtype=ctype, out=counts[:, :, 1:])
    is_probe = np.array([m in p.probes for m in ms])
    drafts = [cm.draft_for(m) for m in ms]
    form = np.array([FORMS[d.form] for d in drafts], np.int64)
    dpar = np.array([[d.kv, d.num_spec, d.const, d.fraction, d.batched] for d in drafts], np.float64)
    tc = cm.target
    frac = sum(cm.draft_for(m).fraction for m in p.probes)  # as goodput.batch_choice sums it
    cpar = np.array([tc.kv, tc.batched, tc.const, cm.overhead_per_step, cm.overhead_per_request,
                     cm.overhead_per_spec_token, frac], np.float64)  # fmt: skip
    # the lookups' priors: the pool stays empty (pool_counts only under POOL_PRIORS), as free_survival reads it
    h, t, cs, ck = 0.0, 0.0, 0.0, 0.0
    prior = np.array([(h + 0.25) / (t + 4.0), (cs + COPY_PRIOR) / (ck + COPY_PRIOR + 1.0)])
    # the lookups' survival rows by (run, hits, tries), filled as met (rule_kernel.lookup_survival)
    rows = np.full((len(ms), HINDSIGHT + 1 + (RATE_WINDOW + 1) ** 2, max(p.kmax)), -1.0)
    # each request's last model-based rate (nan: none yet) and its survival row
    last, last_rows = np.full((len(ms), N), np.nan), np.zeros((len(ms), N, max(p.kmax)))
    state = (p.s, p.f, p.cal, p.pending, rows, last, last_rows)
    cols, rows, n_steps = rule_kernel.coupled_loop(
        ta.prompt_len, ta.out_len, ta.off, N, batch_size, batching == "continuous", 1 if study else 0,
        max(int(ta.out_len.sum()) * passes, 1), acc, npr, has_npr, counts, np.asarray(p.kmax, np.int64),
        is_probe, form, dpar, cpar, np.asarray(PASS_GRID, np.int64), prior, p.CALIBRATES, state,
    )  # fmt: skip
    c = cols[:, :rows]
    st = StepTable(
        req=c[0].copy(), t=c[1].copy(), pos=c[2].copy(), meth=c[3].copy(), k=c[4].copy(), acc=c[5].copy(),
        produced=c[6].copy(), switched=c[7].astype(bool), cand=np.zeros(rows, bool), n_steps=n_steps,
        probed=np.ones(rows, bool),
    )  # fmt: skip
    return tx, st
