"""In-memory trace records: per request, per output position, what each SD method would get accepted.

Conventions (shared by replay tracing, the bench, the importer and the simulator):
- Output positions p = 0 .. output_len-1 index the target's generated tokens. Entry p describes one SD
  step whose context is prompt + output[:p]: the proposer offers up to k_max draft tokens for output[p:].
- Each method's trace has its own length (MethodTrace.output_len = len(acc_len)): a method's trace may come
  from that method's own run, whose output can differ from the record's (the study's files: EAGLE's arrays
  come from a separate EAGLE run). RequestTrace.output_len / output_token_ids describe the record's
  reference output; a method whose output_token_ids is None and whose length equals the record's follows the
  record's output, otherwise its tokens are unknown unless recorded on the MethodTrace.
- acc_len[p] = accepted drafts + 1 (the bonus/recovered token), so 1 .. k_max+1. This is the study's
  `acc_len`. Position 0 is produced by prefill, so simulators start stepping at p = 1.
- num_proposed[p] = how many draft tokens the proposer could offer there (0 = no proposal, e.g. an n-gram
  lookup miss). None for the whole method when unknown (e.g. imported study traces), never invented.
- accept_prob (sampled traces only, else None): float32 (output_len, k_max); accept_prob[p, j-1] = the
  probability that draft j of step p is accepted given drafts 1..j-1 were, scored along the reference
  (no-SD) output; 0 beyond num_proposed[p]. accept_source says how it was obtained. acc_len keeps its
  meaning (the greedy-rule count along the reference output). See expected_acc_len.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speclab.catalog import TRACE_METHODS
from speclab.errors import TraceError

# Method names a trace may carry. Custom proposers use "custom:<name>".
KNOWN_METHODS: tuple[str, ...] = TRACE_METHODS  # the method catalog is the one home of method facts
_CUSTOM_RE = re.compile(r"^custom:[A-Za-z0-9_.\-]+$")

# Storage bounds (the Parquet store keeps ints in 32 bits): token ids 0 <= id < 2^31, lengths < 2^31,
# k_max 1..K_MAX_LIMIT (far above any SD method; keeps acc_len = k_max+1 and policy arrays small).
INT32_MAX = 2**31 - 1
K_MAX_LIMIT = 2**16

# Study categories a workload can stand for.
CATEGORIES: tuple[str, ...] = ("code-editing", "summarization", "math", "chat", "reasoning", "other")


def check_method_name(name: str) -> str:
    if name in KNOWN_METHODS or _CUSTOM_RE.match(name):
        return name
    raise TraceError(f"unknown method {name!r} (known: {', '.join(KNOWN_METHODS)}, or custom:<name>)")


@dataclass
class MethodTrace:
    k_max: int
    acc_len: np.ndarray  # int16/int32, one per output position, 1..k_max+1
    num_proposed: np.ndarray | None = None  # one per output position, 0..k_max; None = not recorded
    # this method's own output tokens, where its run's output is known and is not the record's
    output_token_ids: np.ndarray | None = None
    # sampled traces: per step and draft position, the conditional acceptance probability (module docstring)
    accept_prob: np.ndarray | None = None
    accept_source: str | None = None

    def __post_init__(self) -> None:
        self.acc_len = np.asarray(self.acc_len, dtype=np.int32)
        if self.num_proposed is not None:
            self.num_proposed = np.asarray(self.num_proposed, dtype=np.int32)
        if self.output_token_ids is not None:
            self.output_token_ids = np.asarray(self.output_token_ids, dtype=np.int32)
        if self.accept_prob is not None:
            self.accept_prob = np.asarray(self.accept_prob, dtype=np.float32)
            if self.accept_prob.size == 0 and not len(self.acc_len) and isinstance(self.k_max, int):
                self.accept_prob = self.accept_prob.reshape(0, max(self.k_max, 0))  # empty output

    @property
    def output_len(self) -> int:
        """This method's output length: one acc_len entry per position of its own output."""
        return len(self.acc_len)

    def validate(self, output_len: int, where: str) -> None:
        """output_len: the record's; a method's own length may differ from it (see the module docstring)."""
        if not isinstance(self.k_max, int | np.integer) or not 1 <= self.k_max <= K_MAX_LIMIT:
            raise TraceError(f"{where}: field k_max: must be an integer 1..{K_MAX_LIMIT}, got {self.k_max!r}")
        if self.acc_len.ndim != 1:
            raise TraceError(f"{where}: field acc_len: expected a flat list")
        n = len(self.acc_len)
        _check_ids(self.output_token_ids, f"{where}: field output_token_ids")
        if self.output_token_ids is not None and len(self.output_token_ids) != n:
            raise TraceError(
                f"{where}: field output_token_ids: has {len(self.output_token_ids)} tokens, "
                f"acc_len has {n} entries (one per output position)"
            )
        if len(self.acc_len) and (self.acc_len.min() < 1 or self.acc_len.max() > self.k_max + 1):
            bad = int(np.flatnonzero((self.acc_len < 1) | (self.acc_len > self.k_max + 1))[0])
            raise TraceError(
                f"{where}: field acc_len: value {int(self.acc_len[bad])} at position {bad} "
                f"out of range 1..{self.k_max + 1}"
            )
        if self.num_proposed is not None:
            np_ = self.num_proposed
            if np_.ndim != 1 or len(np_) != n:
                raise TraceError(
                    f"{where}: field num_proposed: has {len(np_)} entries, acc_len has {n} (one per position)"
                )
            if len(np_) and (np_.min() < 0 or np_.max() > self.k_max):
                bad = int(np.flatnonzero((np_ < 0) | (np_ > self.k_max))[0])
                raise TraceError(
                    f"{where}: field num_proposed: value {int(np_[bad])} at position {bad} "
                    f"out of range 0..{self.k_max}"
                )
            over = np.flatnonzero(self.acc_len > np_ + 1)
            if len(over):
                p = int(over[0])
                raise TraceError(
                    f"{where}: field acc_len: {int(self.acc_len[p])} at position {p} exceeds "
                    f"num_proposed+1 = {int(np_[p]) + 1}"
                )
        self._validate_accept_prob(f"{where}: field accept_prob")

    def _validate_accept_prob(self, where: str) -> None:
        ap = self.accept_prob
        if ap is None:
            if self.accept_source is not None:
                raise TraceError(f"{where}: accept_source given without accept_prob")
            return
        if not isinstance(self.accept_source, str) or not self.accept_source:
            raise TraceError(f"{where}: needs accept_source (how it was obtained)")
        if ap.shape != (len(self.acc_len), self.k_max):
            raise TraceError(
                f"{where}: shape {ap.shape}, expected ({len(self.acc_len)}, {self.k_max}) "
                "(one row per output position, one column per draft position)"
            )
        bad = np.argwhere(~np.isfinite(ap) | (ap < 0) | (ap > 1))
        if len(bad):
            p, j = (int(x) for x in bad[0])
            raise TraceError(f"{where}: value {float(ap[p, j])!r} at position {p}, draft {j + 1} not in 0..1")
        if self.num_proposed is not None:
            beyond = np.argwhere((np.arange(self.k_max)[None, :] >= self.num_proposed[:, None]) & (ap != 0))
            if len(beyond):
                p, j = (int(x) for x in beyond[0])
                raise TraceError(
                    f"{where}: draft {j + 1} at position {p} has probability {float(ap[p, j])!r} but only "
                    f"{int(self.num_proposed[p])} drafts were proposed (must be 0)"
                )

    def expected_acc_len(self) -> np.ndarray | None:
        """Per position, 1 + sum_j prod_{i<=j} accept_prob[p, i-1] (None for a greedy trace)."""
        if self.accept_prob is None:
            return None
        return 1.0 + np.cumprod(self.accept_prob.astype(np.float64), axis=1).sum(axis=1)


