"""Step prices fitted online from the engine's own step intervals (the live adaptive proposer's `price_fit`).

The adaptive proposer decides by the price of a draft token relative to the step it rides on, and a cost
model fitted on one machine can be wrong about that on another (docs/adaptive.md "Stop 19": a preset priced
a draft token at B = 16 1.6x dearer than a slower 2-core machine charged it, and at B = 1 at almost
nothing). What the proposer can observe is the wall time between two of its calls: one engine step that
verified the drafts it returned at the first call, for the requests running then. This module fits

    seconds = a + b * requests + c * draft_tokens + kv_prior * kv_tokens

to those intervals by recursive least squares with forgetting (a step long ago says less about the machine
now), held towards the configured cost model's own coefficients (its step times fitted the same way), so
that a coefficient the intervals cannot tell apart, such as b while the batch never changes size, stays
where the model had it. The fit is handed back as an ordinary `CostModel` (linear target, per-request and
per-draft-token overheads) that the policy prices with unchanged. Steps that carried a prefill, and intervals far off the current fit (an idle
gap between two `generate` calls, a compile), are not fitted.

The KV term is not fitted (it moves slowly and together with the batch); it is the configured model's.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from speclab.costmodel.model import CostModel, TargetCost
from speclab.errors import ConfigError

PRIOR_REQUESTS = (1, 2, 4, 8, 16, 32, 64)  # batch sizes the prior's step times are read at
PRIOR_DRAFTS = (0, 1, 2, 4, 8)  # drafts per request there (capped at kmax)
RATIOS = 33  # recent intervals whose median ratio to the prediction judges the next one
NOISE = 0.05  # an engine step's usual spread, as a share of it (scales the prior's weight)
COEF_FLOOR = 1e-6  # seconds: the prior's coefficients are held at least this (none is free)


@dataclass(frozen=True)
class Prices:
    """The fit now: seconds per step, per running request and per verified draft token (KV: the prior's)."""

    step: float
    request: float
    draft_token: float
    samples: int  # step intervals fitted so far (not discounted)

    def seconds(self, requests: float, drafts: float) -> float:
        return self.step + self.request * requests + self.draft_token * drafts

    def describe(self) -> str:
        return (
            f"{self.step * 1e3:.1f} ms + {self.request * 1e3:.2f} ms/request + "
            f"{self.draft_token * 1e3:.2f} ms/draft token ({self.samples} steps)"
        )


class OnlinePriceFit:
    """Recursive least squares over (1, requests, draft tokens) with exponential forgetting and a fixed
    prior. `half_life`: steps after which an interval weighs half; `prior_weight`: how firmly the prior's
    coefficients are held (see _solve); `min_samples`: intervals before the fit replaces the prior;
    `reject`: an interval is not fitted where its ratio to the current prediction is more than this factor
    off the median ratio of the last RATIOS intervals (either way). Judged against that median, not against
    the prediction itself, so a prior far off the machine, or a fit pulled by an early outlier, does not
    lock the real steps out."""

    def __init__(
        self,
        prior: CostModel,
        probes: tuple[str, ...],
        kmax: int,
        half_life: float = 128.0,
        prior_weight: float = 16.0,
        min_samples: int = 24,
        reject: float = 3.0,
    ) -> None:
        if half_life <= 0 or prior_weight <= 0 or reject <= 1 or min_samples < 0 or kmax < 1:
            raise ConfigError(
                "online price fit: needs half_life > 0, prior_weight > 0, reject > 1, min_samples >= 0, "
                f"kmax >= 1 (got {half_life}, {prior_weight}, {reject}, {min_samples}, {kmax})"
            )
        self.prior = prior
        self.probes = probes
        self.frac = float(sum(prior.draft_for(p).fraction for p in probes))
        self.kv = float(prior.target.kv) * (1 + self.frac)  # seconds per KV token of a step, the prior's
        self.decay = 0.5 ** (1.0 / half_life)
        self.min_samples = int(min_samples)
        self.reject = float(reject)
        # the prior's coefficients: its step times at batch sizes x drafts per request (KV 0), fitted linearly
        from speclab.simulate.adaptive.goodput import step_time  # noqa: PLC0415 - simulate imports costmodel

        pts = [(r, r * d) for r in PRIOR_REQUESTS for d in sorted({min(d, kmax) for d in PRIOR_DRAFTS})]
        x0 = np.array([[1.0, r, dd] for r, dd in pts])
        y0 = np.array(
            [
                float(step_time(prior, None, np.float64(dd / r), np.float64(r), np.float64(0.0), probes))
                for r, dd in pts
            ]
        )
        self._mu0 = np.maximum(np.linalg.lstsq(x0, y0, rcond=None)[0], COEF_FLOOR)
        self.prior_weight = float(prior_weight)
        self._s = np.zeros((3, 3))
        self._t = np.zeros(3)
        self._n = 0.0  # discounted count of fitted intervals
        self.samples = 0
        self.rejected = 0
        self._ratios: deque[float] = deque(maxlen=RATIOS)
        self._theta = self._mu0.copy()
        self.prior_prices = self.prices()

    def _solve(self) -> np.ndarray:
        """Least squares over the discounted intervals plus a ridge towards the prior's coefficients. The
        ridge is scaled to the intervals seen: moving a coefficient by as much as would change the mean
        interval by 100% (a by the mean interval, b by it over the mean batch, c by it over the mean drafts
        per step) costs as much as `prior_weight` intervals off by NOISE. Weak where the intervals vary
        along a coefficient; it holds only the directions they do not tell apart (b while the batch never
        changes size; c while nothing is drafted)."""
        n = max(self._n, 1e-12)
        mean = self._s[0] / n  # discounted means of (1, requests, drafts)
        p0 = self.prior_weight * NOISE**2 * np.diag([1.0, mean[1] ** 2, max(mean[2], 1.0) ** 2])
        return np.linalg.solve(self._s + p0, self._t + p0 @ self._mu0)

    def predict(self, requests: float, drafts: float, kv: float = 0.0) -> float:
        a, b, c = self._theta
        return float(a + b * requests + c * drafts + self.kv * kv)

    def add(self, requests: int, drafts: int, kv: float, seconds: float) -> bool:
        """One step interval: `requests` running, `drafts` draft tokens verified, `kv` tokens of context.
        Returns whether it was fitted (False: off the current fit by more than `reject`, or not finite)."""
        if requests < 1 or drafts < 0 or not math.isfinite(seconds) or seconds <= 0:
            return False
        pred = self.predict(requests, drafts, kv)
        if pred > 0:
            ratio = seconds / pred
            self._ratios.append(ratio)
            med = float(np.median(self._ratios))
            if len(self._ratios) >= 5 and not med / self.reject <= ratio <= med * self.reject:
                self.rejected += 1
                return False
        x = np.array([1.0, float(requests), float(drafts)])
        y = seconds - self.kv * kv
        self._s = self.decay * self._s + np.outer(x, x)
        self._t = self.decay * self._t + x * y
        self._n = self.decay * self._n + 1.0
        self.samples += 1
        if self.samples >= self.min_samples:
            self._theta = self._solve()
            if self.samples == self.min_samples:
                self._ratios.clear()  # ratios to the prior's predictions say nothing about the fit's
        return True

    def prices(self) -> Prices:
        """The current coefficients, held non-negative (a draft token at least 1 microsecond)."""
        a, b, c = (float(v) for v in self._theta)
        return Prices(step=max(a, 0.0), request=max(b, 0.0), draft_token=max(c, 1e-6), samples=self.samples)

    def model(self) -> CostModel:
        """The fit as a CostModel the adaptive policies price with: target = (step + token * tokens + KV)
        / (1 + probes' fraction), so that with the probes' charge it is the fitted step; the request's and
        the draft token's difference from a decode token's price go to the per-request or per-draft-token
        overhead, whichever is positive."""
        p = self.prices()
        g = 1.0 + self.frac
        base = min(p.request, p.draft_token)  # a decoded or verified token's price through the target
        tgt = TargetCost(kv=self.kv / g, batched=base / g, const=p.step / g)
        return CostModel(
            name=f"{self.prior.name}+online",
            target=tgt,
            draft=dict(self.prior.draft),
            overhead_per_step=0.0,
            overhead_per_request=p.request - base,
            overhead_per_spec_token=p.draft_token - base,
            description=f"{self.prior.name} refitted online: {p.describe()}",
            source="the live proposer's step intervals",
        )
