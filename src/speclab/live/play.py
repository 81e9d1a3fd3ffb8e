"""vLLM's continuous batching played around the live adaptive driver, offline: no model, no engine. The
tests use it to drive `AdaptiveDriver` exactly as vLLM calls a custom_class proposer (rows compacted and
shuffled every step, committed tokens = accepted drafts + one, greedy target = a fixed output per request)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from speclab.live.driver import AdaptiveDriver


def play_engine(
    driver: AdaptiveDriver,
    reqs: Sequence[tuple[Sequence[int], Sequence[int]]],
    batch: int,
    order_seed: int = 0,
    max_len: int = 4096,
    timer: list[float] | None = None,
) -> dict[int, list[tuple[int, int]]]:
    """Play vLLM around the driver, offline: requests (prompt, greedy target output) under continuous
    batching, at most `batch` running; rows are shuffled every step (vLLM compacts them); a row commits its
    accepted drafts plus one token. Returns per request the (drafted, accepted) of its steps that drafted.
    `timer`, if given, receives the seconds of every driver.step call. Used by the tests; no engine needed."""
    rng = np.random.default_rng(order_seed)
    waiting = list(range(len(reqs)))
    running: dict[int, list[int]] = {}  # request -> committed tokens so far (prompt + output)
    sampled: dict[int, list[int]] = {}
    log: dict[int, list[tuple[int, int]]] = {i: [] for i in range(len(reqs))}
    while True:
        while waiting and len(running) < batch:
            i = waiting.pop(0)
            p, o = reqs[i]
            running[i] = [*p, o[0]]  # prefill produced output[0]
            sampled[i] = [o[0]]
        if not running:
            break
        ids = list(running)
        rng.shuffle(ids)
        table = np.zeros((len(ids), max_len), np.int32)
        nt = np.zeros(len(ids), np.int32)
        for r, i in enumerate(ids):
            table[r, : len(running[i])] = running[i]
            nt[r] = len(running[i])
        t0 = time.perf_counter()
        drafts = driver.step([sampled[i] for i in ids], nt, table)
        if timer is not None:
            timer.append(time.perf_counter() - t0)
        if len(drafts) != len(ids):
            raise AssertionError(f"driver returned {len(drafts)} drafts for {len(ids)} rows")
        for r, i in enumerate(ids):
            d = drafts[r]
            if len(d) > driver.kmax:
                raise AssertionError(f"draft of {len(d)} > kmax {driver.kmax}")
            p, o = reqs[i]
            pos = len(running[i]) - len(p)
            a = 0
            while a < len(d) and pos + a < len(o) and d[a] == o[pos + a]:
                a += 1
            if d:
                log[i].append((len(d), a))
            new = list(o[pos : pos + a + 1])
            running[i].extend(new)
            sampled[i] = new
            if len(running[i]) - len(p) >= len(o):
                del running[i]
    return log
