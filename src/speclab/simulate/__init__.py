"""Trace-driven speculative-decoding simulator (see docs/simulator.md)."""

from speclab.simulate.api import AGGREGATES, SimResult, simulate
from speclab.simulate.fast import BATCHING_MODES
from speclab.simulate.policies import (
    Policy,
    PolicyContext,
    StepOutcome,
    StepView,
    list_policies,
    make_policy,
    register_policy,
)

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
