"""Fit the study's cost-model form by least squares from a table of profiled step timings.

The table (CONTRACTS.md section 5) is read by speclab.timings, which defines its columns.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from speclab.catalog import MODEL_FREE
from speclab.costmodel.forms import PiecewiseTargetCost, TableTargetCost
from speclab.costmodel.model import _DRAFT_KEYS as DRAFT_KEYS
from speclab.costmodel.model import CostModel, DraftCost, TargetCost
from speclab.errors import ConfigError
from speclab.timings import read_timings, recover_temperatures

KNEES = (2, 4, 8, 16, 32, 64, 128, 256)  # knees the piecewise target form is fitted at (the best kept)
TARGET_FORMS = ("linear", "piecewise", "table")
TABLE_MIN_ROWS = (
    20  # decode/verify forwards of one batched-token count before the table form gives it its own time
)


@dataclass
class FitReport:
    rows: dict[str, int] = field(default_factory=dict)
    r2: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    engine_factors: dict[str, float] = field(default_factory=dict)  # per timings file, when divided out


def timings_files(path: str | os.PathLike[str]) -> list[Path]:
    """The timings CSVs behind PATH: the file itself, or for a bench run directory each engine process's
    own file (engines/*/attempt-*/timings.csv), so rows keep the engine that measured them; a directory
    without those falls back to its timings.csv."""
    p = Path(path)
    if not p.is_dir():
        return [p]
    found = sorted(p.glob("engines/*/attempt-*/timings.csv"))
    if found:
        return found
    if (p / "timings.csv").is_file():
        return [p / "timings.csv"]
    raise ConfigError(f"{p}: no timings.csv and no engines/*/attempt-*/timings.csv under it")


def read_timing_groups(
    paths: Sequence[str | os.PathLike[str]],
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[str]]:
    """Rows per kind (columns as TimingsRow.values, then the temperature and the drafted flag), each row's
    group (index of the file it came from) and the files' names."""
    by_kind: dict[str, list[tuple[float, ...]]] = {}
    group: dict[str, list[int]] = {}
    files = [f for p in paths for f in timings_files(p)]
    for g, f in enumerate(files):
        # an engine attempt's own file: its temperature recovered from the attempt's cells where missing
        for row in recover_temperatures(read_timings(f), f.parent):
            by_kind.setdefault(row.kind, []).append((*row.values, row.temperature, row.drafted))
            group.setdefault(row.kind, []).append(g)
    rows = {k: np.asarray(v, dtype=np.float64) for k, v in by_kind.items()}
    groups = {k: np.asarray(v, dtype=np.int64) for k, v in group.items()}
    return rows, groups, [str(f) for f in files]


KV_BIN = 1.25  # KV tokens within a factor of this count as one step shape for engine_factors


def step_shape(kv: np.ndarray, batched: np.ndarray, requests: np.ndarray) -> np.ndarray:
    """An integer per (batched tokens, requests, KV bin): steps that engines can be compared on. The KV bin
    matters: one engine may meet a shape mostly on long prompts and another mostly on short ones (seen: the
    no-SD engine's 16-token steps at B = 16 had 3.3x the KV of the drafting engines', as those drafted at
    almost every code-edit step), which without it reads as a 10-20% slower engine."""
    kvb = np.floor(np.log(np.maximum(kv, 0.0) + 64.0) / np.log(KV_BIN)).astype(np.int64)
    return (batched.astype(np.int64) * 1_000 + requests.astype(np.int64)) * 1_000 + kvb


def engine_factors(
    group: np.ndarray, key: np.ndarray, sec: np.ndarray, n_groups: int, iterations: int = 30
) -> np.ndarray:
    """Per-engine speed factors from decode/verify forwards: sec ~ factor[engine] * g[key], where key is
    the step's shape (step_shape: batched tokens, requests, KV bin). Engines of one run on one machine
    differ by a persistent 5-30% in the same forward (docs/adaptive.md, "Engines differ"); pooled, the engines that happen to run
    the drafting shapes bias the table. Alternating medians (robust to preempted steps); the factors are
    scaled so that the median engine is 1. An engine with no shape shared with another keeps 1."""
    f = np.ones(n_groups)
    keys, kidx = np.unique(key, return_inverse=True)
    kidx = kidx.reshape(-1)
    # shapes measured by more than one engine are what ties the engines' factors together
    pairs = np.unique(np.column_stack([kidx, group]), axis=0)
    shared = np.bincount(pairs[:, 0], minlength=len(keys)) > 1
    use = shared[kidx]
    members = [np.flatnonzero(kidx == j) for j in range(len(keys))]
    own = [np.flatnonzero((group == e) & use) for e in range(n_groups)]
    present = np.unique(group)
    for _ in range(iterations):
        adj = sec / f[group]
        g = np.array([np.median(adj[ix]) for ix in members])
        ratio = sec / g[kidx]
        new = np.array([float(np.median(ratio[ix])) if len(ix) else 1.0 for ix in own])
        new /= float(np.median(new[present]))
        done = np.allclose(new, f, rtol=1e-6)
        f = new
        if done:
            break
    return f


