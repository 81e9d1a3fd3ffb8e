"""Target-forward forms beyond the study's linear one, selected in a cost-model TOML by `[target] form`.

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

The simulator calls `time(kv, batched, sampled_positions)` (vectorised); a caller that does not know the
sampled positions leaves them out and the term is not charged, so any form here works everywhere a cost model
is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from speclab.costmodel.model import TargetCost
from speclab.errors import ConfigError

TARGET_FORMS = ("linear", "piecewise")


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


def target_from_toml(form: Any, table: dict[str, Any], where: str) -> TargetCost:
    """The [target] table of a form other than linear."""
    if form != "piecewise":
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
    return PiecewiseTargetCost(**vals)
