"""The study's odd rules that are not cost-model or policy rules: request sampling and the n-gram miss
heuristic's per-dataset match probability."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

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
    items = list(items)
    if len(items) < n:
        return items, f"only {len(items)} request(s) (< {n}): using all of them in file order, no sampling"
    rng = random.Random(seed)  # same state as random.seed(seed) on the module-level generator
    return rng.sample(items, n), None


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
