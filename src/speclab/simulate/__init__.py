"""Trace-driven speculative-decoding simulator (see docs/simulator.md)."""

# registers the adaptive policies (issue 12) by name
from speclab.simulate import adaptive as _adaptive  # noqa: E402,F401
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