@dataclass
class RequestTrace:
    id: str
    workload: str
    category: str
    prompt_len: int
    output_len: int
    methods: dict[str, MethodTrace] = field(default_factory=dict)
    prompt_token_ids: np.ndarray | None = None
    output_token_ids: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.prompt_token_ids is not None:
            self.prompt_token_ids = np.asarray(self.prompt_token_ids, dtype=np.int32)
        if self.output_token_ids is not None:
            self.output_token_ids = np.asarray(self.output_token_ids, dtype=np.int32)

    def validate(self, where: str = "record") -> None:
        where = f"{where} (id={self.id!r})"
        if not isinstance(self.id, str) or not self.id:
            raise TraceError(f"{where}: field id: must be a non-empty string")
        if self.category not in CATEGORIES:
            raise TraceError(f"{where}: field category: {self.category!r} not one of {', '.join(CATEGORIES)}")
        for name, value in (("prompt_len", self.prompt_len), ("output_len", self.output_len)):
            if not isinstance(value, int | np.integer) or not 0 <= value <= INT32_MAX:
                raise TraceError(f"{where}: field {name}: must be an integer 0..{INT32_MAX}, got {value!r}")
        _check_ids(self.prompt_token_ids, f"{where}: field prompt_token_ids")
        _check_ids(self.output_token_ids, f"{where}: field output_token_ids")
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != self.prompt_len:
            raise TraceError(
                f"{where}: field prompt_token_ids: has {len(self.prompt_token_ids)} tokens, "
                f"prompt_len is {self.prompt_len}"
            )
        if self.output_token_ids is not None and len(self.output_token_ids) != self.output_len:
            raise TraceError(
                f"{where}: field output_token_ids: has {len(self.output_token_ids)} tokens, "
                f"output_len is {self.output_len}"
            )
        for name, mt in self.methods.items():
            try:
                check_method_name(name)
            except TraceError as exc:
                raise TraceError(f"{where}: field methods: {exc}") from None
            mt.validate(self.output_len, f"{where} method {name}")

    # --- JSON (lossless) ---------------------------------------------------------------------------
    def to_json_dict(self) -> dict[str, Any]:
        def ids(a: np.ndarray | None) -> list[int] | None:
            return None if a is None else a.tolist()

        return {
            "id": self.id,
            "workload": self.workload,
            "category": self.category,
            "prompt_len": int(self.prompt_len),
            "output_len": int(self.output_len),
            "prompt_token_ids": ids(self.prompt_token_ids),
            "output_token_ids": ids(self.output_token_ids),
            "methods": {
                name: {
                    "k_max": int(mt.k_max),
                    "acc_len": mt.acc_len.tolist(),
                    "num_proposed": ids(mt.num_proposed),
                    **({} if mt.output_token_ids is None else {"output_token_ids": ids(mt.output_token_ids)}),
                    **(
                        {}
                        if mt.accept_prob is None
                        else {"accept_prob": mt.accept_prob.tolist(), "accept_source": mt.accept_source}
                    ),
                }
                for name, mt in self.methods.items()
            },
            "meta": self.meta,
        }

    @classmethod
    def from_json_dict(cls, d: Any, where: str) -> RequestTrace:
        if not isinstance(d, dict):
            raise TraceError(f"{where}: expected a JSON object, got {type(d).__name__}")
        try:
            methods_raw = d.get("methods") or {}
            if not isinstance(methods_raw, dict):
                raise TraceError(f"{where}: field methods: expected an object")
            methods = {}
            for name, m in methods_raw.items():
                if not isinstance(m, dict) or "acc_len" not in m or "k_max" not in m:
                    raise TraceError(f"{where}: field methods.{name}: needs k_max and acc_len")
                methods[name] = MethodTrace(
                    k_max=_as_int(m["k_max"], f"{where}: field methods.{name}.k_max"),
                    acc_len=_as_int_array(m["acc_len"], f"{where}: field methods.{name}.acc_len"),
                    num_proposed=None
                    if m.get("num_proposed") is None
                    else _as_int_array(m["num_proposed"], f"{where}: field methods.{name}.num_proposed"),
                    output_token_ids=None
                    if m.get("output_token_ids") is None
                    else _as_int_array(
                        m["output_token_ids"], f"{where}: field methods.{name}.output_token_ids"
                    ),
                    accept_prob=None
                    if m.get("accept_prob") is None
                    else _as_prob_rows(m["accept_prob"], f"{where}: field methods.{name}.accept_prob"),
                    accept_source=None if m.get("accept_source") is None else str(m["accept_source"]),
                )
            rid = _require(d, "id", where)
            if not isinstance(rid, str) or not rid:
                raise TraceError(f"{where}: field id: expected a non-empty string, got {_kind(rid)}")
            rec = cls(
                id=rid,
                workload=str(d.get("workload", "unknown")),
                category=str(d.get("category", "other")),
                prompt_len=_as_int(_require(d, "prompt_len", where), f"{where}: field prompt_len"),
                output_len=_as_int(_require(d, "output_len", where), f"{where}: field output_len"),
                methods=methods,
                prompt_token_ids=None
                if d.get("prompt_token_ids") is None
                else _as_int_array(d["prompt_token_ids"], f"{where}: field prompt_token_ids"),
                output_token_ids=None
                if d.get("output_token_ids") is None
                else _as_int_array(d["output_token_ids"], f"{where}: field output_token_ids"),
                meta=dict(d.get("meta") or {}),
            )
        except TraceError:
            raise
        except (TypeError, ValueError) as exc:
            raise TraceError(f"{where}: {exc}") from None
        rec.validate(where)
        return rec


