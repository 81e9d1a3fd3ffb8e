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

from typing import Any

from speclab.bench.server_spec import Arrivals, parse_arrivals
from speclab.errors import ConfigError

__all__ = ["Arrivals", "logged_requests", "parse_arrivals", "schedule"]


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


def logged_requests(
    prompts: list[Any],
    arrivals: dict[str, float],
    logged: dict[str, dict[str, Any]],
    speed: float,
    max_model_len: int,
    where: str = "",
) -> tuple[list[int], list[float], list[int | None]]:
    """A logged replay of `prompts` (PromptSpecs in log order): the send order (indices), each sent request's
    offset from the load's start (s) and its own logged max_tokens (None where the log gave none; cut to the
    model length left after its prompt)."""
    order, offsets = schedule([arrivals.get(p.id) for p in prompts], speed, where)
    own: list[int | None] = []
    for i in order:
        p = prompts[i]
        mt = (logged.get(p.id) or {}).get("max_tokens")
        own.append(None if mt is None else max(1, min(int(mt), max_model_len - len(p.prompt_token_ids))))
    return order, offsets, own


def logged_schedule(
    arrivals: str | None, specs: list[Any], prompt_set: Any, max_model_len: int, where: str = ""
) -> tuple[list[int], list[float], list[int | None]] | None:
    """`logged_requests` for a load's prompts (bench.preflight.PromptSet's arrival times and logged settings),
    or None when the load is not a logged replay (`arrivals` None or "rate")."""
    a = parse_arrivals(arrivals)
    if not a.logged:
        return None
    return logged_requests(
        specs,
        getattr(prompt_set, "arrivals", {}) or {},
        getattr(prompt_set, "logged", {}) or {},
        a.speed,
        max_model_len,
        where,
    )


def apply_arrivals(spec: Any, text: str) -> None:
    """`--arrivals logged[:SPEED]`: the sweep's server loads become the one logged replay (a [server] table
    is created where the sweep has none)."""
    from speclab.bench.server_spec import ServerSpec

    a = parse_arrivals(text)
    if spec.server is None:
        spec.server = ServerSpec()
    if a.logged:
        spec.server.arrivals = a.label()
        spec.server.request_rates = []
        spec.server.concurrency = []
    else:
        spec.server.arrivals = None
