"""This machine's own speed noise (an A/A control), and the interval it puts around a measured speedup.

A probe runs one fixed piece of work over and over: the matrix-vector products of a decode step shaped like
SmolLM2-135M's (q/k/v/o and the gated MLP of `layers` decoder layers, fp32, `batch` rows), repeated to about
`unit_s` seconds per unit (calibrated once, then fixed). Every unit does the same work, so the ratio of two
back-to-back units (an A/A pair) is pure machine noise: what a matched pair of an SD cell and its no-SD
cell, measured one after the other, carries even when SD changes nothing.

`measure_noise` takes a few seconds (the demo runs it once per run and keeps it as RUN/noise.json;
`benchmarks/host_noise.py` is the longer stand-alone tool over the same probe). `speedup_interval` turns it
into a 95% interval for the speedup of n matched pairs; `repeats_to_decide` says how many pairs would make
that interval clear 1.00x if the pairs go on measuring what they measured so far.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

from speclab.atomic import atomic_write_text

NOISE_JSON = "noise.json"
LEVEL = 0.95
# SmolLM2-135M's decoder: hidden 576, 9 query heads and 3 KV heads of 64, MLP 1536, 30 layers
HIDDEN, KV, MLP, LAYERS = 576, 192, 1536, 30
# two-sided 95% quantiles of Student's t by degrees of freedom; a df between two entries takes the smaller
# df's (wider) value, and beyond the last the normal 1.96
_T95 = ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (6, 2.447), (7, 2.365), (8, 2.306),
        (9, 2.262), (10, 2.228), (12, 2.179), (15, 2.131), (20, 2.086), (30, 2.042), (60, 2.000))  # fmt: skip
MAX_REPEATS_SAID = 50  # beyond this many pairs, say the difference is below what the machine resolves


def t95(df: int) -> float:
    """Two-sided 95% quantile of Student's t with `df` degrees of freedom (conservative between entries)."""
    if df < 1:
        return math.inf
    if df >= 120:
        return 1.96
    return [t for d, t in _T95 if d <= df][-1]


