"""The vLLM engine settings of a job's EngineSpec: the target and drafter as local paths (checked before any
model loads) and the keyword arguments of `vllm.LLM`, speculative_config included (docs/bench.md: engine
settings). Pure functions, no vLLM import: the worker (speclab.engine.worker) builds its engine from them.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from speclab.catalog import ADAPTIVE_DRAFTERS, DRAFTER_CHECKPOINT_METHODS, SAME_TOKENIZER_METHODS
from speclab.engine import cpu_sampling
from speclab.engine.protocol import EngineSpec
from speclab.errors import SpeclabError
from speclab.models import check_same_tokenizer, resolve_model


def resolve_paths(spec: EngineSpec) -> tuple[str, str | None]:
    """Target and drafter as local paths (or hub ids), checked before any model loads."""
    target = str(resolve_model(spec.target, spec.dtype if spec.dtype != "float16" else "float32"))
    drafter: str | None = None
    if spec.method in DRAFTER_CHECKPOINT_METHODS:
        drafter = str(
            resolve_model(spec.options["model"], spec.dtype if spec.dtype != "float16" else "float32")
        )
        if spec.method in SAME_TOKENIZER_METHODS or (Path(drafter) / "tokenizer.json").is_file():
            check_same_tokenizer(target, drafter)
    elif spec.method == "suffix":
        if importlib.util.find_spec("arctic_inference") is None:
            raise SpeclabError(
                "method suffix needs the arctic-inference package: pip install arctic-inference "
                "(builds from source in ~1.5 min; scripts/setup.sh installs it)"
            )
    elif spec.method == "custom_class":
        dotted = str(spec.options["model"])
        mod_name, _, cls_name = dotted.rpartition(".")
        try:
            cls = getattr(importlib.import_module(mod_name), cls_name) if mod_name else None
        except ImportError as exc:
            raise SpeclabError(f"custom_class {dotted}: cannot import {mod_name}: {exc}") from None
        except AttributeError:
            cls = None
        if cls is None:
            raise SpeclabError(
                f"custom_class {dotted}: no class {cls_name!r} (need package.module.ClassName)"
            )
    return target, drafter


def speculative_config(spec: EngineSpec, drafter: str | None) -> dict[str, Any] | None:
    if spec.method == "none":
        return None
    cfg: dict[str, Any] = {k: v for k, v in spec.options.items() if k not in ("model", "proposer_options")}
    cfg["method"] = spec.method
    cfg["num_speculative_tokens"] = spec.k
    if drafter is not None:
        cfg["model"] = drafter
    elif spec.method == "custom_class":
        cfg["model"] = spec.options["model"]
    return cfg


def adaptive_model_drafter(spec: EngineSpec) -> bool:
    """A model drafter with proposer_options: the live adaptive proposer chooses per row between the
    engine's drafter and the lookups (speclab.live.vllm_eagle)."""
    return spec.method in ADAPTIVE_DRAFTERS and spec.options.get("proposer_options") is not None


def llm_kwargs(spec: EngineSpec, target: str, drafter: str | None) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "model": target,
        "dtype": spec.dtype,
        "seed": spec.seed,
        "max_model_len": spec.max_model_len,
        "max_num_seqs": spec.max_num_seqs,
        "enforce_eager": spec.enforce_eager,
        "enable_prefix_caching": False,
        "disable_log_stats": False,
        "async_scheduling": False,
        "distributed_executor_backend": "uni",
    }
    if not float(spec.kv_cache_gib).is_integer():
        # vLLM's CPU build reads VLLM_CPU_KVCACHE_SPACE as a whole number of GiB (int("0.5") fails at start-up);
        # a fractional size goes through the engine argument it sets instead (see engine.launch.kv_cache_env)
        kw["kv_cache_memory_bytes"] = int(spec.kv_cache_gib * 2**30)
    kw.update(cpu_sampling.engine_kwargs())  # sampled SD on the CPU build: speclab.engine.cpu_sampling
    if adaptive_model_drafter(spec):  # the live adaptive proposer over the model drafter (live.vllm_eagle)
        kw["worker_extension_cls"] = cpu_sampling.ADAPTIVE_EXTENSION
    sc = speculative_config(spec, drafter)
    if sc is not None:
        kw["speculative_config"] = sc
        kw["per_request_spec_decode_metrics"] = "detailed"
    kw.update(spec.llm_kwargs)
    if int(kw.get("tensor_parallel_size", 1)) > 1 and "distributed_executor_backend" not in spec.llm_kwargs:
        kw.pop("distributed_executor_backend")  # tensor parallel needs vLLM's multiprocess executor
    return kw
