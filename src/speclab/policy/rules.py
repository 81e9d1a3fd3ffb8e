"""`adaptive`: the rule family. Per step and request, estimate each method's acceptance from what an engine
can observe -- a model-free proposer from hindsight (its lookups over the output known so far: a copy in
progress shows as a run of matches), a model-based drafter from its own recent steps on this request -- and
take the (method, k) with the highest expected goodput under the cost model and the live batch, or no
speculation where none pays (goodput.batch_choice: the whole batch's goodput, shared drafter passes).
`adaptive-pooled` and `adaptive-gated` refine its lookup estimates. Importing this module registers the three
by name."""

from __future__ import annotations

import numpy as np

from speclab.catalog import MODEL_FREE
from speclab.costmodel.model import CostModel
from speclab.errors import ConfigError
from speclab.policy.adaptive import AdaptiveBase
from speclab.policy.core import Policy, StepOutcome, StepView, _int, _method, register_policy
from speclab.policy.goodput import batch_choice
from speclab.traces.model import RequestTrace


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
    # while the first requests still run (with 16 back, 32-token requests pooled little before
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


def parse_methods_kmax(spec: str, args: list[str], name: str) -> tuple[tuple[str, ...], dict]:
    """`NAME[:M1,M2,...[:KMAX]]` -> (methods, extra); no methods = every method the traces hold."""
    if len(args) > 2:
        raise ConfigError(f"policy {spec!r}: expected {name}[:M1,M2,...[:KMAX]]")
    ms: tuple[str, ...] = ()
    if args and args[0].strip():
        ms = tuple(_method(x.strip(), spec) for x in args[0].split(","))
        if len(set(ms)) != len(ms):
            raise ConfigError(f"policy {spec!r}: a method is listed twice")
    extra: dict = {}
    if len(args) > 1:
        extra["kmax"] = _int(args[1], "KMAX", spec, 1)
    return ms, extra


def bind_methods(policies: list[Policy], traces: list[RequestTrace], cm: CostModel) -> None:
    """Give every adaptive policy its methods: those it names, or (bare) every method all traces hold,
    model-free ones first (ties in goodput go to the cheaper proposer)."""
    held = set.intersection(*(set(t.methods) for t in traces)) if traces else set()
    order = sorted(held, key=lambda m: (m not in MODEL_FREE, m))
    for p in policies:
        if isinstance(p, AdaptiveBase):
            p.bind(p.methods or tuple(order), cm, named=bool(p.methods))


def _factory(cls: type[AdaptiveBase], name: str):
    def make(spec: str, args: list[str], opts: dict) -> Policy:
        ms, extra = parse_methods_kmax(spec, args, name)
        canon = name + (":" + ",".join(ms) if ms else "") + (f":{extra['kmax']}" if "kmax" in extra else "")
        p = cls.create(canon, ms, extra)
        if ms:
            p.bind(ms, None)
        return p

    return make


SYNTAX = "{}[:M1,M2,...[:KMAX]]"
register_policy(
    "adaptive",
    SYNTAX.format("adaptive"),
    "online rule: per step the (method, k) with the best expected goodput under the cost model and the live "
    "batch, acceptance from hindsight lookups (model-free) and the request's own steps (model-based); "
    "off where SD would lose (default: every method the traces hold, KMAX 20)",
    _factory(AdaptiveRule, "adaptive"),
)
register_policy(
    "adaptive-pooled",
    SYNTAX.format("adaptive-pooled"),
    "online rule as adaptive, with the lookups' copy continuation and first-draft rate pooled over the "
    "requests served so far (the deployment's own) as the priors of each request's estimate",
    _factory(AdaptivePooled, "adaptive-pooled"),
)
register_policy(
    "adaptive-gated",
    SYNTAX.format("adaptive-gated"),
    "online rule as adaptive, probing only the requests that may use a lookup where probes are dear (a dormant "
    "one is probed every few positions; probes charged per probed request), with the lookups' estimates "
    "calibrated by the pooled record of its own lookup drafts",
    _factory(AdaptiveGated, "adaptive-gated"),
)
