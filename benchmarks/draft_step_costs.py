"""Per-step drafting cost of every SD engine in a bench run, from the step profiler's timings.

    .venv/bin/python benchmarks/draft_step_costs.py RUN

For each engine of RUN (RUN/engines/<engine>/attempt-*/timings.csv, every cell and repeat it ran) and each
batch occupancy seen, over the decode steps only (steps that verified k drafts for every running request,
so a proposer call after a prefill, which also runs the new prompt through the drafter, is left out):
median milliseconds of one proposer call (`runner.propose_draft_token_ids`, all k drafts), median target
forward (verification of 1 + k tokens per request) and their ratio. The ratio is what compares drafters:
one DFlash call (one forward over 1 + k query tokens) against an EAGLE-3 call (k chained forwards).
Medians, because these runs usually share the CPU with other work; absolute milliseconds move with load.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

from speclab.bench.rows import read_rows
from speclab.timings import read_timings


def engine_costs(engine_dir: Path, k: int) -> dict[int, dict[str, float]]:
    """{requests per step: {calls, propose_ms, verify_ms}} over the decode steps of one engine."""
    propose: dict[int, list[float]] = defaultdict(list)
    verify: dict[int, list[float]] = defaultdict(list)
    for f in sorted(engine_dir.glob("attempt-*/timings.csv")):
        for r in read_timings(f, strict=False):
            _kv, batched, spec, nreq, seconds = r.values
            n = int(nreq)
            if n < 1 or int(batched) != n * (k + 1) or int(spec) != n * k:
                continue  # a prefill (or mixed) step, or a step where some request drafted nothing
            if r.kind.startswith("draft:"):
                propose[n].append(seconds)
            elif r.kind == "target":
                verify[n].append(seconds)
    out = {}
    for n, p in sorted(propose.items()):
        v = verify.get(n) or [float("nan")]
        out[n] = {
            "calls": len(p),
            "propose_ms": 1e3 * statistics.median(p),
            "verify_ms": 1e3 * statistics.median(v),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    args = ap.parse_args()
    engines: dict[str, tuple[str, int]] = {}
    for row in read_rows(args.run):
        if row.get("method") != "none" and row.get("engine_id") and row.get("k"):
            engines.setdefault(row["engine_id"], (row.get("label") or row["method"], int(row["k"])))
    print(f"{'label':<24} {'k':>2} {'reqs':>4} {'calls':>6} {'propose ms':>10} {'verify ms':>9} {'ratio':>6}")
    for eid, (label, k) in sorted(engines.items(), key=lambda e: (e[1][1], e[1][0])):
        for n, c in engine_costs(args.run / "engines" / eid, k).items():
            ratio = c["propose_ms"] / c["verify_ms"]
            print(
                f"{label:<24} {k:>2} {n:>4} {c['calls']:>6} {c['propose_ms']:>10.2f} "
                f"{c['verify_ms']:>9.2f} {ratio:>6.2f}"
            )


if __name__ == "__main__":
    main()
