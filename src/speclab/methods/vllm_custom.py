"""vLLM `custom_class` adapters: run speclab's own proposers live inside vLLM.

    speculative_config={"method": "custom_class",
                        "model": "speclab.methods.vllm_custom.SpeclabNgramProposer",
                        "num_speculative_tokens": K}

vLLM builds the class as `Cls(vllm_config)`, calls `load_model(target)` once and then, every step,
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`, expecting one list of
0..K draft ids per running row. vLLM resets prompt_lookup_min/max to 0 for this method and takes no extra
keys, so proposer options come from the environment variable SPECLAB_PROPOSER_OPTIONS (JSON), e.g.
'{"min_n": 3, "max_n": 7}' (ngram) or '{"use_global": false, "max_match": 12}' (suffix).

The adapters call the same `propose`/`speculate` code the replay uses (speclab.methods.ngram/suffix), so a
replayed trace and a live run cannot drift apart; `speclab trace crosscheck` checks it on real runs.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np

from speclab.methods.catalog import NGRAM_MAX_N, NGRAM_MIN_N
from speclab.methods.ngram import NgramProposer
from speclab.methods.suffix import SuffixRequest, SuffixSpeculator

OPTIONS_ENV = "SPECLAB_PROPOSER_OPTIONS"


def _options(method: str) -> dict[str, Any]:
    """Options for `method` from SPECLAB_PROPOSER_OPTIONS: either flat ({"min_n": 3}) or per method
    ({"ngram": {"min_n": 3}, "suffix": {"max_match": 8}})."""
    raw = os.environ.get(OPTIONS_ENV, "").strip()
    opts = json.loads(raw) if raw else {}
    if not isinstance(opts, dict):
        raise ValueError(f"{OPTIONS_ENV} must be a JSON object")
    return _for_method(opts, method)


def _for_method(opts: dict[str, Any], method: str) -> dict[str, Any]:
    if any(k in opts for k in ("ngram", "suffix")):
        opts = opts.get(method) or {}
    return dict(opts)


def adapter_options(engine_options: dict[str, Any]) -> dict[str, Any]:
    """The options a custom_class engine ran with. For one of speclab's adapters (model
    "speclab.methods.vllm_custom.<Class>") its proposer_options, resolved as the adapter resolves
    SPECLAB_PROPOSER_OPTIONS, are merged in at the top level; anything else is returned as given."""
    module, _, cls_name = str(engine_options.get("model", "")).rpartition(".")
    cls = globals().get(cls_name) if module == __name__ else None
    popts = engine_options.get("proposer_options")
    if not (isinstance(cls, type) and issubclass(cls, _Base) and isinstance(popts, dict)):
        return dict(engine_options)
    rest = {k: v for k, v in engine_options.items() if k != "proposer_options"}
    return {**rest, **_for_method(popts, cls.method)}


class _Base:
    method = ""

    def __init__(self, vllm_config: Any) -> None:
        sc = vllm_config.speculative_config
        self.k = int(sc.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.options = _options(self.method)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        # No model: the CPU runner calls this unconditionally.
        pass


class SpeclabNgramProposer(_Base):
    """vLLM's n-gram rules, computed by speclab.methods.ngram (same skip rules as the built-in)."""

    method = "ngram"

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        self.proposer = NgramProposer(
            min_n=int(self.options.get("min_n", NGRAM_MIN_N)),
            max_n=int(self.options.get("max_n", NGRAM_MAX_N)),
            max_model_len=self.max_model_len,
        )

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
        **_: Any,
    ) -> list[list[int]]:
        out: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            if not len(sampled) or n >= self.max_model_len:
                out.append([])  # partial prefill, or already at max_model_len (as the built-in)
                continue
            out.append(self.proposer.propose(token_ids_cpu[i, :n], self.k).tolist())
        return out


def _ctx_key(ids: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(ids, dtype=np.int32).tobytes(), digest_size=16).digest()


class SpeclabSuffixProposer(_Base):
    """speclab's suffix speculation. No request ids are passed to custom proposers and rows are compacted,
    so each request's state is found by a hash of the context it had at the previous step. A state not
    continued in a step is treated as finished (its output then enters the global trie). Defaults to
    use_global=false: with a global trie, live results depend on the order requests finish in."""

    method = "suffix"

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        opts = {"use_global": False, **self.options}
        self.spec = SuffixSpeculator(**opts)
        self.states: dict[bytes, SuffixRequest] = {}

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
        **_: Any,
    ) -> list[list[int]]:
        out: list[list[int]] = []
        new_states: dict[bytes, SuffixRequest] = {}
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            m = len(sampled)
            if not m:
                out.append([])
                continue
            row = token_ids_cpu[i, :n]
            st = self.states.pop(_ctx_key(row[: n - m]), None)
            if st is None:
                # first step after prefill: the prompt is everything before this step's tokens
                st = self.spec.start_request(row[: n - m].tolist())
            self.spec.extend(st, [int(t) for t in sampled])
            new_states[_ctx_key(row)] = st
            if n >= self.max_model_len:
                out.append([])
                continue
            k = min(self.k, self.max_model_len - n)
            out.append(self.spec.speculate(st, k))
        for st in self.states.values():  # not continued: finished
            self.spec.finish_request(st)
        self.states = new_states
        return out
