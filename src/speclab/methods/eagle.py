"""EAGLE replay: NOT AVAILABLE.

An EAGLE head predicts from the target's hidden states; replaying it needs (a) a trained head for the
target and (b) the target's hidden states at every position. No trained EAGLE head exists offline for the
models this project runs (SmolLM2-135M), and a random-init head would only produce meaningless
acceptance numbers, so this proposer refuses to run instead of inventing data. Traces carrying `eagle`
entries today come from imports (the study's traces) or from engine runs with a real head.
"""

from __future__ import annotations

from typing import Any

from speclab.errors import ConfigError


class EagleProposer:
    name = "eagle"

    def __init__(self, **_: Any) -> None:
        raise ConfigError(
            "eagle replay is not available: it needs a trained EAGLE head for the target and the target's "
            "hidden states; none exists offline for this project's models (see speclab/methods/eagle.py)"
        )
