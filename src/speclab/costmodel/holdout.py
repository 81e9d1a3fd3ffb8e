"""Fit a cost model to profiled cells and measure its error on the held-out cells (`speclab profile`, and
`speclab validate` on a bench run's timings).

Target forward: the study's linear form (speclab.costmodel.fit, least squares) and the piecewise form
(speclab.costmodel.forms; least squares on relative error, the knee chosen from a grid), without and with its
per-sampled-position term (lm_head; fitted on absolute error). Drafting per
method: the registered forms that apply (lookup proposers: the study's verify fraction and linear; model
drafters: linear, chained and forwards). Overhead per step: the mean of the training rows, or linear in the
scheduled requests and the verified draft tokens; where the training rows hold sampled and greedy steps
(the timings' temperature column), each also with the sampled terms (`mean+sampled`, `linear+sampled`:
speclab.costmodel.fit.fit_overhead). Each kind keeps the form with the lower error on the
held-out cells (all errors are reported, so the choice is visible).
Error = mean absolute relative error per row, and the relative error of the summed time (what a
throughput prediction depends on).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from speclab.catalog import MODEL_FREE
from speclab.costmodel.fit import (
    OverheadCoef,
    fit_cost_model_report,
    fit_forwards,
    fit_overhead,
    fit_piecewise,
    forwards_design,
    has_sampled_mix,
    nonneg_lstsq,
    overhead_design,
)
from speclab.costmodel.model import CostModel, DraftCost, TargetCost
from speclab.errors import ConfigError
from speclab.timings import COLUMNS, TimingsRow, append_timings, full_fields, read_timings

HOLDOUT_EVERY = 4  # cells 3, 7, 11, ... (of each profiled engine, or chunks of a timings file) are not fitted


class TimedCell(Protocol):
    """A cell's step timings and whether it is held out of the fit (speclab.profile.run.CellTimings)."""

    rows: list[TimingsRow]

    @property
    def holdout(self) -> bool: ...


@dataclass
class Chunk:
    """A run of consecutive steps of a timings file, standing in for a cell."""

    rows: list[TimingsRow]
    holdout: bool


@dataclass
class FormError:
    kind: str
    form: str
    train_rows: int
    test_rows: int
    mean_abs_rel_err: float | None  # held-out rows
    total_rel_err: float | None  # held-out: sum(predicted) / sum(measured) - 1
    cell_abs_err: float | None = None  # mean over held-out cells of |its summed time's relative error|
    chosen: bool = False


@dataclass
class ProfileFit:
    model: CostModel
    errors: list[FormError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"cost_model": self.model.name, "errors": [vars(e) for e in self.errors], "notes": self.notes}


def _arr(rows: list[TimingsRow]) -> np.ndarray:
    """The rows' values, their temperature and drafted flag (as speclab.costmodel.fit.read_timing_groups)."""
    a = np.asarray([(*r.values, r.temperature, r.drafted) for r in rows], dtype=np.float64)
    return a.reshape(-1, len(COLUMNS) + 1)


def draft_time(cost: DraftCost, target: TargetCost, a: np.ndarray) -> np.ndarray:
    """A drafting cost applied to timing rows, as the fit reads them (speclab.costmodel.fit)."""
    kv, bt, ns, nr = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
    if cost.form == "verify_fraction":
        return cost.fraction * np.asarray(target.time(kv, bt))
    if cost.form == "linear":
        return cost.kv * kv + cost.num_spec * ns + cost.const
    if cost.form == "forwards":
        return forwards_design(a) @ np.array([cost.kv, cost.batched, cost.const])
    passes = np.ceil(ns / np.maximum(nr, 1))
    return passes * (cost.kv * kv + cost.const) + cost.num_spec * ns


def _err(
    pred: np.ndarray, sec: np.ndarray, cell: np.ndarray
) -> tuple[float | None, float | None, float | None]:
    """(mean |relative error| per row, relative error of the sum, mean over cells of |relative error of
    the cell's sum|): a throughput prediction depends on a cell's summed time, so forms are chosen by it."""
    if len(sec) == 0:
        return None, None, None
    ok = sec > 0
    mare = float(np.mean(np.abs(pred[ok] - sec[ok]) / sec[ok])) if ok.any() else None
    tot = float(pred.sum() / sec.sum() - 1.0) if sec.sum() > 0 else None
    per = [
        abs(pred[cell == c].sum() / sec[cell == c].sum() - 1.0)
        for c in np.unique(cell)
        if sec[cell == c].sum() > 0
    ]
    return mare, tot, float(np.mean(per)) if per else None


