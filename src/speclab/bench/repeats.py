"""Repeats: a cell measured N times (sweep `repeats = N`), interleaved with its no-SD baseline.

A repeat is a "unit" for the worker: repeat 1 keeps the cell's own id (so a sweep with repeats = 1 has the
ids it always had), repeat r > 1 is `<cell id>#r<r>`. The cell's results row keeps every repeat in `runs`
and summarises them:

- `throughput_tok_s`: the median over the runs; `throughput_spread`: {min, max};
- `speedup`: the median of matched pairs (repeat i of the SD cell / repeat i of its baseline, measured one
  after the other); `speedup_runs`: each pair; `speedup_spread`: {min, max, n};
- `host.loadavg_1m`: the highest load average seen over the runs (the contention flag, `contended`).

Token-exactness, acceptance, traces, time split and memory come from repeat 1.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any

from speclab.bench.noise import MAX_REPEATS_SAID, repeats_to_decide, speedup_interval
from speclab.engine.protocol import CellResult

# A cell counts as contended when some task waited for a CPU during more than CONTENDED_PRESSURE of the
# cell's time (Linux PSI: it covers exactly the cell). Only where the kernel has no PSI does the 1-minute load
# average decide, above CONTENDED_LOAD_FACTOR x the CPU count: it counts the engine's own threads and lags a
# minute, so it cannot separate a quiet engine from a shared machine. Measured on this 2-core kind: a quiet
# demo ran at load 2.05-2.66 (1.0-1.33x the cores) with CPU pressure 3-5%; runs beside other jobs showed CPU
# pressure of 99-100%.
CONTENDED_LOAD_FACTOR = 1.5
CONTENDED_PRESSURE = 0.5


def unit_id(cell_id: str, repeat: int) -> str:
    return cell_id if repeat == 1 else f"{cell_id}#r{repeat}"


def split_unit(uid: str) -> tuple[str, int]:
    """(cell id, repeat) of a unit id; a plain cell id is repeat 1."""
    cid, sep, rep = uid.rpartition("#r")
    if sep and rep.isdigit() and int(rep) > 1:
        return cid, int(rep)
    return uid, 1


def run_entry(res: CellResult, repeat: int, loadavg_now: float | None) -> dict[str, Any]:
    """One repeat's measurement, as kept in a row's `runs`."""
    info = res.engine_info or {}
    loads = [v for v in (info.get("loadavg_start"), info.get("loadavg_end"), loadavg_now) if v is not None]
    return {
        "repeat": repeat,
        "throughput_tok_s": res.output_tokens / res.elapsed_s if res.elapsed_s > 0 else None,
        "output_tokens": res.output_tokens,
        "elapsed_s": res.elapsed_s,
        "loadavg_1m": max(loads) if loads else None,
        "cpu_pressure": info.get("cpu_pressure"),
        "cpus": info.get("cpus") or os.cpu_count(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def runs_done(row: dict[str, Any] | None) -> set[int]:
    """The repeats an ok row holds (a row without `runs` is one measurement: repeat 1)."""
    if row is None or row.get("status") != "ok":
        return set()
    runs = row.get("runs")
    return {int(r["repeat"]) for r in runs} if runs else {1}


def load_is_contended(load: float | None, cpus: int | None, pressure: float | None = None) -> bool:
    if pressure is not None:
        return pressure > CONTENDED_PRESSURE
    return load is not None and bool(cpus) and load > CONTENDED_LOAD_FACTOR * cpus  # type: ignore[operator]


def row_pressure(row: dict[str, Any]) -> float | None:
    """The highest CPU pressure over a row's measurements (None where not recorded)."""
    vals = [(row.get("host") or {}).get("cpu_pressure"), (row.get("engine_info") or {}).get("cpu_pressure")]
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def contended(row: dict[str, Any]) -> bool:
    """Did any measurement of this row run while other processes competed for the CPUs?"""
    host = row.get("host") or {}
    return load_is_contended(host.get("loadavg_1m"), host.get("cpus"), row_pressure(row))


def _run_contended(run: dict[str, Any]) -> bool:
    return load_is_contended(run.get("loadavg_1m"), run.get("cpus"), run.get("cpu_pressure"))


