"""Trace-driven speculative-decoding simulator (see docs/simulator.md). The policies it runs are
speclab.policy's (re-exported here for convenience)."""

from speclab.policy import (
    Policy,
    PolicyContext,
    StepOutcome,
    StepView,
    list_policies,
    make_policy,
    register_policy,
)
from speclab.simulate.api import AGGREGATES, SimResult, simulate
from speclab.simulate.fast import BATCHING_MODES

__all__ = [
    "AGGREGATES",
    "BATCHING_MODES",
    "Policy",
    "PolicyContext",
    "SimResult",
    "StepOutcome",
    "StepView",
    "list_policies",
    "make_policy",
    "register_policy",
    "simulate",
]
