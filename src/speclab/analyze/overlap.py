"""Prompt-output overlap against the advantage of a model-free proposer (n-gram) over a model drafter.

Overlap per request: `speclab.workloads.overlap.ngram_overlap(prompt_ids, output_ids)` (the study's BLEU-4 of
the output against the prompt, on token ids); the report names it.
Advantage per request: mean acc_len(ngram) - mean acc_len(model drafter) over positions 1..n-1.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from speclab.catalog import MODEL_BASED, MODEL_FREE
from speclab.traces import RequestTrace
from speclab.workloads.overlap import ngram_overlap

OVERLAP_BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0001)
OVERLAP_SOURCE = "speclab.workloads.overlap.ngram_overlap"


def _rank(a: np.ndarray) -> np.ndarray:
    order = a.argsort(kind="stable")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(len(a))
    # average ties
    vals, inv = np.unique(a, return_inverse=True)
    sums = np.bincount(inv, weights=ranks)
    cnts = np.bincount(inv)
    return (sums / cnts)[inv]


def _corr(x: np.ndarray, y: np.ndarray) -> float | None:
    if len(x) < 3 or x.std() == 0 or y.std() == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def overlap_vs_advantage(records: Iterable[RequestTrace]) -> dict[str, Any]:
    """Per workload and (model-free, model-based) pair: per-request points, correlations, a linear fit
    and the overlap at which the fit crosses zero (where n-gram starts to win), plus binned means."""
    points: dict[tuple[str, str, str], list[tuple[float, float, str]]] = defaultdict(list)
    skipped_no_ids = 0
    for r in records:
        if r.prompt_token_ids is None or r.output_token_ids is None:
            skipped_no_ids += 1
            continue
        frees = [m for m in MODEL_FREE if m in r.methods and len(r.methods[m].acc_len) >= 2]
        models = [
            m
            for m in r.methods
            if (m in MODEL_BASED or m.startswith("custom:")) and len(r.methods[m].acc_len) >= 2
        ]
        if not frees or not models:
            continue
        ov = float(ngram_overlap(r.prompt_token_ids.tolist(), r.output_token_ids.tolist()))
        for f in frees:
            mf = float(r.methods[f].acc_len[1:].mean())
            for m in models:
                adv = mf - float(r.methods[m].acc_len[1:].mean())
                points[(r.workload, f, m)].append((ov, adv, r.id))
    groups = []
    for (workload, free, model), pts in sorted(points.items()):
        x = np.array([p[0] for p in pts])
        y = np.array([p[1] for p in pts])
        fit = None
        crossover = None
        if len(x) >= 3 and x.std() > 0:
            slope, intercept = np.polyfit(x, y, 1)
            fit = {"slope": float(slope), "intercept": float(intercept)}
            if slope != 0:
                # only inside the observed overlap range: no extrapolation
                c = -intercept / slope
                crossover = float(c) if x.min() <= c <= x.max() else None
        bins = []
        for lo, hi in zip(OVERLAP_BINS[:-1], OVERLAP_BINS[1:], strict=True):
            sel = (x >= lo) & (x < hi)
            bins.append(
                {
                    "lo": lo,
                    "hi": min(hi, 1.0),
                    "n": int(sel.sum()),
                    "mean_advantage": float(y[sel].mean()) if sel.any() else None,
                    "share_free_wins": float((y[sel] > 0).mean()) if sel.any() else None,
                }
            )
        groups.append(
            {
                "workload": workload,
                "free_method": free,
                "model_method": model,
                "n": len(pts),
                "mean_overlap": float(x.mean()),
                "mean_advantage": float(y.mean()),
                "share_free_wins": float((y > 0).mean()),
                "pearson": _corr(x, y),
                "spearman": _corr(_rank(x), _rank(y)),
                "fit": fit,
                "crossover_overlap": crossover,
                "bins": bins,
                "points": [[round(p[0], 4), round(p[1], 4), p[2]] for p in pts[:5000]],
            }
        )
    return {"overlap_source": OVERLAP_SOURCE, "skipped_without_token_ids": skipped_no_ids, "groups": groups}
