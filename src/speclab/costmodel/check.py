"""Does a cost model fit the engine at hand? Measured decode/verify forwards against the model's prediction.

An adaptive policy drafts a token where its expected acceptance beats the token's price relative to the step
(goodput.batch_choice), so what decides its drafts is the model's *relative* price of a verified draft token,
not its absolute speed: a model fitted on a machine whose forwards are 2.5x faster overall decides the same
if its shape is right, and wrongly if one machine's step is mostly a fixed cost and the other's is mostly
per-token work (docs/cost-models.md). `check_cost_model` reports both per band of running requests:
the median measured / predicted time, and the price of one more verified token as a share of the band's
one-token-per-request step, measured (least squares over the band's verify forwards) and as the model has it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from speclab.costmodel.fit import files_engine_factors, read_timing_groups
from speclab.costmodel.model import CostModel
from speclab.errors import ConfigError

# bands of running requests per forward: (lowest, highest)
REQUEST_BANDS: tuple[tuple[int, int], ...] = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 64), (65, 1 << 30))
MIN_ROWS = 20  # decode/verify forwards a band needs before it is reported (as the table fit asks per count)
PRICE_MISMATCH = 1.25  # measured / modelled relative token price beyond which (either way) check() warns


@dataclass(frozen=True)
class BandCheck:
    requests: tuple[int, int]
    rows: int
    measured_s: float  # median measured target forward
    predicted_s: float  # median of the model's prediction for the same forwards
    ratio: float  # median of measured / predicted per forward
    token_share: float | None  # measured: one more verified token's time over the one-token-per-request step
    model_token_share: float | None  # the same read off the model's predictions
    # the model's price of the step's first draft token at the band's commonest request count (its median
    # KV): a table keyed on batched tokens alone can jump there (entries from other request counts), which
    # the least squares over the band smooths away
    model_first_share: float | None = None

    # a measured share <= 0 is noise (a band with few or narrow verifies), not a price: no ratio then

    @property
    def price_ratio(self) -> float | None:
        if self.token_share is None or self.token_share <= 0 or not self.model_token_share:
            return None
        return self.token_share / self.model_token_share

    @property
    def first_ratio(self) -> float | None:
        if self.token_share is None or self.token_share <= 0 or not self.model_first_share:
            return None
        return self.token_share / self.model_first_share

    def deviation(self) -> float:
        """How far the model's prices are from the measured one: the largest |log ratio| (inf where a
        ratio is <= 0: the model says a draft costs nothing or less)."""
        out = 0.0
        for r in (self.price_ratio, self.first_ratio):
            if r is not None:
                out = max(out, math.inf if r <= 0 else abs(math.log(r)))
        return out


def _token_share(tokens: np.ndarray, requests: np.ndarray, sec: np.ndarray) -> float | None:
    """Slope over intercept of sec ~ a + b * (tokens - requests) (+ c * requests): the time of one verified
    draft token as a share of the step without drafts. None where the band has no drafted forwards."""
    drafts = tokens - requests
    if (drafts > 0).sum() < 3 or np.ptp(drafts) == 0:
        return None
    cols = [np.ones_like(sec), drafts]
    if np.ptp(requests) > 0:
        cols.append(requests - requests.mean())
    coef, *_ = np.linalg.lstsq(np.column_stack(cols), sec, rcond=None)
    a, b = float(coef[0]), float(coef[1])
    # a is the fitted step at 0 drafts and the band's mean requests
    return b / a if a > 0 else None


def decode_rows(
    timings: Sequence[str | os.PathLike[str]], engine_offsets: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The decode/verify target forwards in `timings` (CSVs or bench run directories) as (kv, batched tokens,
    requests, seconds). With several engine files and engine_offsets, each engine's start-up factor is
    divided out first (as the fit does). Read once, checked against any number of models (check_rows)."""
    data, groups, files = read_timing_groups(list(timings))
    if "target" not in data:
        raise ConfigError(f"{', '.join(map(str, timings))}: no rows of kind 'target'")
    t = data["target"].copy()
    if engine_offsets and len(files) > 1:
        fac = files_engine_factors(data, groups, len(files))
        if fac is not None:
            t[:, 4] = t[:, 4] / fac[groups["target"]]
    kv, bt, ns, nr, sec = (t[:, i] for i in range(5))
    dec = (bt == nr + ns) & (nr >= 1)
    return kv[dec], bt[dec], nr[dec], sec[dec]


