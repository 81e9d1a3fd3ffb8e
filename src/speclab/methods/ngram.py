"""n-gram (prompt lookup) proposer with exactly vLLM's lookup rules, for replay and live use.

vLLM's rule (v1/spec_decode/ngram_proposer.py, `_find_longest_matched_ngram_and_propose_tokens`), restated:
for a context c of length T,
- no proposal if T < min_n, or if k' = min(k, max_model_len - T) <= 0;
- L = the largest n <= max_n such that the suffix c[T-n:T] also occurs earlier, at a start s with
  s + n <= T - 1 (so at least one token follows the occurrence inside the context);
- no proposal if L < min_n;
- among the occurrences of that length-L suffix, take the EARLIEST one (smallest s), and propose
  c[s+L : s+L+k'], cut at the end of the context (so a proposal may be shorter than k).
(vLLM finds this with a KMP pass over the reversed context; "earliest" is its documented tie rule.)

Here the same rule is computed for many context lengths at once: for each n, every n-gram of the full
sequence gets an exact integer id (no hashing, so no collisions) and the index of its first occurrence; the
earliest occurrence of the suffix ending at T-1 is then the first occurrence of that id, and it lies before
the suffix itself exactly when that index is < T-1. Existence is monotone in n, so L is the largest n in
[min_n, max_n] that has an earlier occurrence. Both `propose` (one context, used live) and `replay` (every
position of a finished request) call `ngram_lookup`, so replay and live proposals cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from speclab.catalog import NGRAM_MAX_N, NGRAM_MIN_N
from speclab.errors import ConfigError


def _first_occurrence_by_n(x: np.ndarray, max_n: int) -> list[np.ndarray]:
    """fo[n][e] = end index of the first occurrence of the n-gram x[e-n+1 : e+1] (fo[n][e] = e when it is
    new; entries with e < n-1 are -1). fo[0] is unused."""
    m = len(x)
    out: list[np.ndarray] = [np.empty(0, dtype=np.int64)]
    # exact ids: id_1 = compact token id; id_n[e] = rank of the pair (id_{n-1}[e-1], id_1[e])
    _, tok_id = np.unique(x, return_inverse=True)
    tok_id = tok_id.astype(np.int64).reshape(-1)
    n_tok = int(tok_id.max()) + 1 if m else 1
    ids = tok_id.copy()
    for n in range(1, max_n + 1):
        fo = np.full(m, -1, dtype=np.int64)
        if m >= n:
            valid = ids[n - 1 :]
            _, first_idx, inv = np.unique(valid, return_index=True, return_inverse=True)
            fo[n - 1 :] = first_idx[inv.reshape(-1)] + (n - 1)
        out.append(fo)
        if n < max_n and m > n:
            nxt = np.full(m, -1, dtype=np.int64)
            pair = ids[n - 1 : m - 1] * n_tok + tok_id[n:]
            _, inv = np.unique(pair, return_inverse=True)
            nxt[n:] = inv.reshape(-1)
            ids = nxt
    return out


def ngram_lookup(
    x: np.ndarray,
    ends: np.ndarray,
    min_n: int,
    max_n: int,
    k: int,
    max_model_len: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """For each context length T in `ends` (context = x[:T]), vLLM's n-gram proposal as (start, length):
    the proposal is x[start : start+length]; length 0 = no proposal."""
    x = np.asarray(x, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    start = np.zeros(len(ends), dtype=np.int64)
    length = np.zeros(len(ends), dtype=np.int64)
    if len(ends) == 0:
        return start, length
    if ends.min() < 0 or ends.max() > len(x):
        raise ValueError("context lengths must lie in 0..len(x)")
    kk = np.full(len(ends), k, dtype=np.int64)
    if max_model_len is not None:
        kk = np.minimum(kk, max_model_len - ends)
    fos = _first_occurrence_by_n(x[: int(ends.max())], max_n)
    best_a = np.full(len(ends), -1, dtype=np.int64)  # index right after the chosen occurrence
    found = np.zeros(len(ends), dtype=bool)
    last = ends - 1
    # longest n first: the first n that matches is L
    for n in range(max_n, min_n - 1, -1):
        ok = (~found) & (ends >= n + 1)
        if not ok.any():
            continue
        idx = np.flatnonzero(ok)
        fo = fos[n][last[idx]]
        hit = (fo >= 0) & (fo < last[idx])
        sel = idx[hit]
        best_a[sel] = fo[hit] + 1
        found[sel] = True
    use = found & (ends >= min_n) & (kk > 0)
    start[use] = best_a[use]
    length[use] = np.minimum(kk[use], ends[use] - best_a[use])
    return start, length


@dataclass
class NgramProposer:
    """Prompt lookup with vLLM's rules. `min_n`/`max_n` are vLLM's prompt_lookup_min/max."""

    min_n: int = NGRAM_MIN_N
    max_n: int = NGRAM_MAX_N
    max_model_len: int | None = None

    name = "ngram"

    def __post_init__(self) -> None:
        if not (1 <= self.min_n <= self.max_n):
            raise ConfigError(f"ngram: need 1 <= min ({self.min_n}) <= max ({self.max_n})")

    def propose(self, context_ids: np.ndarray, k: int) -> np.ndarray:
        ctx = np.asarray(context_ids, dtype=np.int64)
        s, n = ngram_lookup(ctx, np.array([len(ctx)]), self.min_n, self.max_n, k, self.max_model_len)
        return ctx[int(s[0]) : int(s[0]) + int(n[0])]

    def replay(
        self, prompt_ids: np.ndarray, output_ids: np.ndarray, k_max: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """acc_len and num_proposed at every output position p (context prompt + output[:p])."""
        prompt_ids = np.asarray(prompt_ids, dtype=np.int64)
        output_ids = np.asarray(output_ids, dtype=np.int64)
        x = np.concatenate([prompt_ids, output_ids])
        ends = len(prompt_ids) + np.arange(len(output_ids), dtype=np.int64)
        s, n = ngram_lookup(x, ends, self.min_n, self.max_n, k_max, self.max_model_len)
        return acceptance_from_spans(x, ends, s, n, k_max), n.astype(np.int32)


def acceptance_from_spans(
    x: np.ndarray, ends: np.ndarray, start: np.ndarray, length: np.ndarray, k_max: int
) -> np.ndarray:
    """acc_len = 1 + longest prefix of x[start:start+length] equal to x[end:], for proposals that are
    spans of the known sequence x (context = x[:end]). Tokens past the end of x never match."""
    m = len(x)
    j = np.arange(k_max, dtype=np.int64)
    src = start[:, None] + j[None, :]
    dst = ends[:, None] + j[None, :]
    inside = (j[None, :] < length[:, None]) & (dst < m)
    eq = inside & (x[np.minimum(src, m - 1)] == x[np.minimum(dst, m - 1)])
    acc = np.cumprod(eq, axis=1).sum(axis=1)
    return (acc + 1).astype(np.int32)


def vllm_ngram_kernel() -> Callable[..., np.ndarray] | None:
    """vLLM's own compiled n-gram lookup (numba; `_find_longest_matched_ngram_and_propose_tokens` in
    v1/spec_decode/ngram_proposer.py: the rule speclab.methods.ngram restates), compiled once here; None
    where that vLLM is not importable. One call scans the whole context in a few microseconds, which is
    cheaper than keeping a Python index of every prompt (~0.9 ms per 230-token prompt)."""
    try:
        from vllm.v1.spec_decode.ngram_proposer import (
            _find_longest_matched_ngram_and_propose_tokens as kernel,
        )
    except Exception:  # noqa: BLE001 - any import failure means: use speclab's own index
        return None
    kernel(np.array([1, 2, 3, 1, 2], dtype=np.int32), 2, 3, 64, 2)  # compile now, not in the first step
    return kernel


class IncrementalNgram:
    """vLLM's n-gram rule (speclab.methods.ngram, module docstring) for one growing context, kept
    incrementally: a dict per n from each n-gram to the end index of its first occurrence, extended by the
    new tokens of each step, so a proposal costs a few dict lookups instead of re-indexing the whole
    context (the live adaptive driver probes every row every step). `tests/test_adaptive_live.py` checks it
    against NgramProposer.propose on every prefix of random and repetitive sequences."""

    def __init__(self, min_n: int, max_n: int, max_model_len: int | None) -> None:
        self.min_n, self.max_n, self.max_model_len = min_n, max_n, max_model_len
        self.first: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]
        self.toks: list[int] = []

    def extend(self, ids: Sequence[int]) -> None:
        toks = self.toks
        for t in ids:
            toks.append(int(t))
            e = len(toks) - 1
            for n in range(self.min_n, min(self.max_n, e + 1) + 1):
                self.first[n].setdefault(tuple(toks[e - n + 1 : e + 1]), e)

    def propose(self, k: int) -> list[int]:
        toks = self.toks
        t = len(toks)
        if self.max_model_len is not None:
            k = min(k, self.max_model_len - t)
        if t < self.min_n or k <= 0:
            return []
        for n in range(min(self.max_n, t - 1), self.min_n - 1, -1):
            fo = self.first[n].get(tuple(toks[t - n :]))
            if fo is not None and fo < t - 1:
                return toks[fo + 1 : min(fo + 1 + k, t)]
        return []
