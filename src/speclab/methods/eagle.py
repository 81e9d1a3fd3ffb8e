"""EAGLE (v1) head replay, given the target's hidden states. EXPERIMENTAL: never run with a trained head.

No trained EAGLE head exists offline for this project's models, so this code has only been checked for
internal consistency (batched replay == naive per-position chains) with a tiny random-init head and target;
acceptance numbers from a random head mean nothing. With a real head (vLLM's EAGLE Llama layout: `fc`,
`layers.N.*`, optional `embed_tokens`; lm_head and, if absent, embeddings shared with the target) it should
produce EAGLE acceptance traces, but that is untested; rope scaling (e.g. Llama 3.1) is not implemented and
is refused.

The head, as vLLM's llama_eagle.py computes it: input at position t is (token x[t+1], target hidden h[t]);
z = fc([embed(x[t+1]), h[t]]); Llama decoder layers (the first without input norm); output g[t] = hidden +
residual; logits = lm_head(g[t]) predict x[t+2]. Drafting after context x[:T]: the first draft comes from
position T-2 (token x[T-1], feature h[T-2]); each later draft feeds (previous draft, previous head output)
at the next position, attending to the head's cache over the context.

Replay: one causal pass over the whole sequence gives the head's cache and the first draft at every
position. Later chain steps depend on the head's own features, so they are run for real, but batched over
all positions whose chain is still correct (only those can still extend acc_len): each query attends to the
shared context cache up to its own context end plus its own chain.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from speclab.errors import ConfigError


def _torch():
    import torch

    return torch


class EagleHead:
    """A plain-torch EAGLE-1 head (no transformers module plumbing, so masks are explicit)."""

    def __init__(self, cfg: dict[str, Any], weights: dict[str, Any], embed: Any, lm_head: Any) -> None:
        torch = _torch()
        if cfg.get("rope_scaling"):
            raise ConfigError("eagle: rope_scaling is not implemented in speclab's EAGLE replay")
        self.h = int(cfg["hidden_size"])
        self.nh = int(cfg["num_attention_heads"])
        self.nkv = int(cfg.get("num_key_value_heads") or self.nh)
        self.hd = int(cfg.get("head_dim") or self.h // self.nh)
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.theta = float(cfg.get("rope_theta", 10000.0))
        self.n_layers = int(cfg["num_hidden_layers"])
        self.w = {k: v.float() for k, v in weights.items()}
        self.embed = embed.float()  # [V, H]
        self.lm_head = lm_head.float()  # [V, H]
        inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd))
        self.inv_freq = inv.float()

    @classmethod
    def random(cls, cfg: dict[str, Any], embed: Any, lm_head: Any, seed: int = 0) -> EagleHead:
        """A random-init head, for logic tests only."""
        torch = _torch()
        g = torch.Generator().manual_seed(seed)
        h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        nkv, inter = cfg.get("num_key_value_heads") or nh, cfg["intermediate_size"]
        hd = cfg.get("head_dim") or h // nh

        def r(*shape: int) -> Any:
            return torch.randn(*shape, generator=g) * 0.2

        w = {"fc.weight": r(h, 2 * h)}
        for i in range(cfg["num_hidden_layers"]):
            p = f"layers.{i}."
            w.update({
                p + "self_attn.q_proj.weight": r(nh * hd, h), p + "self_attn.k_proj.weight": r(nkv * hd, h),
                p + "self_attn.v_proj.weight": r(nkv * hd, h), p + "self_attn.o_proj.weight": r(h, nh * hd),
                p + "mlp.gate_proj.weight": r(inter, h), p + "mlp.up_proj.weight": r(inter, h),
                p + "mlp.down_proj.weight": r(h, inter), p + "post_attention_layernorm.weight": torch.ones(h),
            })  # fmt: skip
            if i > 0:
                w[p + "input_layernorm.weight"] = torch.ones(h)
        return cls(cfg, w, embed, lm_head)

    @classmethod
    def from_pretrained(cls, path: str | Path, embed: Any, lm_head: Any) -> EagleHead:
        torch = _torch()
        path = Path(path)
        if not (path / "config.json").is_file():
            raise ConfigError(f"eagle head {path}: no config.json")
        cfg = json.loads((path / "config.json").read_text())
        weights: dict[str, Any] = {}
        for f in sorted(path.glob("*.safetensors")):
            from safetensors.torch import load_file

            weights.update(load_file(str(f)))
        for f in sorted(path.glob("*.bin")):
            weights.update(torch.load(str(f), map_location="cpu", weights_only=True))
        if not weights:
            raise ConfigError(f"eagle head {path}: no *.safetensors or *.bin weights")
        weights = {k.removeprefix("model."): v for k, v in weights.items()}
        if "embed_tokens.weight" in weights:
            embed = weights.pop("embed_tokens.weight")
        if "fc.weight" not in weights:
            raise ConfigError(f"eagle head {path}: no fc.weight (not an EAGLE-1 Llama head?)")
        return cls(cfg, weights, embed, lm_head)

    # --- building blocks --------------------------------------------------------------------------
    def _rms(self, x: Any, name: str) -> Any:
        torch = _torch()
        w = self.w.get(name)
        if w is None:  # layer 0 has no input norm
            return x
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def _rope(self, x: Any, pos: Any) -> Any:
        """x: [N, heads, hd]; pos: [N]."""
        torch = _torch()
        ang = pos.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat([ang, ang], dim=-1)
        cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin

    def _attend(self, q: Any, keys: Any, vals: Any, mask: Any) -> Any:
        """q [N, nh, hd]; keys/vals [N or 1, M, nkv, hd]; mask [N, M] bool (True = visible)."""
        torch = _torch()
        rep = self.nh // self.nkv
        k = keys.repeat_interleave(rep, dim=2)
        v = vals.repeat_interleave(rep, dim=2)
        s = torch.einsum("nhd,nmhd->nhm", q, k.expand(q.shape[0], -1, -1, -1)) / (self.hd**0.5)
        s = s.masked_fill(~mask[:, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1)
        return torch.einsum("nhm,nmhd->nhd", p, v.expand(q.shape[0], -1, -1, -1))

    def _input(self, tokens: Any, feats: Any) -> Any:
        """z = fc([embed(tokens), feats])."""
        torch = _torch()
        return torch.cat([self.embed[tokens], feats], dim=-1) @ self.w["fc.weight"].T

    def _qkv(self, x: Any, residual: Any, p: str, pos: Any) -> tuple[Any, Any, Any, Any]:
        """Residual add and input norm of layer p, then q, k (both rotated) and v: (residual, q, k, v)."""
        w, n = self.w, x.shape[0]
        if residual is None:
            residual, hs = x, self._rms(x, p + "input_layernorm.weight")
        else:
            hs = x + residual
            residual, hs = hs, self._rms(hs, p + "input_layernorm.weight")
        q = self._rope((hs @ w[p + "self_attn.q_proj.weight"].T).view(n, self.nh, self.hd), pos)
        k = self._rope((hs @ w[p + "self_attn.k_proj.weight"].T).view(n, self.nkv, self.hd), pos)
        v = (hs @ w[p + "self_attn.v_proj.weight"].T).view(n, self.nkv, self.hd)
        return residual, q, k, v

    def _out(self, a: Any, residual: Any, p: str) -> tuple[Any, Any]:
        """o_proj of the attention output a [N, nh, hd], residual add, post-attention norm and MLP of layer p:
        (x, residual)."""
        torch = _torch()
        w = self.w
        x = a.reshape(a.shape[0], -1) @ w[p + "self_attn.o_proj.weight"].T
        hs = x + residual
        residual, hs = hs, self._rms(hs, p + "post_attention_layernorm.weight")
        gate = hs @ w[p + "mlp.gate_proj.weight"].T
        up = hs @ w[p + "mlp.up_proj.weight"].T
        return (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T, residual

    def step(self, tokens: Any, feats: Any, pos: Any, ctx_kv: list[tuple[Any, Any]] | None, ctx_len: Any,
             chain_kv: list[tuple[Any, Any]] | None) -> tuple[Any, list[tuple[Any, Any]]]:  # fmt: skip
        """One chain step for N independent queries. Query n attends to ctx_kv entries [0, ctx_len[n]) (shared
        [1, S, nkv, hd] per layer), its own chain entries chain_kv [N, c, nkv, hd] and itself.
        Returns (head output g [N, H], this step's (k, v) per layer, [N, nkv, hd])."""
        torch = _torch()
        x = self._input(tokens, feats)
        residual = None
        new_kv = []
        n = x.shape[0]
        for i in range(self.n_layers):
            p = f"layers.{i}."
            residual, q, k, v = self._qkv(x, residual, p, pos)
            new_kv.append((k, v))
            keys, vals, masks = [], [], []
            if ctx_kv is not None:
                ck, cv = ctx_kv[i]
                keys.append(ck.expand(n, -1, -1, -1))
                vals.append(cv.expand(n, -1, -1, -1))
                masks.append(torch.arange(ck.shape[1])[None, :] < ctx_len[:, None])
            if chain_kv is not None and chain_kv[i][0].shape[1]:
                keys.append(chain_kv[i][0])
                vals.append(chain_kv[i][1])
                masks.append(torch.ones(n, chain_kv[i][0].shape[1], dtype=torch.bool))
            keys.append(k[:, None])
            vals.append(v[:, None])
            masks.append(torch.ones(n, 1, dtype=torch.bool))
            a = self._attend(q, torch.cat(keys, 1), torch.cat(vals, 1), torch.cat(masks, 1))
            x, residual = self._out(a, residual, p)
        return x + residual, new_kv

    def causal(self, tokens: Any, feats: Any) -> tuple[Any, list[tuple[Any, Any]]]:
        """Causal pass over a sequence (positions 0..n-1): outputs [n, H] and the cache [1, n, nkv, hd]."""
        torch = _torch()
        n = tokens.shape[0]
        pos = torch.arange(n)
        # a causal pass is n queries, each seeing the cache up to itself: compute k/v first, layer by layer
        x = self._input(tokens, feats)
        residual = None
        cache = []
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        for i in range(self.n_layers):
            p = f"layers.{i}."
            residual, q, k, v = self._qkv(x, residual, p, pos)
            cache.append((k[None], v[None]))
            a = self._attend(q, k[None], v[None], causal)
            x, residual = self._out(a, residual, p)
        return x + residual, cache

    def logits(self, g: Any) -> Any:
        return g @ self.lm_head.T


class EagleProposer:
    """EAGLE replay. `target` = HF causal LM (or path) whose last hidden states feed the head; `head` =
    EagleHead or a checkpoint directory."""

    name = "eagle"

    def __init__(self, head: Any = None, target: Any = None, block: int = 256, **_: Any) -> None:
        torch = _torch()
        if head is None or target is None:
            raise ConfigError(
                "eagle replay needs a trained EAGLE head (--eagle-head) and its target; none exists offline "
                "for this project's models (see speclab/methods/eagle.py)"
            )
        if isinstance(target, str | Path):
            from transformers import AutoModelForCausalLM

            target = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
        self.target = target.eval()
        if not isinstance(head, EagleHead):
            head = EagleHead.from_pretrained(
                head, self.target.get_input_embeddings().weight.detach(), self.target.lm_head.weight.detach()
            )
        self.head = head
        self.block = block

    def target_hidden(self, x: np.ndarray) -> Any:
        torch = _torch()
        with torch.inference_mode():
            return self.target.model(input_ids=torch.as_tensor(x, dtype=torch.long)[None]).last_hidden_state[
                0
            ]

    def propose(self, context_ids: np.ndarray, k: int) -> np.ndarray:
        """Naive reference: recompute everything from scratch at every chain step (no cache, no batching)."""
        torch = _torch()
        x = np.asarray(context_ids, dtype=np.int64)
        if len(x) < 2 or k <= 0:
            return np.empty(0, dtype=np.int64)
        h = self.target_hidden(x)
        toks = torch.as_tensor(x[1:])
        feats = h[:-1]
        out: list[int] = []
        with torch.inference_mode():
            for _ in range(k):
                g, _c = self.head.causal(toks, feats)
                d = int(self.head.logits(g[-1]).argmax())
                out.append(d)
                toks = torch.cat([toks, torch.tensor([d])])
                feats = torch.cat([feats, g[-1:]])
        return np.asarray(out, dtype=np.int64)

    def replay(
        self, prompt_ids: np.ndarray, output_ids: np.ndarray, k_max: int
    ) -> tuple[np.ndarray, np.ndarray]:
        torch = _torch()
        prompt_ids = np.asarray(prompt_ids, dtype=np.int64)
        output_ids = np.asarray(output_ids, dtype=np.int64)
        plen, n = len(prompt_ids), len(output_ids)
        x = np.concatenate([prompt_ids, output_ids])
        s = len(x)
        acc = np.ones(n, dtype=np.int32)
        nprop = np.full(n, k_max, dtype=np.int32)
        if s < 3 or n == 0:
            nprop[:] = np.where(plen + np.arange(n) >= 2, k_max, 0)
            return acc, nprop
        with torch.inference_mode():
            h = self.target_hidden(x[:-1])
            g, cache = self.head.causal(torch.as_tensor(x[1:-1]), h[:-1])  # positions t = 0..s-3
            pred1 = self.head.logits(g).argmax(-1).numpy()  # pred1[t] predicts x[t+2]
            ends = plen + np.arange(n)  # context length T at position p
            ok = ends >= 2
            nprop[~ok] = 0
            pidx = np.flatnonzero(ok & (ends < s))  # positions with a target token x[T] to compare with
            t0 = ends[pidx] - 2
            hit = pred1[t0] == x[ends[pidx]]
            acc[pidx[hit]] = 2
            # later steps: only chains that are still right; batched, in blocks of positions
            live = pidx[hit]
            for b in range(0, len(live), self.block):
                self._chains(x, live[b : b + self.block], ends, g, cache, acc, k_max)
        return acc, nprop

    def _chains(self, x, pos_idx, ends, g, cache, acc, k_max) -> None:  # noqa: ANN001
        torch = _torch()
        s = len(x)
        T = torch.as_tensor(ends[pos_idx])
        tok = torch.as_tensor(x[ends[pos_idx]])  # d1 == x[T] (the chain is right so far)
        feat = g[T - 2]
        ctx_len = T - 1  # cache entries t <= T-2
        chain: list[tuple[Any, Any]] = [
            (torch.zeros(len(pos_idx), 0, self.head.nkv, self.head.hd),) * 2
            for _ in range(self.head.n_layers)
        ]
        idx = np.asarray(pos_idx)
        for j in range(2, k_max + 1):  # computing draft j
            pos = T - 2 + (j - 1)
            out, kv = self.head.step(tok, feat, pos, cache, ctx_len, chain)
            d = self.head.logits(out).argmax(-1).numpy()
            tgt_i = ends[idx] + j - 1
            right = (tgt_i < s) & (d == x[np.minimum(tgt_i, s - 1)])
            acc[idx[right]] = j + 1
            if not right.any() or j == k_max:
                return
            keep = torch.as_tensor(np.flatnonzero(right))
            chain = [(torch.cat([c[0], k_[:, None]], 1)[keep], torch.cat([c[1], v_[:, None]], 1)[keep])
                     for c, (k_, v_) in zip(chain, kv, strict=True)]  # fmt: skip
            idx, T, ctx_len = idx[right], T[keep], ctx_len[keep]
            tok = torch.as_tensor(d[right])
            feat = out[keep]
