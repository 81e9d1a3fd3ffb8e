"""Arrival processes for a server load: vLLM's seeded Poisson/gamma arrivals at a rate, or a request log's own
arrival times replayed (`--arrivals logged[:SPEED]`).

A logged replay sends request i at (arrival_s[i] - arrival_s[first]) / SPEED seconds after the load starts,
in arrival order, each with its own logged max_tokens. The schedule is carried per request in the prompts file
(`"arrival_s"`, already scaled); the load generator (speclab.server.loadgen) hands it to `vllm bench serve`'s
own self-timed scheduler (`get_request(..., self_timed=True)`: it sleeps until each request's offset from the
start and sends it; one coroutine per request, so a slow response never delays the next send).

speclab.workloads.arrivals describes a log's arrival pattern (`speclab workloads inspect`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from speclab.errors import ConfigError


@dataclass(frozen=True)
class Arrivals:
    """How a load's requests arrive: "rate" (vLLM's Poisson/gamma process at the cell's rate or concurrency)
    or "logged" (the log's own times divided by `speed`)."""

    mode: str = "rate"
    speed: float = 1.0

    @property
    def logged(self) -> bool:
        return self.mode == "logged"

    def label(self) -> str:
        return "logged" if self.speed == 1.0 else f"logged:{self.speed:g}"


def parse_arrivals(text: str | None) -> Arrivals:
    """`rate` (default) or `logged[:SPEED]` (SPEED > 0; 2 = twice as fast as logged)."""
    if text is None or text.strip() in ("", "rate", "poisson"):
        return Arrivals()
    head, _, tail = text.strip().partition(":")
    if head != "logged":
        raise ConfigError(f"arrivals {text!r}: expected 'rate' or 'logged[:SPEED]'")
    if not tail:
        return Arrivals("logged", 1.0)
    try:
        speed = float(tail)
    except ValueError:
        raise ConfigError(f"arrivals {text!r}: SPEED must be a number") from None
    if not math.isfinite(speed) or speed <= 0:
        raise ConfigError(f"arrivals {text!r}: SPEED must be > 0")
    return Arrivals("logged", speed)


def schedule(
    arrival_s: list[float | None], speed: float = 1.0, where: str = ""
) -> tuple[list[int], list[float]]:
    """The send order (indices sorted by logged arrival, ties in log order) and each sent request's offset in
    seconds from the first arrival, divided by `speed`. Every request needs an arrival time."""
    missing = [i for i, a in enumerate(arrival_s) if a is None]
    if missing:
        raise ConfigError(
            f"{where or 'workload'}: --arrivals logged needs an arrival time on every request; "
            f"{len(missing)} of {len(arrival_s)} have none (first: request {missing[0]})"
        )
    if speed <= 0:
        raise ConfigError(f"arrival speed must be > 0, got {speed}")
    order = sorted(range(len(arrival_s)), key=lambda i: (arrival_s[i], i))
    if not order:
        return [], []
    t0 = float(arrival_s[order[0]])  # type: ignore[arg-type]
    return order, [(float(arrival_s[i]) - t0) / speed for i in order]  # type: ignore[arg-type]
