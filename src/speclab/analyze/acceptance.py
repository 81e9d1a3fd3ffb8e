"""Acceptance statistics from a trace store, per (workload, method, k_max).

Conventions (see speclab.traces.model): acc_len[p] = accepted drafts + 1 for a step that starts at output
position p. Position 0 is produced by prefill, so every statistic here uses positions 1 .. output_len-1:
the positions a decoding step can start from. Statistics are per *position* (what a step starting there
would get), as in the study, not per executed step; engine-observed per-step acceptance is summarised
separately (`observed_stats`) from meta["observed"].
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from speclab.traces import RequestTrace

DEFAULT_POSITION_BINS = 10
# A position whose step accepts this many tokens or more counts as a "burst" in the heavy-tail stats.
BURST_LEN = 5
TOP_SHARE = 0.10
# Per-request means are kept in the JSON (for plots) up to this many requests per group.
MAX_KEPT_VALUES = 5000


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else float("nan")


def summary(a: np.ndarray) -> dict[str, float]:
    """mean / std / p5 / p50 / p95 / min / max of a 1-D array (NaN when empty)."""
    a = np.asarray(a, dtype=np.float64)
    if not a.size:
        nan = float("nan")
        return {"mean": nan, "std": nan, "p5": nan, "p50": nan, "p95": nan, "min": nan, "max": nan}
    return {
        "mean": float(a.mean()),
        "std": float(a.std()),
        "p5": _pct(a, 5),
        "p50": _pct(a, 50),
        "p95": _pct(a, 95),
        "min": float(a.min()),
        "max": float(a.max()),
    }


def heavy_tail(acc: np.ndarray, k_max: int) -> dict[str, Any]:
    """How much of the accepted work comes from rare long bursts.

    - share_ge_burst: share of positions with acc_len >= BURST_LEN (None when k_max+1 < BURST_LEN)
    - p95_over_p50: ratio of the 95th to the 50th percentile of acc_len
    - top10_share: share of all accepted draft tokens (acc_len - 1) that come from the 10% of positions
      with the longest acceptance (0.10 = no tail at all; near 1 = everything comes from bursts)
    - skewness: sample skewness of acc_len
    """
    acc = np.asarray(acc, dtype=np.float64)
    out: dict[str, Any] = {"burst_len": BURST_LEN, "top_fraction": TOP_SHARE}
    if not acc.size:
        return out | {"share_ge_burst": None, "p95_over_p50": None, "top10_share": None, "skewness": None}
    out["share_ge_burst"] = float((acc >= BURST_LEN).mean()) if k_max + 1 >= BURST_LEN else None
    p50 = _pct(acc, 50)
    out["p95_over_p50"] = _pct(acc, 95) / p50 if p50 > 0 else None
    accepted = np.sort(acc - 1.0)[::-1]
    total = accepted.sum()
    n_top = max(1, int(np.ceil(TOP_SHARE * accepted.size)))
    out["top10_share"] = float(accepted[:n_top].sum() / total) if total > 0 else None
    sd = acc.std()
    out["skewness"] = float(((acc - acc.mean()) ** 3).mean() / sd**3) if sd > 0 else 0.0
    return out


def _position_curve(
    per_request: Sequence[np.ndarray], n_bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Acceptance along the output in normalised position bins (position p / output_len).

    Returns (pooled mean per bin, request-weighted mean per bin, positions per bin). The pooled mean lets
    long outputs weigh by their length; the request-weighted one gives every request one vote per bin, so
    a few very long reasoning outputs do not hide the shape of the short ones (and vice versa).
    """
    sums = np.zeros(n_bins)
    counts = np.zeros(n_bins, dtype=np.int64)
    req_sums = np.zeros(n_bins)
    req_counts = np.zeros(n_bins, dtype=np.int64)
    for full in per_request:
        n = len(full)
        if n < 2:
            continue
        pos = np.arange(1, n)
        bins = np.minimum((pos * n_bins) // n, n_bins - 1)
        vals = full[1:].astype(np.float64)
        s = np.bincount(bins, weights=vals, minlength=n_bins)
        c = np.bincount(bins, minlength=n_bins)
        sums += s
        counts += c
        has = c > 0
        req_sums[has] += s[has] / c[has]
        req_counts[has] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        pooled = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        weighted = np.where(req_counts > 0, req_sums / np.maximum(req_counts, 1), np.nan)
    return pooled, weighted, counts


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and not np.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return x


def acceptance_stats(
    records: Iterable[RequestTrace], n_bins: int = DEFAULT_POSITION_BINS
) -> list[dict[str, Any]]:
    """One entry per (workload, method, k_max) found in the records' `methods`."""
    groups: dict[tuple[str, str, int], list[tuple[RequestTrace, Any]]] = defaultdict(list)
    categories: dict[str, str] = {}
    for r in records:
        categories.setdefault(r.workload, r.category)
        for name, mt in r.methods.items():
            groups[(r.workload, name, int(mt.k_max))].append((r, mt))

    out: list[dict[str, Any]] = []
    for (workload, method, k_max), items in sorted(groups.items()):
        fulls = [mt.acc_len for _, mt in items if len(mt.acc_len) >= 2]
        if not fulls:
            continue
        pooled = np.concatenate([f[1:] for f in fulls]).astype(np.int64)
        req_means = np.array([f[1:].mean() for f in fulls])
        output_lens = np.array([len(f) for f in fulls])
        hist_values = np.arange(1, k_max + 2)
        hist_counts = np.bincount(pooled, minlength=k_max + 2)[1 : k_max + 2]
        # alpha_i = P(at least i drafts accepted), i = 1..k_max: the per-position acceptance rate of a
        # chain, comparable with the bench's acceptance_rate_per_pos.
        rate = [float((pooled - 1 >= i).mean()) for i in range(1, k_max + 1)]
        curve, curve_w, curve_n = _position_curve(fulls, n_bins)
        proposed = [
            mt.num_proposed[1:] for _, mt in items if mt.num_proposed is not None and len(mt.acc_len) >= 2
        ]
        proposal_rate = float(np.concatenate(proposed).astype(bool).mean()) if proposed else None
        per_req = summary(req_means)
        per_req["cv"] = per_req["std"] / per_req["mean"] if per_req["mean"] else None
        entry = {
            "workload": workload,
            "category": categories.get(workload, "other"),
            "method": method,
            "k_max": k_max,
            "n_requests": len(fulls),
            "n_positions": int(pooled.size),
            "output_len": summary(output_lens),
            **summary(pooled),
            "hist": {"values": hist_values.tolist(), "counts": hist_counts.tolist()},
            "per_position_rate": rate,
            "proposal_rate": proposal_rate,
            "position_curve": {
                "n_bins": n_bins,
                "edges": np.linspace(0.0, 1.0, n_bins + 1).round(6).tolist(),
                "mean": curve.tolist(),
                "mean_request_weighted": curve_w.tolist(),
                "count": curve_n.tolist(),
            },
            "per_request": per_req | {"values": req_means[:MAX_KEPT_VALUES].round(4).tolist()},
            "heavy_tail": heavy_tail(pooled, k_max),
        }
        out.append(_nan_to_none(entry))
    return out


def observed_stats(
    records: Iterable[RequestTrace], labels: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Engine-observed acceptance (bench records' meta["observed"]) per (workload, method, k, entry label).

    Acceptance length per executed step = accepted + 1; steps where nothing was proposed are absent from
    vLLM's metrics, so this is conditioned on a proposal (unlike the replayed per-position numbers).
    `labels` (cell_id -> sweep-entry label, from the run's results) keeps two entries with the same method
    and k but other options apart; without it (a trace store alone) they share a group and label is None.
    """
    groups: dict[tuple[str, str, int, str | None], list[list[int]]] = defaultdict(list)
    for r in records:
        meta = r.meta if isinstance(r.meta, dict) else {}
        obs = meta.get("observed")
        if not isinstance(obs, dict) or not obs.get("per_step_accepted"):
            continue
        label = (labels or {}).get(str(meta.get("cell_id")))
        try:
            key = (r.workload, str(obs.get("method")), int(obs.get("k") or 0), label)
            groups[key].append([int(x) for x in obs["per_step_accepted"]])
        except (TypeError, ValueError):
            continue
    out = []
    for (workload, method, k, label), steps in sorted(
        groups.items(), key=lambda g: (*g[0][:3], g[0][3] or "")
    ):
        acc = np.concatenate([np.asarray(s, dtype=np.float64) for s in steps]) + 1.0
        out.append(
            _nan_to_none(
                {
                    "workload": workload,
                    "method": method,
                    "k": k,
                    "label": label,
                    "n_requests": len(steps),
                    "n_steps": int(acc.size),
                    **summary(acc),
                }
            )
        )
    return out
