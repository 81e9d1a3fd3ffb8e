"""The shipped online policy's coupled loop, compiled (numba), where the rule needs nothing the compiled
restatement lacks; elsewhere, or without numba, coupled.run_steps_coupled runs the numpy implementation.

Covered: `adaptive` and `adaptive-gated` (its gate too, where its probes are dear enough to gate: gate_kernel)
under the linear target form, in static or continuous batching (the coupled loop's modes). The compiled
loop (coupled_loop below) returns the same step table as the numpy loop and leaves the policy's estimates
and gate state as it would; tests/test_compiled_policy.py runs both and compares them.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from speclab.costmodel.forms import TargetCost
from speclab.policy.adaptive import COPY_PRIOR
from speclab.policy.core import Policy, PolicyContext
from speclab.policy.goodput import PASS_GRID
from speclab.policy.pooling import HINDSIGHT, RATE_WINDOW
from speclab.policy.rules import AdaptiveGated, AdaptiveRule
from speclab.simulate import gate_kernel, rule_kernel
from speclab.simulate.fast import StepTable, TraceArrays, check_probes, repeat_requests
from speclab.simulate.gate_kernel import decide_observe_gated
from speclab.simulate.rule_kernel import STAMP, decide_observe, jit

# False: always the numpy loop (the tests compare the two; SPECLAB_COMPILED=0 in the environment: a run
# that should not compile, e.g. once after an install where ~30 s of compiling would outweigh the run)
ENABLED = os.environ.get("SPECLAB_COMPILED", "1") != "0"
FORMS = {"verify_fraction": rule_kernel.VERIFY_FRACTION, "chained": rule_kernel.CHAINED,
         "forwards": rule_kernel.FORWARDS, "linear": rule_kernel.LINEAR}  # fmt: skip
_OWN = ("decide", "observe", "gate", "gate_done", "survival", "calibrated", "predict", "learn")


def available() -> bool:
    """Whether numba imports, so the kernels are compiled (it is an optional dependency), and their
    compiled code is of the current source and constants (rule_kernel.STAMP; stale cached code is compiled
    afresh, once per process that finds it so)."""
    global _CURRENT
    if rule_kernel.numba is None:
        return False
    if _CURRENT is None:
        if _stale():
            _recompile()
        _CURRENT = not _stale()
    return _CURRENT


_CURRENT: bool | None = None


def _modules() -> tuple:
    return (rule_kernel, gate_kernel, sys.modules[__name__])


def _stale() -> bool:
    return any(m.frozen_stamp() != rule_kernel.STAMP for m in _modules())


def _recompile() -> None:
    """Every kernel function's cache dropped and compiled again at its next call."""
    seen = set()
    for m in _modules():
        for f in vars(m).values():
            if isinstance(f, rule_kernel.numba.core.dispatcher.Dispatcher) and id(f) not in seen:
                seen.add(id(f))
                f.recompile()


def covers(policy: Policy) -> bool:
    """Whether the compiled loop restates `policy` exactly (after policy.begin: its cost model is bound)."""
    if not (ENABLED and available() and type(policy) in (AdaptiveRule, AdaptiveGated)):
        return False
    if any(name in vars(policy) for name in _OWN) or not policy.methods or policy.heuristic_ok:
        return False  # a patched instance (the tests spy on decide)
    cm = policy.cm
    return type(cm.target) is TargetCost and all(cm.draft_for(m).form in FORMS for m in policy.methods)


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
    hits, tries, cont, risk = 0.0, 0.0, 0.0, 0.0
    prior = np.array([(hits + 0.25) / (tries + 4.0), (cont + COPY_PRIOR) / (risk + COPY_PRIOR + 1.0)])
    # the lookups' survival rows by (run, hits, tries), filled as met (rule_kernel.lookup_survival)
    rows = np.full((len(ms), HINDSIGHT + 1 + (RATE_WINDOW + 1) ** 2, max(p.kmax)), -1.0)
    # each request's last model-based rate (nan: none yet) and its survival row
    last, last_rows = np.full((len(ms), N), np.nan), np.zeros((len(ms), N, max(p.kmax)))
    state = (p.s, p.f, p.cal, p.pending, rows, last, last_rows)
    gst = (p.ring_q, p.ring_f, p.prev_pos, p.prev_probed, p.last_probe, p.dormant)  # the gate's own state
    cols, used, n_steps = coupled_loop(
        ta.prompt_len, ta.out_len, ta.off, N, batch_size, batching == "continuous", 1 if study else 0,
        max(int(ta.out_len.sum()) * passes, 1), acc, npr, has_npr, counts, np.asarray(p.kmax, np.int64),
        is_probe, form, dpar, cpar, np.asarray(PASS_GRID, np.int64), prior, p.CALIBRATES, state, p.gating,
        gst,
    )  # fmt: skip
    c = cols[:, :used]
    st = StepTable(
        req=c[0].copy(), t=c[1].copy(), pos=c[2].copy(), meth=c[3].copy(), k=c[4].copy(), acc=c[5].copy(),
        produced=c[6].copy(), switched=c[7].astype(bool), cand=np.zeros(used, bool), n_steps=n_steps,
        probed=c[8].astype(bool),
    )  # fmt: skip
    return tx, st