def decode_weights(seed: int, layers: int = LAYERS) -> list[list[Any]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    shapes = [(HIDDEN, HIDDEN), (HIDDEN, KV), (HIDDEN, KV), (HIDDEN, HIDDEN), (HIDDEN, MLP), (HIDDEN, MLP)]
    shapes.append((MLP, HIDDEN))
    return [[torch.randn(s, generator=g) / 24 for s in shapes] for _ in range(layers)]


def one_step(x: Any, layers: list[list[Any]]) -> Any:
    import torch

    for q, k, v, o, gate, up, down in layers:
        h = x @ q + (x @ k).sum() * 0 + (x @ v).sum() * 0  # k and v are read, as a decode step reads them
        x = x + h @ o
        x = x + (torch.nn.functional.silu(x @ gate) * (x @ up)) @ down
        x = x / (x.norm(dim=-1, keepdim=True) + 1e-6)
    return x


def unit(x: Any, layers: list[list[Any]], steps: int) -> tuple[float, float]:
    """(wall, CPU) seconds of `steps` decode steps."""
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        x = one_step(x, layers)
    return time.perf_counter() - w0, time.process_time() - c0


def time_units(
    units: int, unit_s: float, threads: int | None, batch: int, layers: int, seed: int
) -> tuple[list[tuple[float, float]], int]:
    """Calibrate the probe to about `unit_s` per unit and time `units` units: ([(wall, cpu)], steps)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads or os.cpu_count() or 1)
    try:
        weights = decode_weights(seed, layers)
        x = torch.randn(batch, HIDDEN, generator=torch.Generator().manual_seed(seed))
        unit(x, weights, 3)  # first touches of the weights
        w, _ = unit(x, weights, 10)
        steps = max(1, round(unit_s / max(w / 10, 1e-9)))
        return [unit(x, weights, steps) for _ in range(units)], steps
    finally:
        torch.set_num_threads(old)


def aa_summary(wall: list[float]) -> dict[str, Any]:
    """A/A ratios of back-to-back units (unit 2i+1 over unit 2i) and their log spread: the root mean square
    of log ratio (an A/A ratio's true value is 1, so a drift within pairs counts as noise too)."""
    ratios = [wall[i + 1] / wall[i] for i in range(0, len(wall) - 1, 2)]
    logs = [math.log(r) for r in ratios]
    sd = math.sqrt(sum(v * v for v in logs) / len(logs)) if logs else None
    return {"pairs": len(ratios), "ratios": ratios, "sd_log": sd}


def noise_record(
    wall: list[float], steps: int, threads: int | None, batch: int, layers: int, load: tuple[float, float]
) -> dict[str, Any]:
    """The noise record (RUN/noise.json) of timed probe units (`load`: 1-minute load average before, after)."""
    med = statistics.median(wall)
    return {
        "probe": f"decode-shaped matrix products, {layers} layers of SmolLM2-135M's shapes, batch {batch}",
        "units": len(wall),
        "unit_s": med,
        "steps_per_unit": steps,
        "threads": threads or os.cpu_count(),
        "unit_sd_over_median": statistics.pstdev(wall) / med,
        **aa_summary(wall),
        "loadavg_1m": list(load),
        "cpus": os.cpu_count(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def measure_noise(
    units: int = 24, unit_s: float = 0.3, threads: int | None = None, batch: int = 4, layers: int = 8,
    seed: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """Run the A/A probe (about units x unit_s seconds) and return the noise record kept as RUN/noise.json."""
    if units < 4:
        raise ValueError("the noise probe needs at least 4 units (2 back-to-back pairs)")
    load0 = os.getloadavg()[0]
    times, steps = time_units(units, unit_s, threads, batch, layers, seed)
    return noise_record([w for w, _ in times], steps, threads, batch, layers, (load0, os.getloadavg()[0]))


def save_noise(run_dir: str | Path, noise: dict[str, Any]) -> Path:
    path = Path(run_dir) / NOISE_JSON
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(noise, indent=1) + "\n")
    return path


def load_noise(run_dir: str | Path | None) -> dict[str, Any] | None:
    """RUN/noise.json, or None where the run has none (or it cannot be read: verdicts then use pairs only)."""
    if run_dir is None:
        return None
    try:
        noise = json.loads((Path(run_dir) / NOISE_JSON).read_text())
    except (OSError, ValueError):
        return None
    ok = (
        isinstance(noise, dict)
        and isinstance(noise.get("sd_log"), int | float)
        and noise.get("pairs", 0) >= 2
    )
    return noise if ok else None


def pair_halfwidth(noise: dict[str, Any]) -> float:
    """Half-width (in log) of the 95% interval of one matched pair's ratio under this noise."""
    return t95(int(noise["pairs"])) * float(noise["sd_log"])


def describe(noise: dict[str, Any]) -> str:
    """One line for the report and `bench show`."""
    pct = 100 * (math.exp(pair_halfwidth(noise)) - 1)
    return (
        f"this machine's A/A noise: +-{pct:.1f}% on one matched pair (95%; sd of log ratio "
        f"{noise['sd_log']:.3f} over {noise['pairs']} back-to-back pairs of a "
        f"{noise.get('unit_s', 0):.2f} s probe unit, measured {noise.get('measured_at', '?')})"
    )


def _spread(logs: list[float], noise: dict[str, Any]) -> float:
    """The per-pair log spread used: the machine's A/A noise, or the pairs' own spread where that is wider."""
    own = statistics.stdev(logs) if len(logs) >= 2 else 0.0
    return max(float(noise["sd_log"]), own)


def speedup_interval(ratios: list[float], noise: dict[str, Any]) -> tuple[float, float]:
    """95% interval of the speedup that n matched pairs measured: exp(mean log ratio +- t * s / sqrt(n)), s
    the A/A noise's sd (or the pairs' own, where wider), t Student's with the A/A pairs' count as df."""
    logs = [math.log(r) for r in ratios]
    m = statistics.fmean(logs)
    half = t95(int(noise["pairs"])) * _spread(logs, noise) / math.sqrt(len(logs))
    return math.exp(m - half), math.exp(m + half)


def repeats_to_decide(ratios: list[float], noise: dict[str, Any]) -> int | None:
    """How many matched pairs in all would make the interval clear 1.00x if further pairs measure what these
    did (None: more than MAX_REPEATS_SAID, or no difference at all)."""
    logs = [math.log(r) for r in ratios]
    m = statistics.fmean(logs)
    if m == 0:
        return None
    # the interval clears 1.00x once t * s / sqrt(n) < |m|, i.e. n > (t * s / m)^2
    need = max(math.floor((t95(int(noise["pairs"])) * _spread(logs, noise) / abs(m)) ** 2) + 1, len(logs) + 1)
    return need if need <= MAX_REPEATS_SAID else None
