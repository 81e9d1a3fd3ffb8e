"""`adaptive-bandit`: the bandit family. Per request, arms are off and (method, k) for k on a doubling
grid; an arm's reward is the tokens a step produced divided by the step time the cost model estimates for
that arm in the live batch (goodput.step_time), as a ratio to off's. Discounted UCB picks the arm. It sees
only the outcome of the arm it pulled (no hindsight, no model of acceptance), which is its handicap: with
a few dozen steps per request, exploring ~10 arms costs a large share of them."""

from __future__ import annotations

import numpy as np

from speclab.simulate.adaptive.base import AdaptiveBase
from speclab.simulate.adaptive.goodput import step_time
from speclab.simulate.policies import PolicyContext, StepOutcome, StepView

GAMMA = 0.95  # discount per pull of any arm
EXPLORE = 0.5  # UCB width, in units of the reward ratio


class AdaptiveBandit(AdaptiveBase):
    def begin(self, ctx: PolicyContext) -> None:
        super().begin(ctx)
        arms = [(-1, 0)]
        for j, km in enumerate(self.kmax):
            k = 1
            while k <= km:
                arms.append((j, k))
                k *= 2
        self.arms = np.array(arms, dtype=np.int64)
        self.sum = np.zeros((len(arms), ctx.num_requests))
        self.cnt = np.zeros((len(arms), ctx.num_requests))
        self.last_t: dict[int, np.ndarray] = {}

    def _times(self, view: StepView) -> np.ndarray:
        occ = view.occupancy.astype(np.float64)
        kv = view.batch_kv.astype(np.float64)
        t = np.empty((len(self.arms), len(view)))
        for a, (j, k) in enumerate(self.arms.tolist()):
            m = None if j < 0 else self.methods[j]
            t[a] = step_time(self.cm, m, np.float64(k), occ, kv, self.probes)
        return t

    def decide(self, view: StepView) -> tuple[np.ndarray, np.ndarray]:
        t = self._times(view)
        cnt, tot = self.cnt[:, view.req], self.sum[:, view.req]
        mean = np.where(cnt > 0, tot / np.maximum(cnt, 1e-9), np.inf)  # untried arms first
        bonus = EXPLORE * np.sqrt(np.log1p(cnt.sum(axis=0))[None, :] / np.maximum(cnt, 1e-9))
        arm = (mean + bonus).argmax(axis=0)
        meth, k = self.arms[arm, 0], self.arms[arm, 1]
        for j, m in enumerate(self.methods):  # cap by recorded offers
            npr = view.num_proposed(m)
            if npr is not None:
                k = np.where(meth == j, np.minimum(k, npr), k)
        self._pending = (view.req.copy(), arm, t[arm, np.arange(len(view))] / t[0])
        return meth.astype(np.int64), k.astype(np.int64)

    def observe(self, outcome: StepOutcome) -> None:
        req, arm, rel = self._pending
        if not np.array_equal(req, outcome.req):  # decide/observe always pair up in both engines
            raise RuntimeError("adaptive-bandit: observe() does not match the last decide()")
        reward = (outcome.accepted + 1) / rel  # tokens per off-step-equivalent of time
        self.sum[:, req] *= GAMMA
        self.cnt[:, req] *= GAMMA
        self.sum[arm, req] += reward
        self.cnt[arm, req] += 1
        self.learn(outcome.req, outcome.method, outcome.k, outcome.accepted)
