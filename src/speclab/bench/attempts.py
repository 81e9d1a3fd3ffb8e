"""The engine attempts of a run directory: RUN/engines/<engine>/attempt-<n>/ holds one worker run's
job.json, categories.json (workload -> category), cells.jsonl, timings.csv and worker.log.

A new attempt is made for every worker start (the first, and a restart after a crash). What the runner needs
from old attempts: the cells a worker finished that a killed runner never recorded, and the timings.
"""

from __future__ import annotations

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
from speclab.timings import ALL_COLUMNS, TimingsRow, attempt_timings, full_fields


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
    lines = [",".join(full_fields(r)) + "\n" for r in run_timings(run_dir)]
    if lines or (run_dir / "timings.csv").exists():
        atomic_write_text(run_dir / "timings.csv", ",".join(ALL_COLUMNS) + "\n" + "".join(lines))


def run_timings(run_dir: Path) -> list[TimingsRow]:
    """Every attempt's timings rows in merge order, each with its temperature where the attempt's file or
    its cells say it (speclab.timings.attempt_timings)."""
    return [r for ad in attempt_dirs(run_dir) for r in attempt_timings(ad)]
