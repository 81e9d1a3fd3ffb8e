"""Facts about the speculative-decoding methods, in one place: everything that asks "which methods ..." reads
this module (the job protocol, the sweep parser and preflight, the worker, the runner's ETA, the cost-model
fit, the analysis, the demo). Plain data and no imports beyond the standard library, so it is cheap anywhere.

Two kinds of method name:
- engine methods: what a sweep or a job names and vLLM's speculative_config takes (`ENGINE_METHODS`);
- trace methods: what a trace store carries (CONTRACTS.md section 1): the engine name, except that `none` has
  no trace and a `custom_class` proposer appears as `custom:<ClassName>` (`trace_method_name`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MethodFacts:
    name: str
    # how drafts are made: "none" (no SD), "lookup" (model-free: match the context, cost modelled as a share
    # of the verify time), "model" (a neural drafter with its own weights), "custom" (a class named by path)
    drafter: str
    # what option "model" names: None (no model), "checkpoint" (a draft model sharing the target's
    # tokenizer), "head" (an EAGLE head: its own checkpoint, a tokenizer is optional), "class" (a dotted
    # Python class path, package.module.ClassName)
    model_option: str | None = None
    replay: bool = False  # speclab has a replay proposer (speclab.methods.make_proposer)


CATALOG: dict[str, MethodFacts] = {
    f.name: f
    for f in (
        MethodFacts("none", "none"),
        MethodFacts("ngram", "lookup", replay=True),
        MethodFacts("suffix", "lookup", replay=True),
        MethodFacts("draft_model", "model", "checkpoint", replay=True),
        MethodFacts("eagle", "model", "head", replay=True),
        MethodFacts("eagle3", "model", "head", replay=True),
        # parallel drafting: one draft forward proposes all k tokens (a DFlash drafter in speculators' layout)
        MethodFacts("dflash", "model", "head"),
        MethodFacts("mtp", "model"),  # the target's own multi-token-prediction layers: no option needed
        MethodFacts("custom_class", "custom", "class"),
    )
}

ENGINE_METHODS: tuple[str, ...] = tuple(CATALOG)
# methods whose options must name a drafter or a class ("model")
METHODS_NEEDING_MODEL: tuple[str, ...] = tuple(n for n, f in CATALOG.items() if f.model_option)
# methods whose "model" is a drafter checkpoint the worker resolves to a local path
DRAFTER_CHECKPOINT_METHODS: tuple[str, ...] = tuple(
    n for n, f in CATALOG.items() if f.model_option in ("checkpoint", "head")
)
# methods whose drafter must share the target's tokenizer (checked before an engine starts)
SAME_TOKENIZER_METHODS: tuple[str, ...] = tuple(
    n for n, f in CATALOG.items() if f.model_option == "checkpoint"
)
MODEL_FREE: tuple[str, ...] = tuple(n for n, f in CATALOG.items() if f.drafter == "lookup")
MODEL_BASED: tuple[str, ...] = tuple(n for n, f in CATALOG.items() if f.drafter == "model")
# engine drafters the live adaptive proposer can choose per row against the lookups (speclab.live.vllm_eagle)
ADAPTIVE_DRAFTERS: tuple[str, ...] = ("eagle3",)
ADAPTIVE_EAGLE_TRACE = "custom:SpeclabAdaptiveEagle"
# trace names of the built-in methods (a custom proposer adds custom:<name>)
TRACE_METHODS: tuple[str, ...] = tuple(n for n, f in CATALOG.items() if f.drafter in ("lookup", "model"))
REPLAY_METHODS: tuple[str, ...] = tuple(n for n, f in CATALOG.items() if f.replay)

# speclab's n-gram defaults (prompt_lookup_min / max) for replay and its custom_class adapter
NGRAM_MIN_N = 3
NGRAM_MAX_N = 7


def trace_method_name(method: str, options: dict[str, Any]) -> str:
    """The trace method name of an engine method: custom_class runs appear as custom:<ClassName>, the live
    adaptive proposer over an engine drafter (proposer_options) as custom:SpeclabAdaptiveEagle (its drafts
    are not the drafter's)."""
    if method in ADAPTIVE_DRAFTERS and options.get("proposer_options") is not None:
        return ADAPTIVE_EAGLE_TRACE
    if method == "custom_class":
        return "custom:" + str(options.get("model", "custom")).rsplit(".", 1)[-1]
    return method
