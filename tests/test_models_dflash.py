"""speclab.models.dflash: the DFlash cost probe's checkpoint layout (config and tensors as speculators writes
them), what vLLM's speculators config reader makes of it, seeded determinism, and the presets and method
entry that name it. A tiny random Llama stands in for the target; no engine runs here
(tests/test_drafters_dflash_engine.py runs the real probe in vLLM)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from helpers import tiny_llama

pytest.importorskip("transformers")

from speclab.errors import ConfigError  # noqa: E402
from speclab.models.dflash import DFlashProbe, build_probe  # noqa: E402

VOCAB = 50
AUX = (0, 1)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("target")
    model = tiny_llama(0, vocab=VOCAB)
    model.config.tie_word_embeddings = True
    model.save_pretrained(str(d))
    special = [(0, "<unk>"), (1, "<s>"), (2, "</s>"), (5, "<spare>"), (4, "<other>")]
    tokens = [{"id": i, "content": c, "special": True} for i, c in special]
    tokens.append({"id": 9, "content": "plain", "special": False})
    (d / "tokenizer.json").write_text(json.dumps({"added_tokens": tokens}))
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(bos_token_id=1, eos_token_id=2, unk_token_id=0)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _load(d):
    from safetensors.torch import load_file

    return json.loads((d / "config.json").read_text()), load_file(str(d / "model.safetensors"))


def test_reduced_vocabulary_layout(target_dir, tmp_path) -> None:
    import torch
    from safetensors.torch import load_file

    build_probe(target_dir, DFlashProbe(layers=2, draft_vocab=20, aux_layers=AUX, seed=1), tmp_path)
    cfg, st = _load(tmp_path)
    assert cfg["speculators_model_type"] == "dflash" and cfg["draft_vocab_size"] == 20
    assert cfg["aux_hidden_state_layer_ids"] == list(AUX) and cfg["target_hidden_size"] == 32
    assert cfg["mask_token_id"] == 5  # highest special token that is not unk/bos/eos
    assert cfg["sliding_window_non_causal"] is True and cfg["sample_from_anchor"] is False
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == cfg["block_size"] - 1
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == str(target_dir)
    lc = cfg["transformer_layer_config"]
    assert lc["model_type"] == "qwen3" and lc["num_hidden_layers"] == 2 and lc["head_dim"] == 8
    assert lc["num_attention_heads"] == 4 and lc["num_key_value_heads"] == 2 and lc["vocab_size"] == VOCAB
    per_layer = {
        "input_layernorm.weight": (32,),
        "self_attn.q_proj.weight": (32, 32),
        "self_attn.k_proj.weight": (16, 32),
        "self_attn.v_proj.weight": (16, 32),
        "self_attn.o_proj.weight": (32, 32),
        "self_attn.q_norm.weight": (8,),
        "self_attn.k_norm.weight": (8,),
        "post_attention_layernorm.weight": (32,),
        "mlp.gate_proj.weight": (64, 32),
        "mlp.up_proj.weight": (64, 32),
        "mlp.down_proj.weight": (32, 64),
    }
    want = {f"layers.{i}.{k}": v for i in range(2) for k, v in per_layer.items()}
    want |= {
        "fc.weight": (32, 64),  # [H, n_aux * H]
        "hidden_norm.weight": (32,),
        "norm.weight": (32,),
        "lm_head.weight": (20, 32),
        "d2t": (20,),
        "t2d": (VOCAB,),
    }
    assert {k: tuple(v.shape) for k, v in st.items()} == want
    assert "embed_tokens.weight" not in st  # vLLM shares the target's embedding (mask token included)
    ids = torch.arange(20) + st["d2t"]
    assert torch.equal(ids, torch.arange(20)) and st["t2d"].sum() == 20 and st["t2d"][ids].all()
    emb = load_file(str(target_dir / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(st["lm_head.weight"], emb[:20])  # the target's (tied) head rows of the draft ids


def test_full_vocabulary_ships_no_head(target_dir, tmp_path) -> None:
    build_probe(target_dir, DFlashProbe(draft_vocab=0, aux_layers=AUX, mask_token_id=4), tmp_path)
    cfg, st = _load(tmp_path)
    assert cfg["draft_vocab_size"] == VOCAB and cfg["mask_token_id"] == 4
    assert not {"lm_head.weight", "d2t", "t2d"} & set(st)  # vLLM shares the target's lm_head


def test_seeded(target_dir, tmp_path) -> None:
    import torch

    runs = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        build_probe(target_dir, DFlashProbe(aux_layers=AUX, draft_vocab=10, seed=seed), tmp_path / name)
        runs[name] = _load(tmp_path / name)[1]
    assert all(torch.equal(runs["a"][k], runs["b"][k]) for k in runs["a"])
    assert not torch.equal(runs["a"]["fc.weight"], runs["c"]["fc.weight"])


def test_bad_input(target_dir, tmp_path) -> None:
    with pytest.raises(ConfigError, match="exceeds the target's vocabulary"):
        build_probe(target_dir, DFlashProbe(aux_layers=AUX, draft_vocab=VOCAB + 1), tmp_path / "a")
    with pytest.raises(ConfigError, match="mask_token_id 50 outside"):
        build_probe(
            target_dir, DFlashProbe(aux_layers=AUX, draft_vocab=0, mask_token_id=VOCAB), tmp_path / "b"
        )
    with pytest.raises(ConfigError, match="unknown field"):
        DFlashProbe.from_table({"layer": 2}, "here")
    with pytest.raises(ConfigError, match="layers >= 1"):
        DFlashProbe.from_table({"layers": 0}, "here")
    assert DFlashProbe.from_table({"aux_layers": [1, 2]}, "here").aux_layers == (1, 2)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
def test_vllm_reads_it_as_a_non_causal_dflash_drafter(target_dir, tmp_path) -> None:
    from vllm.model_executor.models.qwen3_dflash import dflash_has_any_non_causal
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    build_probe(target_dir, DFlashProbe(layers=2, aux_layers=AUX, draft_vocab=20), tmp_path)
    hf = SpeculatorsConfig.from_pretrained(str(tmp_path))
    assert hf.architectures == ["DFlashDraftModel"] and hf.draft_vocab_size == 20
    assert hf.num_hidden_layers == 2 and hf.hidden_size == 32
    assert hf.eagle_aux_hidden_state_layer_ids == list(AUX)
    assert hf.dflash_config["target_layer_ids"] == [a - 1 for a in AUX]
    assert hf.dflash_config["mask_token_id"] == 5 and hf.dflash_config["causal"] is False
    assert dflash_has_any_non_causal(hf)  # the block attends both ways, as DFlash is trained


def test_presets_and_method() -> None:
    from speclab.bench.spec import load_preset
    from speclab.catalog import DRAFTER_CHECKPOINT_METHODS, MODEL_BASED
    from speclab.models import get_preset

    assert "dflash" in DRAFTER_CHECKPOINT_METHODS and "dflash" in MODEL_BASED
    for name, vocab in (("smollm2-135m-dflash-probe", 8192),):
        p = get_preset(name)
        assert p.role == "dflash" and p.buildable and p.dtypes == ("float32",)
        assert DFlashProbe.from_table(p.probe, name).draft_vocab == vocab
    sweep = load_preset("dflash-cpu")
    assert {(m.name, m.k) for m in sweep.methods} >= {("dflash", 3), ("dflash", 7), ("eagle3", 3)}
