"""The adaptive proposer with a model-based drafter: vLLM's own EAGLE-3 drafter and the model-free probes,
chosen per step and per request by the simulator's `adaptive` rule (issue 12 item 4).

A `custom_class` proposer gets no target hidden states, so it cannot run an EAGLE head. Here the engine
runs its built-in `eagle3` drafter as usual and speclab wraps the model runner's
`propose_draft_token_ids` (an instance attribute, as speclab.engine.instrument does; the engine runs in
the bench worker's process): at each step the `AdaptiveDriver` decides first, from the probes' offers
and hindsight, each request's recent EAGLE acceptance and the live batch, which rows take EAGLE's drafts,
which take n-gram's or suffix's, and which none, and how many; then vLLM's EAGLE runs with P chained passes,
P = the most EAGLE drafts any row chose; each row then gets its chosen draft. At P = 0 the drafter is not
run at all (default): vLLM's EAGLE could run its forward over the step's verified tokens alone (its
dynamic-k support, `catch_up = true`), which keeps the head's KV cache complete, but on this CPU that forward
costs ~3 ms per step at B = 1, about as much as a pass; skipped, the head's KV cache misses those positions,
which can only lower its acceptance where it is used again (outputs stay exact: the target verifies).

Requirements, checked at install: method `eagle3` (or another drafter vLLM runs inside the runner's EAGLE
path), `disable_padded_drafter_batch = true` (so the drafter runs after the step's bookkeeping, on the
CPU-side token lists the driver reads, and per-request draft counts may differ), and
num_speculative_tokens = the most drafts any method may give (the probes' kmax).

Options (the engine's `proposer_options`): `methods` (model-free probes, default ["ngram", "suffix"]),
`kmax` (probes, <= k), `kmax_model` (EAGLE passes, default 3), `catch_up` (run the head's forward at
P = 0 too, default false), `plain_sampling` (steps where no row drafts skip vLLM's rejection sampler,
default true: `_sample_plainly_without_drafts`), `cost_model` (must price the drafter, form
`chained`; default smollm2-135m-cpu-live), `policy`, `ngram`, `suffix` as for SpeclabAdaptiveProposer.
"""

from __future__ import annotations

from typing import Any

from speclab.errors import ConfigError
from speclab.methods.catalog import HYBRID_METHODS

HYBRID_KEYS = (
    "methods", "kmax", "kmax_model", "cost_model", "policy", "ngram", "suffix", "catch_up", "plain_sampling",
)  # fmt: skip


def install(runner: Any, options: dict[str, Any]) -> Any:
    """Wrap `runner.propose_draft_token_ids` with the adaptive driver; returns the driver."""
    from speclab.methods.adaptive_live import DEFAULT_COST_MODEL, LIVE_METHODS, AdaptiveDriver

    sc = runner.speculative_config
    if sc is None or sc.method not in HYBRID_METHODS:
        raise ConfigError(
            f"hybrid adaptive proposer: needs the engine's method to be one of {', '.join(HYBRID_METHODS)}, "
            f"got {getattr(sc, 'method', None)!r}"
        )
    if not sc.disable_padded_drafter_batch:
        raise ConfigError(
            "hybrid adaptive proposer: set disable_padded_drafter_batch = true in the speculative config "
            "(the drafter must run after the step's bookkeeping, with per-request draft counts)"
        )
    options = dict(options)
    catch_up = bool(options.pop("catch_up", False))
    plain_sampling = bool(options.pop("plain_sampling", True))
    bad = sorted(set(options) - set(HYBRID_KEYS))
    if bad:
        raise ConfigError(f"hybrid adaptive proposer: unknown option(s) {bad} (have {list(HYBRID_KEYS)})")
    k = int(sc.num_speculative_tokens)
    kmax = int(options.get("kmax", k))
    if not 1 <= kmax <= k:
        raise ConfigError(
            f"hybrid adaptive proposer: kmax={kmax} must lie in 1..num_speculative_tokens ({k})"
        )
    probes = tuple(options.get("methods", LIVE_METHODS))
    driver = AdaptiveDriver(
        kmax=kmax,
        max_model_len=int(runner.model_config.max_model_len),
        methods=(*probes, sc.method),
        cost_model=str(options.get("cost_model", DEFAULT_COST_MODEL)),
        policy=str(options.get("policy", "adaptive")),
        ngram=options.get("ngram"),
        suffix=options.get("suffix"),
        model_drafter=True,
        kmax_model=min(int(options.get("kmax_model", 3)), k),
    )
    orig = runner.propose_draft_token_ids

    def propose_draft_token_ids(
        scheduler_output: Any, sampled_token_ids: Any, *args: Any, **kwargs: Any
    ) -> Any:
        if not isinstance(sampled_token_ids, list):  # padded path: refused at install, so not reached
            raise RuntimeError("hybrid adaptive proposer: expected the CPU-side sampled token lists")
        batch = runner.input_batch

        def draft_model(passes: int) -> list[list[int]]:
            if passes == 0 and not catch_up:
                # no row drafts from the head: skip vLLM's drafter (its catch-up forward alone costs ~3 ms
                # per step at B = 1 here, as much as a pass); the head's KV cache misses these positions
                return [[] for _ in sampled_token_ids]
            saved = scheduler_output.num_spec_tokens_to_schedule
            scheduler_output.num_spec_tokens_to_schedule = passes
            try:
                drafts = orig(scheduler_output, sampled_token_ids, *args, **kwargs)
            finally:
                scheduler_output.num_spec_tokens_to_schedule = saved
            return drafts.tolist() if hasattr(drafts, "tolist") else list(drafts)

        return driver.step(sampled_token_ids, batch.num_tokens_no_spec, batch.token_ids_cpu, draft_model)

    runner.propose_draft_token_ids = propose_draft_token_ids
    driver.plain_steps = 0  # steps sampled without the rejection sampler (logged per cell by the worker)
    if plain_sampling:
        _sample_plainly_without_drafts(runner, driver)
    return driver


def _sample_plainly_without_drafts(runner: Any, driver: Any) -> None:
    """A step in which no row has drafts is sampled by vLLM's plain sampler, as a no-SD engine samples it.

    With a speculative config, vLLM 0.32's runner builds spec-decode metadata for every step and sends it
    through the rejection sampler even when every row's draft count is 0 (`_prepare_input_ids` /
    `_sample` in v1/worker/gpu_model_runner.py); on this CPU that costs ~0.8 ms per step at B = 16
    (benchmarks/sd_path_split.py, docs/adaptive.md), paid at every step where the hybrid has switched
    itself off. With no drafts the rejection sampler samples each row's one (bonus)
    position with the same sampler, so the tokens are the same (the bench checks token-exactness); its
    output then has one column, which the runner's bookkeeping reads as a no-SD step. Steps with drafts
    are untouched."""
    orig = runner._sample

    def _sample(logits: Any, spec_decode_metadata: Any) -> Any:
        if spec_decode_metadata is not None and not any(spec_decode_metadata.num_draft_tokens):
            spec_decode_metadata = None
            driver.plain_steps += 1
        return orig(logits, spec_decode_metadata)

    runner._sample = _sample
