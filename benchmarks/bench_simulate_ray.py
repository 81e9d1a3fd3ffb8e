"""How long a simulation sweep takes per trace position, serially and as Ray tasks, extrapolated to 10^8.

Usage: python -m benchmarks.bench_simulate_ray [--positions 1000000] [--sets 2]   (from the repository root)
       [--policy P ...] [--batch-sizes 1,8,32,128] [--batching continuous] [--ray local|auto|ADDRESS]
Synthetic study-shaped traces (bench_simulator.synthetic_traces: k_max 20, n-gram heavy-tailed, EAGLE ~4)
split into --sets trace sets; the sweep = sets x policies x batch sizes (simulate.distributed). Runs it
serially, then twice on Ray (the first includes starting Ray's worker processes; the cluster's own
start-up is timed apart), checks that both give the same rows, and prints seconds, positions simulated per
second (positions x policies x batch sizes / s) and the time the same sweep would take over 10^8 positions
(linear in positions: the serial time is measured at half and full size to show it).
"""

from __future__ import annotations

import argparse
import os
import time

from benchmarks.bench_simulator import synthetic_traces
from speclab.raycluster import start_local
from speclab.simulate.distributed import simulate_sweep

TARGET = 10**8


def sweep(sets: dict, a: argparse.Namespace, sizes: list[int], ray: str | None) -> tuple[float, list]:
    t0 = time.perf_counter()
    rows = simulate_sweep(
        sets, a.cost_model, a.policy, a.batching, sizes, ray_address=ray, echo=lambda s: None
    )
    return time.perf_counter() - t0, rows


def make_sets(positions: int, n_sets: int) -> dict:
    per = 260  # mean positions per request (bench_simulator's default)
    n = max(1, positions // per // n_sets)
    return {f"set{i}": synthetic_traces(n, per, seed=i) for i in range(n_sets)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, default=1_000_000, help="total trace positions over all sets")
    ap.add_argument("--sets", type=int, default=2)
    ap.add_argument("--policy", action="append", default=None)
    ap.add_argument("--batch-sizes", default="1,8,32,128")
    ap.add_argument("--batching", default="continuous")
    ap.add_argument("--cost-model", default="llama3.1-8b-h100")
    ap.add_argument("--by-policy", action="store_true", help="one task per policy too (simulate.distributed)")
    ap.add_argument("--ray", default="local", help="local (a new loopback cluster), auto or an address")
    a = ap.parse_args()
    a.policy = a.policy or ["fixed:ngram:3", "oracle:ngram", "oracle-combine:ngram,eagle"]
    sizes = [int(x) for x in a.batch_sizes.split(",")]
    work = len(a.policy) * len(sizes)
    half = make_sets(a.positions // 2, a.sets)
    sets = make_sets(a.positions, a.sets)
    npos = sum(t.output_len for tr in sets.values() for t in tr)
    nhalf = sum(t.output_len for tr in half.values() for t in tr)
    print(
        f"{npos:,} positions in {a.sets} trace set(s); {len(a.policy)} policies x {len(sizes)} batch sizes "
        f"({a.batching}) = {work} (policy, batch size) pairs per set, "
        f"{a.sets * (work if a.by_policy else len(sizes))} tasks"
    )
    t_half, _ = sweep(half, a, sizes, None)
    t_serial, serial = sweep(sets, a, sizes, None)
    print(f"   serial: {t_half:8.2f} s at {nhalf:,} positions, {t_serial:8.2f} s at {npos:,}")
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report leaves the machine

    t0 = time.perf_counter()
    if a.ray == "local":  # a fresh loopback cluster, timed apart from the sweeps
        start_local(ray, None, {"logging_level": "WARNING"})
    else:
        ray.init(address=a.ray)
    t_start = time.perf_counter() - t0
    try:
        t_cold, _ = sweep(sets, a, sizes, "auto")  # the connection above is used
        t_ray, on_ray = sweep(sets, a, sizes, "auto")
    finally:
        ray.shutdown()
    same = [(n, r.to_dict() | {"notes": None}) for n, r in serial] == [
        (n, r.to_dict() | {"notes": None}) for n, r in on_ray
    ]
    print(
        f"      ray: {t_ray:8.2f} s warm ({ray.__version__}; first sweep {t_cold:.2f} s with worker start-up, "
        f"cluster start/connect {t_start:.1f} s); rows equal serial: {same}"
    )
    for name, t in (("serial", t_serial), ("ray", t_ray)):
        print(
            f"{name:>9}: {npos * work / t:14,.0f} position-simulations/s; this sweep over 10^8 positions: "
            f"~{t * TARGET / npos / 60:.1f} min (one (policy, batch size) pair: ~{t * TARGET / npos / work:.0f} s)"
        )
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
