"""Replay tracing: fill per-position acceptance for each method from token ids, and cross-check it against
what a real engine observed (`speclab trace`)."""

from speclab.replay.crosscheck import CrossCheckResult, crosscheck_records, expected_engine_steps
from speclab.replay.replay import load_records, replay_records

__all__ = [
    "CrossCheckResult",
    "crosscheck_records",
    "expected_engine_steps",
    "load_records",
    "replay_records",
]
