"""A request's own sampling settings (temperature, top-p, top-k, seed, max_tokens), as the engine protocol
carries them on a prompt (`protocol.PromptSpec.sampling`), checked in one place."""

from __future__ import annotations

from typing import Any

from speclab.errors import ConfigError


def _err(where: str, msg: str) -> ConfigError:
    return ConfigError(f"{where}: {msg}")


#: the per-request sampling fields a PromptSpec may carry (all optional; absent = greedy, the cell's max_tokens)
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "max_tokens")


def check_sampling(d: Any, where: str) -> dict[str, Any] | None:
    """A request's sampling settings, checked: temperature >= 0, 0 < top_p <= 1, top_k >= 0 (0: off),
    seed an int or null, max_tokens >= 1 or null. None (or {}) means greedy with the cell's max_tokens."""
    if d is None:
        return None
    if not isinstance(d, dict):
        raise _err(where, "field sampling: expected an object")
    unknown = sorted(set(d) - set(SAMPLING_FIELDS))
    if unknown:
        raise _err(where, f"field sampling: unknown field(s) {', '.join(unknown)}")
    out: dict[str, Any] = {}
    t = d.get("temperature")
    if t is not None:
        if isinstance(t, bool) or not isinstance(t, int | float) or not t >= 0:
            raise _err(where, f"field sampling.temperature: must be a number >= 0, got {t!r}")
        out["temperature"] = float(t)
    tp = d.get("top_p")
    if tp is not None:
        if isinstance(tp, bool) or not isinstance(tp, int | float) or not 0 < tp <= 1:
            raise _err(where, f"field sampling.top_p: must be in (0, 1], got {tp!r}")
        out["top_p"] = float(tp)
    for name, low in (("top_k", 0), ("seed", 0), ("max_tokens", 1)):
        v = d.get(name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise _err(where, f"field sampling.{name}: must be an int >= {low}, got {v!r}")
        out[name] = int(v)
    return out or None
