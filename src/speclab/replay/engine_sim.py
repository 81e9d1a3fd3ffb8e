"""Replay a stateful proposer (suffix decoding) the way one engine of a bench run drove it.

Suffix decoding's global tree holds every active and earlier response of the engine, so what it proposes
to a request depends on everything the engine did before: the warmup request, earlier cells, and, within a
batch, which rows added their tokens earlier in the same step. A per-request replay cannot reproduce that;
this module re-enacts the engine instead, from what a bench run keeps (RUN/engines/<id>/attempt-N/job.json
and cells.jsonl: the cells in the order the worker ran them, every request's output, the warmup).

What is re-enacted (vLLM 0.32 V1, synchronous scheduling, as speclab's worker runs it):
- the worker's admission (at most batch_size requests in flight, a new one when one finishes; replicate
  = batch_size copies of one prompt at a time), the scheduler (running requests first, then waiting ones in
  arrival order, chunked prefill within max_num_batched_tokens; a partial prefill samples nothing);
- the persistent batch's row order (finished rows freed at the next step, new requests fill the lowest
  free row, then the last rows slide down into remaining holes; no decode/prefill reordering: the CPU
  attention backend does none);
- per step, rows in order: verification of the previous draft against the recorded output, then the
  proposer step (`SuffixSpeculator.step`), then stopping requests no longer in the batch.
The one thing a trace cannot say is what the engine sampled past the end of a recorded output (tokens
after EOS or max_tokens in a request's last step): the accepted drafts there are known (the observed count
says how many), the bonus token is not and enters the tree as a token that matches nothing (UNKNOWN).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from speclab.methods.suffix import SuffixSpeculator

UNKNOWN = 2**31 - 1  # stands for a sampled token the trace does not contain
MAX_NUM_BATCHED_TOKENS = 4096  # vLLM's default with chunked prefill (seen in the CPU engine's log)


@dataclass
class SimRequest:
    key: Any
    prompt: np.ndarray
    output: list[int]
    observed_accepted: list[int] | None = None  # vLLM's per_step_accepted, to resolve the last step
    req_id: str = ""
    computed: int = 0  # prompt tokens prefilled
    tokens: list[int] = field(default_factory=list)  # everything sampled so far (may run past output)
    draft: list[int] = field(default_factory=list)
    steps: list[tuple[int, int, int]] = field(default_factory=list)  # (position, accepted, drafted)

    @property
    def finished(self) -> bool:
        return len(self.tokens) >= len(self.output)


@dataclass
class SimCell:
    cell_id: str
    batching: str  # "replicate" | "continuous"
    batch_size: int
    requests: list[SimRequest]  # replicate: the copies of one prompt are consecutive


class EngineSim:
    """One engine: one proposer state across the warmup and all cells, in order."""

    def __init__(
        self, spec: SuffixSpeculator, k: int, max_model_len: int | None,
        max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
    ) -> None:  # fmt: skip
        self.spec = spec
        self.k = k
        self.max_model_len = max_model_len
        self.budget = max_num_batched_tokens
        self._n = 0

    def run_cell(self, cell: SimCell) -> None:
        if cell.batching == "replicate":
            i = 0
            while i < len(cell.requests):
                self.drive(cell.requests[i : i + cell.batch_size], cell.batch_size)
                i += cell.batch_size
        else:
            self.drive(cell.requests, cell.batch_size)

    def drive(self, requests: list[SimRequest], max_running: int) -> None:
        pending = deque(requests)
        waiting: deque[SimRequest] = deque()
        running: list[SimRequest] = []  # scheduler order
        slots: list[SimRequest | None] = []  # the persistent batch's rows
        freed: list[SimRequest] = []  # finished last step: their rows are freed at the next step
        in_flight = 0
        while pending or in_flight:
            while pending and in_flight < max_running:  # the worker adds requests before each step
                req = pending.popleft()
                self._n += 1
                req.req_id = f"sim-{self._n}"
                waiting.append(req)
                in_flight += 1
            # schedule: running first (decode or continued prefill), then waiting, within the token budget
            budget = self.budget
            scheduled: dict[int, int] = {}
            for req in running:
                need = (
                    len(req.prompt) - req.computed if req.computed < len(req.prompt) else 1 + len(req.draft)
                )
                take = min(need, budget)
                if take <= 0:
                    break
                scheduled[id(req)] = take
                budget -= take
            new: list[SimRequest] = []
            while waiting and budget > 0:
                req = waiting.popleft()
                take = min(len(req.prompt), budget)
                scheduled[id(req)] = take
                budget -= take
                running.append(req)
                new.append(req)
            # the persistent batch: free finished rows, add new requests, condense
            for req in freed:
                slots[slots.index(req)] = None
            freed = []
            for req in new:
                holes = [i for i, s in enumerate(slots) if s is None]
                if holes:
                    slots[holes[0]] = req
                else:
                    slots.append(req)
            _condense(slots)
            # execute and propose, row by row
            seen: list[str] = []
            for req in slots:
                if req is None:
                    continue
                seen.append(req.req_id)
                take = scheduled.get(id(req), 0)
                if take == 0:
                    continue
                if req.computed < len(req.prompt):
                    req.computed += take
                    if req.computed < len(req.prompt):
                        continue  # partial prefill: nothing sampled, nothing proposed
                    sampled = [req.output[0]] if req.output else [UNKNOWN]
                else:
                    sampled = self._verify(req)
                req.tokens.extend(sampled)
                ctx = np.concatenate([req.prompt, np.asarray(req.tokens, dtype=np.int32)])
                req.draft = self.spec.step(req.req_id, req.prompt, sampled, ctx, self.k, self.max_model_len)
            self.spec.stop_missing(seen)
            for req in list(running):
                if req.finished:
                    running.remove(req)
                    freed.append(req)
                    in_flight -= 1

    def _verify(self, req: SimRequest) -> list[int]:
        """This step's sampled tokens for a decoding request: its draft checked against the output."""
        pos, out, d = len(req.tokens), req.output, req.draft
        n = len(out)
        a = 0
        while a < len(d) and pos + a < n and d[a] == out[pos + a]:
            a += 1
        acc = a
        if d and (a == len(d) or pos + a >= n) and pos + a + 1 > n:
            # ran past the recorded output: vLLM's count says how many drafts it really accepted
            obs = req.observed_accepted
            i = len(req.steps)
            if obs is not None and i < len(obs) and a <= obs[i] <= len(d):
                acc = obs[i]
        if d:
            req.steps.append((pos, a, len(d)))
        return [out[pos + j] if pos + j < n else (d[j] if j < acc else UNKNOWN) for j in range(acc + 1)]


