"""Do the bench's verdicts survive a CPU-heavy neighbour? Run a reduced demo twice, once quiet and once beside
busy-loop processes this script starts (and always stops), and compare the verdicts cell by cell.

    python benchmarks/contention_check.py --out runs/contention          # both halves, ~20 min on 2 cores
    python benchmarks/contention_check.py --out runs/contention --compare-only   # re-print the comparison

The reduced demo: the demo-cpu preset's n-gram (k=3) against no SD on offline-code-edit, continuous batching
at B = 1 and 16, 8 prompts x 64 tokens, repeats = 3 (each cell measured 3 times, interleaved with its
baseline; docs/bench.md "Noise"). Quiet half: OUT/quiet (needs a quiet machine: the script refuses to start
it while /proc/pressure/cpu says some task waited for a CPU more than half of the last 10 s). Contended half:
OUT/contended, measured while `--hogs` Python busy loops (default: one per CPU) run; each hog stops itself
after `--hog-seconds` and the script terminates them when the bench ends or fails.

Per cell (workload, batching, batch size) it prints the quiet verdict, the contended one and the outcome
(`speclab.report.recommend.compare_recommendations`): same / cannot tell / differs (same side of on/off,
other method or strength) / WRONG. Exit status 1 if any cell is WRONG. Reruns resume: a finished half's
cells are kept (`speclab bench` skips done cells).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH_ARGS = [
    "bench", "--preset", "demo-cpu", "--workloads", "offline-code-edit", "--batch-sizes", "1,16",
    "--methods", "ngram", "--num-prompts", "8", "--repeats", "3", "--no-progress",
]  # fmt: skip
HOG = "import time\nend = time.time() + {secs}\nwhile time.time() < end:\n    pass\n"
QUIET_PRESSURE = 50.0  # /proc/pressure/cpu "some avg10" (%) above which the machine is not quiet


def cpu_pressure_avg10() -> float | None:
    try:
        first = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        return None
    return float(dict(f.split("=") for f in first.split()[1:])["avg10"])


def bench(out: Path) -> int:
    cmd = [sys.executable, "-c", "import sys; from speclab.cli import main; main(sys.argv[1:])"]
    print(f"$ speclab {' '.join(BENCH_ARGS)} --out {out}", flush=True)
    return subprocess.call([*cmd, *BENCH_ARGS, "--out", str(out)])


def contended_half(out: Path, hogs: int, secs: float) -> int:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(hogs):
            procs.append(subprocess.Popen([sys.executable, "-c", HOG.format(secs=secs)]))
        print(
            f"started {hogs} busy loop(s) (pids {', '.join(str(p.pid) for p in procs)}), each <= {secs:.0f} s"
        )
        time.sleep(15)  # let the pressure show before the engines start
        return bench(out)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        print(f"stopped {len(procs)} busy loop(s)")


def compare(out: Path) -> int:
    from speclab.bench.rows import read_rows
    from speclab.report.recommend import compare_recommendations, recommendations

    quiet = recommendations(read_rows(out / "quiet"), None)
    other = recommendations(read_rows(out / "contended"), None)
    rows = compare_recommendations(quiet, other)
    print(
        f"\n{'workload':<20} {'batching':<11} {'B':>3}  {'quiet run':<28} {'beside busy loops':<28} outcome"
    )
    for r in rows:
        print(f"{r['workload']:<20} {r['batching']:<11} {r['batch_size']:>3}  {str(r['quiet']):<28} "
              f"{str(r['other']):<28} {r['outcome']}")  # fmt: skip
    why = {(r["workload"], r["batch_size"]): r.get("why") for r in other}
    for r in rows:
        if r["outcome"] == "cannot tell":
            print(f"  B={r['batch_size']}: {why.get((r['workload'], r['batch_size']))}")
    counts = {o: sum(r["outcome"] == o for r in rows) for o in ("same", "cannot tell", "differs", "WRONG")}
    print("outcomes: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return 1 if counts["WRONG"] else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy loops beside the bench")
    ap.add_argument(
        "--hog-seconds", type=float, default=1500.0, help="each busy loop stops itself after this"
    )
    ap.add_argument("--compare-only", action="store_true", help="only compare the two halves already run")
    args = ap.parse_args()
    if not args.compare_only:
        pressure = cpu_pressure_avg10()
        if pressure is not None and pressure > QUIET_PRESSURE:
            print(f"the machine is not quiet (CPU pressure {pressure:.0f}% over the last 10 s); "
                  "the quiet half needs it to be")  # fmt: skip
            return 2
        t0 = time.time()
        if bench(args.out / "quiet") != 0:
            return 2
        print(f"quiet half: {(time.time() - t0) / 60:.1f} min", flush=True)
        t0 = time.time()
        if contended_half(args.out / "contended", args.hogs, args.hog_seconds) != 0:
            return 2
        print(f"contended half: {(time.time() - t0) / 60:.1f} min", flush=True)
    return compare(args.out)


if __name__ == "__main__":
    sys.exit(main())
