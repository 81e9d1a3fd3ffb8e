"""vLLM `custom_class` adapters: run speclab's own proposers live inside vLLM.

    speculative_config={"method": "custom_class",
                        "model": "speclab.methods.vllm_custom.SpeclabNgramProposer",
                        "num_speculative_tokens": K}

vLLM builds the class as `Cls(vllm_config)`, calls `load_model(target)` once and then, every step,
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`, expecting one list of
0..K draft ids per running row. vLLM resets prompt_lookup_min/max to 0 for this method and takes no extra
keys, so proposer options come from the environment variable SPECLAB_PROPOSER_OPTIONS (JSON), e.g.
'{"min_n": 3, "max_n": 7}' (ngram) or '{"max_tree_depth": 24, "max_cached_requests": 0}' (suffix).

The adapters call the same code the replay uses (speclab.methods.ngram `propose`, speclab.methods.suffix
`SuffixSpeculator.step`, itself arctic-inference's cache as vLLM's built-in `suffix` runs it), so a replayed
trace and a live run cannot drift apart; `speclab trace crosscheck` checks it on real runs.

The adaptive proposer, which chooses per step among these proposers, is speclab.live.vllm_custom's
`SpeclabAdaptiveProposer`.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np

from speclab.catalog import NGRAM_MAX_N, NGRAM_MIN_N
from speclab.methods.ngram import NgramProposer, vllm_ngram_kernel
from speclab.methods.suffix import SuffixSpeculator, suffix_options

OPTIONS_ENV = "SPECLAB_PROPOSER_OPTIONS"


def _options(method: str) -> dict[str, Any]:
    """Options for `method` from SPECLAB_PROPOSER_OPTIONS: either flat ({"min_n": 3}) or per method
    ({"ngram": {"min_n": 3}, "suffix": {"max_tree_depth": 16}})."""
    raw = os.environ.get(OPTIONS_ENV, "").strip()
    opts = json.loads(raw) if raw else {}
    if not isinstance(opts, dict):
        raise ValueError(f"{OPTIONS_ENV} must be a JSON object")
    return _for_method(opts, method)


def _for_method(opts: dict[str, Any], method: str) -> dict[str, Any]:
    if method == "adaptive":  # its options hold per-proposer tables of their own ("ngram", "suffix")
        return dict(opts.get("adaptive", opts))
    if any(k in opts for k in ("ngram", "suffix")):
        opts = opts.get(method) or {}
    return dict(opts)


class _Base:
    method = ""

    def __init__(self, vllm_config: Any, options: dict[str, Any] | None = None, k: int | None = None) -> None:
        """`options` / `k`: given by a caller that builds the adapter itself (default: the environment's
        options, the engine's num_speculative_tokens)."""
        sc = vllm_config.speculative_config
        self.k = int(sc.num_speculative_tokens) if k is None else int(k)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.options = _options(self.method) if options is None else dict(options)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        # No model: the CPU runner calls this unconditionally.
        pass

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
        **_: Any,
    ) -> list[list[int]]:
        """vLLM's call every step: one list of 0..k draft ids per running row."""
        return self.drafts(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)

    def drafts(
        self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray
    ) -> list[list[int]]:
        """The drafts per row from each row's newly sampled tokens, its context length and token ids."""
        raise NotImplementedError


class SpeclabNgramProposer(_Base):
    """vLLM's n-gram rules, computed by speclab.methods.ngram (same skip rules as the built-in)."""

    method = "ngram"

    def __init__(self, vllm_config: Any, options: dict[str, Any] | None = None, k: int | None = None) -> None:
        super().__init__(vllm_config, options, k)
        bad = sorted(set(self.options) - {"min_n", "max_n", "impl"})
        if bad:
            raise ValueError(f"{OPTIONS_ENV}: unknown ngram option(s) {bad} (have min_n, max_n, impl)")
        self.min_n = int(self.options.get("min_n", NGRAM_MIN_N))
        self.max_n = int(self.options.get("max_n", NGRAM_MAX_N))
        self.proposer = NgramProposer(min_n=self.min_n, max_n=self.max_n, max_model_len=self.max_model_len)
        # impl "vllm": vLLM's own compiled lookup (the same rule, microseconds per row; what the built-in
        # n-gram costs); "speclab" (default): speclab's
        # restatement, which is what `speclab trace crosscheck` checks against the built-in
        impl = self.options.get("impl", "speclab")
        if impl not in ("speclab", "vllm"):
            raise ValueError(f"{OPTIONS_ENV}: ngram impl must be 'speclab' or 'vllm', got {impl!r}")
        self.kernel = None
        if impl == "vllm":
            self.kernel = vllm_ngram_kernel()
            if self.kernel is None:
                raise ValueError(f"{OPTIONS_ENV}: ngram impl 'vllm' needs an importable vLLM")

    def drafts(
        self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray
    ) -> list[list[int]]:
        out: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            if not len(sampled) or n >= self.max_model_len:
                out.append([])  # partial prefill, or already at max_model_len (as the built-in)
                continue
            if self.kernel is not None:
                ctx = np.ascontiguousarray(token_ids_cpu[i, :n], dtype=np.int32)
                out.append(self.kernel(ctx, self.min_n, self.max_n, self.max_model_len, self.k).tolist())
            else:
                out.append(self.proposer.propose(token_ids_cpu[i, :n], self.k).tolist())
        return out


def _ctx_key(ids: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(ids, dtype=np.int32).tobytes(), digest_size=16).digest()


class SpeclabSuffixProposer(_Base):
    """vLLM's suffix decoding (arctic-inference's cache, driven by SuffixSpeculator.step exactly as vLLM's
    built-in `suffix` method drives it; options and defaults are its suffix_decoding_* fields, with or
    without that prefix). No request ids are passed to custom proposers and rows are compacted, so each
    request is recognised by a hash of the context it had at the previous step and given an id of its own;
    a request not continued in a step is stopped, as the built-in stops requests that left the batch."""

    method = "suffix"

    def __init__(self, vllm_config: Any, options: dict[str, Any] | None = None, k: int | None = None) -> None:
        super().__init__(vllm_config, options, k)
        self.spec = SuffixSpeculator(**suffix_options(self.options, strict=True))
        # context hash after the last step -> request ids (a list: replicated copies share contexts)
        self.ids: dict[bytes, list[str]] = {}

    def drafts(
        self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray
    ) -> list[list[int]]:
        out: list[list[int]] = []
        ids: dict[bytes, list[str]] = {}
        seen: list[str] = []
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            m = len(sampled)
            if not m:
                out.append([])  # partial prefill (not started yet, as in the built-in)
                continue
            row = np.ascontiguousarray(token_ids_cpu[i, :n], dtype=np.int32)
            prev = self.ids.get(_ctx_key(row[: n - m]))
            # no earlier context: the first step after prefill (the prompt is all before this step's tokens)
            rid = prev.pop(0) if prev else self.spec.new_id()
            ids.setdefault(_ctx_key(row), []).append(rid)
            seen.append(rid)
            out.append(self.spec.step(rid, row[: n - m], sampled, row, self.k, self.max_model_len))
        self.spec.stop_missing(seen)
        self.ids = ids
        return out
