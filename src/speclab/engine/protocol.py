"""The engine worker's protocol: a JOB file in, one JSON line per cell out (CONTRACTS.md section 3).

A job is one engine configuration (target, dtype, SD method, ...) plus the cells to run on it. The worker
(`python -m speclab.engine.worker --job JOB.json --out CELLS.jsonl`) starts vLLM once, runs every cell and
appends one `CellResult` JSON line per cell (flushed), so a crash loses only the cell that was running.

This module has no heavy imports (no torch, no vllm): the sweep runner imports it freely.

Method options (`EngineSpec.options`), passed on to vLLM's speculative_config:
- ngram: prompt_lookup_min, prompt_lookup_max
- suffix: suffix_decoding_max_tree_depth, suffix_decoding_max_cached_requests,
  suffix_decoding_max_spec_factor, suffix_decoding_min_token_prob
- draft_model / eagle / eagle3 / dflash: model (drafter checkpoint or head: path, preset name or hub id)
- mtp: (none required; options pass through)
- custom_class: model (dotted path "package.module.ClassName"); proposer_options (a JSON object, exported
  to the worker as SPECLAB_PROPOSER_OPTIONS for speclab's custom_class adapters, not sent to vLLM)
Any other key is passed through to speculative_config unchanged. `EngineSpec.llm_kwargs` is passed to
`vllm.LLM(...)` unchanged (e.g. tensor_parallel_size, gpu_memory_utilization on a GPU).

Size: over 400 lines because it is declarations (the job and result dataclasses, each with its JSON round
trip and checks), one per part of the protocol; splitting them would scatter one file format over modules.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from speclab.atomic import atomic_write_text
from speclab.catalog import ENGINE_METHODS, METHODS_NEEDING_MODEL
from speclab.engine.request_sampling import check_sampling
from speclab.errors import ConfigError

DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
BATCHING: tuple[str, ...] = ("replicate", "continuous")


def _err(where: str, msg: str) -> ConfigError:
    return ConfigError(f"{where}: {msg}")


def _get(d: dict[str, Any], key: str, types: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
    if key not in d or d[key] is None:
        if default is ...:
            raise _err(where, f"field {key}: missing")
        return default
    v = d[key]
    # bool is an int subclass: reject it where an int is wanted
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise _err(where, f"field {key}: expected {_tname(types)}, got {v!r}")
    if not isinstance(v, types):
        raise _err(where, f"field {key}: expected {_tname(types)}, got {v!r}")
    return v


def _tname(types: type | tuple[type, ...]) -> str:
    ts = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in ts)


@dataclass
class EngineSpec:
    target: str  # HF checkpoint dir, preset name or hub id (the worker resolves it)
    dtype: str = "float32"
    method: str = "none"
    k: int | None = None  # num_speculative_tokens; required unless method == "none"
    options: dict[str, Any] = field(default_factory=dict)
    max_model_len: int = 2048
    max_num_seqs: int = 1  # should be >= the largest batch_size among the job's cells
    enforce_eager: bool = False
    kv_cache_gib: float = 2.0  # CPU KV cache: VLLM_CPU_KVCACHE_SPACE (whole GiB) or kv_cache_memory_bytes
    seed: int = 42
    llm_kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self, where: str = "engine") -> None:
        if not self.target:
            raise _err(where, "field target: must be a non-empty string")
        if self.dtype not in DTYPES:
            raise _err(where, f"field dtype: {self.dtype!r} not one of {', '.join(DTYPES)}")
        if self.method not in ENGINE_METHODS:
            raise _err(where, f"field method: {self.method!r} not one of {', '.join(ENGINE_METHODS)}")
        if self.method == "none":
            if self.k not in (None, 0):
                raise _err(where, "field k: must be null for method none")
        elif not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise _err(where, f"field k: method {self.method} needs an integer k >= 1, got {self.k!r}")
        if self.method in METHODS_NEEDING_MODEL and not self.options.get("model"):
            what = "a dotted class path" if self.method == "custom_class" else "a drafter checkpoint"
            raise _err(where, f"field options.model: method {self.method} needs {what}")
        if self.method == "ngram":
            lo = self.options.get("prompt_lookup_min", 1)
            hi = self.options.get("prompt_lookup_max", lo)
            if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
                raise _err(where, "fields options.prompt_lookup_min/max: need integers 1 <= min <= max")
        for name in ("max_model_len", "max_num_seqs", "seed"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if name == "seed" else 1):
                raise _err(where, f"field {name}: invalid value {v!r}")
        if not isinstance(self.kv_cache_gib, int | float) or self.kv_cache_gib <= 0:
            raise _err(where, f"field kv_cache_gib: must be > 0, got {self.kv_cache_gib!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any, where: str = "engine") -> EngineSpec:
        if not isinstance(d, dict):
            raise _err(where, "expected an object")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - known)
        if unknown:
            raise _err(where, f"unknown field(s): {', '.join(unknown)}")
        spec = cls(
            target=str(_get(d, "target", str, where)),
            dtype=_get(d, "dtype", str, where, "float32"),
            method=_get(d, "method", str, where, "none"),
            k=_get(d, "k", int, where, None),
            options=dict(_get(d, "options", dict, where, {})),
            max_model_len=_get(d, "max_model_len", int, where, 2048),
            max_num_seqs=_get(d, "max_num_seqs", int, where, 1),
            enforce_eager=_get(d, "enforce_eager", bool, where, False),
            kv_cache_gib=float(_get(d, "kv_cache_gib", (int, float), where, 2.0)),
            seed=_get(d, "seed", int, where, 42),
            llm_kwargs=dict(_get(d, "llm_kwargs", dict, where, {})),
        )
        spec.validate(where)
        return spec


@dataclass
class PromptSpec:
    id: str
    prompt_token_ids: list[int]
    # per-request sampling (SAMPLING_FIELDS); None: greedy with the cell's max_tokens. Under "replicate"
    # batching copy c of the request runs with seed + c, so copies are distinct draws and reruns repeat.
    sampling: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "prompt_token_ids": list(self.prompt_token_ids)}
        if self.sampling:
            d["sampling"] = dict(self.sampling)
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str) -> PromptSpec:
        if not isinstance(d, dict):
            raise _err(where, "expected an object")
        pid = _get(d, "id", str, where)
        ids = _get(d, "prompt_token_ids", list, where)
        if not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise _err(where, "field prompt_token_ids: must be a non-empty list of token ids (ints >= 0)")
        return cls(
            id=pid, prompt_token_ids=[int(t) for t in ids], sampling=check_sampling(d.get("sampling"), where)
        )

    def max_tokens(self, cell_max: int) -> int:
        """The request's own max_tokens where it has one, else the cell's."""
        return int((self.sampling or {}).get("max_tokens") or cell_max)


@dataclass
class CellSpec:
    cell_id: str
    batching: str  # "replicate" | "continuous"
    batch_size: int
    max_tokens: int
    prompts: list[PromptSpec]

    def validate(self, where: str = "cell") -> None:
        if not self.cell_id:
            raise _err(where, "field cell_id: must be a non-empty string")
        if self.batching not in BATCHING:
            raise _err(where, f"field batching: {self.batching!r} not one of {', '.join(BATCHING)}")
        if self.batch_size < 1:
            raise _err(where, f"field batch_size: must be >= 1, got {self.batch_size}")
        if self.max_tokens < 1:
            raise _err(where, f"field max_tokens: must be >= 1, got {self.max_tokens}")
        if not self.prompts:
            raise _err(where, "field prompts: must not be empty")
        ids = [p.id for p in self.prompts]
        if len(set(ids)) != len(ids):
            raise _err(where, "field prompts: prompt ids must be unique within a cell")

    def to_dict(self) -> dict[str, Any]:
        return {
            "cell_id": self.cell_id,
            "batching": self.batching,
            "batch_size": self.batch_size,
            "max_tokens": self.max_tokens,
            "prompts": [p.to_dict() for p in self.prompts],
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "cell") -> CellSpec:
        if not isinstance(d, dict):
            raise _err(where, "expected an object")
        prompts_raw = _get(d, "prompts", list, where)
        cell = cls(
            cell_id=_get(d, "cell_id", str, where),
            batching=_get(d, "batching", str, where),
            batch_size=_get(d, "batch_size", int, where),
            max_tokens=_get(d, "max_tokens", int, where),
            prompts=[PromptSpec.from_dict(p, f"{where}.prompts[{i}]") for i, p in enumerate(prompts_raw)],
        )
        cell.validate(where)
        return cell


@dataclass
class Job:
    engine: EngineSpec
    cells: list[CellSpec]
    timings_csv: str | None = None  # profiled step timings are appended here (CONTRACTS.md section 5)
    warmup: bool = True  # run a tiny request before the first cell (not recorded)
    # gated run (repeats interleaved across engines): after warm-up the worker creates GATE.ready, then runs
    # the cells whose ids the runner appends to GATE, one line each, until a line "done" (gate_lines)
    gate: str | None = None

    def validate(self) -> None:
        self.engine.validate("job.engine")
        if not self.cells:
            raise _err("job", "field cells: must not be empty")
        seen: set[str] = set()
        for i, c in enumerate(self.cells):
            c.validate(f"job.cells[{i}]")
            if c.cell_id in seen:
                raise _err(f"job.cells[{i}]", f"duplicate cell_id {c.cell_id!r}")
            seen.add(c.cell_id)
            longest = max(len(p.prompt_token_ids) + p.max_tokens(c.max_tokens) for p in c.prompts)
            if longest > self.engine.max_model_len:
                raise _err(
                    f"job.cells[{i}]",
                    f"a prompt plus its max_tokens ({longest} tokens) exceeds "
                    f"engine.max_model_len ({self.engine.max_model_len})",
                )
        need = max(c.batch_size for c in self.cells)
        if self.engine.max_num_seqs < need:
            raise _err(
                "job.engine",
                f"field max_num_seqs: {self.engine.max_num_seqs} is below the largest batch_size ({need})",
            )

    def to_dict(self) -> dict[str, Any]:
        d = {
            "engine": self.engine.to_dict(),
            "cells": [c.to_dict() for c in self.cells],
            "timings_csv": self.timings_csv,
            "warmup": self.warmup,
        }
        if self.gate is not None:
            d["gate"] = self.gate
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Job:
        if not isinstance(d, dict):
            raise _err("job", "expected a JSON object")
        unknown = sorted(set(d) - {"engine", "cells", "timings_csv", "warmup", "gate"})
        if unknown:
            raise _err("job", f"unknown field(s): {', '.join(unknown)}")
        job = cls(
            engine=EngineSpec.from_dict(_get(d, "engine", dict, "job"), "job.engine"),
            cells=[
                CellSpec.from_dict(c, f"job.cells[{i}]") for i, c in enumerate(_get(d, "cells", list, "job"))
            ],
            timings_csv=_get(d, "timings_csv", str, "job", None),
            warmup=_get(d, "warmup", bool, "job", True),
            gate=_get(d, "gate", str, "job", None),
        )
        job.validate()
        return job


def write_job(job: Job, path: str | os.PathLike[str]) -> None:
    job.validate()
    atomic_write_text(path, json.dumps(job.to_dict()))


def read_job(path: str | os.PathLike[str]) -> Job:
    try:
        d = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read job file {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"job file {path}: invalid JSON: {exc}") from None
    return Job.from_dict(d)


GATE_DONE = "done"


def gate_ready_path(gate: str | os.PathLike[str]) -> Path:
    """The file a gated worker creates once its engine is up and warm."""
    return Path(f"{gate}.ready")


def gate_lines(gate: str | os.PathLike[str], poll_s: float = 0.02) -> Iterator[str]:
    """A gated worker's instructions: each complete line appended to GATE, in order, until GATE_DONE.
    Polls the file (an idle worker only stats it); the runner only ever appends whole lines."""
    p = Path(gate)
    offset = 0
    buf = b""
    while True:
        data = b""
        if p.exists():
            with open(p, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        if not data:
            time.sleep(poll_s)
            continue
        offset += len(data)
        buf += data
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").strip()
            if line == GATE_DONE:
                return
            if line:
                yield line


# --- results -------------------------------------------------------------------------------------------


@dataclass
class RequestResult:
    id: str  # prompt id
    copy: int  # 0..batch_size-1 under replicate; 0 under continuous
    prompt_len: int
    output_token_ids: list[int]
    finish_reason: str | None = None
    # vLLM's detailed per-request spec-decode metrics (None when method == "none" or unavailable).
    # Steps where the proposer offered nothing are absent (vLLM's convention).
    per_step_accepted: list[int] | None = None
    per_step_drafted: list[int] | None = None


@dataclass
class SpecCounters:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)


@dataclass
class TimeSplit:
    # Sum over the cell's engine steps (seconds of wall clock; CPU runs are synchronous).
    propose: float = 0.0  # the drafter's propose() calls (incl. draft model forwards)
    verify: float = 0.0  # target model forwards (prefill, decode and verification)
    other: float = 0.0  # the rest of each step: scheduling, input prep, sampling, rejection, output


@dataclass
class MemoryInfo:
    peak_rss_bytes: int | None = None  # process peak RSS (high-water mark since the worker started)
    weights_bytes: int | None = None  # target weights
    kv_cache_bytes: int | None = None  # KV cache allocated by the engine
    draft_weights_bytes: int | None = None  # weights the method adds (0 for ngram/suffix/none)


@dataclass
class CellResult:
    cell_id: str
    status: str  # "ok" | "failed"
    error: str | None = None
    output_tokens: int = 0
    elapsed_s: float = 0.0
    steps: int = 0  # engine steps taken by the cell
    requests: list[RequestResult] = field(default_factory=list)
    time_split_s: TimeSplit = field(default_factory=TimeSplit)
    memory: MemoryInfo = field(default_factory=MemoryInfo)
    spec_counters: SpecCounters | None = None  # None when method == "none"
    # engine facts: startup_s, vllm_version, method, k, device, resolved target/drafter paths, ...
    engine_info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json_line(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: Any, where: str = "cell result") -> CellResult:
        if not isinstance(d, dict):
            raise _err(where, "expected an object")
        try:
            sc = d.get("spec_counters")
            return cls(
                cell_id=_get(d, "cell_id", str, where),
                status=_get(d, "status", str, where),
                error=d.get("error"),
                output_tokens=int(d.get("output_tokens", 0)),
                elapsed_s=float(d.get("elapsed_s", 0.0)),
                steps=int(d.get("steps", 0)),
                requests=[RequestResult(**r) for r in d.get("requests") or []],
                time_split_s=TimeSplit(**(d.get("time_split_s") or {})),
                memory=MemoryInfo(**(d.get("memory") or {})),
                spec_counters=None if sc is None else SpecCounters(**sc),
                engine_info=dict(d.get("engine_info") or {}),
            )
        except TypeError as exc:
            raise _err(where, str(exc)) from None


def append_result(path: str | os.PathLike[str], result: CellResult) -> None:
    """Append one result line and flush it to disk (the runner may read while the worker runs)."""
    with open(path, "a") as f:
        f.write(result.to_json_line() + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_results(path: str | os.PathLike[str]) -> list[CellResult]:
    """Read CELLS.jsonl; a torn last line (worker killed mid-write) is ignored."""
    p = Path(path)
    if not p.exists():
        return []
    out: list[CellResult] = []
    lines = p.read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ConfigError(f"{path}: line {i + 1}: invalid JSON") from None
        out.append(CellResult.from_dict(d, f"{path}: line {i + 1}"))
    return out
