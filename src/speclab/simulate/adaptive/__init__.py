"""Adaptive speculation in the simulator: vLLM's batch-size schedule for k derived from the user's traces
(`recommend`, `derive_schedule`), the evaluation of the online policies against the baselines and oracles
(`evaluate`) and synthetic trace shapes (`synth`). The policies themselves: speclab.policy. Guide:
docs/adaptive.md."""

from __future__ import annotations

from speclab.simulate.adaptive.recommend import derive_schedule, recommend

__all__ = ["derive_schedule", "recommend"]
