"""Time the shipped online policy against a fixed one on the same traces, and how close it comes to the bound.

Usage: .venv/bin/python benchmarks/bench_online_policy.py [--traces FILE.jsonl[.gz]] [--requests 100]
       [--policy adaptive-gated] [--fixed fixed:ngram:3] [--batch-sizes 1,4,16,64] [--repeats 3]
       [--cost-model llama3.1-8b-h100-chained] [--batching continuous]
Traces: the study-format fixture (tests/data/study-simulator/combined_instructcoder.jsonl.gz) unless given.
Both policies are simulated in turn, `--repeats` times interleaved (policy, fixed, policy, fixed, ...), so
machine load hits both alike; prints each one's median, the ratio of the medians, and the policy's
fraction of oracle-combine's speedup at batch 1 (its figures are the same in every repeat). Before the
rounds, one untimed call of both on two requests, timed and printed on its own line: the first call in a
process imports numba and loads the compiled loop from numba's cache (or compiles it, once per install:
about half a minute), which the rounds then do not carry.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from speclab.simulate import compiled, simulate
from speclab.traces import RequestTrace
from speclab.traces.importers import import_specdecode_bench

FIXTURE = (
    Path(__file__).parent.parent / "tests" / "data" / "study-simulator" / "combined_instructcoder.jsonl.gz"
)


def load_traces(path: Path, requests: int | None) -> list[RequestTrace]:
    """The study's JSON Lines format (gzipped or not), the first `requests` records."""
    with tempfile.TemporaryDirectory() as d:
        src = path
        if path.suffix == ".gz":
            src = Path(d) / path.stem
            with gzip.open(path, "rb") as a, open(src, "wb") as b:
                shutil.copyfileobj(a, b)
        recs, _ = import_specdecode_bench([src])
    return recs[:requests] if requests else recs


def time_policies(
    traces: list[RequestTrace],
    cost_model: str,
    policies: list[str],
    batching: str,
    sizes: list[int],
    repeats: int,
) -> dict[str, tuple[list[float], list]]:
    """Each policy simulated alone, `repeats` rounds interleaved; per policy (seconds per round, rows)."""
    out: dict[str, tuple[list[float], list]] = {p: ([], []) for p in policies}
    for _ in range(repeats):
        for p in policies:
            t0 = time.perf_counter()
            rows = simulate(traces, cost_model, [p], batching, sizes)
            out[p][0].append(time.perf_counter() - t0)
            out[p][1][:] = rows
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=FIXTURE)
    ap.add_argument("--requests", type=int, default=100, help="first N records (0 = all)")
    ap.add_argument("--policy", default="adaptive-gated")
    ap.add_argument("--fixed", default="fixed:ngram:3")
    ap.add_argument("--oracle", default="oracle-combine:ngram,eagle")
    ap.add_argument("--batching", default="continuous")
    ap.add_argument("--batch-sizes", default="1,4,16,64")
    ap.add_argument("--cost-model", default="llama3.1-8b-h100-chained")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    traces = load_traces(a.traces, a.requests or None)
    sizes = [int(x) for x in a.batch_sizes.split(",")]
    npos = sum(t.output_len for t in traces)
    print(
        f"{len(traces)} requests, {npos} output positions, {a.batching} batching, batch sizes {a.batch_sizes}, "
        f"cost model {a.cost_model}, {a.repeats} interleaved repeats (median)"
    )
    t0 = time.perf_counter()
    simulate(traces[:2], a.cost_model, [a.policy, a.fixed], a.batching, [1])
    first = time.perf_counter() - t0
    how = "numba: the compiled loop where it covers the policy" if compiled.available() else "numpy loop"
    print(f"  first call, two requests ({how}): {first:.3f} s, not in the rounds")
    res = time_policies(traces, a.cost_model, [a.policy, a.fixed], a.batching, sizes, a.repeats)
    med = {p: statistics.median(ts) for p, (ts, _) in res.items()}
    for p, (ts, _) in res.items():
        print(f"{p:>24}: {med[p]:8.3f} s  (rounds: {', '.join(f'{t:.3f}' for t in ts)})")
    ratio = med[a.policy] / med[a.fixed]
    print(f"  {a.policy} / {a.fixed}: {ratio:.1f}x")
    one = min(sizes)
    pol = next(r for r in res[a.policy][1] if r.batch_size == one)
    orc = simulate(traces, a.cost_model, [a.oracle], a.batching, [one])[0]
    frac = pol.speedup / orc.speedup
    print(
        f"  at batch {one}: {a.policy} {pol.speedup:.3f}x, {a.oracle} {orc.speedup:.3f}x: "
        f"{frac:.1%} of the bound"
    )
    return {"ratio": ratio, "seconds": med, "fraction_of_oracle": frac, "first_call_s": first}


if __name__ == "__main__":
    main()