def _runs_of(row: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """repeat -> run; a row without `runs` is its single measurement."""
    if row.get("runs"):
        return {int(r["repeat"]): r for r in row["runs"]}
    host = row.get("host") or {}
    return {
        1: {
            "repeat": 1,
            "throughput_tok_s": row.get("throughput_tok_s"),
            "loadavg_1m": host.get("loadavg_1m"),
            "cpu_pressure": row_pressure(row),
            "cpus": host.get("cpus"),
        }
    }


def add_run(row: dict[str, Any], run: dict[str, Any]) -> None:
    """Add (or replace) one repeat's run in an ok row and update the row's summary of its runs."""
    runs = _runs_of(row)
    runs[int(run["repeat"])] = run
    row["runs"] = [runs[r] for r in sorted(runs)]
    summarise_runs(row)


def summarise_runs(row: dict[str, Any]) -> None:
    """throughput median and spread, repeats, and the worst load average, from the row's `runs`."""
    runs = row.get("runs")
    if not runs:
        return
    tps = [r["throughput_tok_s"] for r in runs if r.get("throughput_tok_s")]
    row["repeats"] = len(runs)
    if tps:
        row["throughput_tok_s"] = statistics.median(tps)
        row["throughput_spread"] = {"min": min(tps), "max": max(tps)}
    loads = [r["loadavg_1m"] for r in runs if r.get("loadavg_1m") is not None]
    host = row.setdefault("host", {})
    if loads:
        host["loadavg_1m"] = max(loads)
    pressures = [r["cpu_pressure"] for r in runs if r.get("cpu_pressure") is not None]
    if pressures:
        host["cpu_pressure"] = max(pressures)
    host.setdefault("cpus", next((r.get("cpus") for r in runs if r.get("cpus")), os.cpu_count()))


def chosen_pairs(pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The matched pairs a speedup rests on: a contended pair's ratio is biased, not only noisier, so where
    some pairs ran on a quiet machine the figure is theirs alone; where none did, all of them."""
    quiet = [p for p in pairs if not p.get("contended")]
    return quiet or list(pairs)


def pair_summary(pairs: list[dict[str, Any]]) -> tuple[float, dict[str, Any]]:
    """Median speedup of the given matched pairs (non-empty) and its spread {min, max, n}."""
    ratios = [p["speedup"] for p in pairs]
    return statistics.median(ratios), {"min": min(ratios), "max": max(ratios), "n": len(ratios)}


def apply_pairs(row: dict[str, Any], baseline_row: dict[str, Any]) -> None:
    """The speedup of a row with repeats from matched pairs with its baseline (same repeat number): the
    median of the ratios, their spread and n. Each pair is marked contended if either side was; where some
    pairs are quiet and some contended, only the quiet ones make the median and spread (`contended_left_out`
    in the spread counts the others)."""
    mine, base = _runs_of(row), _runs_of(baseline_row)
    pairs = []
    for r in sorted(set(mine) & set(base)):
        t, b = mine[r].get("throughput_tok_s"), base[r].get("throughput_tok_s")
        if t and b:
            pairs.append(
                {
                    "repeat": r,
                    "speedup": t / b,
                    "contended": _run_contended(mine[r]) or _run_contended(base[r]),
                }
            )
    row["speedup_runs"] = pairs
    if pairs:
        used = chosen_pairs(pairs)
        row["speedup"], row["speedup_spread"] = pair_summary(used)
        if len(used) < len(pairs):
            row["speedup_spread"]["contended_left_out"] = len(pairs) - len(used)
    else:
        row["speedup"], row["speedup_spread"] = None, None


def evidence(
    row: dict[str, Any], baseline_row: dict[str, Any] | None = None, noise: dict[str, Any] | None = None
) -> tuple[str, float | None, str]:
    """Whether an SD row's speedup supports a verdict beyond this machine's noise: ("faster" | "slower" |
    "unsure", the figure it rests on, why).

    Only pairs measured on a quiet machine count (a competing process shifts the SD/no-SD ratio, not only its
    spread); a row without pairs is one measurement, a pair of one, unless it or its baseline (`baseline_row`,
    the no-SD cell its speedup divides by) was contended: a slowed baseline inflates the speedup as much as a
    slowed SD cell deflates it. The quiet pairs decide when
    - at least MIN_PAIRS of them lie all above (or all below) 1.00x, or
    - the 95% interval that `noise` (the machine's A/A noise, `bench.noise`) puts around their mean clears
      1.00x.
    Otherwise "unsure", saying what was measured and how many more repeats would decide (`_undecided`). The
    figure is the quiet pairs' median."""
    sp = row.get("speedup")
    if sp is None:
        return "unsure", None, "no speedup"
    pairs = row.get("speedup_runs")
    if not pairs:
        for what, r in (("", row), ("its no-SD baseline ", baseline_row)):
            if r is not None and contended(r):
                host = r.get("host") or {}
                return (
                    "unsure",
                    sp,
                    (
                        f"one run, {what}measured while other processes competed for the CPUs (load average "
                        f"{host.get('loadavg_1m')} on {host.get('cpus')} CPUs, CPU pressure {row_pressure(r)})"
                    ),
                )
        return _decide([float(sp)], 1, "one run", noise)
    quiet = [p["speedup"] for p in pairs if not p.get("contended")]
    if not quiet:
        return (
            "unsure",
            sp,
            (f"all {len(pairs)} matched pair(s) ran while other processes competed for the CPUs"),
        )
    n = f"{len(quiet)} quiet matched pair(s)" + (f" of {len(pairs)}" if len(quiet) < len(pairs) else "")
    return _decide(quiet, len(pairs), n, noise)


MIN_PAIRS = 3  # quiet matched pairs that decide without a noise measurement, when all on one side of 1.00x


def _decide(
    ratios: list[float], total: int, what: str, noise: dict[str, Any] | None
) -> tuple[str, float, str]:
    """The verdict of quiet pair ratios (`total`: the row's pairs, quiet or not; `what`: how to name them)."""
    lo, hi, med = min(ratios), max(ratios), statistics.median(ratios)
    figs = f"{med:.2f}x" if len(ratios) == 1 else f"{lo:.2f}x-{hi:.2f}x"
    side = "faster" if lo > 1.0 else "slower" if hi < 1.0 else None
    if side is not None and len(ratios) >= MIN_PAIRS:
        return side, med, f"{what}: {figs}, all {'above' if side == 'faster' else 'below'} 1.00x"
    interval = None
    if noise is not None:
        ilo, ihi = speedup_interval(ratios, noise)
        interval = f"95% interval {ilo:.2f}x-{ihi:.2f}x from this machine's A/A noise"
        if ilo > 1.0 or ihi < 1.0:
            return ("faster" if ilo > 1.0 else "slower"), med, f"{what}: {figs}; {interval}"
    return "unsure", med, _undecided(ratios, total, what, figs, side, noise, interval)


def _undecided(
    ratios: list[float], total: int, what: str, figs: str, side: str | None, noise: dict[str, Any] | None,
    interval: str | None,
) -> str:  # fmt: skip
    """Why pairs cannot tell, and what would decide: the fewest further repeats that would (if they measure
    what these did) give MIN_PAIRS pairs on one side of 1.00x or an A/A interval that clears it."""
    n = len(ratios)
    why = f"{what}: {figs}" + (" straddles 1.00x" if side is None and n > 1 else "")
    if interval:
        why += f"; {interval}"
    more = [MIN_PAIRS - n] if side is not None else []
    need = repeats_to_decide(ratios, noise) if noise is not None else None
    if need is not None:
        more.append(need - n)
    if more:
        k = min(more)
        plural = "s" if k > 1 else ""
        return why + f"; {k} more repeat{plural} would decide if they measure the same (repeats {total + k})"
    if noise is None:
        return why + (
            f"; without {MIN_PAIRS} quiet pairs all on one side, only an interval from this machine's A/A "
            "noise (RUN/noise.json) could decide"
        )
    return why + f"; a difference this small is below what {MAX_REPEATS_SAID} repeats on this machine resolve"


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """Distribution-free interval for the median of paired ratios (the sign test's): the j-th smallest and
    j-th largest value, j the largest with P(Binomial(n, 1/2) < j) <= (1 - level) / 2, and the interval's
    exact coverage. No resampling, so no seed: rounds of a machine this noisy are not normal, and their
    median is what the tables report. None where n is too small for any interval of that level (n < 6 at
    0.95: even min-max covers only 1 - 2 / 2^n)."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return None
    tail = 0.0  # P(Binomial(n, 1/2) <= j - 1), grown while it stays within the level's tail
    j = 0
    while j < n // 2:
        nxt = tail + math.comb(n, j) / 2.0**n
        if nxt > (1.0 - level) / 2.0:
            break
        tail, j = nxt, j + 1
    if j == 0:
        return None
    return xs[j - 1], xs[n - j], 1.0 - 2.0 * tail


def interval_verdict(iv: tuple[float, float, float] | None, n: int) -> str:
    """'ahead' / 'behind' where the whole interval lies above / below 1, else 'level'; 'too few rounds'
    where no interval exists."""
    if iv is None:
        return f"too few rounds ({n})"
    lo, hi, _ = iv
    return "ahead" if lo > 1.0 else "behind" if hi < 1.0 else "level"
