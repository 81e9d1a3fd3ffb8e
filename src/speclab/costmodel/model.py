"""Cost models: how long one engine step takes, as a function of what the batch does in that step.

The form is the study's linear model (arXiv 2601.11580):
- target forward (prefill, decode or verify) = kv * kv_tokens + batched * batched_tokens + const
- drafting, per method, in one of three forms (see DraftCost)
- a fixed overhead per engine step, and an optional overhead for a step in which some request switches method.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from speclab.errors import ConfigError

DRAFT_FORMS = ("linear", "chained", "verify_fraction")


@dataclass(frozen=True)
class TargetCost:
    kv: float
    batched: float
    const: float

    def time(self, kv_tokens: Any, batched_tokens: Any) -> Any:
        return self.kv * kv_tokens + self.batched * batched_tokens + self.const

    def toml_lines(self) -> list[str]:
        return [f"kv = {_f(self.kv)}", f"batched = {_f(self.batched)}", f"const = {_f(self.const)}"]


@dataclass(frozen=True)
class DraftCost:
    """Drafting cost of one proposer for one engine step.

    form "linear" (the study's EAGLE): each request that runs the proposer costs
        kv * batch_kv_tokens + num_spec * its_draft_tokens + const, and the step pays the maximum over requests
        (charged even when a request drafts 0 tokens: the proposer still runs).
    form "chained" (k autoregressive head passes): passes = the most drafts any request asks for; the step pays
        passes * (kv * batch_kv_tokens + const) + num_spec * total_draft_tokens. 0 drafts = 0 cost.
    form "verify_fraction" (the study's n-gram): fraction * this step's verify time, if any request drafts >= 1.
    """

    form: str
    kv: float = 0.0
    num_spec: float = 0.0
    const: float = 0.0
    fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.form not in DRAFT_FORMS:
            raise ConfigError(f"draft cost form {self.form!r} not one of {', '.join(DRAFT_FORMS)}")


@dataclass
class CostModel:
    name: str
    target: TargetCost
    draft: dict[str, DraftCost] = field(default_factory=dict)
    overhead_per_step: float = 0.0
    switch_overhead: float = 0.0
    description: str = ""
    source: str = ""
    path: str | None = None

    def draft_for(self, method: str) -> DraftCost:
        if method not in self.draft:
            raise ConfigError(
                f"cost model {self.name!r} has no drafting cost for method {method!r} "
                f"(it has: {', '.join(sorted(self.draft)) or 'none'})"
            )
        return self.draft[method]

    def target_time(self, kv_tokens: Any, batched_tokens: Any) -> Any:
        return self.target.time(kv_tokens, batched_tokens)

    # --- TOML ---------------------------------------------------------------------------------------------
    def to_toml(self, header: str = "") -> str:
        lines = [header.rstrip()] if header else []
        lines += [
            f"name = {_q(self.name)}",
            f"description = {_q(self.description)}",
            f"source = {_q(self.source)}",
            "",
            "[target]",
            *self.target.toml_lines(),  # other forms: speclab.costmodel.forms
            "",
            "[overhead]",
            f"per_step = {_f(self.overhead_per_step)}",
            f"switch = {_f(self.switch_overhead)}",
        ]
        for m, d in self.draft.items():
            lines += ["", f"[draft.{_key(m)}]", f"form = {_q(d.form)}"]
            if d.form == "verify_fraction":
                lines.append(f"fraction = {_f(d.fraction)}")
            else:
                lines += [f"kv = {_f(d.kv)}", f"num_spec = {_f(d.num_spec)}", f"const = {_f(d.const)}"]
        return "\n".join(lines) + "\n"

    @classmethod
    def from_toml(cls, text: str, where: str) -> CostModel:
        try:
            d = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where}: not valid TOML ({exc})") from None
        tgt = _table(d, "target", where)
        ovh = d.get("overhead", {})
        if not isinstance(ovh, dict):
            raise ConfigError(f"{where}: field overhead: expected a table")
        drafts: dict[str, DraftCost] = {}
        draft_raw = d.get("draft", {})
        if not isinstance(draft_raw, dict):
            raise ConfigError(f"{where}: field draft: expected a table of methods")
        for m, spec in draft_raw.items():
            if not isinstance(spec, dict):
                raise ConfigError(f"{where}: field draft.{m}: expected a table")
            form = spec.get("form")
            if form not in DRAFT_FORMS:
                raise ConfigError(
                    f"{where}: field draft.{m}.form: {form!r} not one of {', '.join(DRAFT_FORMS)}"
                )
            if form == "verify_fraction":
                drafts[m] = DraftCost(form=form, fraction=_num(spec, "fraction", f"{where}: field draft.{m}"))
            else:
                drafts[m] = DraftCost(
                    form=form,
                    kv=_num(spec, "kv", f"{where}: field draft.{m}", 0.0),
                    num_spec=_num(spec, "num_spec", f"{where}: field draft.{m}", 0.0),
                    const=_num(spec, "const", f"{where}: field draft.{m}"),
                )
        if tgt.get("form", "linear") != "linear":
            from speclab.costmodel.forms import target_from_toml

            target: TargetCost = target_from_toml(tgt["form"], tgt, where)
        else:
            target = TargetCost(
                kv=_num(tgt, "kv", f"{where}: field target"),
                batched=_num(tgt, "batched", f"{where}: field target"),
                const=_num(tgt, "const", f"{where}: field target"),
            )
        return cls(
            name=str(d.get("name") or Path(where).stem),
            description=str(d.get("description", "")),
            source=str(d.get("source", "")),
            target=target,
            draft=drafts,
            overhead_per_step=_num(ovh, "per_step", f"{where}: field overhead", 0.0),
            switch_overhead=_num(ovh, "switch", f"{where}: field overhead", 0.0),
        )


def _table(d: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    v = d.get(key)
    if not isinstance(v, dict):
        raise ConfigError(f"{where}: field {key}: missing or not a table")
    return v


_MISSING = object()


def _num(d: dict[str, Any], key: str, where: str, default: Any = _MISSING) -> float:
    if key not in d:
        if default is _MISSING:
            raise ConfigError(f"{where}.{key}: missing")
        return float(default)
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v):
        raise ConfigError(f"{where}.{key}: expected a number, got {v!r}")
    return float(v)


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _f(x: float) -> str:
    return repr(float(x))


def _key(m: str) -> str:
    return m if all(c.isalnum() or c in "_-" for c in m) else _q(m)