@jit
def frozen_stamp() -> int:
    """rule_kernel.STAMP as this module's compiled code holds it."""
    return STAMP


@jit
def coupled_loop(
    prompt_len: np.ndarray, out_len: np.ndarray, off: np.ndarray, n_inst: int, batch_size: int,
    continuous: bool, extra: int, cap: int, acc: np.ndarray, npr: np.ndarray, has_npr: np.ndarray,
    counts: np.ndarray, kmax: np.ndarray, is_probe: np.ndarray, form: np.ndarray, dpar: np.ndarray,
    cpar: np.ndarray, grid: np.ndarray, prior: np.ndarray, calibrates: bool, state: tuple, gated: bool,
    gst: tuple,
) -> tuple:  # fmt: skip
    """coupled.run_steps_coupled's loop: instance q runs request q mod n; admission as costs.schedule
    admits. Returns (columns req, t, pos, meth, k, acc, produced, switched, probed as rows of one array, rows
    used, steps per instance)."""
    n = len(out_len)
    pos = np.ones(n_inst, np.int64)
    n_steps = np.zeros(n_inst, np.int64)
    prev = np.full(n_inst, -2, np.int64)
    cols = np.zeros((9, cap), np.int64)
    probed = np.ones(batch_size, np.bool_)
    running = np.zeros(batch_size, np.int64)
    nrun, nxt, row = 0, 0, 0
    meth, k = np.zeros(batch_size, np.int64), np.zeros(batch_size, np.int64)
    a, prod_raw = np.zeros(batch_size, np.int64), np.zeros(batch_size, np.int64)
    while True:
        if continuous:
            take = min(batch_size - nrun, n_inst - nxt)
        else:
            take = min(batch_size, n_inst - nxt) if nrun == 0 else 0
        first_new = nxt
        nxt += take
        if nrun == 0 and take == 0:
            break
        if nrun:
            req = running[:nrun].copy()
            i = req % n
            p = pos[req]
            fi = off[i] + p
            kv = 0
            for r in range(nrun):
                kv += prompt_len[i[r]] + p[r] - 1 + extra
            if gated:
                decide_observe_gated(acc, npr, has_npr, kmax, is_probe, form, dpar, cpar, grid, prior,
                                     calibrates, state, gst, req, fi, p, nrun + take, kv, meth[:nrun],
                                     k[:nrun], a[:nrun], prod_raw[:nrun], probed[:nrun])  # fmt: skip
            else:
                decide_observe(acc, npr, has_npr, counts, kmax, is_probe, form, dpar, cpar, grid, prior,
                               calibrates, state, req, fi, p, nrun + take, kv, meth[:nrun], k[:nrun],
                               a[:nrun], prod_raw[:nrun])  # fmt: skip
            keep = 0
            for r in range(nrun):
                q = req[r]
                prod = min(prod_raw[r], out_len[i[r]] - p[r])
                cols[0, row], cols[1, row], cols[2, row], cols[3, row] = q, n_steps[q], p[r], meth[r]
                cols[4, row], cols[5, row], cols[6, row] = k[r], a[r], prod
                cols[7, row] = 1 if (prev[q] != -2 and prev[q] != meth[r]) else 0
                cols[8, row] = 1 if probed[r] else 0
                row += 1
                prev[q] = meth[r]
                pos[q] = p[r] + prod
                n_steps[q] += 1
                if pos[q] < out_len[i[r]]:
                    running[keep] = q
                    keep += 1
            nrun = keep
        # requests prefilled in this step run from the next one (a one-token output ends at its prefill)
        for q in range(first_new, first_new + take):
            if out_len[q % n] > 1:
                running[nrun] = q
                nrun += 1
    return cols, row, n_steps
