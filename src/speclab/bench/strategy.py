"""How a sweep's engines run. The runner (bench/runner.py, SweepRunner) owns the run directory, the results
store, the progress display and the bookkeeping of cells and repeats; a strategy decides when and where each
engine worker runs, and hands every result and failure back through the runner's public methods (SweepHost):

- SerialStrategy (here): engines one after the other, each in a local worker subprocess;
- Interleaver (bench/interleave.py): repeats interleaved across engines that are kept resident;
- RayDispatcher (bench/raybench.py): each engine as one Ray task.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from speclab.bench.attempts import Attempt, new_attempt
from speclab.bench.cells import Cell, EngineGroup
from speclab.bench.preflight import PromptSet
from speclab.bench.progress import Progress
from speclab.bench.spec import SweepSpec
from speclab.engine.launch import ResultTail, describe_exit, launch_worker, log_tail, stop_worker


class SweepHost(Protocol):
    """What a strategy may use of the runner."""

    spec: SweepSpec
    run_dir: Path
    poll_s: float  # how often a strategy looks at its workers
    cell_timeout_s: float | None  # a worker that finishes no cell for this long is stopped as hung
    echo: Callable[[str], None]

    @property
    def progress(self) -> Progress:
        """The progress display (status line, result lines, ticks)."""
        ...

    def prompts_for(self, workload: str) -> PromptSet:
        """The workload's rendered prompts (rendered once per sweep)."""
        ...

    def cell_ok(self, cell_id: str) -> bool:
        """Whether the cell's row is ok (a later repeat needs repeat 1 to be)."""
        ...

    def launched(self, g: EngineGroup) -> None:
        """An engine worker for `g` was started (for the time estimate)."""
        ...

    def engine_done(self, g: EngineGroup) -> None:
        """No more cells run on `g`'s engine (for the time estimate)."""
        ...

    def take_results(self, att: Attempt, results: ResultTail, started: float) -> bool:
        """Record the cells the attempt's worker finished since the last call; True if there were any."""
        ...

    def attempt_over(self, att: Attempt, rc: int, reason: str, crashes: int) -> tuple[list[Cell], int]:
        """Settle a finished worker run; returns the cells to restart the engine for and the crash count."""
        ...

    def fail_unit(self, unit: Cell, g: EngineGroup, reason: str) -> None:
        """A cell (or repeat) that did not run, with the reason."""
        ...

    def drop_unit(self, unit: Cell) -> None:
        """A later repeat of a cell whose repeat 1 failed: not run, not counted."""
        ...


class EngineStrategy(Protocol):
    def run(self) -> None:
        """Run every pending cell of the groups it was given, reporting to its host."""
        ...


class SerialStrategy:
    """Engines one after the other; a worker that crashes is restarted for the cells it had left."""

    def __init__(self, host: SweepHost, groups: list[EngineGroup]) -> None:
        self.host = host
        self.groups = groups

    def run(self) -> None:
        for gi, g in enumerate(self.groups, 1):
            self._run_group(g, gi, len(self.groups))
            self.host.engine_done(g)

    def _run_group(self, g: EngineGroup, gi: int, ng: int) -> None:
        h = self.host
        remaining = list(g.cells)
        no_progress_crashes = 0
        while remaining:
            prompt_sets = {c.workload: h.prompts_for(c.workload) for c in remaining}
            att = new_attempt(h.run_dir, g, remaining, prompt_sets)
            h.progress.status(f"[engine {gi}/{ng}] {g.engine_id}: starting")
            rc, tail = self._run_attempt(att)
            reason = f"engine worker {describe_exit(rc)}" + (f": {tail}" if tail else "")
            remaining, no_progress_crashes = h.attempt_over(att, rc, reason, no_progress_crashes)

    def _run_attempt(self, att: Attempt) -> tuple[int, str]:
        """Run one worker over the attempt's cells, recording each result as it appears.
        Returns the worker's return code and a one-line reason from its log."""
        h = self.host
        g = att.group
        results = ResultTail(att.cells_path)
        started = last = time.time()
        h.launched(g)
        with open(att.log_path, "wb") as log:
            proc = launch_worker(
                att.job_path.resolve(), att.cells_path.resolve(), kv_cache_gib=g.engine.kv_cache_gib, log=log
            )
            try:
                while True:
                    rc = proc.poll()
                    if h.take_results(att, results, started):
                        last = time.time()
                    if rc is not None:
                        break
                    if h.cell_timeout_s and time.time() - last > h.cell_timeout_s:
                        stop_worker(proc)
                        rc = proc.returncode if proc.returncode is not None else -9
                        return rc, f"no cell finished within {h.cell_timeout_s:.0f} s (hung? stopped)"
                    h.progress.tick()
                    if not att.done and time.time() - started > 1:
                        h.progress.status(f"{g.engine_id}: starting engine ({time.time() - started:.0f}s)")
                    time.sleep(h.poll_s)
            except BaseException:
                stop_worker(proc)
                h.take_results(att, results, started)  # keep what finished while we were stopping
                raise
        return rc, log_tail(att.log_path)