def _kind(v: Any) -> str:
    return "null" if v is None else ("an object" if isinstance(v, dict) else f"{type(v).__name__} {v!r}"[:80])


def _check_ids(ids: np.ndarray | None, where: str) -> None:
    if ids is not None and len(ids) and ids.min() < 0:
        p = int(np.flatnonzero(ids < 0)[0])
        raise TraceError(f"{where}: negative token id {int(ids[p])} at position {p}")


def _require(d: dict[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise TraceError(f"{where}: field {key}: missing")
    return d[key]


def _as_int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer):
        raise TraceError(f"{where}: expected an integer, got {v!r}")
    return int(v)


def _as_int_array(v: Any, where: str) -> np.ndarray:
    if not isinstance(v, list | np.ndarray):
        raise TraceError(f"{where}: expected a list of integers")
    try:
        arr = np.asarray(v)
    except ValueError:
        raise TraceError(f"{where}: expected a flat list of integers (ragged values found)") from None
    if (
        arr.ndim == 1
        and arr.dtype == object
        and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
    ):
        raise TraceError(f"{where}: integer out of range (values must fit in 32 bits)")
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise TraceError(f"{where}: expected a flat list of integers (ragged or non-integer values found)")
    if arr.size and (arr.min() < -INT32_MAX - 1 or arr.max() > INT32_MAX):
        bad = int(np.flatnonzero((arr < -INT32_MAX - 1) | (arr > INT32_MAX))[0])
        raise TraceError(
            f"{where}: value {int(arr[bad])} at position {bad} out of range (must fit in 32 bits)"
        )
    return arr.astype(np.int32)


def _as_prob_rows(v: Any, where: str) -> np.ndarray:
    """A list of equal-length lists of numbers (one row per output position) as float32 (n, k)."""
    if not isinstance(v, list | np.ndarray) or not all(isinstance(r, list | np.ndarray) for r in v):
        raise TraceError(f"{where}: expected a list of rows (lists of numbers)")
    if any(isinstance(x, bool) or not isinstance(x, int | float) for r in v for x in r):
        raise TraceError(f"{where}: expected numbers")
    if len({len(r) for r in v}) > 1:
        raise TraceError(f"{where}: rows of different lengths")
    return np.asarray(v, dtype=np.float32).reshape(len(v), len(v[0]) if len(v) else 0)


def prob_rows(flat: Any, k_max: int) -> np.ndarray | None:
    """A stored row-major accept_prob (flat list) back to (output_len, k_max); None stays None."""
    return None if flat is None else np.asarray(flat, np.float32).reshape(-1, max(int(k_max), 1))


def dumps_jsonl_line(rec: RequestTrace) -> str:
    return json.dumps(rec.to_json_dict(), separators=(",", ":"))


def json_lines(fh: Iterable[str], path: object) -> Iterator[tuple[int, str, Any]]:
    """(line number, "PATH: line N", parsed value) for each non-blank line of a JSON Lines file."""
    lines = enumerate(fh, 1)
    while True:
        try:
            lineno, line = next(lines)
        except StopIteration:
            return
        except UnicodeDecodeError as exc:
            raise TraceError(
                f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); binary file?"
            ) from None
        if not line.strip():
            continue
        where = f"{path}: line {lineno}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not valid JSON ({exc.msg}; truncated file?)") from None
        except (ValueError, RecursionError) as exc:  # e.g. a 5000-digit number, nesting 10^5 deep
            raise TraceError(f"{where}: not usable JSON ({exc})") from None
        yield lineno, where, d
