"""Cost models: how long one engine step takes, as a function of what the batch does in that step.

The form is the study's linear model (arXiv 2601.11580):
- target forward (prefill, decode or verify) = kv * kv_tokens + batched * batched_tokens + const
- drafting, per method, in one of three forms (see DraftCost)
- an overhead per engine step: a constant, optionally plus a share per scheduled request and per draft token
  verified (sampling and rejection sampling run over those), and an optional overhead for a step in which some
  request switches method; plus, charged only for sampled requests (temperature > 0), a constant for a step
  with any sampled request, shares per sampled request and per draft token of a sampled request (vLLM's
  temperature / top-k / top-p work and the random rejection sampler run there; greedy steps skip them), and
  a further share per sampled request in an engine that runs a drafter (on CPU, a sampled request costs
  far more per step with speculative decoding configured, also at steps that verify no drafts).

TOML schema (checked on load, and by `CostModel.validate` for fitted or hand-built models):
  name, description, source: strings (optional)
  [target]    kv, batched, const: required
  [overhead]  per_step: required (a missing [overhead] is an error, not 0: state 0 if you mean it);
              per_request, per_spec_token, switch: optional, default 0
              sampled_per_step, sampled_per_request, sampled_per_spec_token,
              sampled_drafter_per_request: optional, default 0
  [draft.M]   form = "linear" | "chained": const required, kv and num_spec default 0;
              form = "forwards": const required, kv and batched default 0;
              form = "verify_fraction": fraction required
Every coefficient is a finite number in 0..MAX_COEF seconds (fraction: 0..MAX_FRACTION), and a target
forward must cost time (batched + const > 0). Unknown keys or sections are refused (a typo is not a 0).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from speclab.costmodel.forms import TargetCost, target_from_toml
from speclab.errors import ConfigError
from speclab.validation import check_depth, check_numbers, is_finite_number, loads_toml, show

DRAFT_FORMS = ("linear", "chained", "forwards", "verify_fraction")
MAX_COEF = 1e3  # seconds per token / per step: far above any real engine, small enough to stay finite
MAX_FRACTION = 1e3
_REQUIRED = object()
# section -> key -> default (_REQUIRED: must be given)
_TARGET_KEYS: dict[str, Any] = {"kv": _REQUIRED, "batched": _REQUIRED, "const": _REQUIRED}
_OVERHEAD_KEYS: dict[str, Any] = {
    "per_step": _REQUIRED,
    "switch": 0.0,
    "per_request": 0.0,
    "per_spec_token": 0.0,
    "sampled_per_step": 0.0,
    "sampled_per_request": 0.0,
    "sampled_per_spec_token": 0.0,
    "sampled_drafter_per_request": 0.0,
}
SAMPLED_KEYS = (
    "sampled_per_step",
    "sampled_per_request",
    "sampled_per_spec_token",
    "sampled_drafter_per_request",
)
_DRAFT_KEYS: dict[str, dict[str, Any]] = {
    "linear": {"kv": 0.0, "num_spec": 0.0, "const": _REQUIRED},
    "chained": {"kv": 0.0, "num_spec": 0.0, "const": _REQUIRED},
    "forwards": {"kv": 0.0, "batched": 0.0, "const": _REQUIRED},
    "verify_fraction": {"fraction": _REQUIRED},
}
_TOP_KEYS = ("name", "description", "source", "target", "overhead", "draft")


@dataclass(frozen=True)
class DraftCost:
    """Drafting cost of one proposer for one engine step.

    form "linear" (the study's EAGLE): each request that runs the proposer costs
        kv * batch_kv_tokens + num_spec * its_draft_tokens + const, and the step pays the maximum over requests
        (charged even when a request drafts 0 tokens: the proposer still runs).
    form "chained" (k autoregressive head passes): passes = the most drafts any request asks for; the step pays
        passes * (kv * batch_kv_tokens + const) + num_spec * total_draft_tokens. 0 drafts = 0 cost.
    form "forwards" (a draft model run by the engine, as vLLM's draft-model proposer does): at every engine step
        with a scheduled request (prefills included) the drafter runs `passes` forwards (passes = the drafts per
        request, k): the first over all the step's batched tokens (it catches up on what the target just
        verified or prefilled), the others over one token per request. Each forward is priced like a target
        forward: the step pays passes * (kv * batch_kv_tokens + const) + batched * (batched_tokens +
        (passes - 1) * num_requests).
    form "verify_fraction" (the study's n-gram): fraction * this step's verify time, if any request drafts >= 1.
    """

    form: str
    kv: float = 0.0
    num_spec: float = 0.0
    const: float = 0.0
    fraction: float = 0.0
    batched: float = 0.0  # form "forwards": seconds per token through the drafter

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
    # the overhead's shares per scheduled request and per verified draft token (0: a constant per step)
    overhead_per_request: float = 0.0
    overhead_per_spec_token: float = 0.0
    # charged only for sampled requests: per step with any, per sampled request, per its draft tokens
    overhead_sampled_per_step: float = 0.0
    overhead_sampled_per_request: float = 0.0
    overhead_sampled_per_spec_token: float = 0.0
    overhead_sampled_drafter_per_request: float = 0.0  # per sampled request, engines with a drafter only
    source: str = ""
    path: str | None = None

    def draft_for(self, method: str) -> DraftCost:
        if method not in self.draft:
            raise ConfigError(
                f"cost model {self.name!r} has no drafting cost for method {method!r} "
                f"(it has: {', '.join(sorted(self.draft)) or 'none'})"
            )
        return self.draft[method]

    def target_time(self, kv_tokens: Any, batched_tokens: Any, sampled_positions: Any = None) -> Any:
        """One target forward; sampled_positions (requests + draft tokens verified) where the caller knows
        them (forms that charge the lm_head per sampled position use it)."""
        return self.target.time(kv_tokens, batched_tokens, sampled_positions)

    def overhead_time(
        self,
        num_requests: Any,
        spec_tokens: Any,
        sampled_requests: Any = 0,
        sampled_spec_tokens: Any = 0,
        drafter: bool = False,
    ) -> Any:
        """The per-step overhead (everything but the target forward and drafting) of a step that schedules
        num_requests requests and verifies spec_tokens draft tokens, of which sampled_requests requests
        sample (temperature > 0) and verify sampled_spec_tokens of those draft tokens; drafter: the engine
        runs a drafter (speculative decoding configured)."""
        out = (
            self.overhead_per_step
            + self.overhead_per_request * num_requests
            + self.overhead_per_spec_token * spec_tokens
        )
        if self.samples_cost:
            out = out + self.sampled_overhead(sampled_requests, sampled_spec_tokens, drafter)
        return out

    @property
    def samples_cost(self) -> bool:
        """Whether sampled requests cost more overhead than greedy ones."""
        return bool(
            self.overhead_sampled_per_step
            or self.overhead_sampled_per_request
            or self.overhead_sampled_per_spec_token
            or self.overhead_sampled_drafter_per_request
        )

    def sampled_overhead(self, sampled_requests: Any, sampled_spec_tokens: Any, drafter: Any = False) -> Any:
        """The overhead sampled requests add to a step (0 for a step without one); drafter: the engine runs
        a drafter (a bool, or one per step)."""
        sr = np.asarray(sampled_requests, dtype=np.float64)
        per_req = self.overhead_sampled_per_request + self.overhead_sampled_drafter_per_request * np.asarray(
            drafter, dtype=np.float64
        )
        out = (
            self.overhead_sampled_per_step * (sr > 0)
            + per_req * sr
            + self.overhead_sampled_per_spec_token * np.asarray(sampled_spec_tokens, dtype=np.float64)
        )
        return out if np.ndim(out) else float(out)

    def validate(self, where: str = "") -> CostModel:
        """Raise ConfigError unless every coefficient is usable (see the module docstring); returns self."""
        where = where or f"cost model {self.name!r}"
        for k in (*_TARGET_KEYS, "batched_hi", "sampled"):  # the piecewise form's (speclab.costmodel.forms)
            if hasattr(self.target, k):
                _check_coef(getattr(self.target, k), f"{where}: field target.{k}")
        if self.target.batched + self.target.const <= 0:
            raise ConfigError(
                f"{where}: field target: batched and const are both 0 (a forward pass would take no time)"
            )
        _check_coef(self.overhead_per_step, f"{where}: field overhead.per_step")
        _check_coef(self.switch_overhead, f"{where}: field overhead.switch")
        _check_coef(self.overhead_per_request, f"{where}: field overhead.per_request")
        _check_coef(self.overhead_per_spec_token, f"{where}: field overhead.per_spec_token")
        for k in SAMPLED_KEYS:
            _check_coef(getattr(self, f"overhead_{k}"), f"{where}: field overhead.{k}")
        for m, d in self.draft.items():
            for k in _DRAFT_KEYS[d.form]:
                top = MAX_FRACTION if k == "fraction" else MAX_COEF
                _check_coef(getattr(d, k), f"{where}: field draft.{m}.{k}", top)
        return self

    # --- TOML ---------------------------------------------------------------------------------------------
    def to_toml(self, header: str = "") -> str:
        """The model as TOML that from_toml reads back; `header` goes first as comments (a line that is not
        one already gets "# ", so any text, a path or a command line, keeps the file valid TOML)."""
        lines = [_comment(ln) for ln in header.rstrip().splitlines()] if header.strip() else []
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
        if self.overhead_per_request or self.overhead_per_spec_token:  # else as written before these existed
            lines += [
                f"per_request = {_f(self.overhead_per_request)}",
                f"per_spec_token = {_f(self.overhead_per_spec_token)}",
            ]
        if self.samples_cost:  # else as written before these existed
            lines += [f"{k} = {_f(getattr(self, f'overhead_{k}'))}" for k in SAMPLED_KEYS]
        for m, d in self.draft.items():
            lines += ["", f"[draft.{_key(m)}]", f"form = {_q(d.form)}"]
            if d.form == "verify_fraction":
                lines.append(f"fraction = {_f(d.fraction)}")
            elif d.form == "forwards":
                lines += [f"kv = {_f(d.kv)}", f"batched = {_f(d.batched)}", f"const = {_f(d.const)}"]
            else:
                lines += [f"kv = {_f(d.kv)}", f"num_spec = {_f(d.num_spec)}", f"const = {_f(d.const)}"]
        return "\n".join(lines) + "\n"

    @classmethod
    def from_toml(cls, text: str, where: str) -> CostModel:
        try:
            d = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where}: not valid TOML ({exc})") from None
        except (RecursionError, ValueError):  # nesting beyond the parser, a number of 4300+ digits
            d = loads_toml(text, where)  # says which, in one line
        check_numbers(check_depth(d, where), where)  # no NaN, infinity or 24-digit integer reaches a form
        _no_unknown(d, _TOP_KEYS, f"{where}: top level")
        for key in ("name", "description", "source"):
            if key in d and not isinstance(d[key], str):
                raise ConfigError(f"{where}: field {key}: expected a string, got {d[key]!r}")
        tgt_raw = _table(d, "target", where)
        tgt_form = tgt_raw.get("form", "linear")
        if tgt_form != "linear":  # other forms (piecewise): speclab.costmodel.forms checks their fields
            _no_unknown(
                tgt_raw,
                ("form", *_TARGET_KEYS, "knee", "batched_hi", "sampled", "table", "interpolate"),
                f"{where}: field target",
            )
            target: TargetCost = target_from_toml(tgt_form, tgt_raw, where)
        else:
            rest = {k: v for k, v in tgt_raw.items() if k != "form"}
            target = TargetCost(**_section(rest, _TARGET_KEYS, f"{where}: field target"))
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
            rest = {k: v for k, v in spec.items() if k != "form"}
            drafts[m] = DraftCost(form=form, **_section(rest, _DRAFT_KEYS[form], f"{where}: field draft.{m}"))
        if "overhead" not in d:
            raise ConfigError(f"{where}: section [overhead] missing (give per_step; per_step = 0.0 if none)")
        ovh = _section(_table(d, "overhead", where), _OVERHEAD_KEYS, f"{where}: field overhead")
        return cls(
            name=str(d.get("name") or Path(where).stem),
            description=str(d.get("description", "")),
            source=str(d.get("source", "")),
            target=target,
            draft=drafts,
            overhead_per_step=ovh["per_step"],
            switch_overhead=ovh["switch"],
            overhead_per_request=ovh["per_request"],
            overhead_per_spec_token=ovh["per_spec_token"],
            **{f"overhead_{k}": ovh[k] for k in SAMPLED_KEYS},
        ).validate(where)


def _table(d: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    v = d.get(key)
    if not isinstance(v, dict):
        raise ConfigError(f"{where}: field {key}: missing or not a table")
    return v


def _no_unknown(d: dict[str, Any], known: Any, where: str) -> None:
    unknown = sorted(str(k) for k in d if k not in known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(known)})")


def _section(d: dict[str, Any], keys: dict[str, Any], where: str) -> dict[str, float]:
    """The numbers of one TOML table per its schema: unknown keys refused, required ones present."""
    _no_unknown(d, keys, where)
    return {k: _num(d, k, where, default) for k, default in keys.items()}


def _num(d: dict[str, Any], key: str, where: str, default: Any = _REQUIRED) -> float:
    if key not in d:
        if default is _REQUIRED:
            raise ConfigError(f"{where}.{key}: missing")
        return float(default)
    v = d[key]
    if not is_finite_number(v):
        raise ConfigError(f"{where}.{key}: expected a number, got {show(v)}")
    return float(v)


def _check_coef(v: Any, where: str, top: float = MAX_COEF) -> None:
    if isinstance(v, np.number):
        v = v.item()
    if not is_finite_number(v):
        raise ConfigError(f"{where}: expected a finite number, got {show(v)}")
    if not 0 <= v <= top:
        raise ConfigError(f"{where}: {v!r} out of range 0..{top:g}")


def _comment(line: str) -> str:
    if line.lstrip().startswith("#"):
        return line.rstrip()
    return f"# {line}".rstrip()


def _q(s: str) -> str:
    # a TOML basic string: quote and backslash escaped, control characters (a newline in a description) as \uXXXX
    return '"' + "".join(_ESC.get(c, c) for c in s) + '"'


_ESC = {'"': '\\"', "\\": "\\\\", **{chr(i): f"\\u{i:04x}" for i in (*range(0x20), 0x7F)}}


def _f(x: float) -> str:
    return repr(float(x))


def _key(m: str) -> str:
    return m if m and all(c.isascii() and (c.isalnum() or c in "_-") for c in m) else _q(m)
