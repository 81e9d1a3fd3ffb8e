"""Simulated speedup of `adaptive-gated` beside `adaptive` (the rule it gates) on every trace set at hand, under
the CPU live cost model and the H100 chained one, continuous batching, steady state (docs/adaptive.md,
"Gated probes"). Prints one markdown table per cost model: speedup over no SD of each, their ratio, and the
smallest speedup of each over the batch sizes (the "never below 0.98x" floor).

    PYTHONPATH=src python benchmarks/compare_gated.py [--sizes 1,4,16,64,128] [--store NAME=PATH ...] \
        [--cost-models smollm2-135m-cpu-live,llama3.1-8b-h100-chained]

Sets: speclab's four synthetic shapes (n = 60, seed 7), the study-format fixture (InstructCoder- and
GSM8K-shaped, tests/data/study-simulator), and any Parquet stores given with --store. --made adds sets the
policy was not built on (docs/adaptive.md, "Stop 18"): the synthetic shapes at seed 11, n = 40, and from
each store three variants: every draft rejected (offers kept), prompts 8x longer, outputs cut to 32 tokens."""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import tempfile
from pathlib import Path

import numpy as np

import speclab.simulate.adaptive.base as base
from speclab.simulate import simulate
from speclab.simulate.adaptive.synth import SHAPES, make_set
from speclab.traces import MethodTrace, RequestTrace, read_store
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


def made_variants(name: str, traces: list[RequestTrace]) -> dict[str, list[RequestTrace]]:
    """Three variants of a store: every draft rejected (offers kept), prompts 8x longer, outputs cut to 32."""

    def methods(t: RequestTrace, acc, cut: int | None = None) -> dict[str, MethodTrace]:
        out = {}
        for m, mt in t.methods.items():
            a = acc(mt)[:cut]
            npr = None if mt.num_proposed is None else mt.num_proposed[:cut]
            out[m] = MethodTrace(k_max=mt.k_max, acc_len=a, num_proposed=npr)
        return out

    def cut32(mt: MethodTrace) -> np.ndarray:  # a copy cannot run past the new end
        a = mt.acc_len[:32]
        return np.minimum(a, len(a) - np.arange(len(a)))

    short = [t for t in traces if t.output_len >= 32]
    return {
        f"{name}-never-accepted": [
            dataclasses.replace(t, methods=methods(t, lambda mt: np.ones_like(mt.acc_len))) for t in traces
        ],
        f"{name}-long-prompts": [dataclasses.replace(t, prompt_len=t.prompt_len * 8) for t in traces],
        f"{name}-short32": [
            dataclasses.replace(t, output_len=32, methods=methods(t, cut32, 32)) for t in short
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,4,16,64,128")
    ap.add_argument("--store", action="append", default=[], help="NAME=PATH (repeatable)")
    ap.add_argument("--cost-models", default=",".join(COST_MODELS))
    ap.add_argument("--gate-min-cost", type=float, help="override base.GATE_MIN_COST (an experiment)")
    ap.add_argument("--sets", help="comma-separated subset of the set names")
    ap.add_argument("--made", action="store_true", help="add the made sets (see the module docstring)")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    if a.gate_min_cost is not None:
        base.GATE_MIN_COST = a.gate_min_cost
    sets = {s: make_set(s, n=60, seed=7) for s in SHAPES} | study_sets()
    for spec in a.store:
        name, _, path = spec.partition("=")
        sets[name] = read_store(path)
        if a.made:
            sets |= made_variants(name, sets[name])
    if a.made:
        sets |= {f"{s}-seed11-n40": make_set(s, n=40, seed=11) for s in SHAPES}
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
