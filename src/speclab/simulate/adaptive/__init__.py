"""Adaptive speculation policies (issue 12): online method choice and proposal length from observable
signals, the cost model and the live batch; and vLLM's batch-size schedule for k. See docs/adaptive.md.
Importing this package registers the policies by name."""

from __future__ import annotations

from speclab.simulate.adaptive.base import AdaptiveBase, bind_methods, parse_methods_kmax
from speclab.simulate.adaptive.rule import AdaptiveGated, AdaptivePooled, AdaptiveRule
from speclab.simulate.adaptive.schedule import BatchSchedule, derive_schedule, recommend
from speclab.simulate.policies import Policy, register_policy


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
__all__ = [
    "AdaptiveBase",
    "AdaptiveGated",
    "AdaptivePooled",
    "AdaptiveRule",
    "BatchSchedule",
    "bind_methods",
    "derive_schedule",
    "recommend",
]
