"""Replay of a drafter against the target's greedy output (teacher-forced), as vLLM would step it.

For each held-out sequence (prompt + the target's greedy output), the head's k-step chains are computed at
every position in one TTT pass. Decoding is then stepped as vLLM does: with context x[..c-1] the head drafts
from position c-2; a = the number of leading drafts equal to the target's tokens; the step commits a + 1
tokens. Metrics per workload: first-position acceptance (share of steps whose first draft is accepted),
mean tokens per step (a + 1), and acceptance rate per draft position.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from speclab.drafters.data import Sequence
from speclab.models.eagle3 import Eagle3Head


def collate(seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (tokens, feats, labels, valid) for a list of sequences."""
    n = max(len(s.tokens) for s in seqs)
    b, dim = len(seqs), seqs[0].feats.shape[1]
    tokens = torch.zeros(b, n, dtype=torch.long)
    feats = torch.zeros(b, n, dim)
    labels = torch.full((b, n), -1, dtype=torch.long)
    valid = torch.zeros(b, n, dtype=torch.bool)
    for i, s in enumerate(seqs):
        m = len(s.tokens)
        tokens[i, :m], feats[i, :m], labels[i, :m], valid[i, :m] = s.tokens, s.feats.float(), s.labels, True
    return tokens, feats, labels, valid


@torch.no_grad()
def chain_accepts(head: Eagle3Head, seqs: list[Sequence], k: int, batch_size: int = 8) -> list[torch.Tensor]:
    """Per sequence, acc[t] = how many of the k drafts made from position t match the target's greedy
    tokens x[t+2 ..] (chains are cut where the sequence ends)."""
    head.eval()
    draft_ids = head.draft_ids()
    out: list[torch.Tensor] = []
    for i in range(0, len(seqs), batch_size):
        chunk = seqs[i : i + batch_size]
        tokens, feats, labels, valid = collate(chunk)
        logits = head.forward_ttt(tokens, feats, valid, k)
        n = tokens.shape[1]
        ok = torch.ones(tokens.shape, dtype=torch.bool)
        acc = torch.zeros(tokens.shape, dtype=torch.long)
        for j, lg in enumerate(logits):
            pred = draft_ids[lg.argmax(-1)]  # target ids
            lab = torch.roll(labels, -(1 + j), 1)  # target's argmax at t+1+j = x[t+2+j] in greedy output
            inside = torch.arange(n) + 1 + j < n
            ok = ok & (pred == lab) & (lab >= 0) & inside
            acc += ok.long()
        for r, s in enumerate(chunk):
            out.append(acc[r, : len(s.tokens)].clone())
    return out


def step_replay(acc: torch.Tensor, out_start: int, n: int, k: int) -> list[int]:
    """Accepted drafts per step while decoding positions out_start+1 .. n-1 (the first output token comes
    from prefill). Drafts past the end of the output are not counted as accepted."""
    steps: list[int] = []
    c = out_start + 1
    while c < n:
        a = min(int(acc[c - 2]), k, n - c)
        steps.append(a)
        c += a + 1
    return steps


TRAINING_SOURCES = "training-sources"  # held-out prompts of the sources the drafter was trained on
LEFT_OUT = "left-out"  # prompts of sources left out of training entirely


def summarize_steps(by: dict[str, list[int]], k: int) -> dict[str, Any]:
    """Accepted drafts per step, grouped (sources, then the pooled groups and "all") -> steps, first_acceptance (share of
    steps whose first draft is accepted), tokens_per_step (mean a + 1) and per-position acceptance rates."""
    res: dict[str, Any] = {}
    last = (
        TRAINING_SOURCES,
        LEFT_OUT,
        "all",
    )  # sources first, in order of appearance, then the pooled groups
    for w in [w for w in by if w not in last] + [w for w in last if w in by]:
        steps = by[w]
        t = torch.tensor(steps, dtype=torch.float)
        n = max(len(steps), 1)
        res[w] = {
            "steps": len(steps),
            "first_acceptance": round(float((t >= 1).sum()) / n, 4),
            "tokens_per_step": round(float((t + 1).sum()) / n, 4),
            "per_position": [round(float((t >= j + 1).sum()) / n, 4) for j in range(k)],
        }
    return res


def add_steps(by: dict[str, list[int]], source: str, steps: list[int], left_out: frozenset[str]) -> None:
    """Group one sequence's steps under its source, "all", and (when some evaluation source was left out of
    training) under LEFT_OUT or TRAINING_SOURCES."""
    by[source] += steps
    by["all"] += steps
    if left_out:
        by[LEFT_OUT if source in left_out else TRAINING_SOURCES] += steps


def replay_metrics(
    head: Eagle3Head, seqs: list[Sequence], k: int = 3, left_out: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Metrics per source (workload), over all, and over the sources in / left out of training: steps,
    first_acceptance, tokens_per_step, per-position rates."""
    accs = chain_accepts(head, seqs, k)
    by: dict[str, list[int]] = defaultdict(list)
    for s, acc in zip(seqs, accs, strict=True):
        add_steps(by, s.workload, step_replay(acc, s.out_start, len(s.tokens), k), left_out)
    return summarize_steps(by, k)


def left_out_sources(recipe: Any) -> frozenset[str]:
    """The recipe's evaluation sources it does not train on (a recipe object or its manifest dict)."""
    r = recipe if isinstance(recipe, dict) else vars(recipe)
    return frozenset(w for w in r["eval_workloads"] if w not in r["workloads"])


def evaluation_by_source(final: dict[str, Any] | None, recipe: Any) -> dict[str, Any]:
    """The final held-out metrics keyed by source, each marked left_out (not a training source) or not,
    and the two pooled groups: what a manifest's `evaluation` holds."""
    final = final or {}
    out: dict[str, Any] = {"sources": {}}
    gone = left_out_sources(recipe)
    for w in (recipe if isinstance(recipe, dict) else vars(recipe))["eval_workloads"]:
        if isinstance(final.get(w), dict):
            out["sources"][w] = {"left_out": w in gone, **final[w]}
    for g in (TRAINING_SOURCES, LEFT_OUT):
        if isinstance(final.get(g), dict):
            out[g] = final[g]
    return out
