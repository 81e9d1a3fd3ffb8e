"""The profiled step-timings table (CONTRACTS.md section 5): its columns, its writer and its one reader.

The engine worker appends rows, the sweep runner merges every attempt's file into RUN/timings.csv and the
cost-model fit reads it. This module sits between them (no heavy imports) so that the engine protocol does
not depend on the fit and nobody parses the file a second way.

Columns: kind,kv_tokens,batched_tokens,num_spec_tokens,num_requests,seconds, and optionally a trailing
temperature. kind is "target" (one target forward), "draft:<method>" (one proposer call for the batch) or
"overhead" (the rest of the step). temperature: the highest sampling temperature among the requests of the
cell the step belongs to (0 = every request greedy); empty = not recorded (files written before the column,
read as greedy; bench.attempts can recover it for a bench run). A file without the column reads as before.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speclab.errors import ConfigError

# Largest value in a timings row: far above any token count or step time, small enough that squares and sums
# in the fit stay finite.
MAX_VALUE = 1e12

COLUMNS: tuple[str, ...] = (
    "kind",
    "kv_tokens",
    "batched_tokens",
    "num_spec_tokens",
    "num_requests",
    "seconds",
)
# optional trailing columns: a file may lack them (every file written before they existed)
OPTIONAL_COLUMNS: tuple[str, ...] = ("temperature",)
ALL_COLUMNS = COLUMNS + OPTIONAL_COLUMNS


@dataclass(frozen=True)
class TimingsRow:
    kind: str
    values: tuple[float, ...]  # COLUMNS[1:], an empty field read as 0
    fields: tuple[str, ...]  # the row as written (COLUMNS, and the temperature where the file has it)
    temperature: float = 0.0  # the step's sampling temperature (0: greedy or not recorded)
    # an "overhead" row: its step ran the drafter (a draft:<method> row came between its target row and
    # it; read_timings sets it from the file's order, speclab.engine.instrument.StepProfiler.end_step)
    drafted: bool = False

    @property
    def sampled(self) -> bool:
        return self.temperature > 0.0

    @property
    def recorded(self) -> bool:
        """Whether the row says which sampling it ran with (its temperature field is not empty)."""
        return len(self.fields) > len(COLUMNS) and self.fields[len(COLUMNS)] != ""


def append_timings(path: str | os.PathLike[str], rows: Iterable[Sequence[object]]) -> None:
    """Append rows (in COLUMNS order, optionally with the temperature after them) to a timings CSV, writing
    the header first if the file is new (with the temperature column when the first row has it)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    new = not p.exists() or p.stat().st_size == 0
    with open(p, "a", newline="") as f:
        w = csv.writer(f)
        for r in rows:
            if new:
                w.writerow(ALL_COLUMNS if len(r) > len(COLUMNS) else COLUMNS)
                new = False
            w.writerow(r)
        if new:
            w.writerow(COLUMNS)
        f.flush()


