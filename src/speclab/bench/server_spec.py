"""The sweep's `[server]` table: the loads a server-mode bench drives each engine configuration at.

    [server]
    request_rates = [0.5, 2.0]   # open loop: Poisson arrivals at R requests/s (vllm bench serve --request-rate)
    concurrency = [1, 4]         # closed loop: all requests queued at once, at most N in flight (--max-concurrency)
    num_prompts = 16             # requests per cell (default: the sweep's num_prompts)
    slo = { ttft_ms = 2000, tpot_ms = 150 }   # goodput: requests/s meeting every bound (also e2el_ms)
    ignore_eos = false           # as the offline bench: EOS ends a request (true: every request runs max_tokens)
    burstiness = 1.0             # 1 = Poisson; other values: gamma-distributed gaps (vLLM's --burstiness)
    arrivals = "logged:2"        # one more load: the request log's own arrival times, twice as fast
    startup_timeout_s = 900      # a server not healthy by then fails its cells
    cell_timeout_s = 900         # the load generator is stopped after this long; the cell fails

Parsed without loading anything; bad input is one ConfigError line.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from speclab.errors import ConfigError
from speclab.validation import unknown_fields

SERVER_KEYS = {
    "request_rates",
    "concurrency",
    "num_prompts",
    "slo",
    "ignore_eos",
    "burstiness",
    "arrivals",
    "startup_timeout_s",
    "cell_timeout_s",
}
# SLO keys in the sweep -> vllm bench serve's --goodput metric names
SLO_KEYS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "e2el_ms": "e2el"}


@dataclass
class ServerSpec:
    request_rates: list[float] = field(default_factory=list)
    concurrency: list[int] = field(default_factory=list)
    num_prompts: int | None = None  # None: the sweep's num_prompts
    slo: dict[str, float] = field(default_factory=dict)  # keys of SLO_KEYS, milliseconds
    ignore_eos: bool = False
    burstiness: float = 1.0
    arrivals: str | None = None  # "logged[:SPEED]": a load replaying the log's arrival times
    startup_timeout_s: float = 900.0
    cell_timeout_s: float = 900.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def goodput_args(self) -> list[str]:
        """`--goodput ttft:2000 tpot:150` values for vllm bench serve (empty without an SLO)."""
        return [f"{SLO_KEYS[k]}:{v:g}" for k, v in sorted(self.slo.items())]


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


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise ConfigError(f"{where}: expected a finite number > 0, got {v!r}")
    return float(v)


def _pos_int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{where}: expected an integer >= 1, got {v!r}")
    return v


def parse_server(d: Any, src: str) -> ServerSpec:
    where = f"{src}: server"
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected a table ([server])")
    unknown_fields(d, sorted(SERVER_KEYS), where)
    rates_raw = d.get("request_rates", [])
    conc_raw = d.get("concurrency", [])
    if not isinstance(rates_raw, list):
        rates_raw = [rates_raw]
    if not isinstance(conc_raw, list):
        conc_raw = [conc_raw]
    arrivals = d.get("arrivals")
    if arrivals is not None:
        if not isinstance(arrivals, str):
            raise ConfigError(f'{where}.arrivals: expected a string such as "logged" or "logged:2"')
        arrivals = parse_arrivals(arrivals).label() if parse_arrivals(arrivals).logged else None
    rates = sorted(_number(r, f"{where}.request_rates") for r in rates_raw)
    conc = sorted(_pos_int(c, f"{where}.concurrency") for c in conc_raw)
    if not rates and not conc and arrivals is None:
        raise ConfigError(f"{where}: give request_rates, concurrency and/or arrivals (at least one load)")
    if len(set(rates)) != len(rates):
        raise ConfigError(f"{where}.request_rates: duplicate rates in {rates}")
    if len(set(conc)) != len(conc):
        raise ConfigError(f"{where}.concurrency: duplicate levels in {conc}")
    n = d.get("num_prompts")
    n = None if n is None else _pos_int(n, f"{where}.num_prompts")
    slo_raw = d.get("slo", {})
    if not isinstance(slo_raw, dict):
        raise ConfigError(f"{where}.slo: expected a table, e.g. {{ ttft_ms = 2000, tpot_ms = 150 }}")
    bad = sorted(set(slo_raw) - set(SLO_KEYS))
    if bad:
        raise ConfigError(f"{where}.slo: unknown key(s) {', '.join(bad)} (known: {', '.join(SLO_KEYS)})")
    slo = {k: _number(v, f"{where}.slo.{k}") for k, v in slo_raw.items()}
    ignore_eos = d.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise ConfigError(f"{where}.ignore_eos: expected true or false, got {ignore_eos!r}")
    return ServerSpec(
        request_rates=rates,
        concurrency=conc,
        num_prompts=n,
        slo=slo,
        ignore_eos=ignore_eos,
        arrivals=arrivals,
        burstiness=_number(d.get("burstiness", 1.0), f"{where}.burstiness"),
        startup_timeout_s=_number(d.get("startup_timeout_s", 900.0), f"{where}.startup_timeout_s"),
        cell_timeout_s=_number(d.get("cell_timeout_s", 900.0), f"{where}.cell_timeout_s"),
    )
