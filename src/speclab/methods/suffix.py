"""Suffix decoding (Oliaro et al., arXiv 2411.04975) as vLLM's built-in `suffix` method runs it.

There is one implementation: arctic-inference's `SuffixDecodingCache` (the library vLLM's
`SuffixDecodingProposer` imports), driven here call for call the way vLLM drives it:

- a request enters with `start_request(req_id, prompt)` at its first proposing step (the step whose sampled
  tokens are non-empty, i.e. after its prefill completed), evicting an earlier cached response of the same
  id first;
- every step, `add_active_response(req_id, sampled)` then `speculate(req_id, last max_tree_depth tokens,
  max_spec_tokens=min(k, max_model_len - num_tokens - 1), max_spec_factor, min_token_prob)`; a row at
  `num_tokens >= max_model_len` is skipped before anything is added;
- after the rows of a step, every active request not in the batch is stopped (`stop_request`).

The response of every active request is added to the *global* tree as it is generated (not when it
finishes), so in a batch requests see each other's partial answers, and a request sees its own; the global
tree keeps the last `max_cached_requests` responses (FIFO by start). Options and defaults are vLLM's
SpeculativeConfig `suffix_decoding_*` fields, accepted with or without that prefix.

`SuffixSpeculator.step` is that per-row logic; the live `custom_class` adapter (methods/vllm_custom.py),
the engine replay (replay/engine_sim.py) and the per-position replay (`replay` below) all call it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speclab.errors import ConfigError

INSTALL_HINT = (
    "suffix decoding runs arctic-inference's cache (the library vLLM's suffix method uses): "
    "install it with scripts/setup.sh or `pip install arctic-inference`"
)
# vLLM SpeculativeConfig defaults (suffix_decoding_* fields, vLLM 0.32)
VLLM_DEFAULTS: dict[str, Any] = {
    "max_tree_depth": 24,
    "max_cached_requests": 10000,
    "max_spec_factor": 1.0,
    "min_token_prob": 0.1,
}
VLLM_PREFIX = "suffix_decoding_"


def suffix_options(options: dict[str, Any], strict: bool = False) -> dict[str, Any]:
    """SuffixSpeculator keyword arguments from vLLM-style (`suffix_decoding_max_tree_depth`) or short
    (`max_tree_depth`) option names; other keys are dropped, or rejected if `strict`."""
    out: dict[str, Any] = {}
    for key, val in options.items():
        name = key[len(VLLM_PREFIX) :] if key.startswith(VLLM_PREFIX) else key
        if name in VLLM_DEFAULTS:
            out[name] = val
        elif strict:
            raise ConfigError(f"suffix: unknown option {key!r} (have {', '.join(VLLM_DEFAULTS)})")
    return out


def suffix_available() -> bool:
    """Whether arctic-inference (vLLM's suffix decoding library) is installed."""
    import importlib.util

    return importlib.util.find_spec("arctic_inference") is not None


def _cache_class() -> Any:
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    return SuffixDecodingCache


@dataclass
class SuffixSpeculator:
    """One arctic-inference suffix cache (one engine's worth of state) and vLLM's way of driving it."""

    max_tree_depth: int = VLLM_DEFAULTS["max_tree_depth"]
    max_cached_requests: int = VLLM_DEFAULTS["max_cached_requests"]
    max_spec_factor: float = VLLM_DEFAULTS["max_spec_factor"]
    min_token_prob: float = VLLM_DEFAULTS["min_token_prob"]
    cache: Any = field(init=False, repr=False)
    _next_id: int = field(default=0, init=False, repr=False)

    name = "suffix"

    def __post_init__(self) -> None:
        # vLLM's own checks (SpeculativeConfig._validate_suffix_decoding)
        if int(self.max_tree_depth) < 1:
            raise ConfigError(f"suffix: max_tree_depth={self.max_tree_depth} must be >= 1")
        if int(self.max_cached_requests) < 0:
            raise ConfigError(f"suffix: max_cached_requests={self.max_cached_requests} must be >= 0")
        if float(self.max_spec_factor) < 0:
            raise ConfigError(f"suffix: max_spec_factor={self.max_spec_factor} must be >= 0")
        if not 0.0 <= float(self.min_token_prob) <= 1.0:
            raise ConfigError(f"suffix: min_token_prob={self.min_token_prob} must be in [0, 1]")
        self.max_tree_depth = int(self.max_tree_depth)
        self.max_cached_requests = int(self.max_cached_requests)
        self.max_spec_factor = float(self.max_spec_factor)
        self.min_token_prob = float(self.min_token_prob)
        self.cache = _cache_class()(
            max_tree_depth=self.max_tree_depth, max_cached_requests=self.max_cached_requests
        )

    def new_id(self) -> str:
        """A request id not used before in this cache (for callers that have none)."""
        self._next_id += 1
        return f"speclab-suffix-{self._next_id}"

    # --- vLLM's per-row step (SuffixDecodingProposer.propose) --------------------------------------------
    def step(
        self,
        req_id: Hashable,
        prompt: np.ndarray | Sequence[int],
        sampled: Sequence[int],
        tokens: np.ndarray,
        k: int,
        max_model_len: int | None = None,
    ) -> list[int]:
        """One row of one engine step: `sampled` are this step's new tokens (non-empty), `tokens` the
        request's whole context including them (int32, contiguous). Returns the draft (0..k tokens)."""
        n = len(tokens)
        if max_model_len is not None and n >= max_model_len:
            return []  # at the context limit: skipped before the cache sees this step's tokens
        cache = self.cache
        if req_id not in cache.active_requests:
            if req_id in cache.cached_requests:
                cache.evict_cached_response(req_id)
            cache.start_request(req_id, _i32(prompt))
        cache.add_active_response(req_id, _i32(sampled))
        limit = k if max_model_len is None else min(k, max_model_len - n - 1)
        if limit <= 0:  # nothing to draft (k = 0: the adaptive driver feeds the cache without a lookup)
            return []
        pattern = tokens[max(0, n - self.max_tree_depth) : n]
        draft = cache.speculate(
            req_id,
            pattern,
            max_spec_tokens=limit,
            max_spec_factor=self.max_spec_factor,
            min_token_prob=self.min_token_prob,
        )
        return list(draft.token_ids)

    def stop_missing(self, seen: Iterable[Hashable]) -> None:
        """End of a step: stop every active request that was not in the batch (vLLM's order)."""
        for req_id in list(self.cache.active_requests - set(seen)):
            self.cache.stop_request(req_id)

    def forget(self, req_id: Hashable) -> None:
        """Drop a request's response from the global tree (and stop it if active)."""
        if req_id in self.cache.active_requests:
            self.cache.stop_request(req_id)
        if req_id in self.cache.cached_requests:
            self.cache.evict_cached_response(req_id)

    def remember(
        self, prompt_ids: np.ndarray | Sequence[int], output_ids: np.ndarray | Sequence[int]
    ) -> None:
        """Run a request through the cache without speculating: its response enters the global tree."""
        req_id = self.new_id()
        self.cache.start_request(req_id, _i32(prompt_ids))
        self.cache.add_active_response(req_id, _i32(output_ids))
        self.cache.stop_request(req_id)

    # --- per-position replay ------------------------------------------------------------------------------
    def replay(
        self,
        prompt_ids: np.ndarray | Sequence[int],
        output_ids: np.ndarray | Sequence[int],
        k_max: int,
        keep: bool = True,
        max_model_len: int | None = None,
        drafts: dict[int, list[int]] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Replay one request alone (as at batch 1) after the requests replayed before: the draft at every
        position p (context prompt + output[:p]), then the request is stopped; its response stays in the
        global tree if `keep`. Position 0 is prefill: its draft is the one the cache would make after the
        prompt alone (the engine never proposes there). `drafts`, if given, receives each position's draft."""
        prompt = _i32(prompt_ids)
        out = _i32(output_ids)
        n = len(out)
        full = np.concatenate([prompt, out])
        plen = len(prompt)
        acc = np.ones(n, dtype=np.int32)
        nprop = np.zeros(n, dtype=np.int32)
        if n == 0:
            return acc, nprop
        req_id = self.new_id()
        cache = self.cache
        cache.start_request(req_id, prompt)
        outl = out.tolist()
        depth = self.max_tree_depth
        for p in range(n):
            end = plen + p
            if p:
                cache.add_active_response(req_id, full[end - 1 : end])
            if max_model_len is not None and end >= max_model_len:
                continue
            limit = k_max if max_model_len is None else min(k_max, max_model_len - end - 1)
            d = cache.speculate(
                req_id,
                full[max(0, end - depth) : end],
                max_spec_tokens=limit,
                max_spec_factor=self.max_spec_factor,
                min_token_prob=self.min_token_prob,
            ).token_ids
            nprop[p] = len(d)
            acc[p] = acc_len_at(d, outl, p)
            if drafts is not None:
                drafts[p] = list(d)
        cache.add_active_response(req_id, full[-1:])  # the last token is sampled too
        cache.stop_request(req_id)
        if not keep:
            self.forget(req_id)
        return acc, nprop


def acc_len_at(draft: Sequence[int], output: Sequence[int], p: int) -> int:
    """Tokens one step at output position p produces with this draft: the drafts that match the output from
    p on (stopping at the first miss or the output's end), plus the bonus token."""
    a = 0
    for j, t in enumerate(draft):
        if p + j >= len(output) or output[p + j] != t:
            break
        a += 1
    return a + 1


def _i32(ids: np.ndarray | Sequence[int]) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(ids, dtype=np.int32).reshape(-1))
