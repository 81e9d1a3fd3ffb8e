"""Simulated speedup of `adaptive-gated` beside `adaptive` (the rule it gates) on every trace set at hand, under
the CPU live cost model and the H100 chained one, continuous batching, steady state (docs/adaptive.md,
"Gated probes"). Prints one markdown table per cost model: speedup over no SD of each, their ratio, and the
smallest speedup of each over the batch sizes (the "never below 0.98x" floor).

    PYTHONPATH=src python benchmarks/compare_gated.py [--sizes 1,4,16,64,128] [--store NAME=PATH ...] \
        [--cost-models smollm2-135m-cpu-live,llama3.1-8b-h100-chained]

Sets: speclab's four synthetic shapes (n = 60, seed 7), the study-format fixture (InstructCoder- and
GSM8K-shaped, tests/data/study-simulator), and any Parquet stores given with --store."""

from __future__ import annotations

import argparse
import gzip
import tempfile
from pathlib import Path

import speclab.simulate.adaptive.base as base
from speclab.simulate import simulate
from speclab.simulate.adaptive.synth import SHAPES, make_set
from speclab.traces import RequestTrace, read_store
from speclab.traces.importers import import_specdecode_bench

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "study-simulator"
POLICIES = ("adaptive", "adaptive-gated")
COST_MODELS = ("smollm2-135m-cpu-live", "llama3.1-8b-h100-chained")


def study_sets() -> dict[str, list[RequestTrace]]:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for ds in ("instructcoder", "gsm8k"):
            path = Path(tmp) / f"{ds}.jsonl"
            with gzip.open(FIXTURE / f"combined_{ds}.jsonl.gz", "rb") as src:
                path.write_bytes(src.read())
            out[f"study-{ds}"] = import_specdecode_bench([path])[0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,4,16,64,128")
    ap.add_argument("--store", action="append", default=[], help="NAME=PATH (repeatable)")
    ap.add_argument("--cost-models", default=",".join(COST_MODELS))
    ap.add_argument("--gate-min-cost", type=float, help="override base.GATE_MIN_COST (an experiment)")
    ap.add_argument("--sets", help="comma-separated subset of the set names")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    if a.gate_min_cost is not None:
        base.GATE_MIN_COST = a.gate_min_cost
    sets = {s: make_set(s, n=60, seed=7) for s in SHAPES} | study_sets()
    for spec in a.store:
        name, _, path = spec.partition("=")
        sets[name] = read_store(path)
    if a.sets:
        sets = {k: v for k, v in sets.items() if k in a.sets.split(",")}
    for cm in a.cost_models.split(","):
        print(f"\n### {cm} (continuous, steady state)\n")
        print("| set | " + " | ".join(f"B = {b}" for b in sizes) + " | min adaptive | min gated |")
        print("|---|" + "---|" * (len(sizes) + 2))
        for name, traces in sets.items():
            res = simulate(traces, cm, list(POLICIES), "continuous", sizes)
            by = {(r.policy, r.batch_size): r.speedup for r in res}
            cells = [
                f"{by[('adaptive', b)]:.3f} / {by[('adaptive-gated', b)]:.3f} "
                f"({by[('adaptive-gated', b)] / by[('adaptive', b)] - 1:+.1%})"
                for b in sizes
            ]
            lo = [min(by[(p, b)] for b in sizes) for p in POLICIES]
            print(f"| {name} | " + " | ".join(cells) + f" | {lo[0]:.3f} | {lo[1]:.3f} |")


if __name__ == "__main__":
    main()
