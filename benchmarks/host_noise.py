"""How much this machine's own speed moves, and so how small a difference a live comparison here can show.

    python benchmarks/host_noise.py [--units 40] [--unit-s 1.5] [--threads 2] [--batch 4] [--seed 0]
                                    [--layers 30] [--save RUN]

A longer run of `speclab.bench.noise`'s A/A probe: the matrix-vector products of a decode step of
SmolLM2-135M (`--layers` layers of q/k/v/o and the gated MLP at its shapes, fp32, `--batch` rows), repeated to
about `--unit-s` seconds per unit (calibrated once, then fixed). Every unit does the same work, so every
difference between units is the machine's. It prints:

- the spread of unit times (sd / median, min-max) and of the process's CPU time per unit: CPU time moving
  with wall time means the host ran slower (memory bandwidth, clock, neighbours), not that the process was
  descheduled;
- the A/A paired ratio of back-to-back units (unit 2i+1 over unit 2i): the noise a paired comparison of two
  proposers, run one after the other, carries even when they do the same work;
- the resolution: for R rounds, the median half-width of the 95% sign-test interval
  (speclab.bench.repeats.median_interval) of R such A/A ratios drawn from the ones measured (seeded), i.e.
  the smallest difference a same-engine ranking over R rounds could call ahead or behind.

`--save RUN` also writes the measurement as RUN/noise.json, the machine noise the report's verdicts use for
that run (docs/report.md).

Run it alone (no engine, no tests beside it): it measures the machine, so anything else running is in it.
The load average before and after is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np

from speclab.bench.noise import LAYERS, describe, noise_record, save_noise, time_units
from speclab.bench.repeats import median_interval


def resolution(ratios: list[float], rounds: int, draws: int, rng: np.random.Generator) -> float | None:
    """Median half-width of the 95% sign-test interval of `rounds` A/A ratios drawn from `ratios`."""
    widths = []
    for _ in range(draws):
        iv = median_interval(list(rng.choice(ratios, size=rounds, replace=True)))
        if iv is None:
            return None
        widths.append((iv[1] - iv[0]) / 2)
    return float(np.median(widths))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=40, help="units to time (even: paired back to back)")
    ap.add_argument("--unit-s", type=float, default=1.5, help="seconds per unit (calibrated once)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4, help="rows per product (requests in the step)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=LAYERS, help="decoder layers (fewer: a smaller probe)")
    ap.add_argument("--draws", type=int, default=400, help="resamples per resolution figure")
    ap.add_argument("--save", metavar="RUN", help="also write RUN/noise.json (the report's machine noise)")
    args = ap.parse_args(argv)
    if args.units < 4:
        ap.error("--units: at least 4 (2 pairs)")
    load0 = os.getloadavg()
    times, steps = time_units(args.units, args.unit_s, args.threads, args.batch, args.layers, args.seed)
    load1 = os.getloadavg()
    wall = [t for t, _ in times]
    cpu = [c for _, c in times]
    med = statistics.median(wall)
    print(
        f"# {args.units} units of {steps} decode steps (B = {args.batch}, {args.threads} threads); "
        f"load average {load0[0]:.2f} before, {load1[0]:.2f} after"
    )
    print(
        f"unit wall time: median {med:.3f} s, sd / median {statistics.pstdev(wall) / med:.3f}, "
        f"range {min(wall) / med:.3f}-{max(wall) / med:.3f} of the median"
    )
    cmed = statistics.median(cpu)
    corr = float(np.corrcoef(wall, cpu)[0, 1]) if statistics.pstdev(cpu) > 0 else float("nan")
    print(
        f"unit CPU time: median {cmed:.3f} s, sd / median {statistics.pstdev(cpu) / cmed:.3f}, "
        f"correlation with wall time {corr:.2f}"
    )
    pairs = [wall[i] / wall[i + 1] for i in range(0, len(wall) - 1, 2)]
    q = statistics.quantiles(pairs, n=10) if len(pairs) >= 2 else [pairs[0]] * 9
    print(
        f"A/A ratio of back-to-back units ({len(pairs)} pairs): sd {statistics.pstdev(pairs):.3f}, "
        f"10-90% {q[0]:.3f}-{q[8]:.3f}"
    )
    rng = np.random.default_rng(args.seed)
    for rounds in (6, 11, 20, 50, 100):
        r = resolution(pairs, rounds, args.draws, rng)
        print(f"resolution over {rounds:3d} rounds (95% sign-test half-width): +-{100 * r:.1f}%")
    if args.save:
        noise = noise_record(wall, steps, args.threads, args.batch, args.layers, (load0[0], load1[0]))
        print(f"wrote {save_noise(args.save, noise)}: {describe(noise)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
