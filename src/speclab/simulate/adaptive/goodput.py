"""Expected goodput of one speculation choice under a cost model and the live batch (shared by the adaptive
policies).

For a running request, a choice is (method m, k drafts) or off. With S_m(j) the estimated probability that
at least j of m's drafts are accepted, the step produces E = 1 + sum_{j<=k} S_m(j) tokens in expectation.
Its time is estimated as if every sequence in the live batch (StepView.occupancy, copies included) chose
the same, with the batch's KV (StepView.batch_kv): the target verifies occupancy * (k + 1) tokens, the
proposer costs what the cost model charges for that many drafts, plus the per-step overhead and the probes
the policy runs anyway. The choice maximising E / T (tokens per second of this request's share) wins; off
(E = 1) wins wherever speculation would cost more than it returns, which is how SD switches itself off at
large batch or low acceptance.
"""

from __future__ import annotations

import numpy as np

from speclab.costmodel.model import CostModel


def step_time(
    cm: CostModel, method: str | None, k: np.ndarray, occ: np.ndarray, kv: np.ndarray, probes: tuple[str, ...]
) -> np.ndarray:
    """Estimated engine-step time when all `occ` sequences propose k drafts with `method` (None = off).
    k broadcasts against occ/kv (e.g. occ[:, None] with k[None, :])."""
    verify = cm.target_time(kv, occ * (k + 1))
    t = verify + cm.overhead_per_step
    for p in probes:  # probes run at every step whatever is chosen
        t = t + cm.draft_for(p).fraction * verify
    if method is None or method in probes:
        return t
    d = cm.draft_for(method)
    if d.form == "verify_fraction":
        return t + np.where(k > 0, d.fraction * verify, 0.0)
    if d.form == "linear":
        return t + np.where(k > 0, d.kv * kv + d.num_spec * k + d.const, 0.0)
    return t + k * (d.kv * kv + d.const) + d.num_spec * occ * k  # chained


def best_choice(
    cm: CostModel,
    methods: tuple[str, ...],
    surv: list[np.ndarray | None],
    kmax: list[int],
    occ: np.ndarray,
    kv: np.ndarray,
    probes: tuple[str, ...],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request the (method index, k) with the highest expected goodput E / T; -1, 0 = off.
    surv[j]: (n, kmax[j]) survival estimates for methods[j] (None = method unavailable now).
    Returns (method, k, best goodput)."""
    n = len(occ)
    occ_f = occ.astype(np.float64)[:, None]
    kv_f = kv.astype(np.float64)[:, None]
    best = 1.0 / step_time(cm, None, np.zeros((n, 1)), occ_f, kv_f, probes)[:, 0]
    meth = np.full(n, -1, dtype=np.int64)
    kbest = np.zeros(n, dtype=np.int64)
    for j, m in enumerate(methods):
        if surv[j] is None or kmax[j] < 1:
            continue
        ks = np.arange(1, kmax[j] + 1, dtype=np.float64)[None, :]
        e = 1.0 + np.cumsum(surv[j][:, : kmax[j]], axis=1)
        g = e / step_time(cm, m, ks, occ_f, kv_f, probes)
        i = g.argmax(axis=1)
        gi = g[np.arange(n), i]
        better = gi > best
        best = np.where(better, gi, best)
        meth = np.where(better, j, meth)
        kbest = np.where(better, i + 1, kbest)
    return meth, kbest, best


def run_length(hind: np.ndarray) -> np.ndarray:
    """From StepView.hindsight: how many of the last positions the proposer at that position would have
    predicted all the way to now (the longest d with min(acc - 1, d) == d, counted contiguously from d = 1).
    A copy in progress shows as a long run."""
    d = np.arange(1, hind.shape[1] + 1)[None, :]
    full = hind == d
    return np.where(full.all(axis=1), hind.shape[1], full.argmin(axis=1))


def geometric(alpha: np.ndarray, kmax: int, first: np.ndarray | None = None) -> np.ndarray:
    """Survival S(j) = first * alpha^(j-1) for j = 1..kmax (first defaults to alpha)."""
    j = np.arange(kmax)[None, :]
    a = np.clip(alpha, 1e-6, 0.999)[:, None]
    f = a if first is None else np.clip(first, 1e-6, 0.999)[:, None]
    return f * a**j
