"""The live adaptive proposer as a vLLM `custom_class` proposer:

    speculative_config={"method": "custom_class",
                        "model": "speclab.live.vllm_custom.SpeclabAdaptiveProposer",
                        "num_speculative_tokens": K}

with its options in the environment variable SPECLAB_PROPOSER_OPTIONS (JSON; vLLM passes a custom class no
extra keys), e.g. '{"methods": ["ngram", "suffix"], "policy": "adaptive", "kmax": 8,
"cost_model": "smollm2-135m-cpu-live", "ngram": {...}, "suffix": {...}}' (all optional; without `methods` /
`policy` it runs the n-gram probe only with `adaptive-pooled`). In a `speclab bench` sweep they are the
entry's `proposer_options` (docs/adaptive.md). The model-free adapters it builds on:
speclab.methods.vllm_custom.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from speclab.live.driver import (
    DEFAULT_COST_MODEL,
    ENGINE_DEFAULT_METHODS,
    ENGINE_DEFAULT_POLICY,
    AdaptiveDriver,
)
from speclab.methods import vllm_custom as model_free
from speclab.methods.vllm_custom import OPTIONS_ENV, _Base, _for_method

ADAPTIVE_KEYS = ("methods", "kmax", "cost_model", "policy", "ngram", "suffix")


def adapter_options(engine_options: dict[str, Any]) -> dict[str, Any]:
    """The options a custom_class engine ran with. For one of speclab's adapters (model
    "speclab.methods.vllm_custom.<Class>" or "speclab.live.vllm_custom.<Class>") its proposer_options,
    resolved as the adapter resolves SPECLAB_PROPOSER_OPTIONS, are merged in at the top level; anything else
    is returned as given."""
    module, _, cls_name = str(engine_options.get("model", "")).rpartition(".")
    home = {__name__: sys.modules[__name__], model_free.__name__: model_free}.get(module)
    cls = getattr(home, cls_name, None) if home is not None else None
    popts = engine_options.get("proposer_options")
    if not (isinstance(cls, type) and issubclass(cls, _Base) and isinstance(popts, dict)):
        return dict(engine_options)
    rest = {k: v for k, v in engine_options.items() if k != "proposer_options"}
    return {**rest, **_for_method(popts, cls.method)}


class SpeclabAdaptiveProposer(_Base):
    """An adaptive policy live: per step and row, n-gram or suffix drafts (speclab's code for both) or
    none, and how many, from each request's hindsight, the proposers' current offers and the live batch
    (speclab.live.driver). KMAX = the engine's num_speculative_tokens unless `kmax` is smaller.
    Default: the n-gram probe only, `adaptive-pooled` (speclab.live.driver.ENGINE_DEFAULT_*)."""

    method = "adaptive"

    def __init__(self, vllm_config: Any, options: dict[str, Any] | None = None, k: int | None = None) -> None:
        super().__init__(vllm_config, options, k)
        o = self.options
        bad = sorted(set(o) - set(ADAPTIVE_KEYS))
        if bad:
            raise ValueError(f"{OPTIONS_ENV}: unknown adaptive option(s) {bad} (have {list(ADAPTIVE_KEYS)})")
        kmax = int(o.get("kmax", self.k))
        if not 1 <= kmax <= self.k:
            raise ValueError(f"{OPTIONS_ENV}: kmax={kmax} must lie in 1..num_speculative_tokens ({self.k})")
        self.driver = AdaptiveDriver(
            kmax=kmax,
            max_model_len=self.max_model_len,
            methods=tuple(o.get("methods", ENGINE_DEFAULT_METHODS)),
            cost_model=str(o.get("cost_model", DEFAULT_COST_MODEL)),
            policy=str(o.get("policy", ENGINE_DEFAULT_POLICY)),
            ngram=o.get("ngram"),
            suffix=o.get("suffix"),
        )

    def drafts(
        self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray
    ) -> list[list[int]]:
        return self.driver.step(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
