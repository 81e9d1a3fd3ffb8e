"""The study's odd rules that are not cost-model or policy rules: request sampling and the n-gram miss
heuristic's per-dataset match probability."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from speclab.errors import ConfigError

T = TypeVar("T")

STUDY_NUM_REQUESTS = 300
STUDY_BATCH_SIZES = (1, 8, 16, 32, 64, 128)

# match_p: probability that an n-gram lookup finds a match where acc_len is 1 (the study's guess per dataset)
STUDY_MATCH_P = {"instructcoder": 0.8, "cnn": 0.4, "sharegpt": 0.2, "gsm8k": 0.2}


def study_sample(
    items: Sequence[T], seed: int = 42, n: int = STUDY_NUM_REQUESTS
) -> tuple[list[T], str | None]:
    """`random.seed(seed); random.sample(items_in_file_order, n)`, exactly as the study; with fewer than n
    items, all of them in file order (and a note saying so)."""
    out, note, _ = study_sample_state(items, seed, n)
    return out, note


def study_sample_state(
    items: Sequence[T], seed: int = 42, n: int = STUDY_NUM_REQUESTS
) -> tuple[list[T], str | None, Any]:
    """study_sample, plus the generator's state after sampling: the study draws its n-gram misses from the
    same module-level generator next (see miss_generator)."""
    items = list(items)
    rng = random.Random(seed)  # same state as random.seed(seed) on the module-level generator
    if len(items) < n:
        note = f"only {len(items)} request(s) (< {n}): using all of them in file order, no sampling"
        return items, note, rng.getstate()
    return rng.sample(items, n), None, rng.getstate()


def miss_generator(state: Any) -> np.random.RandomState:
    """A numpy generator that continues Python's `random` from `state` (both are MT19937 and build a double
    from two 32-bit outputs the same way), so random_sample(n) gives the next n random.random() values
    without a Python loop."""
    _, internal, _ = state
    rs = np.random.RandomState()
    rs.set_state(("MT19937", np.array(internal[:624], dtype=np.uint32), int(internal[624])))
    return rs


def match_p_for(setting: str | float, workload: str) -> float:
    """Resolve --ngram-miss-heuristic: a probability, a study dataset name, or 'auto' (from the workload)."""
    if isinstance(setting, int | float):
        p = float(setting)
    else:
        s = str(setting).strip().lower()
        key = workload.lower() if s == "auto" else s
        found = [v for name, v in STUDY_MATCH_P.items() if name in key.replace("_", "").replace("-", "")]
        if found:
            p = found[0]
        else:
            try:
                p = float(s)
            except ValueError:
                where = f"workload {workload!r}" if s == "auto" else repr(setting)
                raise ConfigError(
                    f"n-gram miss heuristic: no study match_p for {where} "
                    f"(known: {', '.join(f'{k}={v}' for k, v in STUDY_MATCH_P.items())}; or give a probability)"
                ) from None
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"n-gram miss heuristic: match probability {p} not in [0, 1]")
    return p
