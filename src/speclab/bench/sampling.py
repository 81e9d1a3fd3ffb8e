"""Sampling as a cell axis of the bench: the sweep keys, each cell's setting and each request's settings.

Sweep keys (all optional; the defaults are greedy decoding, so a sweep without them runs as it always did):

    temperatures = [0, 0.7, 1.0]     # each temperature is its own cell (default [0])
    top_p = 1.0                      # in (0, 1] (default 1: off)
    top_k = 0                        # >= 0 (default 0: off)
    sampling = "fixed"               # or "as-logged": each request of a request-log workload runs with its
                                     # own logged temperature, top_p, top_k and max_tokens

Every sampled request draws with its own seed, a stable hash of (sweep seed, prompt id): an SD cell and its
no-SD baseline give each prompt the same seed, and a rerun draws the same. Under replicate batching copy c of
a request draws with seed + c (the worker adds it).

A greedy cell (fixed, T = 0, top_p 1, top_k 0) adds nothing to its cell id, so runs made before sampling was
an axis keep their ids and resume; any other setting is hashed into the id (and into the baseline key, so an
SD cell is compared with the no-SD cell at the same setting only).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from speclab.engine.protocol import PromptSpec
from speclab.errors import ConfigError
from speclab.validation import number

SAMPLING_MODES = ("fixed", "as-logged")
SAMPLING_KEYS = ("temperatures", "top_p", "top_k", "sampling")
MAX_TEMPERATURE = 100.0
MAX_TOP_K = 1 << 20
# request seeds stay below 2**31 with room for the copies of a replicated request (seed + copy)
_SEED_SPAN = (1 << 31) - (1 << 16)
# what a request without its own value gets under "as-logged" (the OpenAI API's defaults)
LOGGED_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
LOGGED_FIELDS = ("temperature", "top_p", "top_k", "max_tokens")


@dataclass(frozen=True)
class Setting:
    """One cell's sampling setting. temperature is None for "as-logged" (each request has its own)."""

    sampling: str = "fixed"
    temperature: float | None = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.sampling == "fixed" and not self.temperature

    @property
    def is_default(self) -> bool:
        """The setting every cell had before sampling was an axis (nothing added to cell ids)."""
        return self == Setting()

    def key(self) -> dict[str, Any]:
        """What a cell id hashes for this setting (only where it is not the default)."""
        return {
            "sampling": self.sampling,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
        }

    def tag(self) -> str:
        """The readable part of a sampled cell's id: "" (greedy), "t0.7", "logged"."""
        if self.is_default:
            return ""
        if self.sampling == "as-logged":
            return "logged"
        return f"t{self.temperature:g}"

    def row_fields(self) -> dict[str, Any]:
        return {
            "sampling": self.sampling,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "requests_own_settings": None,
        }


