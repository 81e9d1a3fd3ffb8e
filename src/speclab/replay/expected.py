"""Expected acceptance of sampled traces: MethodTrace.accept_prob along the no-SD (reference) output.

A sampled record (meta["sampling"] with temperature > 0) holds one sampled output of the target without SD.
Under speculative sampling the target accepts draft j with probability min(1, p_T(d)/q(d)); for a step at
output position p (context prompt + output[:p]):
- lookup methods (n-gram, suffix) propose tokens without a distribution (vLLM treats the draft as one-hot),
  so draft j = d is accepted with probability p_T(d), the target's tempered, top-p/top-k filtered
  probability of d at that position;
- model drafters (draft model, EAGLE-3 head) drafting probabilistically from their tempered distribution
  q_T accept draft j with probability sum_x min(p_T(x), q_T(x)) ("sum-min"). vLLM's default
  (draft_sample_method "greedy") drafts argmax q and treats it as one-hot: then the probability is
  p_T(argmax q) ("greedy-draft"). Which one a trace holds is its accept_source.

Approximation: the probability of draft j is taken given drafts 1..j-1 accepted *along the reference path*,
i.e. with the target's (and the drafter's) distribution at output position p+j-1 after prompt +
output[:p+j-1], the reference tokens, not the drafts themselves. Exact for the first draft, and wherever the
earlier drafts equal the reference tokens; an estimate elsewhere. One teacher-forced forward of the target
(and of a draft model) over prompt + output gives every position's distribution.

The target's distribution is computed as vLLM samples: logits / temperature, then top-k, then top-p (the
smallest set of most probable tokens holding top_p of the mass), then softmax. The drafter's q_T is tempered
only (vLLM ignores top-p/top-k when drafting). Re-tempering a trace to another temperature needs new outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from speclab.traces import MethodTrace, RequestTrace

LOOKUP_SOURCE = "lookup p_T(d) along the no-SD path"
SUM_MIN_SOURCE = "model sum-min along the no-SD path"
GREEDY_DRAFT_SOURCE = "model greedy-draft p_T(argmax q) along the no-SD path"
DRAFT_SAMPLING = ("probabilistic", "greedy")  # model drafters: sum-min / greedy-draft


def record_sampling(rec: RequestTrace) -> dict[str, Any] | None:
    """The record's sampling settings when it was sampled (temperature > 0), else None (greedy)."""
    s = rec.meta.get("sampling")
    if not isinstance(s, dict) or float(s.get("temperature") or 0.0) <= 0.0:
        return None
    return s