def _condense(slots: list[SimRequest | None]) -> None:
    """vLLM's InputBatch.condense: move the last rows down into the lowest holes."""
    while slots and slots[-1] is None:
        slots.pop()
    while None in slots:
        hole = slots.index(None)
        slots[hole] = slots.pop()
        while slots and slots[-1] is None:
            slots.pop()


def per_position(req: SimRequest) -> tuple[np.ndarray, np.ndarray]:
    """(acc_len, num_proposed) over the output positions, exact where the engine proposed; positions it
    stepped over hold (1, 0) and are never read by the cross-check's engine walk."""
    n = len(req.output)
    acc = np.ones(n, dtype=np.int32)
    nprop = np.zeros(n, dtype=np.int32)
    for p, a, d in req.steps:
        if p < n:
            acc[p] = a + 1
            nprop[p] = d
    return acc, nprop


# --- reading a bench run ---------------------------------------------------------------------------------


def attempt_dirs(run: Path) -> list[Path]:
    """Every engine attempt of a run (RUN/engines/<engine_id>/attempt-N), in run order per engine."""
    base = Path(run) / "engines"
    if not base.is_dir():
        return []
    out = []
    for eng in sorted(p for p in base.iterdir() if p.is_dir()):
        out += sorted(
            (p for p in eng.iterdir() if p.is_dir() and p.name.startswith("attempt-")),
            key=lambda p: int(p.name.split("-", 1)[1]) if p.name.split("-", 1)[1].isdigit() else 0,
        )
    return out


def replay_attempt(
    attempt: Path, make_spec: Any, max_model_len: int | None = None
) -> dict[tuple[str, str, int], SimRequest] | str:
    """Re-enact one worker attempt. `make_spec(method, engine_options, k)` returns (SuffixSpeculator, k) for
    the engine, or a reason string when it cannot be replayed. Returns {(cell_id, prompt_id, copy):
    SimRequest} for the cells replayed (up to the first cell that did not finish ok), or a reason."""
    from speclab.engine.protocol import read_job, read_results

    job = read_job(attempt / "job.json")
    made = make_spec(job.engine.method, dict(job.engine.options), job.engine.k)
    if isinstance(made, str):
        return made
    results = {r.cell_id: r for r in read_results(attempt / "cells.jsonl")}
    spec, k = made
    mml = job.engine.max_model_len if max_model_len is None else max_model_len
    sim = EngineSim(spec, k, mml)
    out: dict[tuple[str, str, int], SimRequest] = {}
    ok = [results.get(c.cell_id) for c in job.cells]
    if all(r is None for r in ok):
        return {}  # no cell finished in this attempt (yet)
    info = next((r.engine_info for r in ok if r is not None and r.engine_info), {})
    warm = info.get("warmup")
    if job.warmup:
        if not warm:
            return "the run did not record its warmup request (made before speclab recorded it)"
        sim.drive([SimRequest("warmup", np.asarray(warm["prompt_token_ids"], np.int32),
                              list(warm["output_token_ids"]), warm.get("per_step_accepted"))], 1)  # fmt: skip
    for cell, res in zip(job.cells, ok, strict=True):
        if res is None or res.status != "ok":
            break  # what it did to the proposer's state before failing is unknown
        prompts = {p.id: np.asarray(p.prompt_token_ids, np.int32) for p in cell.prompts}
        by_key = {(r.id, r.copy): r for r in res.requests}
        copies = cell.batch_size if cell.batching == "replicate" else 1
        reqs = []
        for p in cell.prompts:
            for c in range(copies):
                r = by_key[(p.id, c)]
                reqs.append(SimRequest((cell.cell_id, p.id, c), prompts[p.id], list(r.output_token_ids),
                                       r.per_step_accepted))  # fmt: skip
        sim.run_cell(SimCell(cell.cell_id, cell.batching, cell.batch_size, reqs))
        out.update({r.key: r for r in reqs})
    return out