def check_cost_model(
    timings: Sequence[str | os.PathLike[str]], cm: CostModel, engine_offsets: bool = True
) -> list[BandCheck]:
    """Per band of running requests, the decode/verify target forwards in `timings` against `cm`'s target
    time (decode_rows, then check_rows)."""
    return check_rows(decode_rows(timings, engine_offsets), cm)


def check_rows(rows: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], cm: CostModel) -> list[BandCheck]:
    """check_cost_model on rows already read by decode_rows."""
    kv, bt, nr, sec = rows
    pred = np.asarray(cm.target_time(kv, bt), dtype=np.float64)
    out = []
    for lo, hi in REQUEST_BANDS:
        sel = (nr >= lo) & (nr <= hi)
        if sel.sum() < MIN_ROWS:
            continue
        out.append(
            BandCheck(
                requests=(lo, hi),
                rows=int(sel.sum()),
                measured_s=float(np.median(sec[sel])),
                predicted_s=float(np.median(pred[sel])),
                ratio=float(np.median(sec[sel] / pred[sel])),
                token_share=_token_share(bt[sel], nr[sel], sec[sel]),
                model_token_share=_token_share(bt[sel], nr[sel], pred[sel]),
                model_first_share=_first_share(cm, kv[sel], nr[sel]),
            )
        )
    return out


def _first_share(cm: CostModel, kv: np.ndarray, requests: np.ndarray) -> float | None:
    """The model's price of one draft token added to a step at the commonest request count of the rows
    (their median KV), as a share of that step."""
    counts = np.bincount(requests.astype(np.int64))
    n = int(np.argmax(counts))
    k = float(np.median(kv[requests == n]))
    base = float(cm.target_time(k, n))
    return (float(cm.target_time(k, n + 1)) - base) / base if base > 0 else None


def mismatches(bands: Sequence[BandCheck], limit: float = PRICE_MISMATCH) -> list[BandCheck]:
    """Bands whose measured relative token price differs from the model's by more than `limit` either way
    (the band's least-squares share, or the first draft token's at its commonest request count), or has the other
    sign (a table whose wider forwards are cheaper says a draft costs less than nothing)."""
    return [b for b in bands if b.deviation() > math.log(limit)]


def worst(bands: Sequence[BandCheck]) -> BandCheck:
    """The band whose prices are furthest from the measured one (one of the opposite sign first)."""
    return max(bands, key=lambda b: b.deviation())


def mismatch_note(name: str, bad: Sequence[BandCheck], fit_from: str = "RUN") -> str:
    """One line for `cost-models check` and the bench's summary: how far the worst band of `bad` is off, and
    what to do (fit the machine's own model from `fit_from`)."""

    w = worst(bad)
    lo, hi = w.requests
    return (
        f"cost model {name} does not price draft tokens as this engine charges them in {len(bad)} band(s) of "
        f"running requests (beyond {PRICE_MISMATCH:.2f}x either way); worst at {lo}-{hi} requests: "
        f"{fmt_share(w.token_share)} of a step measured, {fmt_share(w.model_token_share)} by the model, "
        f"{fmt_share(w.model_first_share)} for a step's first draft. An adaptive policy priced by it drafts too "
        f"little or too much here: fit this machine's own (speclab cost-models fit {fit_from} --target-form "
        "table --overhead-form linear --out FILE) and check it; where a fitted table still jumps at the first "
        "draft, its entries come from other request counts (docs/cost-models.md)"
    )


def fmt_share(x: float | None) -> str:
    """A price share as printed by the check ("-" where not known)."""
    return "-" if x is None else f"{x:.1%}"
