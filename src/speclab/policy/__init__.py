"""Speculation policies: what each running request proposes at each step, and with which method.

One layer below both the simulator (speclab.simulate, which runs policies over traces) and the live engine
(speclab.live, which runs the online rules inside vLLM). `core`: the interface (Policy, StepView,
StepOutcome, PolicyContext), the registry and the baselines (none, fixed, oracle, oracle-combine);
`schedule`: vLLM's batch-size schedule for k; `rules`: the online rules adaptive, adaptive-pooled and
adaptive-gated (estimates in `adaptive` and `pooling`, the batch's expected goodput in `goodput`).
Importing this package registers every policy by name. Guide: docs/adaptive.md, docs/simulator.md."""

from __future__ import annotations

from speclab.policy import schedule as _schedule  # noqa: F401  (registers schedule)
from speclab.policy.adaptive import AdaptiveBase
from speclab.policy.core import (
    Policy,
    PolicyContext,
    PolicyInfo,
    StepOutcome,
    StepView,
    check_k_within_traces,
    list_policies,
    make_policy,
    register_policy,
)
from speclab.policy.rules import AdaptiveGated, AdaptivePooled, AdaptiveRule, bind_methods
from speclab.policy.schedule import BatchSchedule

__all__ = [
    "AdaptiveBase",
    "AdaptiveGated",
    "AdaptivePooled",
    "AdaptiveRule",
    "BatchSchedule",
    "Policy",
    "PolicyContext",
    "PolicyInfo",
    "StepOutcome",
    "StepView",
    "bind_methods",
    "check_k_within_traces",
    "list_policies",
    "make_policy",
    "register_policy",
]
