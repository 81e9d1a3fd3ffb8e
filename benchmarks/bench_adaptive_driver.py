"""The live adaptive proposer's own time per engine step, offline, on a bench run's real requests.

    python benchmarks/bench_adaptive_driver.py RUN [--batch 1,4,16] [--repeats 3] [--variants python,vllm]
    python benchmarks/bench_adaptive_driver.py RUN --hybrid 0.56 [--variants shortcut,grid]
    python benchmarks/bench_adaptive_driver.py RUN --variants adaptive,adaptive-gated

RUN is a `speclab bench` run directory with a no-SD engine (prompts from its job.json, greedy outputs from its
cells at the smallest batch size it ran). Each workload's requests are played through `AdaptiveDriver` at each batch size with
`adaptive_live.play_engine` (vLLM's continuous batching around the driver, no model), once per variant of
the n-gram probe (`python`: speclab's incremental index; `vllm`: vLLM's compiled lookup), the variants
interleaved within each repeat. Prints the mean milliseconds per driver call (total driver time over
calls: what the engine pays per step, prompt indexing included) per variant and the ratio,
with the spread over repeats and the load average, so the comparison is side by side in one run.

--hybrid HIT: the hybrid's driver (speclab.methods.hybrid_live: probes n-gram and suffix plus an engine
drafter, eagle3, up to 3 passes), the drafter stood in by one that drafts the true next token with
probability HIT per position (its own time is not the engine's; the stand-in costs microseconds). Its
variants: `shortcut` (as shipped: goodput._all_off answers all-off steps without the pass grid) and `grid`
(the shortcut disabled: every step through the grid), to measure what the shortcut saves.

Variants named after an adaptive policy (`adaptive`, `adaptive-gated`, ...): the model-free driver running
that policy (vLLM's n-gram kernel where it imports); besides the time it prints the rows probed and the
drafted / accepted tokens, so a policy's cost and what it buys are side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

from speclab.engine.protocol import read_job, read_results
from speclab.methods.adaptive_live import AdaptiveDriver, play_engine
from speclab.simulate.adaptive import goodput


def none_job(run: Path) -> Path:
    """The job file of a bench run's no-SD engine (its latest attempt)."""
    jobs = sorted(run.glob("engines/none-*/attempt-*/job.json"))
    if not jobs:
        raise SystemExit(f"{run}: no engines/none-*/attempt-*/job.json (a run with a no-SD entry is needed)")
    return jobs[-1]


def load_requests(run: Path) -> dict[str, list[tuple[list[int], list[int]]]]:
    """Per workload: (prompt ids, no-SD output ids) of the batch-1 cell of the run's `none` engine."""
    path = none_job(run)
    job = read_job(path)
    results = {r.cell_id: r for r in read_results(path.parent / "cells.jsonl") if r.status == "ok"}
    out: dict[str, list[tuple[list[int], list[int]]]] = {}
    smallest = min((c.batch_size for c in job.cells if c.cell_id in results), default=1)
    for cell in job.cells:
        if cell.batch_size != smallest or cell.cell_id not in results:
            continue
        workload = cell.cell_id.split(".")[1]
        outputs = {q.id: q.output_token_ids for q in results[cell.cell_id].requests}
        out.setdefault(
            workload,
            [(list(p.prompt_token_ids), list(outputs[p.id])) for p in cell.prompts if p.id in outputs],
        )
    return out


def stand_in(reqs: list[tuple[list[int], list[int]]], hit: float):
    """A drafter right with probability `hit` at each (request, position, depth), the same answer to the
    same question (seeded by it)."""

    def draft(i: int, pos: int, p: int) -> list[int]:
        out = reqs[i][1]
        return [
            out[pos + j] if pos + j < len(out) and np.random.default_rng([i, pos, j]).random() < hit else -1
            for j in range(p)
        ]

    return draft


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--batch", default="1,4,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default="python,vllm", help="n-gram probe implementations to compare")
    ap.add_argument("--kmax", type=int, default=8)
    ap.add_argument("--cost-model", default=None, help="default: the live proposer's")
    ap.add_argument("--hybrid", type=float, default=None, metavar="HIT", help="the hybrid's driver (above)")
    args = ap.parse_args(argv)
    reqs = load_requests(args.run)
    if args.hybrid is not None and args.variants == "python,vllm":
        args.variants = "shortcut,grid"
    variants = args.variants.split(",")
    extra = {"cost_model": args.cost_model} if args.cost_model else {}
    print(f"# load average at start: {os.getloadavg()}", flush=True)
    print(
        "workload             B  variant   ms/call (mean) median of repeats [min-max]  calls  ratio to first"
    )
    for workload, rs in sorted(reqs.items()):
        for b in (int(x) for x in args.batch.split(",")):
            per: dict[str, list[float]] = {v: [] for v in variants}
            calls: dict[str, int] = {}
            seen: dict[str, tuple[int, int, int, int]] = {}
            for _ in range(args.repeats):
                for v in variants:  # interleaved: a slow phase of the machine hits every variant
                    timer: list[float] = []
                    if v.startswith("adaptive"):
                        drv = AdaptiveDriver(kmax=args.kmax, max_model_len=4096, policy=v, **extra)
                        log = play_engine(drv, rs, b, timer=timer)
                        seen[v] = (
                            drv.probe_rows["probed"],
                            drv.probe_rows["probed"] + drv.probe_rows["skipped"],
                            sum(d for lg in log.values() for d, _ in lg),
                            sum(a for lg in log.values() for _, a in lg),
                        )
                    elif args.hybrid is None:
                        drv = AdaptiveDriver(kmax=args.kmax, max_model_len=4096, ngram_impl=v, **extra)
                        play_engine(drv, rs, b, timer=timer)
                    else:
                        if v not in ("shortcut", "grid"):
                            raise SystemExit(f"--hybrid variants: shortcut, grid (got {v!r})")
                        drv = AdaptiveDriver(
                            kmax=args.kmax, max_model_len=4096, methods=("ngram", "suffix", "eagle3"),
                            model_drafter=True, kmax_model=3, **extra,
                        )  # fmt: skip
                        all_off = goodput._all_off
                        if v == "grid":
                            goodput._all_off = lambda *a: False  # type: ignore[assignment]
                        try:
                            play_engine(drv, rs, b, timer=timer, drafter=stand_in(rs, args.hybrid))
                        finally:
                            goodput._all_off = all_off  # type: ignore[assignment]
                    per[v].append(1e3 * sum(timer) / len(timer))
                    calls[v] = len(timer)
            base = statistics.median(per[variants[0]])
            for v in variants:
                med = statistics.median(per[v])
                print(
                    f"{workload:18s} {b:3d}  {v:8s}  {med:7.3f} [{min(per[v]):.3f}-{max(per[v]):.3f}]"
                    f"{'':16s}{calls[v]:6d}  {med / base:.2f}"
                    + ("  probed {}/{} rows, drafted {} accepted {}".format(*seen[v]) if v in seen else ""),
                    flush=True,
                )
    print(f"# load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
