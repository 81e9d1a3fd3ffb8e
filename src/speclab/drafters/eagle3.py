"""An EAGLE-3 head in plain torch that computes what vLLM's `llama_eagle3.py` computes, trains with
training-time test (TTT), and saves in the checkpoint layout that vLLM's `eagle3` loader reads.

The head (one decoder layer), as vLLM runs it:
- target features: the target's residual stream at `aux_layers` (HF `hidden_states[i]`, i.e. the output of
  decoder layer i-1), concatenated and projected by `fc` to the hidden size;
- input at position t: token x[t+1] (embedded with the target's frozen embedding) and a hidden state: fc(target
  features at t) for context positions, the head's own pre-norm output for later draft steps;
- layer: residual = hidden; cat[input_layernorm(emb), hidden_norm(hidden)] -> attention (2H -> H) + residual ->
  post_attention_layernorm -> MLP + residual = pre-norm output; logits = lm_head(norm(pre-norm)) over a reduced
  draft vocabulary, mapped back to target ids by `d2t` (target id = draft id + d2t[draft id]).

TTT: step 0 runs over every position with target features (a causal pass: the head's KV cache over the
context). Step j >= 1 at position t is the (j+1)-th draft after context x[..t+1]: input token x[t+1+j] (the
true token; a chain only continues while drafts equal it), hidden = step j-1's output at t, rope position t+j;
it attends to step-0 keys at positions <= t plus its own chain's keys (steps 1..j at t), as vLLM's proposer
does after a prefill. So one batched pass gives, for every position, the whole k-step chain.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from speclab.errors import ConfigError

FORMAT_ARCH = "LlamaForCausalLMEagle3"  # vLLM registry: llama_eagle3.Eagle3LlamaForCausalLM


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.weight


def _rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Neox-style rotary embedding (vLLM's Llama default). x [B, h, n, d], pos [B, n]."""
    ang = pos[:, None, :, None].float() * inv_freq  # [B, 1, n, d/2]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


