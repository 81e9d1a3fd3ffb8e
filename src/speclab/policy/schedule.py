"""vLLM's batch-size schedule for k as a policy: `schedule:METHOD:B1=K1,B2=K2,...` (vLLM 0.32's
`num_speculative_tokens_per_batch_size`). k = K_i for live occupancy >= B_i (the first entry must be
B1 = 1; K = 0 = no speculation at that size); one k for every request of the step, as vLLM's scheduler
does. speclab.simulate.adaptive.recommend derives such a schedule from the user's traces."""

from __future__ import annotations

import numpy as np

from speclab.catalog import MODEL_BASED
from speclab.errors import ConfigError
from speclab.policy.core import Policy, StepView, _int, _method, register_policy


class BatchSchedule(Policy):
    def decide(self, view: StepView) -> tuple[np.ndarray, np.ndarray]:
        starts, ks = self.extra["starts"], self.extra["ks"]
        k = ks[np.searchsorted(starts, view.occupancy, side="right") - 1]
        npr = view.num_proposed(self.methods[0])
        if npr is not None:
            k = np.minimum(k, npr)
        meth = np.where(k > 0, 0, -1)
        return meth.astype(np.int64), k.astype(np.int64)


def parse_schedule(text: str, spec: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        b, eq, k = part.partition("=")
        if not eq:
            raise ConfigError(f"policy {spec!r}: schedule entries are B=K, got {part!r}")
        out.append((_int(b.strip(), "B", spec, 1), _int(k.strip(), "K", spec, 0)))
    out.sort()
    if out[0][0] != 1 or len({b for b, _ in out}) != len(out):
        raise ConfigError(f"policy {spec!r}: the schedule must start at B=1 and name each B once")
    return out


def _schedule(spec: str, args: list[str], opts: dict) -> Policy:
    if len(args) != 2:
        raise ConfigError(f"policy {spec!r}: expected schedule:METHOD:B1=K1,B2=K2,...")
    m = _method(args[0], spec)
    sched = parse_schedule(args[1], spec)
    canon = f"schedule:{m}:" + ",".join(f"{b}={k}" for b, k in sched)
    return BatchSchedule(
        spec=canon, methods=(m,), uses_batch_size=True, uses_occupancy=True, drafter_always_runs=m in MODEL_BASED,
        extra={"starts": np.array([b for b, _ in sched]), "ks": np.array([k for _, k in sched])},
    )  # fmt: skip


register_policy(
    "schedule",
    "schedule:METHOD:B1=K1,B2=K2,...",
    "vLLM's batch-size schedule for k: k = Ki while the live batch holds >= Bi requests (0 = off)",
    _schedule,
)