def _fit_linear_forms(rows: list[TimingsRow], draft_form: str) -> tuple[CostModel, list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.csv"
        append_timings(path, (full_fields(r) for r in rows))
        model, rep = fit_cost_model_report(path, name="profile", draft_form=draft_form)
    return model, rep.notes


def fit_profile(cells: Sequence[TimedCell], name: str, description: str = "") -> ProfileFit:
    """Fit on the cells not held out, report the error on the held-out ones, keep the better form per kind."""
    train = [r for c in cells if not c.holdout for r in c.rows]
    if not any(r.kind == "target" for r in train):
        raise ConfigError("profile: no target timings to fit (did every cell fail?)")
    lin, notes = _fit_linear_forms(train, "linear")
    chained, _ = _fit_linear_forms(train, "chained")
    errors: list[FormError] = []

    def split(kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Training rows, held-out rows and each held-out row's cell index."""
        held = [(i, r) for i, c in enumerate(cells) if c.holdout for r in c.rows if r.kind == kind]
        return (
            _arr([r for r in train if r.kind == kind]),
            _arr([r for _, r in held]),
            np.asarray([i for i, _ in held], dtype=np.int64),
        )

    tr, te, tc_ = split("target")
    pw = fit_piecewise(tr[:, 0], tr[:, 1], tr[:, 4])
    cands: list[tuple[str, TargetCost]] = [("linear", lin.target), ("piecewise", pw)]
    if len(tr) >= 5:
        cands.append(("piecewise+sampled", fit_piecewise(tr[:, 0], tr[:, 1], tr[:, 4], tr[:, 3] + tr[:, 2])))
    scored = []
    for form, tc in cands:
        pred = tc.time(te[:, 0], te[:, 1], te[:, 3] + te[:, 2])  # sampled positions = requests + drafts
        m, t, c = _err(np.asarray(pred, dtype=float), te[:, 4], tc_)
        scored.append(FormError("target", form, len(tr), len(te), m, t, c))
    pick = _pick(scored)
    target = dict(cands)[pick.form]
    errors += scored
    drafts: dict[str, DraftCost] = {}
    for kind in sorted({r.kind for r in train if r.kind.startswith("draft:")}):
        method = kind.split(":", 1)[1]
        tr, te, tc_ = split(kind)
        forms: list[tuple[str, DraftCost]] = []
        if method in MODEL_FREE:
            forms.append(("verify_fraction", lin.draft[method]))
            forms.append(("linear", _fit_draft_linear(tr)))
        else:
            forms += [("linear", lin.draft[method]), ("chained", chained.draft[method])]
            if len(tr) >= 3:
                forms.append(("forwards", fit_forwards(tr, kind)))
        scored = []
        for form, dc in forms:
            m, t, c = _err(draft_time(dc, target, te), te[:, 4], tc_)
            scored.append(FormError(kind, form, len(tr), len(te), m, t, c))
        p = _pick(scored)
        drafts[method] = dict(forms)[p.form]
        errors += scored
    ov_tr, ov_te, ov_c = split("overhead")
    ov_forms: list[tuple[str, OverheadCoef]] = [("mean", fit_overhead(ov_tr, "mean", sampled=False))]
    if len(ov_tr) >= 3:
        ov_forms.append(("linear", fit_overhead(ov_tr, "linear", sampled=False)))
    if len(ov_tr) >= 6 and has_sampled_mix(ov_tr):  # sampled steps cost more (sampler, rejection sampler)
        ov_forms += [(f"{f}+sampled", fit_overhead(ov_tr, f, sampled=True)) for f in ("mean", "linear")]
    scored = []
    for form, coef in ov_forms:
        m, t, c = _err(overhead_design(ov_te) @ np.array(coef), ov_te[:, 4], ov_c)
        scored.append(FormError("overhead", form, len(ov_tr), len(ov_te), m, t, c))
    ovh = dict(ov_forms)[_pick(scored).form]
    errors += scored
    model = CostModel(
        name=name,
        target=target,
        draft=drafts,
        overhead_per_step=ovh[0],
        overhead_per_request=ovh[1],
        overhead_per_spec_token=ovh[2],
        overhead_sampled_per_step=ovh[3],
        overhead_sampled_per_request=ovh[4],
        overhead_sampled_per_spec_token=ovh[5],
        overhead_sampled_drafter_per_request=ovh[6],
        description=description or f"profiled by `speclab profile` ({len(cells)} cells)",
        source="speclab profile",
    )
    return ProfileFit(model=model, errors=errors, notes=notes)


def _fit_draft_linear(a: np.ndarray) -> DraftCost:
    """Linear drafting for a lookup proposer: on CPU its cost is a search, not a share of the forward."""
    x = np.column_stack([a[:, 0], a[:, 2], np.ones(len(a))])
    if len(a) < 3:
        return DraftCost(form="linear", const=float(a[:, 4].mean()) if len(a) else 0.0)
    c = nonneg_lstsq(x, a[:, 4])
    return DraftCost(form="linear", kv=float(c[0]), num_spec=float(c[1]), const=float(c[2]))


def _pick(scored: list[FormError]) -> FormError:
    """The form with the lower held-out error of the cells' summed time (the first listed when nothing
    was held out)."""
    ok = [e for e in scored if e.cell_abs_err is not None]
    best = min(ok, key=lambda e: e.cell_abs_err) if ok else scored[0]  # type: ignore[arg-type,return-value]
    best.chosen = True
    return best


def fit_timings_csv(
    path: str | Path, name: str, chunk_steps: int = 64, rows: list[TimingsRow] | None = None
) -> ProfileFit:
    """Fit a timings CSV that is not cut into cells (e.g. a bench run's RUN/timings.csv) like a profile:
    consecutive runs of `chunk_steps` steps stand in for cells, every fourth held out. rows: the file's
    rows already read (e.g. with their temperature recovered), so the file is only named."""
    rows = read_timings(path) if rows is None else rows
    cells: list[Chunk] = []
    cur: list[TimingsRow] = []
    steps = 0
    for r in rows + [TimingsRow("target", (0.0,) * (len(COLUMNS) - 1), ())]:  # a sentinel closes the last
        if r.kind == "target":
            if steps == chunk_steps or (r.fields == () and cur):
                i = len(cells)
                cells.append(Chunk(cur, holdout=i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1))
                cur, steps = [], 0
            steps += 1
        if r.fields != ():
            cur.append(r)
    return fit_profile(
        cells, name, f"fitted from {path} (speclab.costmodel.holdout: best form on held-out steps)"
    )