def tempered_probs(logits: Any, temperature: float, top_p: float = 1.0, top_k: int = 0) -> Any:
    """Rows of logits -> the sampling distribution (torch float32), vLLM's order: temperature, top-k, top-p."""
    import torch

    x = logits.float() / float(temperature)
    if top_k and 0 < top_k < x.shape[-1]:
        kth = torch.topk(x, int(top_k), dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        srt, idx = torch.sort(x, dim=-1, descending=False)
        cum = torch.softmax(srt, dim=-1).cumsum(dim=-1)
        drop = cum <= 1.0 - float(top_p)
        drop[..., -1] = False  # the most probable token always stays
        x = x.masked_fill(torch.zeros_like(drop).scatter(-1, idx, drop), float("-inf"))
    return torch.softmax(x, dim=-1)


def next_token_logits(model: Any, x: np.ndarray, first: int, chunk: int = 512) -> Any:
    """Teacher-forced logits of a causal LM over x, rows first..len(x)-1 only (row i: the distribution of
    x[i+1]); [len(x) - first, V] float32. The output head runs on those rows only."""
    from speclab.methods.draft_model import tail_logits

    return tail_logits(model, x, first, chunk)


class TargetScorer:
    """The target's sampling distribution at every output position of a record (teacher forcing)."""

    def __init__(self, target: Any, chunk: int = 512, threads: int | None = None) -> None:
        import torch

        if threads:
            torch.set_num_threads(threads)
        if isinstance(target, str | Path):
            from transformers import AutoModelForCausalLM

            target = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
        self.model = target.eval()
        self.chunk = chunk

    def probs(self, prompt_ids: np.ndarray, output_ids: np.ndarray, sampling: dict[str, Any]) -> Any:
        """[n+1, V]: row i = the target's distribution of output[i] given prompt + output[:i] (row n: the
        token after the whole output)."""
        x = np.concatenate([np.asarray(prompt_ids, np.int64), np.asarray(output_ids, np.int64)])
        logits = next_token_logits(self.model, x, len(prompt_ids) - 1, self.chunk)
        return tempered_probs(
            logits,
            sampling["temperature"],
            float(sampling.get("top_p") or 1.0),
            int(sampling.get("top_k") or 0),
        )


def _rows(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(p, j) grids of shape (n, k): position p, draft index j (0-based); the draft is scored at p + j."""
    return np.meshgrid(np.arange(n), np.arange(k), indexing="ij")


def lookup_accept_prob(probs: Any, drafts: np.ndarray) -> np.ndarray:
    """drafts (n, k_max): the tokens proposed at each position, -1 where none. accept_prob[p, j] = the
    target's probability of draft j+1 at output position p + j (0 past the last known distribution)."""
    p_np = probs.numpy() if hasattr(probs, "numpy") else np.asarray(probs)
    n, k = drafts.shape
    pos, j = _rows(n, k)
    at = pos + j
    ok = (drafts >= 0) & (at < p_np.shape[0])
    out = np.zeros((n, k), dtype=np.float32)
    out[ok] = p_np[at[ok], drafts[ok]]
    return out


def ngram_drafts(proposer: Any, prompt_ids: np.ndarray, output_ids: np.ndarray, k_max: int) -> np.ndarray:
    """The n-gram proposer's draft tokens at every output position, (n, k_max), -1 padded."""
    from speclab.methods.ngram import ngram_lookup

    x = np.concatenate([np.asarray(prompt_ids, np.int64), np.asarray(output_ids, np.int64)])
    n = len(output_ids)
    ends = len(prompt_ids) + np.arange(n, dtype=np.int64)
    s, ln = ngram_lookup(x, ends, proposer.min_n, proposer.max_n, k_max, proposer.max_model_len)
    return pad_drafts([x[a : a + b] for a, b in zip(s, ln, strict=True)], k_max)


def pad_drafts(drafts: list[Any], k_max: int) -> np.ndarray:
    out = np.full((len(drafts), k_max), -1, dtype=np.int64)
    for p, d in enumerate(drafts):
        d = np.asarray(d, dtype=np.int64)[:k_max]
        out[p, : len(d)] = d
    return out


def _overlap(p_rows: Any, q_rows: Any, how: str) -> Any:
    """Per row: sum_x min(p, q) ("probabilistic") or p(argmax q) ("greedy")."""
    import torch

    if how == "greedy":
        return p_rows.gather(-1, q_rows.argmax(-1, keepdim=True))[..., 0]
    return torch.minimum(p_rows, q_rows).sum(-1)


def _same_vocab(p: Any, q: Any) -> tuple[Any, Any]:
    """Pad the smaller vocabulary with zero-probability columns (padded embedding rows differ by model)."""
    import torch.nn.functional as F

    v = max(p.shape[-1], q.shape[-1])
    return F.pad(p, (0, v - p.shape[-1])), F.pad(q, (0, v - q.shape[-1]))


def draft_model_accept_prob(
    proposer: Any, prompt_ids: np.ndarray, output_ids: np.ndarray, probs: Any, temperature: float,
    num_proposed: np.ndarray, how: str = "probabilistic",
) -> np.ndarray:  # fmt: skip
    """Draft model: its tempered q at every position from one teacher-forced forward; draft j+1 of the step
    at p is scored at position p + j (the chain's context along the reference path)."""
    import torch

    x = np.concatenate([np.asarray(prompt_ids, np.int64), np.asarray(output_ids, np.int64)])
    first = len(prompt_ids) - 1
    with torch.inference_mode():
        if hasattr(proposer, "next_logits"):  # the forward its replay already ran over this record
            lg = proposer.next_logits(x, first)
        else:
            lg = next_token_logits(proposer.model, x, first, proposer.chunk)
        q = tempered_probs(lg, temperature)
        ov = _overlap(*_same_vocab(probs, q), how).numpy()  # [n+1]
    return _by_position(ov, num_proposed)


def _by_position(ov: np.ndarray, num_proposed: np.ndarray) -> np.ndarray:
    n, k = len(num_proposed), int(num_proposed.max(initial=0))
    out = np.zeros((n, k), dtype=np.float32)
    pos, j = _rows(n, k)
    ok = (j < num_proposed[:, None]) & (pos + j < len(ov))
    out[ok] = ov[(pos + j)[ok]]
    return out


def eagle3_accept_prob(
    proposer: Any, prompt_ids: np.ndarray, output_ids: np.ndarray, probs: Any, temperature: float,
    num_proposed: np.ndarray, how: str = "probabilistic",
) -> np.ndarray:  # fmt: skip
    """EAGLE-3 head: draft j+1 of the chain started at p (head row t = plen + p - 2) fed the reference tokens
    (the training-time-test pass), its tempered q over the draft vocabulary against p_T at position p + j."""
    import torch

    plen, n = len(prompt_ids), len(output_ids)
    x = np.concatenate([np.asarray(prompt_ids, np.int64), np.asarray(output_ids, np.int64)])
    k = int(num_proposed.max(initial=0))
    out = np.zeros((n, k), dtype=np.float32)
    use = np.flatnonzero(num_proposed > 0)
    if not len(use):
        return out
    draft_ids = torch.as_tensor(proposer.draft_ids)
    tokens, valid = torch.as_tensor(x)[None], torch.ones(1, len(x), dtype=torch.bool)
    t_lo, t_hi = plen + int(use.min()) - 2, plen + int(use.max()) - 1
    with torch.inference_mode():
        feats = proposer.features(x)[None]
        for a in range(t_lo, t_hi, proposer.block):
            b = min(a + proposer.block, t_hi)
            pos = np.arange(a, b) - plen + 2  # output position of each row's step
            for j, lg in enumerate(proposer.head.iter_ttt(tokens, feats, valid, k, rows=slice(a, b))):
                at = pos + j
                ok = (at < probs.shape[0]) & (j < num_proposed[pos])
                if not ok.any():
                    continue
                p_rows = probs[torch.as_tensor(at[ok])][:, draft_ids]
                q_rows = tempered_probs(lg[0][torch.as_tensor(ok)], temperature)
                out[pos[ok], j] = _overlap(p_rows, q_rows, how).numpy()
    return out


def fill_accept_prob(
    mt: MethodTrace, method: str, proposer: Any, rec: RequestTrace, probs: Any, sampling: dict[str, Any],
    drafts: np.ndarray | None = None, how: str = "probabilistic",
) -> None:  # fmt: skip
    """Set mt.accept_prob / accept_source for one replayed method of a sampled record."""
    args = (rec.prompt_token_ids, rec.output_token_ids)
    if method in ("ngram", "suffix"):
        if drafts is None:
            drafts = ngram_drafts(proposer, *args, mt.k_max)
        ap, src = lookup_accept_prob(probs, drafts), LOOKUP_SOURCE
    elif method in ("draft_model", "eagle3"):
        fn = draft_model_accept_prob if method == "draft_model" else eagle3_accept_prob
        ap = fn(proposer, *args, probs, float(sampling["temperature"]), mt.num_proposed, how)
        src = SUM_MIN_SOURCE if how == "probabilistic" else GREEDY_DRAFT_SOURCE
    else:
        return  # no expected acceptance for this method (e.g. EAGLE-1): the trace stays greedy-only
    full = np.zeros((len(mt.acc_len), mt.k_max), dtype=np.float32)
    full[:, : ap.shape[1]] = ap[:, : mt.k_max]
    full[np.arange(mt.k_max)[None, :] >= mt.num_proposed[:, None]] = 0.0
    mt.accept_prob, mt.accept_source = full, src
