"""`adaptive`: the rule family. Per step and request, estimate each method's acceptance from what an engine
can observe -- a model-free proposer from hindsight (its lookups over the output known so far: a copy in
progress shows as a run of matches), a model-based drafter from its own recent steps on this request -- and
take the (method, k) with the highest expected goodput under the cost model and the live batch, or no
speculation where none pays (goodput.batch_choice: the whole batch's goodput, shared drafter passes)."""

from __future__ import annotations

import numpy as np

from speclab.simulate.adaptive.base import AdaptiveBase
from speclab.simulate.adaptive.goodput import batch_choice
from speclab.simulate.policies import StepOutcome, StepView


class AdaptiveRule(AdaptiveBase):
    def decide(self, view: StepView) -> tuple[np.ndarray, np.ndarray]:
        self.gate(view)
        raw = [self.survival(view, j) for j in range(len(self.methods))]
        surv = self.calibrated(raw)
        group = np.zeros(len(view), np.int64) if view.one_batch else np.arange(len(view))
        args = (self.cm, self.methods, surv, self.kmax, view.occupancy, view.batch_kv, self.probes, group)
        meth, k = batch_choice(*args, offers=self.offer_caps(view))
        self.predict(view, raw, meth, k)
        if self.gated(view):  # would a lookup be used if it offered?
            free = self.calibrated([self.survival(view, j, offered=False) for j in range(len(self.methods))])
            fm, fk = batch_choice(*args[:2], free, *args[3:])
            # ... and would it draft from a copy, were one in progress?
            cs = [
                self.copy_survival(len(view), j) if m in self.probes else free[j]
                for j, m in enumerate(self.methods)
            ]
            cm_, ck = batch_choice(*args[:2], self.calibrated(cs), *args[3:])
            lookups = [j for j, m in enumerate(self.methods) if m in self.probes]
            self.gate_done(view, fm, fk, free, np.isin(cm_, lookups) & (ck > 0))
        return meth, k

    def observe(self, outcome: StepOutcome) -> None:
        self.learn(outcome.req, outcome.method, outcome.k, outcome.accepted)
        self.calibrate_with(outcome)


class AdaptivePooled(AdaptiveRule):
    """`adaptive-pooled`: the rule with its lookup priors (copy continuation, first-draft rate outside a copy)
    pooled over the requests the engine has served (base.pool_counts): the deployment's own copy lengths
    instead of hand-set constants. Mixed in simulation (docs/adaptive.md), so not the default."""

    POOLS = True
    POOL_PRIORS = True
    # a position joins the pool 4 positions back (censored there, not counted as a stop): the pool fills
    # while the first requests still run (stop 21: with 16 back, 32-token requests pooled little before
    # half of a batch's output was decoded)
    POOL_LAG = 4


class AdaptiveGated(AdaptiveRule):
    """`adaptive-gated`: the rule, (1) probing only the requests that may use a lookup where the probes are
    dear (AdaptiveBase.gate / gate_done: a dormant request is probed every REPROBE positions; what it did
    not probe reads as unknown; the simulator charges probes per probed request), and (2) with the lookups'
    estimates scaled by the pooled record of its own lookup drafts (AdaptiveBase.calibration)."""

    GATED = True
    POOLS = True  # the calibration pools outcomes over requests: served in time order (Policy.pools_requests)
    CALIBRATES = True
