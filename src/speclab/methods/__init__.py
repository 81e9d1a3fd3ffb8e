"""Speculative proposers, one file per method, each used both for replay tracing and live in vLLM.

Common interface: `propose(context_ids, k) -> np.ndarray` (live, one context) and
`replay(prompt_ids, output_ids, k_max) -> (acc_len, num_proposed)` (every output position of a finished
request). Suffix decoding is stateful (arctic-inference's cache, as vLLM runs it): see
`speclab.methods.suffix`.
"""

from __future__ import annotations

from typing import Any

from speclab.catalog import REPLAY_METHODS
from speclab.errors import ConfigError

__all__ = ["REPLAY_METHODS", "make_proposer"]


def make_proposer(method: str, **options: Any) -> Any:
    """Build a replay proposer by trace method name. Unknown option keys raise ConfigError."""
    try:
        if method == "ngram":
            from speclab.methods.ngram import NgramProposer

            return NgramProposer(**options)
        if method == "suffix":
            from speclab.methods.suffix import SuffixSpeculator, suffix_options

            return SuffixSpeculator(**suffix_options(options, strict=True))
        if method == "draft_model":
            from speclab.methods.draft_model import DraftModelProposer

            if not options.get("model"):
                raise ConfigError("draft_model replay needs a draft checkpoint (--draft-model PATH)")
            return DraftModelProposer(**options)
        if method == "eagle3":
            from speclab.methods.eagle3 import Eagle3Proposer

            return Eagle3Proposer(**options)
        if method == "eagle":
            from speclab.methods.eagle import EagleProposer

            return EagleProposer(**options)
    except TypeError as exc:
        raise ConfigError(f"{method}: bad option ({exc})") from None
    raise ConfigError(f"no replay proposer for method {method!r} (have: {', '.join(REPLAY_METHODS)})")
