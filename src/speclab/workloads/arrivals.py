"""A request log's arrival pattern, for `speclab workloads inspect`: the rate over time (requests per bin),
the gaps' coefficient of variation (1 = Poisson, above 1 = bursty, 0 = evenly spaced) and the peak-to-mean
rate ratio. Server mode replays the times themselves (`--arrivals logged[:SPEED]`, speclab.server.arrivals).
"""

from __future__ import annotations

import math
from typing import Any


def pattern(arrival_s: list[float], bins: int = 12) -> dict[str, Any] | None:
    """Rate over time and burstiness of an arrival sequence (seconds; any order). None below 2 arrivals."""
    ts = sorted(float(t) for t in arrival_s)
    if len(ts) < 2:
        return None
    span = ts[-1] - ts[0]
    gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
    mean_gap = sum(gaps) / len(gaps)
    cv = None
    if mean_gap > 0:
        var = sum((g - mean_gap) ** 2 for g in gaps) / len(gaps)
        cv = math.sqrt(var) / mean_gap
    out: dict[str, Any] = {
        "n": len(ts),
        "span_s": span,
        "rate_per_s": (len(ts) - 1) / span if span > 0 else None,
        "gap_cv": cv,
        "simultaneous": sum(1 for g in gaps if g == 0),
    }
    if span > 0:
        width = span / bins
        counts = [0] * bins
        for t in ts:
            counts[min(int((t - ts[0]) / width), bins - 1)] += 1
        out["bin_s"] = width
        out["per_bin"] = counts
        mean = len(ts) / bins
        out["peak_to_mean"] = max(counts) / mean
    return out


def burstiness_word(cv: float | None) -> str:
    if cv is None:
        return "all at once"
    if cv > 1.3:
        return "bursty"
    if cv < 0.7:
        return "regular"
    return "Poisson-like"


def pattern_lines(p: dict[str, Any] | None) -> list[str]:
    """Text lines for `workloads inspect`."""
    if not p:
        return []
    rate = f", {p['rate_per_s']:.3g} req/s mean" if p.get("rate_per_s") else ""
    cv = p.get("gap_cv")
    lines = [
        f"arrival pattern: {p['n']} requests over {p['span_s']:.1f} s{rate}; gaps CV "
        + ("-" if cv is None else f"{cv:.2f}")
        + f" ({burstiness_word(cv)}; 1 = Poisson)"
        + (f", {p['simultaneous']} at the same instant as the previous" if p.get("simultaneous") else "")
    ]
    if p.get("per_bin"):
        peak = max(p["per_bin"]) or 1
        bars = "".join(" ▁▂▃▄▅▆▇█"[min(8, math.ceil(8 * c / peak))] for c in p["per_bin"])
        lines.append(
            f"  rate over time ({p['bin_s']:.3g} s bins): |{bars}| "
            + " ".join(str(c) for c in p["per_bin"])
            + f"; peak/mean {p['peak_to_mean']:.2f}"
        )
    lines.append("  replay it in server mode: speclab bench SWEEP --server --arrivals logged[:SPEED]")
    return lines
