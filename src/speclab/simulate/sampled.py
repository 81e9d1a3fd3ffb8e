"""Sampled traces in the simulator: realisations of each step's accepted count, drawn from accept_prob.

A sampled trace (MethodTrace.accept_prob, see speclab.traces.model) gives, per output position p and draft
position j, the probability that draft j is accepted given drafts 1..j-1 were. One realisation draws, for
every (request, method, position), uniforms u_1..u_k_max from a seeded generator and accepts the leading
drafts with u_j < accept_prob[p, j-1] (sequential Bernoulli); acc_len[p] = 1 + that run. A step at p that
proposes k drafts then gets min(acc_len[p], k + 1), the run among its first k drafts. Each position is
visited at most once per request, so drawing per position equals drawing per step, and every policy, the
fast simulator and the reference loop see the same draws (common random numbers): both simulators read the
realised traces, so they agree for the same seed.

simulate() runs each of `draws` realisations and reports the mean, with the spread of the speedup over the
realisations in SimResult.speedup_spread ({min, max, std, n}). Traces without accept_prob are not touched.
"""

from __future__ import annotations

import zlib
from dataclasses import fields, replace
from typing import Any

import numpy as np

from speclab.traces.model import MethodTrace, RequestTrace

DEFAULT_DRAWS = 8


def has_accept_prob(traces: list[RequestTrace], methods: set[str] | None = None) -> bool:
    return any(
        mt.accept_prob is not None
        for t in traces
        for m, mt in t.methods.items()
        if methods is None or m in methods
    )


def is_sampled(t: RequestTrace) -> bool:
    """Whether a request samples (temperature > 0): its meta["sampling"] says so, or a method trace holds
    sampled acceptance (accept_prob); the cost model's sampled overhead is charged for it."""
    s = t.meta.get("sampling") if isinstance(t.meta, dict) else None
    if isinstance(s, dict) and float(s.get("temperature") or 0.0) > 0.0:
        return True
    return any(mt.accept_prob is not None for mt in t.methods.values())


def draw_acc_len(accept_prob: np.ndarray, u: np.ndarray) -> np.ndarray:
    """acc_len per position: 1 + the leading drafts whose uniform falls below their acceptance probability."""
    return (1 + np.cumprod(u < accept_prob, axis=1).sum(axis=1)).astype(np.int32)


def realise(traces: list[RequestTrace], seed: int, draw: int) -> list[RequestTrace]:
    """Realisation `draw` of the traces: every method trace with accept_prob gets a drawn acc_len (its
    generator seeded by (seed, draw, method), requests in order); others are shared unchanged."""
    gens: dict[str, np.random.Generator] = {}
    out = []
    for t in traces:
        methods: dict[str, MethodTrace] = {}
        for m, mt in t.methods.items():
            if mt.accept_prob is None:
                methods[m] = mt
                continue
            if m not in gens:
                gens[m] = np.random.default_rng([int(seed) & 0xFFFFFFFF, draw, zlib.crc32(m.encode())])
            u = gens[m].random(mt.accept_prob.shape)
            methods[m] = replace(mt, acc_len=draw_acc_len(mt.accept_prob, u))
        out.append(replace(t, methods=methods))
    return out


_INT_FIELDS = ("tokens_rejected", "steps", "output_tokens", "num_requests")


def combine(runs: list[list[Any]], seed: int) -> list[Any]:
    """The mean SimResult over realisations (rows in the same order in every run), with the speedup's
    spread; notes say how the rows were made."""
    out = []
    note = (
        f"sampled traces: {len(runs)} realisation(s) of each step's accepted count drawn from accept_prob "
        f"(seed {seed}); figures are their mean, speedup_spread their range"
    )
    for rows in zip(*runs, strict=True):
        first = rows[0]
        vals: dict[str, Any] = {}
        for f in fields(first):
            v = [getattr(r, f.name) for r in rows]
            if f.name in _INT_FIELDS:
                vals[f.name] = int(round(float(np.mean(v))))
            elif f.name == "time_split_s":
                vals[f.name] = {k: float(np.mean([x[k] for x in v])) for k in v[0]}
            elif isinstance(v[0], float) and all(isinstance(x, float) for x in v):
                vals[f.name] = float(np.mean(v))
        sp = np.array([r.speedup for r in rows], dtype=np.float64)
        vals["speedup_spread"] = {
            "min": float(sp.min()), "max": float(sp.max()), "std": float(sp.std()), "n": len(sp),
        }  # fmt: skip
        vals["draws"] = len(rows)
        vals["notes"] = [*first.notes, note] if note not in first.notes else list(first.notes)
        out.append(replace(first, **vals))
    return out
