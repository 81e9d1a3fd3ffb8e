"""The live adaptive proposer's own time per engine step, offline, on a bench run's real requests.

    python benchmarks/bench_adaptive_driver.py RUN [--batch 1,4,16] [--repeats 3] [--variants python,vllm]

RUN is a `speclab bench` run directory with a no-SD engine (prompts from its job.json, greedy outputs from its
cells). Each workload's requests are played through `AdaptiveDriver` at each batch size with
`adaptive_live.play_engine` (vLLM's continuous batching around the driver, no model), once per variant of
the n-gram probe (`python`: speclab's incremental index; `vllm`: vLLM's compiled lookup), the variants
interleaved within each repeat. Prints the mean milliseconds per driver call (total driver time over
calls: what the engine pays per step, prompt indexing included) per variant and the ratio,
with the spread over repeats and the load average, so the comparison is side by side in one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from speclab.engine.protocol import read_job, read_results
from speclab.methods.adaptive_live import AdaptiveDriver, play_engine


def load_requests(run: Path) -> dict[str, list[tuple[list[int], list[int]]]]:
    """Per workload: (prompt ids, no-SD output ids) of the batch-1 cell of the run's `none` engine."""
    jobs = sorted(run.glob("engines/none-*/attempt-*/job.json"))
    if not jobs:
        raise SystemExit(f"{run}: no engines/none-*/attempt-*/job.json (a run with a no-SD entry is needed)")
    job = read_job(jobs[-1])
    results = {r.cell_id: r for r in read_results(jobs[-1].parent / "cells.jsonl") if r.status == "ok"}
    out: dict[str, list[tuple[list[int], list[int]]]] = {}
    for cell in job.cells:
        if cell.batch_size != 1 or cell.cell_id not in results:
            continue
        workload = cell.cell_id.split(".")[1]
        outputs = {q.id: q.output_token_ids for q in results[cell.cell_id].requests}
        out.setdefault(
            workload,
            [(list(p.prompt_token_ids), list(outputs[p.id])) for p in cell.prompts if p.id in outputs],
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--batch", default="1,4,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default="python,vllm", help="n-gram probe implementations to compare")
    ap.add_argument("--kmax", type=int, default=8)
    ap.add_argument("--cost-model", default=None, help="default: the live proposer's")
    args = ap.parse_args(argv)
    reqs = load_requests(args.run)
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
            for _ in range(args.repeats):
                for v in variants:  # interleaved: a slow phase of the machine hits every variant
                    drv = AdaptiveDriver(kmax=args.kmax, max_model_len=4096, ngram_impl=v, **extra)
                    timer: list[float] = []
                    play_engine(drv, rs, b, timer=timer)
                    per[v].append(1e3 * sum(timer) / len(timer))
                    calls[v] = len(timer)
            base = statistics.median(per[variants[0]])
            for v in variants:
                med = statistics.median(per[v])
                print(
                    f"{workload:18s} {b:3d}  {v:8s}  {med:7.3f} [{min(per[v]):.3f}-{max(per[v]):.3f}]"
                    f"{'':16s}{calls[v]:6d}  {med / base:.2f}",
                    flush=True,
                )
    print(f"# load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
