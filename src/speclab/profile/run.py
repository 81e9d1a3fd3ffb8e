"""Run a profile plan on the real engine: one worker per engine (speclab.engine.launch), a progress line per
cell, each engine's step timings in its own CSV, cut into cells afterwards.

Layout of the work directory: engines/<label>/{job.json, cells.jsonl, timings.csv, worker.log}. An engine
whose cells all finished ok in an earlier call is not run again (rerun the same command to resume).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from speclab.engine.launch import ResultTail, describe_exit, launch_worker, log_tail, stop_worker
from speclab.engine.protocol import CellResult, read_results, write_job
from speclab.errors import SpeclabError
from speclab.profile.plan import ProfileCell, ProfileEngine
from speclab.timings import TimingsRow, read_timings


@dataclass
class CellTimings:
    engine: str
    cell: ProfileCell
    rows: list[TimingsRow]

    @property
    def holdout(self) -> bool:
        return self.cell.holdout


def engine_dir(work: Path, eng: ProfileEngine) -> Path:
    return work / "engines" / eng.label


def _complete(d: Path, eng: ProfileEngine) -> bool:
    done = {r.cell_id for r in read_results(d / "cells.jsonl") if r.status == "ok"}
    return all(c.cell_id in done for c in eng.cells) and (d / "timings.csv").is_file()


def run_engine(
    eng: ProfileEngine,
    work: Path,
    echo: Callable[[str], None] = print,
    timeout_s: float = 1800.0,
    prefix: str = "",
) -> list[CellResult]:
    """Run one engine's cells (or reuse a complete earlier run); returns its cell results."""
    d = engine_dir(work, eng)
    if _complete(d, eng):
        echo(f"{prefix}{eng.label}: already measured in {d} (reused)")
        return read_results(d / "cells.jsonl")
    d.mkdir(parents=True, exist_ok=True)
    for name in ("cells.jsonl", "timings.csv"):
        (d / name).unlink(missing_ok=True)
    write_job(eng.job(str((d / "timings.csv").resolve())), d / "job.json")
    tail = ResultTail(d / "cells.jsonl")
    n = len(eng.cells)
    done = 0
    t0 = time.time()
    echo(f"{prefix}{eng.label}: starting the engine ({n} cells)")
    with open(d / "worker.log", "wb") as log:
        proc = launch_worker((d / "job.json").resolve(), (d / "cells.jsonl").resolve(), log=log)
        try:
            while True:
                rc = proc.poll()
                for res in tail.read():
                    done += 1
                    bar = "#" * done + "." * (n - done)
                    what = f"{res.steps} steps in {res.elapsed_s:.1f} s" if res.status == "ok" else res.error
                    echo(f"{prefix}{eng.label} [{bar}] {done}/{n} {res.cell_id}: {what}")
                if rc is not None:
                    break
                if time.time() - t0 > timeout_s:
                    stop_worker(proc)
                    raise SpeclabError(
                        f"profile engine {eng.label}: no result within {timeout_s:.0f} s (stopped)"
                    )
                time.sleep(0.5)
        except BaseException:
            stop_worker(proc)
            raise
    results = read_results(d / "cells.jsonl")
    if rc != 0 and not any(r.status == "ok" for r in results):
        why = log_tail(d / "worker.log")
        raise SpeclabError(
            f"profile engine {eng.label}: worker {describe_exit(rc)}" + (f": {why}" if why else "")
        )
    return results


def cell_timings(eng: ProfileEngine, work: Path) -> list[CellTimings]:
    """The engine's timings CSV cut into its cells. The worker appends a cell's rows after the cell, ok cells
    only, in cell order; a profiled step writes exactly one "target" row, and the cell's result says how
    many steps were profiled (engine_info["profiled_steps"])."""
    d = engine_dir(work, eng)
    path = d / "timings.csv"
    rows = read_timings(path) if path.is_file() else []
    by_id = {c.cell_id: c for c in eng.cells}
    out: list[CellTimings] = []
    i = 0
    for res in read_results(d / "cells.jsonl"):
        if res.status != "ok" or res.cell_id not in by_id:
            continue
        want = int(res.engine_info.get("profiled_steps", 0))
        j, seen = i, 0
        while j < len(rows) and not (rows[j].kind == "target" and seen == want):
            seen += rows[j].kind == "target"
            j += 1
        out.append(CellTimings(eng.label, by_id[res.cell_id], rows[i:j]))
        i = j
    return out
