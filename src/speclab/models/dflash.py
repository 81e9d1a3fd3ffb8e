"""A DFlash drafter (parallel drafting: one draft forward proposes the whole block of k tokens) for a
Llama-family target, written in the checkpoint layout that vllm-project `speculators` saves for DFlash and
vLLM 0.32 loads with `method = "dflash"`. The weights are random (seeded): this is a COST probe. Its drafts
are almost never accepted; it measures what one parallel draft step costs next to k chained EAGLE-3 steps.

How vLLM 0.32 runs it (read in `v1/spec_decode/dflash.py`, `model_executor/models/qwen3_dflash.py`):
- the target's residual stream at the aux layers (as for EAGLE-3) of every token the target just ran is
  concatenated and projected by `fc`, normed by `hidden_norm` and turned into K/V of every draft layer
  (`precompute_and_store_context_kv`): the target's features are the draft's context, it never runs them as
  queries;
- the queries are 1 + k tokens per request: the bonus token the target sampled, then k copies of
  `mask_token_id`, at the next 1 + k positions, through the draft's Qwen3 layers (q/k norms, non-causal
  attention inside the block), then `norm` and the vocabulary head; the k mask positions give the k drafts.
So a step runs the draft layers and the vocabulary head once over 1 + k rows instead of k times over one.

Layout (vLLM's `transformers_utils/configs/speculators/algos.py::update_dflash` reads config.json; the tensor
names are those of speculators' `DFlashDraftModel`, which vLLM's `DFlashQwen3ForCausalLM.load_weights` maps):
- config.json: `speculators_model_type = "dflash"`, `transformer_layer_config` (a Qwen3 config of the draft
  layers: the target's widths, `num_hidden_layers` = draft layers), `draft_vocab_size`, `target_hidden_size`,
  `aux_hidden_state_layer_ids` (HF `hidden_states` indices, like EAGLE-3's; vLLM derives DFlash's
  `target_layer_ids` = id - 1), `mask_token_id`, `block_size`, `sliding_window_non_causal`,
  `sample_from_anchor = false`, `speculators_config` (proposal method and verifier);
- model.safetensors: `layers.<i>.self_attn.{q,k,v,o}_proj.weight`, `layers.<i>.self_attn.{q,k}_norm.weight`,
  `layers.<i>.mlp.{gate,up,down}_proj.weight`, `layers.<i>.{input,post_attention}_layernorm.weight`,
  `fc.weight` [H, n_aux * H], `hidden_norm.weight`, `norm.weight`; with a reduced draft vocabulary also
  `lm_head.weight` [V_d, H], `d2t` (target id = draft id + d2t[draft id]) and `t2d`. No `embed_tokens` and,
  with the full vocabulary, no `lm_head`: vLLM then shares the target's (SmolLM2's tied 49,152 x 576 matrix).

`sliding_window_non_causal = true`: vLLM turns it into `dflash_config.causal = false`, which it applies to
every draft layer; with the default (false) vLLM 0.32 would run full-attention layers causally, while
speculators documents them as always bidirectional. The probe has no sliding-window layers, so for
speculators the flag changes nothing and vLLM then runs the block non-causally, as DFlash is trained.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speclab.errors import ConfigError, SpeclabError

if TYPE_CHECKING:  # torch is imported where tensors are made: presets parse [probe] tables without it
    import torch

RECIPE_VERSION = "1"  # bump when the probe's layout or weights change (part of its cache key)
FORMAT = "dflash"  # speculators_model_type; vLLM maps it to architecture DFlashDraftModel (qwen3_dflash.py)
WEIGHTS = "model.safetensors"


def default_aux_layers(tcfg: dict[str, Any], aux: list[int] | None) -> list[int]:
    """The target layers whose hidden states a drafter reads (`aux`, or 2, L // 2, L - 1 of a target with L
    layers); EAGLE-3 heads (speclab.drafters.train) and DFlash probes share the default."""
    n_layers = int(tcfg["num_hidden_layers"])
    out = list(aux or [2, n_layers // 2, n_layers - 1])
    if any(a < 0 or a >= n_layers for a in out):
        raise SpeclabError(f"drafters: aux layers must lie in 0..{n_layers - 1} (got {out})")
    return out


@dataclass(frozen=True)
class DFlashProbe:
    """What a probe is built from (besides the target checkpoint); its fields are a preset's `[probe]` table."""

    layers: int = 1  # draft decoder layers
    draft_vocab: int = 8192  # 0: the target's full vocabulary (the target's lm_head is shared)
    aux_layers: tuple[int, ...] | None = None  # HF hidden_states indices; None: (2, L // 2, L - 1) as EAGLE-3
    mask_token_id: int | None = None  # None: the target tokenizer's highest unused special token
    block_size: int = 8  # largest block the config advertises (k <= block_size - 1 drafts)
    seed: int = 0

    @classmethod
    def from_table(cls, table: dict[str, Any], where: str) -> DFlashProbe:
        bad = sorted(set(table) - set(cls.__dataclass_fields__))
        if bad:
            raise ConfigError(f"{where}: [probe] has unknown field(s) {', '.join(bad)}")
        kw = dict(table)
        if kw.get("aux_layers") is not None:
            kw["aux_layers"] = tuple(int(a) for a in kw["aux_layers"])
        probe = cls(**kw)
        if probe.layers < 1 or probe.draft_vocab < 0 or probe.block_size < 2:
            raise ConfigError(f"{where}: [probe] needs layers >= 1, draft_vocab >= 0, block_size >= 2")
        return probe

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["aux_layers"] = list(self.aux_layers) if self.aux_layers is not None else None
        return d


