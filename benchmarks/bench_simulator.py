"""Benchmark the vectorised simulator against the plain per-step reference loop (same rules, same results).

Usage: .venv/bin/python benchmarks/bench_simulator.py [--requests 300] [--positions 260] [--policy P]
       [--batching replicate] [--aggregate study] [--skip-reference]
Synthetic traces shaped like the study's (k_max 20; n-gram heavy-tailed, EAGLE around 4).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from speclab.simulate import simulate
from speclab.traces import MethodTrace, RequestTrace


def synthetic_traces(n: int, positions: int, seed: int = 0) -> list[RequestTrace]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        L = int(rng.integers(positions // 2, positions * 3 // 2))
        # n-gram: mostly 1-2, occasionally long bursts; EAGLE: around 4
        ng = np.where(rng.random(L) < 0.25, rng.integers(5, 22, L), rng.integers(1, 3, L))
        ea = np.clip(rng.poisson(3.2, L) + 1, 1, 21)
        out.append(
            RequestTrace(
                id=f"req{i}",
                workload="instructcoder",
                category="code-editing",
                prompt_len=int(rng.integers(100, 1000)),
                output_len=L,
                methods={"ngram": MethodTrace(20, ng), "eagle": MethodTrace(20, ea)},
            )
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--positions", type=int, default=260)
    ap.add_argument("--policy", default="oracle-combine:ngram,eagle")
    ap.add_argument("--batching", default="replicate")
    ap.add_argument("--aggregate", default="study")
    ap.add_argument("--batch-sizes", default="1,8,16,32,64,128")
    ap.add_argument("--cost-model", default="llama3.1-8b-h100")
    ap.add_argument("--skip-reference", action="store_true")
    a = ap.parse_args()
    traces = synthetic_traces(a.requests, a.positions)
    sizes = [int(x) for x in a.batch_sizes.split(",")]
    kw = dict(aggregate=a.aggregate, sample=a.requests if a.aggregate == "study" else None)
    npos = sum(t.output_len for t in traces)
    print(
        f"{a.requests} requests, {npos} output positions, policy {a.policy}, batching {a.batching}, "
        f"aggregate {a.aggregate}, batch sizes {a.batch_sizes} (+ the none baseline at each)"
    )
    engines = ["fast"] if a.skip_reference else ["fast", "reference"]
    res = {}
    for eng in engines:
        best = float("inf")
        reps = 3 if eng == "fast" else 1
        for _ in range(reps):
            t0 = time.perf_counter()
            r = simulate(traces, a.cost_model, [a.policy], a.batching, sizes, engine=eng, **kw)
            best = min(best, time.perf_counter() - t0)
        # engine steps simulated: the policy's and the baseline's (baseline steps = output tokens - requests)
        steps = sum(x.steps for x in r)
        base_steps = sum(
            x.steps for x in simulate(traces, a.cost_model, ["none"], a.batching, sizes, engine="fast", **kw)
        )
        res[eng] = (best, steps + base_steps, r)
        print(
            f"{eng:>9}: {best:8.3f} s  {(steps + base_steps) / best:12,.0f} simulated engine steps/s"
            + ("  (best of 3)" if reps > 1 else "")
        )
    if "reference" in res:
        f, ref = res["fast"], res["reference"]
        print(f"  speedup of fast over reference: {ref[0] / f[0]:.1f}x")
        worst = max(abs(x.speedup - y.speedup) / y.speedup for x, y in zip(f[2], ref[2], strict=True))
        print(f"  max relative difference in speedup between the two: {worst:.2e}")
    print("batch  speedup")
    for x in res["fast"][2]:
        print(f"{x.batch_size:>5}  {x.speedup:.3f}x")


if __name__ == "__main__":
    main()
