"""The engine attempts of a run directory: RUN/engines/<engine>/attempt-<n>/ holds one worker run's
job.json, categories.json (workload -> category), cells.jsonl, timings.csv and worker.log.

A new attempt is made for every worker start (the first, and a restart after a crash). What the runner needs
from old attempts: the cells a worker finished that a killed runner never recorded, and the timings.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from speclab.atomic import atomic_write_text
from speclab.bench.cells import Cell, EngineGroup
from speclab.bench.preflight import PromptSet
from speclab.bench.sampling import cell_prompts
from speclab.engine.protocol import CellResult, CellSpec, Job, read_results, write_job
from speclab.errors import ConfigError
from speclab.timings import ALL_COLUMNS, COLUMNS, TimingsRow, cell_temperature, read_timings


@dataclass
class Attempt:
    """One worker run for an engine group: its directory, the cells given to it and those it finished."""

    dir: Path
    group: EngineGroup
    cells: list[Cell]
    prompts_by_cell: dict[str, dict[str, list[int]]]
    categories: dict[str, str]  # workload -> category
    done: set[str] = field(default_factory=set)

    @property
    def job_path(self) -> Path:
        return self.dir / "job.json"

    @property
    def cells_path(self) -> Path:
        return self.dir / "cells.jsonl"

    @property
    def log_path(self) -> Path:
        return self.dir / "worker.log"

    @property
    def gate_path(self) -> Path:
        return self.dir / "gate"


def attempt_dirs(run_dir: Path) -> list[Path]:
    base = run_dir / "engines"
    if not base.exists():
        return []
    return sorted(p for p in base.glob("*/attempt-*") if p.is_dir())


def new_attempt(
    run_dir: Path,
    g: EngineGroup,
    cells: list[Cell],
    prompt_sets: dict[str, PromptSet],
    gated: bool = False,
) -> Attempt:
    """Make the engine's next attempt directory and write its job (the given cells on the group's engine).
    gated: the worker runs only the cells the runner names in the attempt's `gate` file (bench.interleave)."""
    base = run_dir / "engines" / g.engine_id
    n = 1
    while (base / f"attempt-{n}").exists():
        n += 1
    ad = base / f"attempt-{n}"
    ad.mkdir(parents=True)
    cell_specs = [
        CellSpec(
            cell_id=c.cell_id,
            batching=c.batching,
            batch_size=c.batch_size,
            max_tokens=c.max_tokens,
            # each request with the cell's sampling (greedy cells: the prompts as rendered)
            prompts=cell_prompts(c.setting, c.seed, prompt_sets[c.workload], g.engine.max_model_len)[0],
        )
        for c in cells
    ]
    job = Job(
        engine=g.engine,
        cells=cell_specs,
        timings_csv=str((ad / "timings.csv").resolve()),
        gate=str((ad / "gate").resolve()) if gated else None,
    )
    write_job(job, ad / "job.json")
    categories = {w: ps.category for w, ps in prompt_sets.items()}
    atomic_write_text(ad / "categories.json", json.dumps(categories))
    prompts_by_cell = {
        c.cell_id: {p.id: p.prompt_token_ids for p in prompt_sets[c.workload].prompts} for c in cells
    }
    return Attempt(ad, g, list(cells), prompts_by_cell, categories)


def finished_results(
    run_dir: Path,
) -> Iterator[tuple[str, CellResult, dict[str, list[int]], dict[str, str]]]:
    """Every ok result that old workers wrote: (engine id, result, its prompts by id, workload -> category).
    Attempts whose files cannot be read (killed before the job was written) are skipped."""
    for ad in attempt_dirs(run_dir):
        cells_path = ad / "cells.jsonl"
        job_path = ad / "job.json"
        if not cells_path.exists() or not job_path.exists():
            continue
        try:
            results = read_results(cells_path)
            job = json.loads(job_path.read_text())
            cats = json.loads((ad / "categories.json").read_text())
        except (ConfigError, OSError, json.JSONDecodeError):
            continue
        prompts = {
            c["cell_id"]: {p["id"]: p["prompt_token_ids"] for p in c["prompts"]} for c in job.get("cells", [])
        }
        for res in results:
            if res.status == "ok":
                yield ad.parent.name, res, prompts.get(res.cell_id, {}), cats


def merge_timings(run_dir: Path) -> None:
    """RUN/timings.csv = every attempt's timings, one header, torn or malformed lines dropped, and the
    temperature column recovered where an attempt's file lacks it (attempt_timings)."""
    pad = ("",) * (len(ALL_COLUMNS) - len(COLUMNS))
    lines = [",".join((*r.fields, *pad)[: len(ALL_COLUMNS)]) + "\n" for r in run_timings(run_dir)]
    if lines or (run_dir / "timings.csv").exists():
        atomic_write_text(run_dir / "timings.csv", ",".join(ALL_COLUMNS) + "\n" + "".join(lines))


def run_timings(run_dir: Path) -> list[TimingsRow]:
    """Every attempt's timings rows in merge order, each with its temperature (attempt_timings)."""
    return [r for ad in attempt_dirs(run_dir) for r in attempt_timings(ad)]


def attempt_timings(ad: Path) -> list[TimingsRow]:
    """An attempt's timings rows (torn or malformed lines dropped). Rows without a temperature (files
    written before the column) get it recovered from the attempt's cells: the worker appends each ok cell's
    rows after the cell, in the order of cells.jsonl, one "target" row per engine step with a forward,
    followed by that step's draft and overhead rows; so the ok cells' `steps`, in order, cut the rows into
    cells. Where the counts do not match (a step without a forward, a lost append, a torn file) the column
    stays empty: no guess."""
    f = ad / "timings.csv"
    rows = read_timings(f, strict=False) if f.exists() else []
    if not rows or all(r.recorded for r in rows):
        return rows
    temps = _cell_step_temperatures(ad)
    starts = [i for i, r in enumerate(rows) if r.kind == "target"]
    if temps is None or len(temps) != len(starts) or (starts and starts[0] != 0):
        return rows
    out: list[TimingsRow] = []
    for n, a in enumerate(starts):
        b = starts[n + 1] if n + 1 < len(starts) else len(rows)
        out += [with_temperature(r, temps[n]) if not r.recorded else r for r in rows[a:b]]
    return out


def with_temperature(r: TimingsRow, temperature: float) -> TimingsRow:
    """The row with its temperature field set."""
    fields = (*r.fields[: len(COLUMNS)], f"{temperature:g}")
    return dataclasses.replace(r, fields=fields, temperature=float(temperature))


def _cell_step_temperatures(ad: Path) -> list[float] | None:
    """One temperature per engine step of the attempt's ok cells (cells.jsonl order, `steps` each, the
    cell's temperature from its prompts in job.json); None when the files cannot be read."""
    try:
        results = read_results(ad / "cells.jsonl")
        job = json.loads((ad / "job.json").read_text())
        temp = {
            c["cell_id"]: cell_temperature(p.get("sampling") for p in c.get("prompts", []))
            for c in job.get("cells", [])
        }
        out: list[float] = []
        for res in results:
            if res.status == "ok":
                out += [temp[res.cell_id]] * int(res.steps)
        return out
    except (ConfigError, OSError, json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