def _temperature(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(f"{where}: expected a number >= 0, got {v!r}")
    return number(v, where, 0.0, MAX_TEMPERATURE)


def parse_sampling(
    data: dict[str, Any], src: str, workloads: list[str], file_workloads: set[str]
) -> dict[str, Any]:
    """The sweep's sampling keys, checked (one ConfigError line naming the key). `file_workloads`: those of
    the sweep's workloads read from a file (the only ones "as-logged" can run on)."""
    mode = data.get("sampling", "fixed")
    if mode not in SAMPLING_MODES:
        raise ConfigError(f"{src}: field sampling: {mode!r} not one of {', '.join(SAMPLING_MODES)}")
    raw = data.get("temperatures", [0.0])
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{src}: field temperatures: expected a list of numbers >= 0, e.g. [0, 0.7]")
    temps = [_temperature(t, f"{src}: field temperatures") for t in raw]
    if len(set(temps)) != len(temps):
        raise ConfigError(f"{src}: field temperatures: each temperature once, got {raw!r}")
    top_p = data.get("top_p", 1.0)
    if isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0 < top_p <= 1:
        raise ConfigError(f"{src}: field top_p: must be a number in (0, 1], got {top_p!r}")
    top_k = data.get("top_k", 0)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 <= top_k <= MAX_TOP_K:
        raise ConfigError(f"{src}: field top_k: must be an integer >= 0 (0: off), got {top_k!r}")
    if mode == "as-logged":
        if "temperatures" in data or "top_p" in data or "top_k" in data:
            raise ConfigError(
                f'{src}: field sampling: "as-logged" takes each request\'s own settings; '
                "give no temperatures, top_p or top_k with it"
            )
        others = [w for w in workloads if w not in file_workloads]
        if others:
            raise ConfigError(
                f'{src}: field sampling: "as-logged" needs request-log workloads (file:PATH or a '
                f"[workloads.NAME] table with a path); not a file: {', '.join(others)}"
            )
    return {"temperatures": temps, "top_p": float(top_p), "top_k": int(top_k), "sampling": mode}


def sweep_settings(spec: Any) -> list[Setting]:
    """The sampling settings a sweep's cells run at, in sweep order."""
    if spec.sampling == "as-logged":
        return [Setting(sampling="as-logged", temperature=None, top_p=1.0, top_k=0)]
    # at T = 0 top_p and top_k change nothing (greedy): such a cell is the greedy cell, whatever they say
    return [
        Setting("fixed", float(t), float(spec.top_p), int(spec.top_k)) if t else Setting()
        for t in spec.temperatures
    ]


def request_seed(sweep_seed: int, prompt_id: str) -> int:
    """A request's sampling seed: a stable hash of (sweep seed, prompt id), the same on every machine."""
    h = hashlib.sha256(f"{int(sweep_seed)}:{prompt_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") % _SEED_SPAN


def logged_settings(meta: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields a request log gave for one request (from Prompt.meta; empty if none)."""
    return {k: meta[k] for k in LOGGED_FIELDS if meta.get(k) is not None}


def request_sampling(
    setting: Setting,
    sweep_seed: int,
    prompt_id: str,
    logged: dict[str, Any] | None = None,
    max_tokens_cap: int | None = None,
) -> tuple[dict[str, Any] | None, bool]:
    """PromptSpec.sampling for one request of a cell, and whether it runs with its own logged settings.
    Greedy cells: (None, False), exactly the request greedy cells always sent. "as-logged": the request's
    logged temperature / top_p / top_k / max_tokens, the API defaults where it gave none (then it does not
    count as running with its own settings), max_tokens cut to `max_tokens_cap` (the model length left)."""
    if setting.greedy:
        return None, False
    seed = request_seed(sweep_seed, prompt_id)
    if setting.sampling == "fixed":
        out = {
            "temperature": setting.temperature,
            "top_p": setting.top_p,
            "top_k": setting.top_k,
            "seed": seed,
        }
        return out, False
    own = dict(logged or {})
    out = {k: own.get(k, v) for k, v in LOGGED_DEFAULTS.items()}
    out = {"temperature": float(out["temperature"]), "top_p": float(out["top_p"]), "top_k": int(out["top_k"])}
    out["seed"] = seed
    ran_own = bool(own)
    if "max_tokens" in own:
        mt = int(own["max_tokens"])
        if max_tokens_cap is not None and mt > max_tokens_cap:
            mt, ran_own = max(1, max_tokens_cap), False
        out["max_tokens"] = mt
    return out, ran_own


def is_sampled_row(r: dict[str, Any]) -> bool:
    """Whether a results row decoded by sampling (token-exactness against no SD does not apply). Rows written
    before sampling was an axis have none of the fields: greedy."""
    return r.get("sampling") == "as-logged" or bool(r.get("temperature") or 0.0)


def row_setting(r: dict[str, Any]) -> tuple[Any, ...]:
    """A row's sampling setting, for matching an SD row with its no-SD row (absent fields: greedy)."""
    mode = r.get("sampling") or "fixed"
    temp = r.get("temperature")
    top_p = r.get("top_p")
    top_k = r.get("top_k")
    return (
        mode,
        None if mode == "as-logged" else float(temp or 0.0),
        1.0 if top_p is None else float(top_p),
        0 if top_k is None else int(top_k),
    )


def cell_prompts(
    setting: Setting, sweep_seed: int, prompt_set: Any, max_model_len: int
) -> tuple[list[PromptSpec], set[str]]:
    """A cell's requests: the workload's rendered prompts (bench.preflight.PromptSet) with the cell's sampling
    on each, and the ids of those that run with their own logged settings ("as-logged" only). A greedy cell
    gets the prompts unchanged."""
    if setting.greedy:
        return list(prompt_set.prompts), set()
    logged = getattr(prompt_set, "logged", {}) or {}
    out, own = [], set()
    for p in prompt_set.prompts:
        cap = max_model_len - len(p.prompt_token_ids)
        s, ran_own = request_sampling(setting, sweep_seed, p.id, logged.get(p.id), cap)
        out.append(PromptSpec(id=p.id, prompt_token_ids=p.prompt_token_ids, sampling=s))
        if ran_own:
            own.add(p.id)
    return out, own


def setting_text(r: dict[str, Any]) -> str:
    """A row's setting for tables: "0", "0.7", "0.7 top-p 0.9 top-k 50", or "as logged"."""
    mode, temp, top_p, top_k = row_setting(r)
    if mode == "as-logged":
        return "as logged"
    text = f"{temp:g}"
    if temp and top_p < 1.0:
        text += f" top-p {top_p:g}"
    if temp and top_k > 0:
        text += f" top-k {top_k}"
    return text


def has_sampled(rows: list[dict[str, Any]]) -> bool:
    """Whether a run has cells at any setting other than greedy (tables then name each row's setting)."""
    return any(row_setting(r) != ("fixed", 0.0, 1.0, 0) for r in rows)