def read_timings(path: str | os.PathLike[str], *, strict: bool = True) -> list[TimingsRow]:
    """The rows of a timings CSV. strict: any bad line is a ConfigError naming it. Not strict (a worker's
    file, possibly cut short by a kill): a torn last line, bad lines and a file without the header are
    skipped."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); binary file?"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read timings CSV ({exc.strerror})") from None
    if not strict and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]  # a torn last line from a killed worker
    out: list[TimingsRow] = []
    with io.StringIO(text, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, [])
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            if not strict:
                return []
            raise ConfigError(
                f"{path}: line 1: missing column(s) {', '.join(missing)} (need {','.join(COLUMNS)})"
            )
        index = [header.index(c) if c in header else -1 for c in ALL_COLUMNS]
        drafted = False  # the current step (since its target row) has a draft row
        for lineno, raw in enumerate(reader, 2):
            if not raw:
                continue
            try:
                row = _row(raw, index, header, lineno, path)
            except ConfigError:
                if strict:
                    raise
                continue
            if row.kind == "target":
                drafted = False
            elif row.kind != "overhead":
                drafted = True
            elif drafted:
                row = dataclasses.replace(row, drafted=True)
            out.append(row)
    return out


def _row(raw: list[str], index: list[int], header: list[str], lineno: int, path: object) -> TimingsRow:
    if len(raw) != len(header):  # a torn or mangled line
        raise ConfigError(f"{path}: line {lineno}: {len(raw)} fields, the header has {len(header)}")
    fields = [raw[i].strip() if i >= 0 else "" for i in index]
    kind = fields[0]
    if kind not in ("target", "overhead") and not kind.startswith("draft:"):
        raise ConfigError(
            f"{path}: line {lineno}: field kind: {kind!r} not target, overhead or draft:<method>"
        )
    vals = []
    for name, field in zip(ALL_COLUMNS[1:], fields[1:], strict=True):
        try:
            v = float(field) if field else 0.0
        except ValueError:
            raise ConfigError(f"{path}: line {lineno}: field {name}: not a number: {field!r}") from None
        if not math.isfinite(v) or not 0 <= v <= MAX_VALUE:
            raise ConfigError(
                f"{path}: line {lineno}: field {name}: must be a finite number in 0..{MAX_VALUE:g}, got {field!r}"
            )
        vals.append(v)
    n = len(COLUMNS) - 1
    kept = fields if index[-1] >= 0 else fields[: len(COLUMNS)]  # as written: no column, no field
    return TimingsRow(kind=kind, values=tuple(vals[:n]), fields=tuple(kept), temperature=vals[n])


def cell_temperature(samplings: Iterable[Mapping[str, Any] | None]) -> float:
    """The temperature column's value for a cell whose requests have these sampling settings
    (PromptSpec.sampling; None = greedy): the highest temperature (0 when every request is greedy)."""
    return max((float((s or {}).get("temperature") or 0.0) for s in samplings), default=0.0)


def attempt_timings(ad: str | os.PathLike[str]) -> list[TimingsRow]:
    """An engine attempt's timings rows (AD/timings.csv, torn or malformed lines dropped), each with its
    temperature where the file or the attempt's cells say it (recover_temperatures)."""
    f = Path(ad) / "timings.csv"
    return recover_temperatures(read_timings(f, strict=False), ad) if f.exists() else []


def recover_temperatures(rows: list[TimingsRow], ad: str | os.PathLike[str]) -> list[TimingsRow]:
    """The timings rows of engine attempt AD (files written before the temperature column) with the
    temperature recovered from the attempt's cells (AD/cells.jsonl, AD/job.json). The worker appends each
    ok cell's rows after the cell, in the order of cells.jsonl: per engine step with a forward a "target"
    row followed by that step's draft and overhead rows (speclab.engine.instrument.StepProfiler.end_step);
    so the ok cells' `steps`, in order, cut the rows into cells. Where the counts do not match (a step
    without a forward, a lost append, a torn file) the rows are returned as they are: no guess."""
    if not rows or all(r.recorded for r in rows):
        return rows
    temps = _cell_step_temperatures(Path(ad))
    starts = [i for i, r in enumerate(rows) if r.kind == "target"]
    if temps is None or len(temps) != len(starts) or (starts and starts[0] != 0):
        return rows
    out: list[TimingsRow] = []
    for n, a in enumerate(starts):
        b = starts[n + 1] if n + 1 < len(starts) else len(rows)
        out += [r if r.recorded else with_temperature(r, temps[n]) for r in rows[a:b]]
    return out


def full_fields(r: TimingsRow) -> tuple[str, ...]:
    """The row's fields in ALL_COLUMNS order ("" for a column its file lacks): rows of files with and
    without the temperature column written to one file."""
    return (*r.fields, *("",) * len(ALL_COLUMNS))[: len(ALL_COLUMNS)]


def with_temperature(r: TimingsRow, temperature: float) -> TimingsRow:
    """The row with its temperature field set."""
    fields = (*r.fields[: len(COLUMNS)], f"{temperature:g}")
    return dataclasses.replace(r, fields=fields, temperature=float(temperature))


def _cell_step_temperatures(ad: Path) -> list[float] | None:
    """One temperature per engine step of the attempt's ok cells (cells.jsonl order, `steps` each; a cell's
    temperature from its prompts' sampling in job.json); None when the files cannot be read. Reads only
    the fields it needs (cell_id, status, steps), so this module stays free of the engine protocol."""
    try:
        lines = (ad / "cells.jsonl").read_text(encoding="utf-8").splitlines()
        job = json.loads((ad / "job.json").read_text(encoding="utf-8"))
        temp = {
            c["cell_id"]: cell_temperature(p.get("sampling") for p in c.get("prompts", []))
            for c in job.get("cells", [])
        }
        out: list[float] = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    break  # a torn last line: that cell's timings were never appended
                return None
            if d.get("status") == "ok":
                out += [temp[d["cell_id"]]] * int(d["steps"])
        return out
    except (
        OSError,
        UnicodeDecodeError,
        json.JSONDecodeError,
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
    ):
        return None