def files_engine_factors(
    data: dict[str, np.ndarray], groups: dict[str, np.ndarray], n_files: int
) -> np.ndarray | None:
    """engine_factors for rows read by read_timing_groups (one engine process per file), on their decode/verify
    target forwards; None where there are too few of those."""
    t = data.get("target")
    if t is None:
        return None
    dec = t[:, 1] == t[:, 3] + t[:, 2]
    if dec.sum() < 4:
        return None
    shape = step_shape(t[dec, 0], t[dec, 1], t[dec, 3])
    return engine_factors(groups["target"][dec], shape, t[dec, 4], n_files)


def _lstsq(x: np.ndarray, y: np.ndarray, what: str) -> tuple[np.ndarray, float]:
    if len(y) < x.shape[1]:
        raise ConfigError(
            f"timings: {what}: {len(y)} row(s), need at least {x.shape[1]} to fit {x.shape[1]} terms"
        )
    coef = nonneg_lstsq(x, y)
    return coef, _r2(y, x @ coef)


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0


def nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (a negative time per token is not a cost model): the best
    unconstrained fit over each subset of terms, keeping the feasible one with the smallest residual (the plain
    fit when it is already non-negative). Exact, and cheap for the few terms of a cost model (2^n subsets)."""
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


def forwards_design(rows: np.ndarray) -> np.ndarray:
    """The terms of the "forwards" drafting form (CostModel's DraftCost) for `draft:<method>` timing rows:
    [passes * kv before the step, batched_tokens + (passes - 1) * num_requests, passes]. A draft row records
    the KV after the step's target forward (kv + batched) and the drafts proposed (num_requests * k)."""
    kv, bt, ns, nr = rows[:, 0], rows[:, 1], rows[:, 2], np.maximum(rows[:, 3], 1)
    passes = np.ceil(ns / nr)
    return np.column_stack([passes * np.maximum(kv - bt, 0), bt + np.maximum(passes - 1, 0) * nr, passes])


def fit_forwards(rows: np.ndarray, what: str = "draft") -> DraftCost:
    """Least-squares fit (non-negative) of the "forwards" drafting form from `draft:<method>` rows."""
    c, _ = _lstsq(forwards_design(rows), rows[:, 4], what)
    return DraftCost(form="forwards", kv=float(c[0]), batched=float(c[1]), const=float(c[2]))


OverheadCoef = tuple[float, float, float, float, float, float, float]


def overhead_design(rows: np.ndarray) -> np.ndarray:
    """The terms of the overhead per step for `overhead` rows: [1, num_requests, num_spec_tokens], the same
    charged on sampled steps only (temperature > 0, the rows' sixth column where present) and the sampled
    requests of a step that ran the drafter (seventh column: TimingsRow.drafted)."""
    s = (rows[:, 5] > 0).astype(np.float64) if rows.shape[1] > 5 else np.zeros(len(rows))
    d = rows[:, 6] if rows.shape[1] > 6 else np.zeros(len(rows))
    nr, ns = rows[:, 3], rows[:, 2]
    return np.column_stack([np.ones(len(rows)), nr, ns, s, s * nr, s * ns, s * d * nr])


def has_sampled_mix(rows: np.ndarray) -> bool:
    """Whether overhead rows hold both sampled and greedy steps: the sampled terms are fitted only then."""
    if rows.shape[1] <= 5 or not len(rows):
        return False
    s = rows[:, 5] > 0
    return bool(s.any() and not s.all())


def fit_overhead(rows: np.ndarray, form: str = "linear", sampled: bool | None = None) -> OverheadCoef:
    """(per_step, per_request, per_spec_token, sampled_per_step, sampled_per_request,
    sampled_per_spec_token, sampled_drafter_per_request), non-negative. form "linear": a constant plus a share per scheduled request and
    per verified draft token (sampling and rejection sampling run over them); "mean": the constant only.
    sampled (default: where the rows hold sampled and greedy steps, has_sampled_mix): the sampled terms
    too, charged on sampled steps only; else they are 0."""
    x = overhead_design(rows)
    use = [0, 1, 2] if form == "linear" else [0]
    if has_sampled_mix(rows) if sampled is None else sampled:
        use += [3, 4, 5, 6]
    if use == [0]:
        return (float(rows[:, 4].mean()) if len(rows) else 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    c, _ = _lstsq(x[:, use], rows[:, 4], "overhead")
    out = np.zeros(7)
    out[use] = c
    return tuple(float(v) for v in out)  # type: ignore[return-value]


def fit_overhead_linear(rows: np.ndarray) -> tuple[float, float, float]:
    """(per_step, per_request, per_spec_token): fit_overhead in the linear form, no sampled terms."""
    return fit_overhead(rows, "linear", sampled=False)[:3]


def fit_piecewise(
    kv: np.ndarray, bt: np.ndarray, sec: np.ndarray, sampled: np.ndarray | None = None
) -> PiecewiseTargetCost:
    """Least squares for every knee in KNEES. Without `sampled`: on relative error (each row weighted 1 /
    seconds). With `sampled` (the rows' sampled positions, num_requests + num_spec_tokens): the form's
    per-sampled-position term too, on absolute error, i.e. weighted by time, which is what a cell's summed
    time (and so a throughput) depends on; the many short decode rows would otherwise outweigh the verify
    rows that carry that term."""
    w = 1.0 / np.maximum(sec, 1e-9) if sampled is None else np.ones_like(sec)
    best: tuple[float, PiecewiseTargetCost] | None = None
    for knee in KNEES:
        cols = [kv, np.minimum(bt, knee), np.maximum(bt - knee, 0.0), np.ones_like(kv)]
        x = np.column_stack(cols if sampled is None else [*cols, sampled])
        if len(sec) < x.shape[1]:
            continue
        c = nonneg_lstsq(x * w[:, None], sec * w)  # a negative time per token is not a cost model
        sse = float((((x @ c) - sec) * w) ** 2 @ np.ones_like(sec))
        cand = PiecewiseTargetCost(
            kv=float(c[0]), batched=float(c[1]), const=float(c[3]), knee=float(knee), batched_hi=float(c[2]),
            sampled=float(c[4]) if sampled is not None else 0.0,
        )  # fmt: skip
        if best is None or sse < best[0]:
            best = (sse, cand)
    if best is None:
        raise ConfigError(f"timings: {len(sec)} target row(s), too few to fit the piecewise form")
    return best[1]


def fit_table(
    smooth: PiecewiseTargetCost,
    kv: np.ndarray,
    bt: np.ndarray,
    sec: np.ndarray,
    min_rows: int = TABLE_MIN_ROWS,
    bins: bool = False,
) -> TableTargetCost:
    """The table form over a fitted piecewise one: for each batched-token count with at least `min_rows`
    decode/verify rows, the median of (seconds - kv term) -- a median, so a few preempted steps do not move
    it; other counts keep the piecewise terms.

    bins: the rows of the other counts (wide verifies at large batch are spread thin over many counts) are
    also used: sorted by count and cut into runs of `min_rows` rows (the remainder joins the last run), each
    run one entry at its median count (rounded; a run centred on a count that has its own entry is
    dropped), and the table interpolates between entries (TableTargetCost.interpolate)."""
    rest = sec - smooth.kv * kv
    counts, n = np.unique(bt, return_counts=True)
    own = {
        int(c): float(np.median(rest[bt == c]))
        for c, k in zip(counts, n, strict=True)
        if k >= min_rows and c >= 1
    }
    if bins:
        exact = set(own)
        sparse = ~np.isin(bt, list(exact)) & (bt >= 1)
        order = np.argsort(bt[sparse], kind="stable")
        sb, sr = bt[sparse][order], rest[sparse][order]
        for a in range(0, len(sb) - min_rows + 1, min_rows):
            b = a + min_rows if len(sb) - (a + min_rows) >= min_rows else len(sb)  # remainder joins
            c = int(round(float(np.median(sb[a:b]))))
            if c not in own:  # a run centred on a count with its own entry adds nothing to it
                own[c] = float(np.median(sr[a:b]))
    table = tuple(sorted(own.items()))
    return TableTargetCost(**dataclasses.asdict(smooth), table=table, interpolate=bins)


TimingsSource = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def fit_cost_model(csv_path: TimingsSource, name: str | None = None, draft_form: str = "linear") -> CostModel:
    """Least-squares fit of the study's form. draft_form: "linear" (study), "chained" or "forwards" for model
    proposers; lookup proposers (ngram, suffix) are fitted as a fraction of the predicted verify time."""
    return fit_cost_model_report(csv_path, name, draft_form)[0]


def fit_cost_model_report(
    csv_path: TimingsSource,
    name: str | None = None,
    draft_form: str = "linear",
    overhead_form: str = "mean",
    target_form: str = "linear",
    engine_offsets: bool = True,
    table_bins: bool = False,
) -> tuple[CostModel, FitReport]:
    """As fit_cost_model; overhead_form "mean" (the study's constant per step) or "linear" (a constant plus a
    share per scheduled request and per verified draft token, fit_overhead_linear); target_form "linear"
    (the study's, on every target row), "piecewise" (speclab.costmodel.forms, on the decode and verify
    rows only: a prefill's attention over its prompt is not linear in its tokens, and the piecewise form is
    for what a proposer decides, the decode and verify steps) or "table" (piecewise plus the median time of
    each batched-token count seen often enough, fit_table; table_bins: the sparse counts too, binned and
    interpolated).

    csv_path: a timings CSV, a bench run directory (each engine's own file) or a list of them. With rows
    from more than one engine process and engine_offsets, each engine's persistent speed offset is
    estimated on the decode/verify forwards (engine_factors) and divided out of all its rows first."""
    if target_form not in TARGET_FORMS:
        raise ConfigError(f"target form {target_form!r}: use {' or '.join(TARGET_FORMS)}")
    if draft_form not in ("linear", "chained", "forwards"):
        raise ConfigError(f"draft form {draft_form!r}: use linear, chained or forwards")
    if overhead_form not in ("mean", "linear"):
        raise ConfigError(f"overhead form {overhead_form!r}: use mean or linear")
    paths = [csv_path] if isinstance(csv_path, (str, os.PathLike)) else list(csv_path)
    if not paths:
        raise ConfigError("timings: no file or run directory given")
    data, groups, files = read_timing_groups(paths)
    rep = FitReport(rows={k: len(v) for k, v in data.items()})
    where = ", ".join(str(p) for p in paths)
    if "target" not in data:
        raise ConfigError(f"{where}: no rows of kind 'target'; cannot fit the target forward cost")
    fac = files_engine_factors(data, groups, len(files)) if engine_offsets and len(files) > 1 else None
    if fac is not None:
        for kind, rows in data.items():
            rows[:, 4] = rows[:, 4] / fac[groups[kind]]
        rep.engine_factors = {f: float(x) for f, x in zip(files, fac, strict=True)}
        rep.notes.append(
            f"engine offsets divided out: {len(files)} engine files, factors "
            f"{fac.min():.3f}-{fac.max():.3f} (median engine = 1)"
        )
    target = _fit_target(data, target_form, table_bins, where, rep)
    drafts = _fit_drafts(data, target, draft_form, rep)
    ovh = fit_overhead(data["overhead"], overhead_form) if "overhead" in data else (0.0,) * 7
    if "overhead" not in data:
        rep.notes.append("no 'overhead' rows: per-step overhead set to 0")
    elif has_sampled_mix(data["overhead"]):
        rep.notes.append(
            f"sampled steps: {int((data['overhead'][:, 5] > 0).sum())} of {len(data['overhead'])} "
            "overhead rows; sampled overhead terms fitted"
        )
    zero = [f"target.{k}" for k in ("kv", "batched", "const") if getattr(target, k) == 0]
    if target_form != "linear":
        zero = [z for z in zero if z != "target.batched"]  # 0 below the knee is the weights-bound shape
    zero += [f"draft.{m}.{k}" for m, d in drafts.items() for k in DRAFT_KEYS[d.form] if getattr(d, k) == 0]
    if zero:
        rep.notes.append(
            f"coefficient(s) fitted as 0 (held at 0 where a free fit went negative): {', '.join(zero)} "
            "(too few or too narrow timings?)"
        )
    model = CostModel(
        name=name or os.path.splitext(os.path.basename(os.path.normpath(str(paths[0]))))[0],
        description="fitted by least squares from "
        + ", ".join(os.path.basename(os.path.normpath(str(p))) for p in paths),
        source=where,
        target=target,
        draft=drafts,
        overhead_per_step=ovh[0],
        switch_overhead=0.0,
        overhead_per_request=ovh[1],
        overhead_per_spec_token=ovh[2],
        overhead_sampled_per_step=ovh[3],
        overhead_sampled_per_request=ovh[4],
        overhead_sampled_per_spec_token=ovh[5],
        overhead_sampled_drafter_per_request=ovh[6],
    )
    return model.validate(f"cost model fitted from {where}"), rep


def _fit_target(
    data: dict[str, np.ndarray], target_form: str, table_bins: bool, where: str, rep: FitReport
) -> TargetCost:
    """The target forward's cost in `target_form` (see fit_cost_model_report); its r2 and notes go to `rep`."""
    t = data["target"]
    kv, bt, ns, nr, sec = (t[:, i] for i in range(5))
    if target_form == "linear":
        coef, r2 = _lstsq(np.column_stack([kv, bt, np.ones_like(kv)]), sec, "target")
        target: TargetCost = TargetCost(kv=float(coef[0]), batched=float(coef[1]), const=float(coef[2]))
    else:
        dec = bt == nr + ns  # decode/verify: one token per request plus its drafts, no prompt tokens
        if dec.sum() < 4:
            raise ConfigError(
                f"{where}: {int(dec.sum())} decode/verify target row(s); the piecewise form needs at least 4"
            )
        kv, bt, sec = kv[dec], bt[dec], sec[dec]
        target = fit_piecewise(kv, bt, sec)
        if target_form == "table":
            target = fit_table(target, kv, bt, sec, bins=table_bins)
            rep.notes.append(
                f"table: own times for {len(target.table)} batched-token count(s) with >= {TABLE_MIN_ROWS} rows"
                + (" (sparse counts in runs of that many rows; interpolated)" if table_bins else "")
            )
        r2 = _r2(sec, np.asarray(target.time(kv, bt), dtype=np.float64))
        rep.notes.append(
            f"piecewise target fitted on {int(dec.sum())} decode/verify rows of {len(dec)} (prefills left out)"
        )
    rep.r2["target"] = r2
    return target


def _fit_drafts(
    data: dict[str, np.ndarray], target: TargetCost, draft_form: str, rep: FitReport
) -> dict[str, DraftCost]:
    """Each proposer's drafting cost (lookups as a share of the verify time, model proposers in
    `draft_form`); each one's r2 goes to `rep`."""
    drafts: dict[str, DraftCost] = {}
    for kind, rows in sorted(data.items()):
        if not kind.startswith("draft:"):
            continue
        method = kind.split(":", 1)[1]
        kv, bt, ns, nr, sec = (rows[:, i] for i in range(5))
        if method in MODEL_FREE:  # lookup: the study models its cost as a share of the verify time
            v = target.time(kv, bt)
            frac = float((sec * v).sum() / (v * v).sum()) if (v * v).sum() > 0 else 0.0
            drafts[method] = DraftCost(form="verify_fraction", fraction=frac)
            pred = frac * v
        elif draft_form == "linear":
            x = np.column_stack([kv, ns, np.ones_like(kv)])
            c, _ = _lstsq(x, sec, kind)
            drafts[method] = DraftCost(form="linear", kv=float(c[0]), num_spec=float(c[1]), const=float(c[2]))
            pred = x @ c
        elif draft_form == "forwards":
            drafts[method] = fit_forwards(rows, kind)
            d = drafts[method]
            pred = forwards_design(rows) @ np.array([d.kv, d.batched, d.const])
        else:
            # chained: passes = drafts per request (a chain of k drafts is k head passes)
            passes = np.ceil(ns / np.maximum(nr, 1))
            x = np.column_stack([passes * kv, ns, passes])
            c, _ = _lstsq(x, sec, kind)
            drafts[method] = DraftCost(
                form="chained", kv=float(c[0]), num_spec=float(c[1]), const=float(c[2])
            )
            pred = x @ c
        rep.r2[kind] = _r2(sec, pred)
    return drafts
