"""An EAGLE-3 head in plain torch that computes what vLLM's `llama_eagle3.py` computes, trains with
training-time test (TTT), and saves in the checkpoint layout that vLLM's `eagle3` loader reads.

The head (one decoder layer by default; later layers are plain Llama layers on the first's output), as vLLM
runs it:
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


class DecoderLayer(nn.Module):
    """One layer of the head, as vLLM's `llama_eagle3.LlamaDecoderLayer` computes it. The first layer takes
    [input_layernorm(token embedding), hidden_norm(hidden)] (2H wide); later ones are plain Llama layers on
    the previous layer's output (their `hidden_norm` exists in vLLM too and is unused)."""

    def __init__(self, cfg: dict[str, Any], first: bool) -> None:
        super().__init__()
        h, self.nh, self.nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or h // self.nh
        self.first = first
        eps, inter, width = cfg["rms_norm_eps"], cfg["intermediate_size"], (2 * h if first else h)
        self.input_layernorm, self.hidden_norm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.q_proj = nn.Linear(width, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(width, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(width, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)

    def qkv(self, emb: torch.Tensor | None, x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor):
        """emb [B, n, H] (first layer only), x [B, n, H] (hidden, or the previous layer's output), pos [B, n]
        -> (q [B,nh,n,d], k/v [B,nh,n,d] (GQA expanded), residual)."""
        b, n, _ = x.shape
        inp = (
            torch.cat([self.input_layernorm(emb), self.hidden_norm(x)], -1)
            if self.first
            else self.input_layernorm(x)
        )
        q = self.q_proj(inp).view(b, n, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(inp).view(b, n, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(inp).view(b, n, self.nkv, self.hd).transpose(1, 2)
        q, k = _rope(q, pos, inv_freq), _rope(k, pos, inv_freq)
        rep = self.nh // self.nkv
        return q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), x

    def finish(self, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """attn [B, nh, n, d] -> the layer's pre-norm output [B, n, H]."""
        b, _, n, _ = attn.shape
        s = self.o_proj(attn.transpose(1, 2).reshape(b, n, -1)) + residual
        y = self.post_attention_layernorm(s)
        return self.down_proj(nn.functional.silu(self.gate_proj(y)) * self.up_proj(y)) + s


class Eagle3Head(nn.Module):
    def __init__(
        self, cfg: dict[str, Any], embed: torch.Tensor, d2t: torch.Tensor, t2d: torch.Tensor
    ) -> None:
        super().__init__()
        self.cfg = dict(cfg)
        h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        self.hd = cfg.get("head_dim") or h // nh
        n_aux, vd = len(cfg["eagle_aux_hidden_state_layer_ids"]), cfg["draft_vocab_size"]
        n_layers = int(cfg.get("num_hidden_layers", 1))
        self.fc = nn.Linear(n_aux * h, h, bias=False)
        self.layers = nn.ModuleList(DecoderLayer(cfg, first=i == 0) for i in range(n_layers))
        self.norm = RMSNorm(h, cfg["rms_norm_eps"])
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

    def _layers_step(
        self,
        tok: torch.Tensor,
        hidden: torch.Tensor,
        pos: torch.Tensor,
        attend: Any,
    ) -> torch.Tensor:
        """Every layer on query positions: tok [B, n], hidden [B, n, H] (fc(features) or the previous draft
        step's output), pos [B, n]. `attend(i, q, k, v)` returns layer i's attention output for its queries,
        given this step's keys and values (it holds the layer's cache). Returns the last layer's pre-norm
        output [B, n, H] (what the next draft step is fed, vLLM's `hidden_prenorm`)."""
        emb, x = self.embed[tok], hidden
        for i, layer in enumerate(self.layers):
            q, k, v, res = layer.qkv(emb if i == 0 else None, x, pos, self.inv_freq)
            x = layer.finish(attend(i, q, k, v), res)
        return x

    def logits(self, pre: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(pre))

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
        blocks (memory ~ rows x n instead of n x n) and stops when no chain in the block is still right.
        With more than one layer, the layers below the last run over every position up to the block's end
        (their outputs are the next layer's step-0 keys)."""
        b, n = tokens.shape
        r = rows or slice(0, n)
        m = min(r.stop, n)  # keys beyond the block's last row are never visible to it
        last = len(self.layers) - 1
        pos = torch.arange(m).expand(b, m)
        nxt = torch.roll(tokens, -1, 1)[:, :m]  # x[t+1]; the wrapped last column is masked by callers
        causal = (torch.arange(m)[None, :] <= torch.arange(m)[:, None])[None, None] & valid[:, None, None, :m]
        scale = self.hd**-0.5
        keys: list[tuple[torch.Tensor, torch.Tensor]] = []

        def attend0(i: int, q: torch.Tensor, kk: torch.Tensor, vv: torch.Tensor) -> torch.Tensor:
            keys.append((kk, vv))
            mask = causal
            if i == last:  # only the block's rows go on
                q, mask = q[:, :, r], causal[:, :, r]
            s0 = (q @ kk.transpose(-1, -2)) * scale
            return torch.softmax(s0.masked_fill(~mask, float("-inf")), -1) @ vv

        emb, x = self.embed[nxt], self.fc(feats[:, :m])
        for i, layer in enumerate(self.layers):
            q, kk, vv, res = layer.qkv(emb if i == 0 else None, x, pos, self.inv_freq)
            x = layer.finish(attend0(i, q, kk, vv), res[:, r] if i == last else res)
        pre = x
        yield self.logits(pre)
        chains: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = [([], []) for _ in self.layers]
        mask_r = causal[:, :, r]

        def attend_chain(i: int, qj: torch.Tensor, kj: torch.Tensor, vj: torch.Tensor) -> torch.Tensor:
            ck, cv = chains[i]
            ck.append(kj)
            cv.append(vj)
            k0, v0 = keys[i]
            sj = ((qj @ k0.transpose(-1, -2)) * scale).masked_fill(~mask_r, float("-inf"))
            sd = torch.stack([(qj * c).sum(-1) * scale for c in ck], -1)  # [B,nh,rows,j]
            p = torch.softmax(torch.cat([sj, sd], -1), -1)
            return p[..., :m] @ v0 + sum(p[..., m + c, None] * cv[c] for c in range(len(cv)))

        pos_r = pos[:, r]
        for j in range(1, k):
            tok_j = torch.roll(tokens, -(1 + j), 1)[:, r]
            pre = self._layers_step(tok_j, pre, pos_r + j, attend_chain)
            yield self.logits(pre)

    @torch.no_grad()
    def greedy_chain(self, tokens: torch.Tensor, feats: torch.Tensor, k: int) -> torch.Tensor:
        """Live drafting, step by step as vLLM's proposer runs after a prefill: k target ids drafted after
        the context tokens [T] (T >= 2), given the target's aux features [>= T-1, A*H] at its positions.
        A causal pass over positions 0..T-2 (input x[t+1] with fc(features at t)) gives the first draft and
        each layer's cache; each later draft feeds the previous draft with the head's pre-norm output at
        the next position and attends to that cache plus the earlier drafts."""
        t_len = tokens.shape[0]
        scale = self.hd**-0.5
        mask = torch.ones(t_len - 1, t_len - 1, dtype=torch.bool).tril()
        cache: list[list[torch.Tensor]] = []

        def prefill(i: int, q: torch.Tensor, kk: torch.Tensor, vv: torch.Tensor) -> torch.Tensor:
            cache.append([kk, vv])
            s = ((q @ kk.transpose(-1, -2)) * scale).masked_fill(~mask, float("-inf"))
            return torch.softmax(s, -1) @ vv

        def decode(i: int, q: torch.Tensor, kk: torch.Tensor, vv: torch.Tensor) -> torch.Tensor:
            c = cache[i]
            c[0], c[1] = torch.cat([c[0], kk], 2), torch.cat([c[1], vv], 2)
            return torch.softmax((q @ c[0].transpose(-1, -2)) * scale, -1) @ c[1]

        pre = self._layers_step(
            tokens[None, 1:], self.fc(feats[None, : t_len - 1]), torch.arange(t_len - 1)[None], prefill
        )
        draft_ids = self.draft_ids()
        out = [int(draft_ids[self.logits(pre)[0, -1].argmax()])]
        prev = pre[:, -1:]
        for j in range(1, k):
            prev = self._layers_step(torch.tensor([[out[-1]]]), prev, torch.tensor([[t_len - 2 + j]]), decode)
            out.append(int(draft_ids[self.logits(prev)[0, -1].argmax()]))
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
        for layer in self.layers:  # every layer starts as the identity on its residual stream
            for lin in (layer.q_proj, layer.k_proj, layer.v_proj, layer.gate_proj, layer.up_proj):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * 0.02)
            layer.o_proj.weight.zero_()
            layer.down_proj.weight.zero_()
        h = self.fc.out_features
        self.fc.weight.zero_()
        self.fc.weight[:, -h:] = torch.eye(h)
        self.norm.weight.copy_(target_norm.float())
        self.lm_head.weight.copy_(target_lm_head.detach().float()[self.draft_ids()])

    def state_for_vllm(self) -> dict[str, torch.Tensor]:
        """Tensors named as the EAGLE-3 checkpoints vLLM loads (`midlayer.*` for the first layer, which vLLM
        maps to `layers.0.*`; `layers.<i>.*` for later ones; `fc`, `norm`, `lm_head`, `d2t`, `t2d`); the
        embedding is left out, so vLLM shares the target's."""
        names = {"fc.weight": self.fc.weight}
        for i, layer in enumerate(self.layers):
            for key, t in layer.state_dict(keep_vars=True).items():
                names[_checkpoint_name(i, key)] = t
        names |= {"norm.weight": self.norm.weight, "lm_head.weight": self.lm_head.weight}
        names |= {"d2t": self.d2t, "t2d": self.t2d}
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
        st = {("midlayer." + k[9:] if k.startswith("layers.0.") else k): v for k, v in st.items()}
        own = {
            _checkpoint_name(i, key): f"layers.{i}.{key}"
            for i, layer in enumerate(head.layers)
            for key in layer.state_dict()
        }
        sd = {own.get(k, k): v for k, v in st.items()}
        if len(head.layers) > 1:  # checkpoints from elsewhere may leave the unused hidden_norm out
            for i in range(1, len(head.layers)):
                sd.setdefault(f"layers.{i}.hidden_norm.weight", head.layers[i].hidden_norm.weight.detach())
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
    if int(cfg.get("num_hidden_layers", 1)) < 1:
        bad.append(f"num_hidden_layers = {cfg['num_hidden_layers']}")
    if cfg.get("rope_scaling") or (cfg.get("rope_parameters") or {}).get("rope_type", "default") != "default":
        bad.append("rope scaling")
    if not cfg.get("eagle_aux_hidden_state_layer_ids"):
        bad.append("no top-level eagle_aux_hidden_state_layer_ids")
    return bad


def _checkpoint_name(layer: int, key: str) -> str:
    """A layer parameter's name in the checkpoint: the first layer is `midlayer` (EAGLE-3's own name)."""
    prefix = "midlayer." if layer == 0 else f"layers.{layer}."
    if key.split(".")[0] in ("q_proj", "k_proj", "v_proj", "o_proj"):
        return prefix + "self_attn." + key
    if key.split(".")[0] in ("gate_proj", "up_proj", "down_proj"):
        return prefix + "mlp." + key
    return prefix + key


def head_config(
    target_cfg: dict[str, Any], aux_layers: list[int], draft_vocab: int, layers: int = 1
) -> dict[str, Any]:
    """config.json of an EAGLE-3 head (`layers` decoder layers) for a Llama-family target (vLLM reads it with method eagle3)."""
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
        "num_hidden_layers": int(layers),
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
