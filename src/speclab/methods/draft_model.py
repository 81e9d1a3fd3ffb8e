"""Draft-model proposer: a greedy chain from any causal-LM checkpoint (transformers, CPU, fp32 by default).

Live (`propose`): prefill the context into a KV cache, then feed the draft's own argmax token k-1 times.

Replay (`replay`): for acceptance only the chain up to its first wrong token matters, and while the chain
is still right its context IS the target's output. So for greedy drafting, with g[t] = the draft's argmax
after x[:t+1] (one teacher-forced forward over prompt + output, chunked over a reused KV cache):
  the chain started at context length T proposes g[T-1], g[T], ... and stays equal to the target's tokens
  x[T], x[T+1], ... exactly as long as g[t] == x[t+1] for t = T-1, T, ...
so acc_len at every position is 1 + the run of consecutive hits starting at T-1 (capped at k_max), and
num_proposed is k_max (a draft model always proposes k). One forward pass covers all positions, so a
500-token output with k_max 20 replays in about the time of one prefill, instead of 500 chained generations.
The unit test checks this against naive per-position greedy chains. In fp32 the two computations differ
only in floating-point summation order, so an argmax can flip only on a near-exact logit tie.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from speclab.errors import ConfigError


def chunked_forward(
    model: Any, x: np.ndarray, chunk: int, take: Callable[[Any], Any], **kwargs: Any
) -> list[Any]:
    """One sequence through a transformers model with teacher forcing, `chunk` tokens per call over one reused
    KV cache; `take` keeps what is needed of each call's output (so full outputs are not all held at once)."""
    import torch
    from transformers import DynamicCache

    ids = torch.as_tensor(np.asarray(x, dtype=np.int64))[None, :]
    cache = DynamicCache()
    parts = []
    with torch.inference_mode():
        for s in range(0, ids.shape[1], chunk):
            out = model(input_ids=ids[:, s : s + chunk], past_key_values=cache, use_cache=True, **kwargs)
            parts.append(take(out))
    return parts


def tail_logits(model: Any, x: np.ndarray, first: int, chunk: int = 512) -> Any:
    """Teacher-forced next-token logits of a causal LM over x, rows first..len(x)-1 only (row i: the
    distribution of x[i+1]); [len(x) - first, V] float32. The output head runs on those rows only
    (transformers' logits_to_keep): over a long prompt most of a forward's head work is skipped."""
    import torch
    from transformers import DynamicCache

    first = max(int(first), 0)
    ids = torch.as_tensor(np.asarray(x, dtype=np.int64))[None, :]
    cache = DynamicCache()
    parts = []
    with torch.inference_mode():
        for s in range(0, ids.shape[1], chunk):
            e = min(s + chunk, ids.shape[1])
            keep = e - max(first, s)
            out = model(
                input_ids=ids[:, s:e], past_key_values=cache, use_cache=True, logits_to_keep=max(keep, 1)
            )
            if keep > 0:
                parts.append(out.logits[0, -keep:].float())
    return torch.cat(parts) if parts else torch.empty(0)


def runs_of_hits(hit: np.ndarray) -> np.ndarray:
    """run[t] = number of consecutive True values in hit starting at t."""
    n = len(hit)
    idx = np.arange(n)
    # index of the next False at or after t (n if none)
    nxt = np.where(~hit, idx, n)
    nxt = np.minimum.accumulate(nxt[::-1])[::-1]
    return (nxt - idx).astype(np.int64)


class DraftModelProposer:
    name = "draft_model"

    def __init__(
        self,
        model: Any,
        dtype: str = "float32",
        chunk: int = 512,
        max_model_len: int | None = None,
        threads: int | None = None,
    ) -> None:
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        if isinstance(model, str | Path):
            from transformers import AutoModelForCausalLM

            path = Path(model)
            if not path.exists():
                raise ConfigError(f"draft model {path}: not found (prepare it with `speclab models prepare`)")
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
        self.model = model.eval()
        self.chunk = chunk
        self.max_model_len = max_model_len
        self._last: tuple[tuple[bytes, int], Any] | None = None

    # --- live -------------------------------------------------------------------------------------
    def propose(self, context_ids: np.ndarray, k: int) -> np.ndarray:
        torch = self.torch
        from transformers import DynamicCache

        ctx = torch.as_tensor(np.asarray(context_ids, dtype=np.int64))[None, :]
        if self.max_model_len is not None:
            k = min(k, self.max_model_len - ctx.shape[1])
        if k <= 0 or ctx.shape[1] == 0:
            return np.empty(0, dtype=np.int64)
        cache = DynamicCache()
        out: list[int] = []
        with torch.inference_mode():
            logits = None
            for s in range(0, ctx.shape[1], self.chunk):
                logits = self.model(
                    input_ids=ctx[:, s : s + self.chunk], past_key_values=cache, use_cache=True
                ).logits
            for _ in range(k):
                tok = int(logits[0, -1].argmax())
                out.append(tok)
                if len(out) == k:
                    break
                logits = self.model(
                    input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True
                ).logits
        return np.asarray(out, dtype=np.int64)

    # --- replay -----------------------------------------------------------------------------------
    def next_logits(self, x: np.ndarray, first: int) -> Any:
        """tail_logits of the draft over x from row `first`; the last call's result is kept, so replay
        (argmax) and the expected acceptance (tempered q) of one record share one forward."""
        x = np.asarray(x, dtype=np.int64)
        key = (x.tobytes(), int(first))
        if self._last is None or self._last[0] != key:
            self._last = (key, tail_logits(self.model, x, first, self.chunk))
        return self._last[1]

    def greedy_next(self, x: np.ndarray) -> np.ndarray:
        """g[t] = argmax of the draft's next-token logits after x[:t+1], for every t (teacher forcing)."""
        parts = chunked_forward(self.model, x, self.chunk, lambda out: out.logits[0].argmax(-1).numpy())
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def replay(
        self, prompt_ids: np.ndarray, output_ids: np.ndarray, k_max: int
    ) -> tuple[np.ndarray, np.ndarray]:
        prompt_ids = np.asarray(prompt_ids, dtype=np.int64)
        output_ids = np.asarray(output_ids, dtype=np.int64)
        n, plen = len(output_ids), len(prompt_ids)
        if n == 0:
            return np.ones(0, np.int32), np.zeros(0, np.int32)
        x = np.concatenate([prompt_ids, output_ids])
        ends = plen + np.arange(n)  # context length at position p
        if plen > 0:
            # only chains started in the output matter: rows plen-1.. (the last row is never compared)
            g = self.next_logits(x, plen - 1)[:n].argmax(-1).numpy()
            runs = np.concatenate([np.zeros(plen - 1, np.int64), runs_of_hits(g == x[plen:])])
        else:
            # the last token's prediction is never needed (nothing to compare it with)
            runs = runs_of_hits(self.greedy_next(x[:-1]) == x[1:])  # hit[t]: draft after x[:t+1] is x[t+1]
        kk = np.full(n, k_max, dtype=np.int64)
        if self.max_model_len is not None:
            kk = np.clip(np.minimum(kk, self.max_model_len - ends), 0, None)
        # position p's first draft is g[T-1]; run over hits[T-1:], capped at k
        acc = np.minimum(runs[ends - 1], kk) + 1
        return acc.astype(np.int32), kk.astype(np.int32)
