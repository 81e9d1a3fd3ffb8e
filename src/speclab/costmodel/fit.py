"""Fit the study's cost-model form by least squares from a table of profiled step timings.

CSV columns (CONTRACTS.md section 5): kind,kv_tokens,batched_tokens,num_spec_tokens,num_requests,seconds
kind = "target" (one target forward), "draft:<method>" (one proposer call for the batch) or "overhead".
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass, field

import numpy as np

from speclab.costmodel.model import CostModel, DraftCost, TargetCost
from speclab.errors import ConfigError

COLUMNS = ("kind", "kv_tokens", "batched_tokens", "num_spec_tokens", "num_requests", "seconds")
# Largest value in a timings row: far above any token count or step time, small enough that squares and
# sums in the fit stay finite.
MAX_VALUE = 1e12
# Lookup proposers whose cost the study models as a fraction of the verify time.
LOOKUP_METHODS = ("ngram", "suffix")


@dataclass
class FitReport:
    rows: dict[str, int] = field(default_factory=dict)
    r2: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _read_rows(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    by_kind: dict[str, list[list[float]]] = {}
    try:
        with open(path, newline="", encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); binary file?"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read timings CSV ({exc.strerror})") from None
    with io.StringIO(text, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(
                f"{path}: line 1: missing column(s) {', '.join(missing)} (need {','.join(COLUMNS)})"
            )
        for lineno, row in enumerate(reader, 2):
            kind = (row["kind"] or "").strip()
            if kind not in ("target", "overhead") and not kind.startswith("draft:"):
                raise ConfigError(
                    f"{path}: line {lineno}: field kind: {kind!r} not target, overhead or draft:<method>"
                )
            vals = []
            for c in COLUMNS[1:]:
                raw = (row[c] or "").strip()
                try:
                    v = float(raw) if raw else 0.0
                except ValueError:
                    raise ConfigError(f"{path}: line {lineno}: field {c}: not a number: {raw!r}") from None
                if not math.isfinite(v) or not 0 <= v <= MAX_VALUE:
                    raise ConfigError(
                        f"{path}: line {lineno}: field {c}: must be a finite number in 0..{MAX_VALUE:g}, "
                        f"got {raw!r}"
                    )
                vals.append(v)
            by_kind.setdefault(kind, []).append(vals)
    return {k: np.asarray(v, dtype=np.float64) for k, v in by_kind.items()}


def _lstsq(x: np.ndarray, y: np.ndarray, what: str) -> tuple[np.ndarray, float]:
    if len(y) < x.shape[1]:
        raise ConfigError(
            f"timings: {what}: {len(y)} row(s), need at least {x.shape[1]} to fit {x.shape[1]} terms"
        )
    coef = _nonneg_lstsq(x, y)
    resid = y - x @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / ss_tot if ss_tot > 0 else 1.0
    return coef, r2


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (a negative time per token is not a cost model). Exact for
    our 3 terms: the best unconstrained fit over each subset of terms, keeping the feasible one with the
    smallest residual (the plain fit when it is already non-negative)."""
    n = x.shape[1]
    best, best_ss = np.zeros(n), float((y**2).sum())
    for mask in range((1 << n) - 1, 0, -1):
        cols = [i for i in range(n) if mask >> i & 1]
        c, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if (c < 0).any():
            continue
        coef = np.zeros(n)
        coef[cols] = c
        ss = float(((y - x @ coef) ** 2).sum())
        if ss < best_ss * (1 - 1e-12) or mask == (1 << n) - 1:
            best, best_ss = coef, ss
            if mask == (1 << n) - 1:
                break
    return best


def fit_cost_model(
    csv_path: str | os.PathLike[str], name: str | None = None, draft_form: str = "linear"
) -> CostModel:
    """Least-squares fit of the study's form. draft_form: "linear" (study) or "chained" for model proposers;
    lookup proposers (ngram, suffix) are fitted as a fraction of the predicted verify time."""
    return fit_cost_model_report(csv_path, name, draft_form)[0]


def fit_cost_model_report(
    csv_path: str | os.PathLike[str], name: str | None = None, draft_form: str = "linear"
) -> tuple[CostModel, FitReport]:
    if draft_form not in ("linear", "chained"):
        raise ConfigError(f"draft form {draft_form!r}: use linear or chained")
    data = _read_rows(csv_path)
    rep = FitReport(rows={k: len(v) for k, v in data.items()})
    if "target" not in data:
        raise ConfigError(f"{csv_path}: no rows of kind 'target'; cannot fit the target forward cost")
    t = data["target"]
    kv, bt, ns, nr, sec = (t[:, i] for i in range(5))
    coef, r2 = _lstsq(np.column_stack([kv, bt, np.ones_like(kv)]), sec, "target")
    target = TargetCost(kv=float(coef[0]), batched=float(coef[1]), const=float(coef[2]))
    rep.r2["target"] = r2
    drafts: dict[str, DraftCost] = {}
    for kind, rows in sorted(data.items()):
        if not kind.startswith("draft:"):
            continue
        method = kind.split(":", 1)[1]
        kv, bt, ns, nr, sec = (rows[:, i] for i in range(5))
        if method in LOOKUP_METHODS:
            v = target.time(kv, bt)
            frac = float((sec * v).sum() / (v * v).sum()) if (v * v).sum() > 0 else 0.0
            drafts[method] = DraftCost(form="verify_fraction", fraction=frac)
            pred = frac * v
        elif draft_form == "linear":
            x = np.column_stack([kv, ns, np.ones_like(kv)])
            c, _ = _lstsq(x, sec, kind)
            drafts[method] = DraftCost(form="linear", kv=float(c[0]), num_spec=float(c[1]), const=float(c[2]))
            pred = x @ c
        else:
            # chained: passes = drafts per request (a chain of k drafts is k head passes)
            passes = np.ceil(ns / np.maximum(nr, 1))
            x = np.column_stack([passes * kv, ns, passes])
            c, _ = _lstsq(x, sec, kind)
            drafts[method] = DraftCost(
                form="chained", kv=float(c[0]), num_spec=float(c[1]), const=float(c[2])
            )
            pred = x @ c
        ss_tot = float(((sec - sec.mean()) ** 2).sum())
        rep.r2[kind] = 1.0 - float(((sec - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    overhead = float(data["overhead"][:, 4].mean()) if "overhead" in data else 0.0
    if "overhead" not in data:
        rep.notes.append("no 'overhead' rows: per-step overhead set to 0")
    zero = [f"target.{k}" for k, v in vars(target).items() if v == 0]
    zero += [
        f"draft.{m}.{k}"
        for m, d in drafts.items()
        for k, v in vars(d).items()
        if isinstance(v, float) and v == 0 and (k == "fraction") == (d.form == "verify_fraction")
    ]
    if zero:
        rep.notes.append(
            f"coefficient(s) fitted as 0 (held at 0 where a free fit went negative): {', '.join(zero)} "
            "(too few or too narrow timings?)"
        )
    model = CostModel(
        name=name or os.path.splitext(os.path.basename(str(csv_path)))[0],
        description=f"fitted by least squares from {os.path.basename(str(csv_path))}",
        source=str(csv_path),
        target=target,
        draft=drafts,
        overhead_per_step=overhead,
        switch_overhead=0.0,
    )
    return model.validate(f"cost model fitted from {csv_path}"), rep
