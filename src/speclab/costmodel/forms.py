"""Target-forward forms, selected in a cost-model TOML by `[target] form`: the study's linear one
(`TargetCost`) and two beyond it.

`piecewise` (speclab): a forward's time is linear in the KV tokens, and piecewise linear in the batched
tokens with one knee: below it a forward is bound by reading the weights (adding a token costs little),
above it by compute (each token costs its FLOPs). This is the shape seen on CPU (decode at batch 1 vs 8 vs
32: 19 / 34 / 82 ms) and the roofline's max(memory, compute) made continuous:

    time = kv * kv_tokens + batched * min(batched_tokens, knee) + batched_hi * max(batched_tokens - knee, 0)
           + const

With batched_hi == batched it is the linear form. Optional `sampled` (default 0): seconds per position the
target samples from (its lm_head and logits run there: one per request in a prefill or decode, k + 1 per
request in a verify step), so verify tokens cost more than prefill tokens of the same count:

    ... + sampled * (num_requests + num_spec_tokens)

`table` (speclab): the piecewise form plus measured forward times for the batched-token counts seen often
enough, which replace its batched and const terms there (the KV term stays):

    time = kv * kv_tokens + table[batched_tokens]      where the table has that count, else piecewise

On a CPU the forward's time is not monotone in its tokens at small counts: vLLM's CPU build (2 cores, fp32,
SmolLM2-135M) measured ~30 ms for 1 token, ~35 ms for 2 and ~27-28 ms for 4-5 in every quiet run
(matrix-kernel shapes), so a draft of 3 can cost less than none and a draft of 1 costs the most; a smooth
form cannot say which k is cheap.

The simulator calls `time(kv, batched, sampled_positions)` (vectorised); a caller that does not know the
sampled positions leaves them out and the term is not charged, so any form here works everywhere a cost model
is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speclab.errors import ConfigError

TARGET_FORMS = ("linear", "piecewise", "table")


@dataclass(frozen=True)
class TargetCost:
    """The linear form: kv * kv_tokens + batched * batched_tokens + const."""

    kv: float
    batched: float
    const: float

    def time(self, kv_tokens: Any, batched_tokens: Any, sampled_positions: Any = None) -> Any:
        # sampled_positions: used by the forms below with a per-sampled-position term
        return self.kv * kv_tokens + self.batched * batched_tokens + self.const

    def toml_lines(self) -> list[str]:
        return [
            f"kv = {float(self.kv)!r}",
            f"batched = {float(self.batched)!r}",
            f"const = {float(self.const)!r}",
        ]


@dataclass(frozen=True)
class PiecewiseTargetCost(TargetCost):
    knee: float = 1.0
    batched_hi: float = 0.0
    sampled: float = 0.0
    form = "piecewise"

    def time(self, kv_tokens: Any, batched_tokens: Any, sampled_positions: Any = None) -> Any:
        bt = np.asarray(batched_tokens, dtype=np.float64)
        lo = np.minimum(bt, self.knee)
        hi = np.maximum(bt - self.knee, 0.0)
        out = self.kv * kv_tokens + self.batched * lo + self.batched_hi * hi + self.const
        if self.sampled and sampled_positions is not None:
            out = out + self.sampled * np.asarray(sampled_positions, dtype=np.float64)
        return out if np.ndim(out) else float(out)

    def toml_lines(self) -> list[str]:
        return [
            'form = "piecewise"',
            *super().toml_lines(),
            f"knee = {float(self.knee)!r}",
            f"batched_hi = {float(self.batched_hi)!r}",
            *([f"sampled = {float(self.sampled)!r}"] if self.sampled else []),
        ]


@dataclass(frozen=True)
class TableTargetCost(PiecewiseTargetCost):
    """PiecewiseTargetCost with measured times at kv = 0 for some batched-token counts (`table`: sorted
    (count, seconds) pairs); other counts fall back to the piecewise terms, or with `interpolate` are read
    off the straight line between the two table entries around them (beyond the last entry: its time plus
    the piecewise slope per token). Interpolation is for tables with binned entries where forwards are
    sparse (wide verifies at large batch: `speclab cost-models fit --table-bins`), where the piecewise
    slope fitted on the many narrow forwards overprices the wide ones."""

    table: tuple[tuple[int, float], ...] = ()
    interpolate: bool = False
    form = "table"
    _keys: np.ndarray = field(init=False, repr=False, compare=False)
    _vals: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # arrays once: the live proposer prices every option of every step with time()
        object.__setattr__(self, "_keys", np.array([c for c, _ in self.table], dtype=np.float64))
        object.__setattr__(self, "_vals", np.array([v for _, v in self.table], dtype=np.float64))

    def time(self, kv_tokens: Any, batched_tokens: Any, sampled_positions: Any = None) -> Any:
        smooth = super().time(kv_tokens, batched_tokens, sampled_positions)
        if not self.table:
            return smooth
        keys, vals = self._keys, self._vals
        bt = np.asarray(batched_tokens, dtype=np.float64)
        i = np.minimum(np.searchsorted(keys, bt), len(keys) - 1)  # np.clip costs more per call
        hit = keys[i] == bt
        if self.interpolate:
            lo = np.maximum(i - 1, 0)
            span = np.maximum(keys[i] - keys[lo], 1e-12)
            between = vals[lo] + (vals[i] - vals[lo]) * (bt - keys[lo]) / span
            beyond = vals[-1] + self.batched_hi * (bt - keys[-1])
            own = np.where(hit, vals[i], np.where(bt > keys[-1], beyond, between))
            kv_term = self.kv * np.asarray(kv_tokens, dtype=np.float64)
            out = np.where(bt < keys[0], smooth, kv_term + own)
        else:
            out = np.where(hit, self.kv * np.asarray(kv_tokens, dtype=np.float64) + vals[i], smooth)
        return out if np.ndim(out) else float(out)

    def toml_lines(self) -> list[str]:
        lines = super().toml_lines()
        if not self.table:  # no count with its own time: exactly the piecewise form (a table must list one)
            return lines
        lines[0] = 'form = "table"'
        pairs = ", ".join(f"[{c}, {v!r}]" for c, v in self.table)
        return [*lines, *(["interpolate = true"] if self.interpolate else []), f"table = [{pairs}]"]


def target_from_toml(form: Any, table: dict[str, Any], where: str) -> TargetCost:
    """The [target] table of a form other than linear."""
    if form not in TARGET_FORMS or form == "linear":
        raise ConfigError(f"{where}: field target.form: {form!r} not one of {', '.join(TARGET_FORMS)}")
    vals = {}
    for key in ("kv", "batched", "const", "knee", "batched_hi", "sampled"):
        if key == "sampled" and key not in table:
            continue  # optional, 0
        v = table.get(key)
        if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v):
            raise ConfigError(f"{where}: field target.{key}: expected a number, got {v!r}")
        vals[key] = float(v)
    if vals["knee"] <= 0:
        raise ConfigError(f"{where}: field target.knee: must be > 0, got {vals['knee']!r}")
    if form == "piecewise":
        if "table" in table:
            raise ConfigError(f'{where}: field target.table: only with form = "table"')
        return PiecewiseTargetCost(**vals)
    raw = table.get("table")
    bad = f"{where}: field target.table: expected [[batched_tokens, seconds], ...] with whole counts >= 1, "
    bad += "increasing, and seconds in 0..1000"
    if not isinstance(raw, list) or not raw:
        raise ConfigError(bad)
    pairs: list[tuple[int, float]] = []
    for e in raw:
        ok = (
            isinstance(e, list)
            and len(e) == 2
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in e)
        )
        if not ok or e[0] != int(e[0]) or e[0] < 1 or not (np.isfinite(e[1]) and 0 <= e[1] <= 1e3):
            raise ConfigError(f"{bad}; got {e!r}")
        if pairs and int(e[0]) <= pairs[-1][0]:
            raise ConfigError(f"{bad}; {int(e[0])} after {pairs[-1][0]}")
        pairs.append((int(e[0]), float(e[1])))
    interp = table.get("interpolate", False)
    if not isinstance(interp, bool):
        raise ConfigError(f"{where}: field target.interpolate: expected true or false, got {interp!r}")
    return TableTargetCost(**vals, table=tuple(pairs), interpolate=interp)