class Eagle3Head(nn.Module):
    def __init__(
        self, cfg: dict[str, Any], embed: torch.Tensor, d2t: torch.Tensor, t2d: torch.Tensor
    ) -> None:
        super().__init__()
        self.cfg = dict(cfg)
        h, self.nh, self.nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or h // self.nh
        eps, inter = cfg["rms_norm_eps"], cfg["intermediate_size"]
        n_aux, vd = len(cfg["eagle_aux_hidden_state_layer_ids"]), cfg["draft_vocab_size"]
        self.fc = nn.Linear(n_aux * h, h, bias=False)
        self.input_layernorm, self.hidden_norm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.q_proj = nn.Linear(2 * h, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(2 * h, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(2 * h, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)
        self.norm = RMSNorm(h, eps)
        self.lm_head = nn.Linear(h, vd, bias=False)
        self.register_buffer("embed", embed.detach().float().clone(), persistent=False)  # target's, frozen
        self.register_buffer("d2t", d2t.long().clone())
        self.register_buffer("t2d", t2d.bool().clone())
        # target id -> draft id (-1: not in the draft vocabulary)
        t2d_index = torch.full((embed.shape[0],), -1, dtype=torch.long)
        t2d_index[torch.arange(vd) + self.d2t] = torch.arange(vd)
        self.register_buffer("t2d_index", t2d_index, persistent=False)
        theta = float(cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
        inv = 1.0 / (theta ** (torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd))
        self.register_buffer("inv_freq", inv.float(), persistent=False)

    # --- pieces -------------------------------------------------------------------------------------

    def draft_ids(self) -> torch.Tensor:
        return torch.arange(self.lm_head.out_features) + self.d2t

    def _qkv(self, tok: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor):
        """tok [B, n], hidden [B, n, H] -> (q [B,nh,n,d], k/v [B,nh,n,d] (GQA expanded), residual)."""
        b, n = tok.shape
        x = torch.cat([self.input_layernorm(self.embed[tok]), self.hidden_norm(hidden)], -1)
        q = self.q_proj(x).view(b, n, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.nkv, self.hd).transpose(1, 2)
        q, k = _rope(q, pos, self.inv_freq), _rope(k, pos, self.inv_freq)
        rep = self.nh // self.nkv
        return q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)

    def _finish(self, attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """attn [B, nh, n, d] -> (logits over the draft vocabulary, pre-norm output)."""
        b, _, n, _ = attn.shape
        s = self.o_proj(attn.transpose(1, 2).reshape(b, n, -1)) + residual
        y = self.post_attention_layernorm(s)
        pre = self.down_proj(nn.functional.silu(self.gate_proj(y)) * self.up_proj(y)) + s
        return self.lm_head(self.norm(pre)), pre

    # --- TTT forward ----------------------------------------------------------------------------------

    def forward_ttt(
        self, tokens: torch.Tensor, feats: torch.Tensor, valid: torch.Tensor, k: int
    ) -> list[torch.Tensor]:
        """Draft logits for k chained steps at every position.

        tokens [B, n] (x), feats [B, n, A*H] (target aux features at each position), valid [B, n] bool
        (real, non-padding positions; sequences left-aligned). Returns k tensors [B, n, Vd]: step j at
        position t predicts x[t+2+j] from input token x[t+1+j] (positions where t+1+j >= n are garbage; mask
        them in the loss). Padding is appended on the right, so positions stay 0..n-1.
        """
        return list(self.iter_ttt(tokens, feats, valid, k))

    def iter_ttt(
        self,
        tokens: torch.Tensor,
        feats: torch.Tensor,
        valid: torch.Tensor,
        k: int,
        rows: slice | None = None,
    ) -> Iterator[torch.Tensor]:
        """`forward_ttt` one step at a time, for the query positions `rows` only (default: all): yields k
        tensors [B, len(rows), Vd]. Rows see the same keys as in the full pass (step-0 keys up to their own
        position), so a block of rows gives exactly the full pass's rows; replay walks long sequences in
        blocks (memory ~ rows x n instead of n x n) and stops when no chain in the block is still right."""
        b, n = tokens.shape
        r = rows or slice(0, n)
        pos = torch.arange(n).expand(b, n)
        nxt = torch.roll(tokens, -1, 1)  # x[t+1]; the wrapped last column is masked by callers
        hidden = self.fc(feats)
        q, k0, v0 = self._qkv(nxt, hidden, pos)
        # keys beyond the block's last row are never visible to it
        m = min(r.stop, n)
        q, k0, v0, hidden, pos = q[:, :, r], k0[:, :, :m], v0[:, :, :m], hidden[:, r], pos[:, r]
        causal = (torch.arange(m)[None, :] <= pos[0, :, None])[None, None] & valid[:, None, None, :m]
        scale = self.hd**-0.5
        s0 = (q @ k0.transpose(-1, -2)) * scale
        s0 = s0.masked_fill(~causal, float("-inf"))
        logits, pre = self._finish(torch.softmax(s0, -1) @ v0, hidden)
        yield logits
        chain_k: list[torch.Tensor] = []
        chain_v: list[torch.Tensor] = []
        for j in range(1, k):
            tok_j = torch.roll(tokens, -(1 + j), 1)[:, r]
            qj, kj, vj = self._qkv(tok_j, pre, pos + j)
            chain_k.append(kj)
            chain_v.append(vj)
            sj = (qj @ k0.transpose(-1, -2)) * scale
            sj = sj.masked_fill(~causal, float("-inf"))
            sd = torch.stack([(qj * kk).sum(-1) * scale for kk in chain_k], -1)  # [B,nh,rows,j]
            p = torch.softmax(torch.cat([sj, sd], -1), -1)
            attn = p[..., :m] @ v0 + sum(p[..., m + i, None] * chain_v[i] for i in range(j))
            logits, pre = self._finish(attn, pre)
            yield logits

    @torch.no_grad()
    def greedy_chain(self, tokens: torch.Tensor, feats: torch.Tensor, k: int) -> torch.Tensor:
        """Live drafting, step by step as vLLM's proposer runs after a prefill: k target ids drafted after
        the context tokens [T] (T >= 2), given the target's aux features [>= T-1, A*H] at its positions.
        A causal pass over positions 0..T-2 (input x[t+1] with fc(features at t)) gives the first draft and
        the head's cache; each later draft feeds the previous draft with the head's pre-norm output at the
        next position and attends to that cache plus the earlier drafts."""
        t_len = tokens.shape[0]
        pos = torch.arange(t_len - 1)[None]
        hidden = self.fc(feats[None, : t_len - 1])
        q, kc, vc = self._qkv(tokens[None, 1:], hidden, pos)
        mask = torch.ones(t_len - 1, t_len - 1, dtype=torch.bool).tril()
        s = ((q @ kc.transpose(-1, -2)) * self.hd**-0.5).masked_fill(~mask, float("-inf"))
        logits, pre = self._finish(torch.softmax(s, -1) @ vc, hidden)
        draft_ids = self.draft_ids()
        out = [int(draft_ids[logits[0, -1].argmax()])]
        prev = pre[:, -1:]
        for j in range(1, k):
            qj, kj, vj = self._qkv(torch.tensor([[out[-1]]]), prev, torch.tensor([[t_len - 2 + j]]))
            kc, vc = torch.cat([kc, kj], 2), torch.cat([vc, vj], 2)
            a = torch.softmax((qj @ kc.transpose(-1, -2)) * self.hd**-0.5, -1) @ vc
            lg, prev = self._finish(a, prev)
            out.append(int(draft_ids[lg[0, -1].argmax()]))
        return torch.tensor(out, dtype=torch.long)

    # --- init / save / load ---------------------------------------------------------------------------

    @torch.no_grad()
    def init_from_target(self, target_norm: torch.Tensor, target_lm_head: torch.Tensor, seed: int) -> None:
        """Start from the target's own output path: fc selects the last aux layer, attention and MLP outputs
        start at zero, final norm and lm_head rows (draft vocabulary) are the target's. Step 0 then equals
        the target's early exit at that layer, which predicts x[t+1], the token the head is already given
        (acceptance about 0, checked in vLLM): training must learn the shift to x[t+2]; the init only gives
        it a calibrated output head and feature scale to start from."""
        g = torch.Generator().manual_seed(seed)
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.gate_proj, self.up_proj):
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * 0.02)
        self.o_proj.weight.zero_()
        self.down_proj.weight.zero_()
        h = self.fc.out_features
        self.fc.weight.zero_()
        self.fc.weight[:, -h:] = torch.eye(h)
        self.norm.weight.copy_(target_norm.float())
        self.lm_head.weight.copy_(target_lm_head.detach().float()[self.draft_ids()])

    def state_for_vllm(self) -> dict[str, torch.Tensor]:
        """Tensors named as the EAGLE-3 checkpoints vLLM loads (`midlayer.*`, `fc`, `norm`, `lm_head`,
        `d2t`, `t2d`); the embedding is left out, so vLLM shares the target's."""
        m = "midlayer."
        names = {
            "fc.weight": self.fc.weight,
            m + "input_layernorm.weight": self.input_layernorm.weight,
            m + "hidden_norm.weight": self.hidden_norm.weight,
            m + "self_attn.q_proj.weight": self.q_proj.weight,
            m + "self_attn.k_proj.weight": self.k_proj.weight,
            m + "self_attn.v_proj.weight": self.v_proj.weight,
            m + "self_attn.o_proj.weight": self.o_proj.weight,
            m + "post_attention_layernorm.weight": self.post_attention_layernorm.weight,
            m + "mlp.gate_proj.weight": self.gate_proj.weight,
            m + "mlp.up_proj.weight": self.up_proj.weight,
            m + "mlp.down_proj.weight": self.down_proj.weight,
            "norm.weight": self.norm.weight,
            "lm_head.weight": self.lm_head.weight,
            "d2t": self.d2t,
            "t2d": self.t2d,
        }
        return {k: v.detach().contiguous().clone() for k, v in names.items()}

    def save(self, out: Path) -> None:
        from safetensors.torch import save_file

        out.mkdir(parents=True, exist_ok=True)
        save_file(self.state_for_vllm(), str(out / "model.safetensors"))
        (out / "config.json").write_text(json.dumps(self.cfg, indent=1))

    @classmethod
    def load(cls, path: Path, embed: torch.Tensor) -> Eagle3Head:
        from safetensors.torch import load_file

        try:
            cfg = json.loads((path / "config.json").read_text())
            st = load_file(str(path / "model.safetensors"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path}: not an EAGLE-3 head ({exc})") from None
        unsupported = unsupported_options(cfg)
        if unsupported:
            raise ConfigError(
                f"{path}: EAGLE-3 head options speclab does not compute: {', '.join(unsupported)}"
            )
        head = cls(cfg, embed, st["d2t"], st["t2d"])
        own = {"midlayer." + k: k for k in ("input_layernorm.weight", "hidden_norm.weight")}
        own |= {
            f"midlayer.self_attn.{p}.weight": f"{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")
        }
        own |= {f"midlayer.mlp.{p}.weight": f"{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}
        own["midlayer.post_attention_layernorm.weight"] = "post_attention_layernorm.weight"
        sd = {own.get(k, k): v for k, v in st.items()}
        try:
            head.load_state_dict(sd, strict=True)
        except RuntimeError as exc:  # missing/unexpected tensors or shapes that disagree with config.json
            raise ConfigError(
                f"{path}: weights do not match config.json ({str(exc).splitlines()[-1].strip()})"
            ) from None
        return head


def unsupported_options(cfg: dict[str, Any]) -> list[str]:
    """Variants of vLLM's llama_eagle3 that this head does not implement (set in other EAGLE-3 checkpoints)."""
    eagle = cfg.get("eagle_config") or {}
    bad = [f for f in ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual", "attention_bias")
           if cfg.get(f) or eagle.get(f)]  # fmt: skip
    if eagle.get("use_aux_hidden_state") is False:
        bad.append("use_aux_hidden_state = false")
    if int(cfg.get("num_hidden_layers", 1)) != 1:
        bad.append(f"num_hidden_layers = {cfg['num_hidden_layers']}")
    if cfg.get("rope_scaling") or (cfg.get("rope_parameters") or {}).get("rope_type", "default") != "default":
        bad.append("rope scaling")
    if not cfg.get("eagle_aux_hidden_state_layer_ids"):
        bad.append("no top-level eagle_aux_hidden_state_layer_ids")
    return bad


def head_config(target_cfg: dict[str, Any], aux_layers: list[int], draft_vocab: int) -> dict[str, Any]:
    """config.json of a one-layer EAGLE-3 head for a Llama-family target (vLLM reads it with method eagle3)."""
    rope = target_cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", target_cfg.get("rope_theta", 10000.0))
    if (rope.get("rope_type") or "default") != "default" or target_cfg.get("rope_scaling"):
        raise ConfigError("drafters: targets with rope scaling are not supported yet")
    h = target_cfg["hidden_size"]
    return {
        "architectures": [FORMAT_ARCH],
        "model_type": "llama",
        "hidden_size": h,
        "target_hidden_size": h,
        "intermediate_size": target_cfg["intermediate_size"],
        "num_attention_heads": target_cfg["num_attention_heads"],
        "num_key_value_heads": target_cfg.get("num_key_value_heads") or target_cfg["num_attention_heads"],
        "head_dim": target_cfg.get("head_dim") or h // target_cfg["num_attention_heads"],
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": target_cfg["rms_norm_eps"],
        "rope_theta": theta,
        "rope_parameters": {"rope_theta": theta, "rope_type": "default"},
        "max_position_embeddings": target_cfg.get("max_position_embeddings", 8192),
        "vocab_size": target_cfg["vocab_size"],
        "draft_vocab_size": draft_vocab,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "eagle_aux_hidden_state_layer_ids": list(aux_layers),
        "bos_token_id": target_cfg.get("bos_token_id"),
        "eos_token_id": target_cfg.get("eos_token_id"),
        "dtype": "float32",
    }