def default_mask_token(target_dir: Path, tcfg: dict[str, Any]) -> int:
    """The highest-id added special token of the target's tokenizer that is not its bos/eos/pad/unk token
    (SmolLM2: 16, `<empty_output>`, which its chat model does not emit): the mask slots' input token. Its
    embedding is the target's (vLLM shares the embedding), as speculators trains it."""
    try:
        tok = json.loads((target_dir / "tokenizer.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"{target_dir}: no readable tokenizer.json to pick a mask token from ({exc})"
        ) from None
    reserved = set()
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        v = tcfg.get(key)
        reserved |= set(v) if isinstance(v, list) else {v}
    ids = [int(t["id"]) for t in tok.get("added_tokens", []) if t.get("special") and t["id"] not in reserved]
    if not ids:
        raise ConfigError(f"{target_dir}: tokenizer has no spare special token; set [probe] mask_token_id")
    return max(ids)


def draft_config(
    tcfg: dict[str, Any], probe: DFlashProbe, aux: list[int], mask_token_id: int, verifier: str
) -> dict[str, Any]:
    """config.json of a DFlash drafter for a Llama-family target, as speculators writes it."""
    if tcfg.get("model_type") not in ("llama", "qwen3", "qwen2", "mistral"):
        raise ConfigError(f"dflash probe: target model_type {tcfg.get('model_type')!r} is not Llama-family")
    rope = tcfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", tcfg.get("rope_theta", 10000.0))
    if (rope.get("rope_type") or "default") != "default" or tcfg.get("rope_scaling"):
        raise ConfigError("dflash probe: targets with rope scaling are not supported")
    h, vocab = int(tcfg["hidden_size"]), int(tcfg["vocab_size"])
    heads = int(tcfg["num_attention_heads"])
    draft_vocab = probe.draft_vocab or vocab
    if draft_vocab > vocab:
        raise ConfigError(
            f"dflash probe: draft_vocab {draft_vocab} exceeds the target's vocabulary ({vocab})"
        )
    if not 0 <= mask_token_id < vocab:
        raise ConfigError(
            f"dflash probe: mask_token_id {mask_token_id} outside the vocabulary 0..{vocab - 1}"
        )
    layer_cfg = {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": h,
        "intermediate_size": int(tcfg["intermediate_size"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(tcfg.get("num_key_value_heads") or heads),
        "head_dim": int(tcfg.get("head_dim") or h // heads),
        "num_hidden_layers": probe.layers,
        "layer_types": ["full_attention"] * probe.layers,
        "hidden_act": tcfg.get("hidden_act", "silu"),
        "rms_norm_eps": float(tcfg["rms_norm_eps"]),
        "rope_theta": theta,
        "rope_parameters": {"rope_theta": theta, "rope_type": "default"},
        "max_position_embeddings": int(tcfg.get("max_position_embeddings", 8192)),
        "vocab_size": vocab,
        "attention_bias": False,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "dtype": "float32",
    }
    return {
        "speculators_model_type": FORMAT,
        "architectures": ["DFlashSpeculator"],
        "transformer_layer_config": layer_cfg,
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": h,
        "aux_hidden_state_layer_ids": list(aux),
        "mask_token_id": int(mask_token_id),
        "block_size": probe.block_size,
        "sliding_window_non_causal": True,
        "sample_from_anchor": False,
        "speculators_config": {
            "algorithm": FORMAT,
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": probe.block_size - 1}],
            "verifier": {"name_or_path": verifier, "architectures": list(tcfg.get("architectures") or [])},
        },
        "speclab_probe": {**probe.as_dict(), "note": "random seeded weights: a cost probe, not a drafter"},
    }


def probe_weights(
    cfg: dict[str, Any], target_lm_head: torch.Tensor | None, seed: int
) -> dict[str, torch.Tensor]:
    """Seeded random tensors in speculators' DFlash names. Linear weights ~ N(0, 0.02) (HF's default init),
    norms 1; a reduced vocabulary head takes the target's lm_head rows of the draft ids (0..V_d-1: the probe
    does not pick frequent tokens, its drafts are not meant to be accepted)."""
    import torch

    lc = cfg["transformer_layer_config"]
    h, inter, hd = lc["hidden_size"], lc["intermediate_size"], lc["head_dim"]
    q, kv = lc["num_attention_heads"] * hd, lc["num_key_value_heads"] * hd
    n_aux, vocab, vd = len(cfg["aux_hidden_state_layer_ids"]), lc["vocab_size"], cfg["draft_vocab_size"]
    gen = torch.Generator().manual_seed(seed)

    def lin(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen) * 0.02

    st: dict[str, torch.Tensor] = {}
    for i in range(lc["num_hidden_layers"]):
        p = f"layers.{i}."
        st[p + "input_layernorm.weight"] = torch.ones(h)
        st[p + "self_attn.q_proj.weight"] = lin(q, h)
        st[p + "self_attn.k_proj.weight"] = lin(kv, h)
        st[p + "self_attn.v_proj.weight"] = lin(kv, h)
        st[p + "self_attn.o_proj.weight"] = lin(h, q)
        st[p + "self_attn.q_norm.weight"] = torch.ones(hd)
        st[p + "self_attn.k_norm.weight"] = torch.ones(hd)
        st[p + "post_attention_layernorm.weight"] = torch.ones(h)
        st[p + "mlp.gate_proj.weight"] = lin(inter, h)
        st[p + "mlp.up_proj.weight"] = lin(inter, h)
        st[p + "mlp.down_proj.weight"] = lin(h, inter)
    st["fc.weight"] = lin(h, n_aux * h)
    st["hidden_norm.weight"] = torch.ones(h)
    st["norm.weight"] = torch.ones(h)
    if vd < vocab:
        if target_lm_head is None or tuple(target_lm_head.shape) != (vocab, h):
            raise ConfigError(
                f"dflash probe: need the target's lm_head [{vocab}, {h}] for a reduced vocabulary"
            )
        st["lm_head.weight"] = target_lm_head[:vd].float().clone()
        st["d2t"] = torch.zeros(vd, dtype=torch.long)  # draft id i is target id i
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[:vd] = True
        st["t2d"] = t2d
    return {k: v.contiguous() for k, v in st.items()}


def _target_lm_head(target_dir: Path, tie: bool) -> torch.Tensor:
    from safetensors import safe_open

    names = ["lm_head.weight", "model.embed_tokens.weight"] if not tie else ["model.embed_tokens.weight"]
    for f in sorted(target_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            for n in names:
                if n in sf.keys():  # noqa: SIM118 (safe_open has keys(), no __contains__)
                    return sf.get_tensor(n)
    raise ConfigError(f"{target_dir}: no lm_head / embed_tokens tensor found")


def build_probe(
    target_dir: Path, probe: DFlashProbe, out: Path, verifier: str | None = None
) -> dict[str, Any]:
    """Write a seeded random DFlash drafter for the target checkpoint at `target_dir` into `out`
    (config.json + model.safetensors); returns its config."""
    from safetensors.torch import save_file

    try:
        tcfg = json.loads((target_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{target_dir}: not a checkpoint ({exc})") from None
    aux = default_aux_layers(tcfg, list(probe.aux_layers) if probe.aux_layers else None)
    mask = probe.mask_token_id if probe.mask_token_id is not None else default_mask_token(target_dir, tcfg)
    cfg = draft_config(tcfg, probe, aux, mask, verifier or str(target_dir))
    head = None
    if cfg["draft_vocab_size"] < int(tcfg["vocab_size"]):
        head = _target_lm_head(target_dir, bool(tcfg.get("tie_word_embeddings")))
    st = probe_weights(cfg, head, probe.seed)
    out.mkdir(parents=True, exist_ok=True)
    save_file(st, str(out / WEIGHTS), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return cfg
