"""Cross-check replayed traces against what vLLM observed in a bench run.

The engine does not step through every position: after prefill (which produces output[0]) it proposes at
position 1, and each step jumps over the tokens it accepted. So the replayed trace is walked the way the
engine walks (`expected_engine_steps`) and the resulting (accepted, drafted) sequence is compared with
meta["observed"] (vLLM's per-request detailed spec-decode metrics: per_step_accepted / per_step_drafted;
steps where nothing was proposed are absent there, and absent here too).

Known, explainable differences (classified, not hidden):
- "output_end": the last step reaches the end of the recorded output (max_tokens or EOS). vLLM counts
  accepted drafts before truncating the output, so it may have accepted tokens the trace does not contain;
  the replay can only say "at least". Counted as agreement when the observed value is >= the replayed one
  there and everything before it matched exactly.
- "max_model_len": the step lies where prompt + position + k exceeds the run's max_model_len; vLLM then
  skips or trims drafting (for the whole batch), which a per-request replay does not model.
Anything else is "mismatch": a bug to explain.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speclab.traces import RequestTrace


def expected_engine_steps(
    acc_len: np.ndarray, num_proposed: np.ndarray, k: int, start: int = 1
) -> list[tuple[int, int, int]]:
    """Walk a replayed trace like the engine: [(position, accepted, drafted)] for steps with a proposal."""
    n = len(acc_len)
    steps: list[tuple[int, int, int]] = []
    p = start
    while p < n:
        d = min(int(num_proposed[p]), k)
        if d == 0:
            p += 1  # a plain decode step; vLLM records no spec entry for it
            continue
        a = min(int(acc_len[p]) - 1, d)
        steps.append((p, a, d))
        p += a + 1
    return steps


@dataclass
class RequestCheck:
    id: str
    method: str
    k: int
    status: str  # "agree" | "output_end" | "max_model_len" | "mismatch"
    steps_expected: int
    steps_observed: int
    steps_matched: int  # equal entries before the first difference
    first_diff: dict[str, Any] | None = None
    workload: str = ""


@dataclass
class CrossCheckResult:
    per_request: list[RequestCheck] = field(default_factory=list)

    def summary(self, by_workload: bool = False) -> dict[str, dict[str, Any]]:
        """Per method (or per "method / workload") counts and agreement rates."""
        out: dict[str, dict[str, Any]] = {}
        for rc in self.per_request:
            s = out.setdefault(
                f"{rc.method} / {rc.workload}" if by_workload else rc.method,
                {"requests": 0, "agree": 0, "output_end": 0, "max_model_len": 0, "mismatch": 0,
                 "steps_observed": 0, "steps_matched": 0},
            )  # fmt: skip
            s["requests"] += 1
            s[rc.status] += 1
            s["steps_observed"] += rc.steps_observed
            s["steps_matched"] += rc.steps_matched
        for s in out.values():
            ok = s["agree"] + s["output_end"]
            s["agreement_rate"] = ok / s["requests"] if s["requests"] else float("nan")
            s["step_agreement_rate"] = (
                s["steps_matched"] / s["steps_observed"] if s["steps_observed"] else float("nan")
            )
        return out

    def mismatches(self) -> list[RequestCheck]:
        return [r for r in self.per_request if r.status == "mismatch"]


def check_request(
    rec: RequestTrace, acc_len: np.ndarray, num_proposed: np.ndarray, method: str, k: int,
    observed: dict[str, Any], max_model_len: int | None = None,
) -> RequestCheck:  # fmt: skip
    exp = expected_engine_steps(acc_len, num_proposed, k)
    obs_a = [int(v) for v in observed.get("per_step_accepted") or []]
    obs_d = [int(v) for v in observed.get("per_step_drafted") or []]
    n = rec.output_len
    m = 0
    while m < len(exp) and m < len(obs_a) and exp[m][1] == obs_a[m] and exp[m][2] == obs_d[m]:
        m += 1
    rc = RequestCheck(rec.id, method, k, "agree", len(exp), len(obs_a), m, workload=rec.workload)
    if m == len(exp) == len(obs_a):
        return rc
    diff: dict[str, Any] = {"step": m}
    if m < len(exp):
        p, a, d = exp[m]
        diff.update(position=p, expected_accepted=a, expected_drafted=d)
    if m < len(obs_a):
        diff.update(observed_accepted=obs_a[m], observed_drafted=obs_d[m])
    rc.first_diff = diff
    if m < len(exp) and m < len(obs_a):
        p, a, d = exp[m]
        last = m == len(exp) - 1 == len(obs_a) - 1
        if last and p + a + 1 >= n and obs_d[m] == d and obs_a[m] >= a:
            rc.status = "output_end"
            rc.steps_matched += 1
            return rc
        if max_model_len is not None and rec.prompt_len + p + k > max_model_len:
            rc.status = "max_model_len"
            return rc
    rc.status = "mismatch"
    return rc


ReplayFn = Callable[[RequestTrace, str, int, dict[str, Any]], tuple[np.ndarray, np.ndarray] | None]


def crosscheck_records(
    records: list[RequestTrace],
    replay_fn: ReplayFn,
    max_model_len: int | None = None,
) -> CrossCheckResult:
    """For every record with meta["observed"], get the replayed (acc_len, num_proposed) for the observed
    method at the run's k from `replay_fn(rec, method, k, observed)` (None = cannot replay; skipped) and
    compare the engine walk with what was observed."""
    res = CrossCheckResult()
    for rec in records:
        obs = rec.meta.get("observed")
        if not obs or rec.output_token_ids is None:
            continue
        method, k = str(obs["method"]), int(obs["k"])
        got = replay_fn(rec, method, k, obs)
        if got is None:
            continue
        acc, nprop = got
        mml = obs.get("max_model_len", rec.meta.get("max_model_len", max_model_len))
        res.per_request.append(check_request(rec, acc, nprop, method, k, obs, mml))
    return res


# --- expected acceptance (sampled runs) --------------------------------------------------------------------
# A sampled run's acceptance is random, so replay cannot predict each step; it predicts its expectation
# (MethodTrace.accept_prob along the request's output). `expected_check` walks the engine's observed steps
# over the output (misses where the replay proposes nothing) and adds up, per step, the accepted drafts the
# engine measured and the ones accept_prob expects at that position for the drafts it made.
# A fault needs both: the engine accepted below ENGINE_FAULT_RATIO of the expected drafts, and chance cannot
# explain it (the measured count ENGINE_FAULT_Z standard deviations below the expectation; one-sided p ~ 5e-4,
# from each step's variance under the expected acceptance, steps independent).
ENGINE_FAULT_RATIO = 0.5
ENGINE_FAULT_Z = 3.29
ENGINE_FAULT_MIN_STEPS = 20  # fewer steps say too little to call a fault


@dataclass
class ExpectedCheck:
    id: str
    method: str
    k: int
    temperature: float
    cell_id: str
    steps: int
    measured_accepted: int  # accepted drafts over the steps
    expected_accepted: float
    expected_var: float = 0.0  # variance of the accepted count under the expectation (steps independent)

    @property
    def measured_len(self) -> float:
        return 1.0 + self.measured_accepted / self.steps if self.steps else float("nan")

    @property
    def expected_len(self) -> float:
        return 1.0 + self.expected_accepted / self.steps if self.steps else float("nan")


def expected_check(
    rec: RequestTrace, mt: Any, method: str, k: int, observed: dict[str, Any], temperature: float
) -> ExpectedCheck:
    """Walk the observed steps over the output; per step, the expected accepted count from accept_prob at its
    position for min(drafted, k) drafts: sum_j prod_{i<=j} accept_prob[p, i-1]."""
    obs_a = [int(v) for v in observed.get("per_step_accepted") or []]
    obs_d = [int(v) for v in observed.get("per_step_drafted") or []]
    surv = np.cumprod(mt.accept_prob.astype(np.float64), axis=1)  # P(drafts 1..j all accepted)
    nprop = mt.num_proposed if mt.num_proposed is not None else np.full(len(mt.acc_len), mt.k_max)
    n, p, i = len(mt.acc_len), 1, 0
    chk = ExpectedCheck(rec.id, method, k, temperature, str(rec.meta.get("cell_id", "")), 0, 0, 0.0)
    while p < n and i < len(obs_a):
        if min(int(nprop[p]), k) == 0:
            p += 1  # a plain decode step (vLLM records nothing for it)
            continue
        a, d = obs_a[i], min(obs_d[i] if i < len(obs_d) else k, k, mt.k_max)
        e = float(surv[p, :d].sum())
        chk.expected_accepted += e
        # accepted = sum_j 1{drafts 1..j accepted}; E[1_i 1_j] = surv_max(i,j): var = sum (2j-1) surv_j - e^2
        chk.expected_var += float(((2 * np.arange(1, d + 1) - 1) * surv[p, :d]).sum()) - e * e
        chk.measured_accepted += a
        chk.steps += 1
        p, i = p + a + 1, i + 1
    return chk


def expected_summary(checks: list[ExpectedCheck], by: str = "method") -> dict[str, dict[str, Any]]:
    """Per method and temperature (by="method") or per cell (by="cell", with the cell's method, k and
    temperature): mean acceptance lengths measured and expected (1 + accepted drafts per step), their relative
    error ("rel_error"), the mean absolute error of the requests' measured length relative to their expected
    one ("mae_rel": few steps per request make it noisy), the one of the cells' mean lengths ("cell_mae_rel"),
    the relative standard deviation chance alone gives the measured mean length ("chance_sd_rel"), and
    "engine_fault" where the engine accepted far fewer drafts than expected, beyond chance."""
    groups: dict[str, list[ExpectedCheck]] = {}
    for c in checks:
        if c.steps:
            key = c.cell_id if by == "cell" else f"{c.method} T={c.temperature:g}"
            groups.setdefault(key, []).append(c)
    out: dict[str, dict[str, Any]] = {}
    for key, cs in groups.items():
        steps = sum(c.steps for c in cs)
        meas = sum(c.measured_accepted for c in cs) / steps
        exp = sum(c.expected_accepted for c in cs) / steps
        var = max(sum(c.expected_var for c in cs), 0.0)
        s: dict[str, Any] = {
            "requests": len(cs),
            "steps": steps,
            "measured_mean_acceptance_length": 1.0 + meas,
            "expected_mean_acceptance_length": 1.0 + exp,
            "rel_error": (meas - exp) / (1.0 + exp),
            "mae_rel": float(np.mean([abs(c.measured_len - c.expected_len) / c.expected_len for c in cs])),
            "cell_mae_rel": _cell_mae(cs),
            "chance_sd_rel": math.sqrt(var) / steps / (1.0 + exp),
        }
        if by == "cell":  # the cell's method, k and temperature (None where its requests had several)
            temps = {c.temperature for c in cs}
            s.update(method=cs[0].method, k=cs[0].k, temperature=temps.pop() if len(temps) == 1 else None)
        z = (meas - exp) * steps / math.sqrt(var) if var > 0 else (-math.inf if meas < exp else 0.0)
        if steps >= ENGINE_FAULT_MIN_STEPS and meas < ENGINE_FAULT_RATIO * exp and z < -ENGINE_FAULT_Z:
            s["engine_fault"] = (
                f"engine accepted {meas:.2f} drafts per step, below {ENGINE_FAULT_RATIO:.0%} of the "
                f"{exp:.2f} the replayed expectation gives ({steps} steps, {-z:.1f} sd below it)"
            )
        out[key] = s
    return out


def _cell_mae(cs: list[ExpectedCheck]) -> float:
    """Mean over the cells of |measured - expected| / expected mean acceptance length, each cell's requests
    pooled."""
    cells: dict[str, list[ExpectedCheck]] = {}
    for c in cs:
        cells.setdefault(c.cell_id, []).append(c)
    errs = []
    for group in cells.values():
        steps = sum(c.steps for c in group)
        m = 1.0 + sum(c.measured_accepted for c in group) / steps
        e = 1.0 + sum(c.expected_accepted for c in group) / steps
        errs.append(abs(m - e) / e)
    return float(np.mean(errs))
