"""Model checkpoints: presets, local preparation (GGUF -> HF, layer-truncated drafters), resolution."""

from speclab.models.prepare import (
    cache_root,
    check_same_tokenizer,
    is_prepared,
    list_models,
    prepare_model,
    prepared_path,
    resolve_model,
)
from speclab.models.presets import ModelPreset, drafter_for, get_preset, presets

__all__ = [
    "ModelPreset",
    "cache_root",
    "check_same_tokenizer",
    "drafter_for",
    "get_preset",
    "is_prepared",
    "list_models",
    "prepare_model",
    "prepared_path",
    "presets",
    "resolve_model",
]
