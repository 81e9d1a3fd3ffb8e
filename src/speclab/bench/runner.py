"""Run a sweep: one engine subprocess per engine configuration, results appended cell by cell, resumable.

Layout of a run directory RUN/:
  results.jsonl            one row per cell (CONTRACTS.md section 4), rewritten atomically
  traces/part-<cell>.parquet   the cell's requests: token ids and meta["observed"] per-step acceptance
  timings.csv              profiled step timings of every engine (merged from the attempts)
  sweep.toml, sweep.json   the sweep as given and as understood; command.txt: the command lines that ran
  engines/<engine>/attempt-<n>/{job.json, cells.jsonl, timings.csv, worker.log, categories.json}

Crash safety: the worker appends one line per finished cell and the runner turns each line into a results row
as soon as it appears, so killing the runner, the worker or both loses at most the cell in flight; on the next
run, lines that a worker wrote but the runner never saw are picked up first (nothing is run twice).

How the engines run is a strategy (bench/strategy.py): one after the other (SerialStrategy), repeats
interleaved across resident engines (bench/interleave.py) or as Ray tasks (bench/raybench.py); each calls the
runner's public methods only (SweepHost). Progress, attempts, launch and repeat bookkeeping live in
bench/progress.py, bench/attempts.py, engine/launch.py and bench/repeat_units.py.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speclab.bench.attempts import Attempt, finished_results, merge_timings
from speclab.bench.categories import category_breakdown, prompt_categories
from speclab.bench.cells import Cell, EngineGroup, expand_cells, group_engines
from speclab.bench.interleave import Interleaver, unit_groups
from speclab.bench.preflight import PromptSet
from speclab.bench.progress import Eta, Progress, format_cell_line
from speclab.bench.raybench import RayDispatcher
from speclab.bench.repeat_units import RepeatUnits
from speclab.bench.repeats import apply_pairs, run_entry, runs_done, split_unit, summarise_runs
from speclab.bench.results import (
    ResultsStore,
    apply_baseline,
    baseline_outputs,
    build_row,
    run_lock,
    trace_records,
    write_run_files,
    write_trace_part,
)
from speclab.bench.sampling import cell_prompts
from speclab.bench.spec import SweepSpec
from speclab.bench.strategy import EngineStrategy, SerialStrategy
from speclab.engine.launch import ResultTail
from speclab.engine.protocol import CellResult, RequestResult

# workload -> rendered prompts (the default renders with the target's tokenizer)
PromptProvider = Callable[[str], PromptSet]


@dataclass
class SweepOutcome:
    run_dir: Path
    total: int
    skipped: int  # already ok before this run
    recovered: int  # picked up from a previous run's worker output
    ok: int  # finished ok in this run
    failed: int
    rows: list[dict[str, Any]] = field(default_factory=list)


class _Terminated(Exception):
    pass


def _sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


class SweepRunner(RepeatUnits):
    def __init__(
        self,
        spec: SweepSpec,
        run_dir: str | Path,
        prompt_provider: PromptProvider,
        *,
        progress: bool = True,
        echo: Callable[[str], None] = print,
        poll_s: float = 0.5,
        cell_timeout_s: float | None = None,
        spec_text: str | None = None,
        command_line: str | None = None,
        redo: list[str] | None = None,
        ray_address: str | None = None,
    ) -> None:
        self.spec = spec
        # None: engines one after the other in local subprocesses; else each engine is a Ray task on the
        # cluster at this address ("auto": the running cluster, or a local one on loopback; bench/raybench.py)
        self.ray_address = ray_address
        self.run_dir = Path(run_dir)
        self.prompt_provider = prompt_provider
        self.progress_enabled = progress
        self.echo = echo
        self.poll_s = poll_s
        # a worker that finishes no cell for this long (engine start included) is stopped as hung
        self.cell_timeout_s = cell_timeout_s
        self.redo = list(redo or [])  # cell id globs to measure again even if done
        self._redone: set[str] = set()
        self.spec_text = spec_text
        self.command_line = command_line
        self.cells = expand_cells(spec)
        self.by_id = {c.cell_id: c for c in self.cells}
        self.store: ResultsStore | None = None
        self._prompts: dict[str, PromptSet] = {}
        self._baseline_out_cache: dict[str, dict[str, list[int]]] = {}
        self._progress: Progress | None = None
        self._eta: Eta | None = None
        self.counts = {"ok": 0, "failed": 0, "recovered": 0}

    # --- public ------------------------------------------------------------------------------------------
    def run(self) -> SweepOutcome:
        with run_lock(self.run_dir):
            old = signal.signal(signal.SIGTERM, _sigterm)
            try:
                return self._run()
            finally:
                signal.signal(signal.SIGTERM, old)

    # --- the interface of the strategies (SweepHost, bench/strategy.py) ------------------------------------
    @property
    def progress(self) -> Progress:
        assert self._progress is not None, "the sweep is not running"
        return self._progress

    def cell_ok(self, cell_id: str) -> bool:
        assert self.store is not None
        return self.store.is_ok(cell_id)

    def launched(self, g: EngineGroup) -> None:
        if self._eta is not None:
            self._eta.launched(g)

    def engine_done(self, g: EngineGroup) -> None:
        if self._eta is not None:
            self._eta.engine_done(g)

    # --- internals ---------------------------------------------------------------------------------------
    def _run(self) -> SweepOutcome:
        rd = self.run_dir
        self.store = store = ResultsStore(rd)
        write_run_files(rd, self.spec, self.spec_text, self.command_line)
        if self.redo:
            again = store.redo([c.cell_id for c in self.cells], self.redo)
            self._redone = set(again)
            self.echo(f"measuring {len(again)} cell(s) again: {', '.join(again)}")
        skipped = sum(1 for c in self.cells if not self._missing(c))
        self._recover()
        merge_timings(self.run_dir)
        missing = {c.cell_id: self._missing(c) for c in self.cells}
        pending = [c for c in self.cells if missing[c.cell_id]]
        groups = group_engines(self.spec, self.cells)  # max_num_seqs from all cells, not just pending
        pending_ids = {c.cell_id for c in pending}
        todo = []
        for g in groups:
            g.cells = sorted(
                (c for c in g.cells if c.cell_id in pending_ids),
                key=lambda c: (self.spec.workloads.index(c.workload), c.batching, c.batch_size),
            )
            if g.cells:
                todo.append(g)
        n_recovered = self.counts["recovered"]
        if skipped or n_recovered:
            self.echo(
                f"resuming {rd}: {skipped + n_recovered} of {len(self.cells)} cells already done"
                + (f" ({n_recovered} recovered from a killed run)" if n_recovered else "")
            )
        interleaved = self.spec.repeats > 1 and self.ray_address is None
        if self.spec.repeats > 1:
            todo = unit_groups(todo, missing)
        self._eta = Eta(todo, self.spec.enforce_eager)
        n_units = sum(len(g.cells) for g in todo)
        self._progress = Progress(n_units, self.progress_enabled, self.echo, self._eta)
        strategy: EngineStrategy
        if self.ray_address is not None:
            strategy = RayDispatcher(self, todo, self.ray_address)
        elif interleaved:
            strategy = Interleaver(self, todo)
        else:
            strategy = SerialStrategy(self, todo)
        try:
            strategy.run()
        except (KeyboardInterrupt, _Terminated):
            self._progress.line(
                f"interrupted: completed cells are kept in {rd}; rerun the same command to resume"
            )
            raise KeyboardInterrupt from None
        finally:
            self._progress.close()
            merge_timings(self.run_dir)
        self._refresh_baselines()
        rows = [store.rows[c.cell_id] for c in self.cells if c.cell_id in store.rows]
        return SweepOutcome(
            run_dir=rd,
            total=len(self.cells),
            skipped=skipped,
            recovered=n_recovered,
            ok=self.counts["ok"],
            failed=self.counts["failed"],
            rows=rows,
        )

    def prompts_for(self, workload: str) -> PromptSet:
        ps = self._prompts.get(workload)
        if ps is None:
            ps = self._prompts[workload] = self.prompt_provider(workload)
            if ps.truncated:
                self.echo(
                    f"note: {workload}: {ps.truncated} prompt(s) truncated to {self.spec.prompt_budget} tokens"
                )
            if len(ps.prompts) < self.spec.num_prompts:
                self.echo(
                    f"note: {workload}: only {len(ps.prompts)} prompts (asked for {self.spec.num_prompts})"
                )
        return ps

    def _missing(self, c: Cell) -> list[int]:
        """The repeats of a cell still to measure: all of them unless repeat 1 is ok."""
        assert self.store is not None
        done = runs_done(self.store.rows.get(c.cell_id))
        if 1 not in done:
            return list(range(1, self.spec.repeats + 1))
        return [r for r in range(2, self.spec.repeats + 1) if r not in done]

    def _recover(self) -> None:
        """Ingest cells (and repeats) a previous worker finished but the (killed) runner never recorded."""
        assert self.store is not None
        found = sorted(finished_results(self.run_dir), key=lambda t: split_unit(t[1].cell_id)[1])
        for engine_id, res, prompts, cats in found:
            cid, rep = split_unit(res.cell_id)
            cell = self.by_id.get(cid)
            if cell is None or cid in self._redone or rep not in self._missing(cell):
                continue
            self._ingest(cell, res, prompts, cats.get(cell.workload, "other"), engine_id, count="recovered")

    def attempt_over(self, att: Attempt, rc: int, reason: str, crashes: int) -> tuple[list[Cell], int]:
        """Settle a finished worker run: a crash (OOM, segfault, kill) fails the cell in flight, the one it
        hit; an exit without running a cell fails the cells left. Returns the cells to restart the engine
        for (none: the engine is finished) and the count of crashes in a row without a finished cell.
        `rc`: the worker's exit status; `reason`: why it ended, in one line (for a failed cell's error).
        Shared by the serial path and `--ray` (bench/raybench.py)."""
        assert self._progress is not None
        g = att.group
        remaining = [c for c in att.cells if c.cell_id not in att.done]
        if not remaining:
            return [], 0
        if rc == 0:
            for c in remaining:
                self.fail_unit(c, g, "the worker exited without running this cell")
            return [], 0
        self.fail_unit(remaining[0], g, reason)
        remaining = remaining[1:]
        crashes = 0 if att.done else crashes + 1
        if remaining and crashes >= 2:
            for c in remaining:
                self.fail_unit(c, g, f"not run: engine failed twice in a row ({reason})")
            return [], crashes
        if remaining:
            self._progress.line(
                f"  restarting engine {g.engine_id} for its {len(remaining)} remaining cell(s)"
            )
        return remaining, crashes

    def take_results(self, att: Attempt, results: ResultTail, started: float) -> bool:
        """Ingest the attempt's newly finished cells; True if the worker wrote anything new."""
        assert self._progress is not None
        new = results.read()
        by_id = {c.cell_id: c for c in att.cells}
        for res in new:
            cell = by_id.get(res.cell_id)
            if cell is None or res.cell_id in att.done:
                continue
            att.done.add(cell.cell_id)
            if self._eta is not None:
                startup = time.time() - started - res.elapsed_s if len(att.done) == 1 else None
                self._eta.cell_done(cell, res.elapsed_s, startup)
            self._ingest(
                cell,
                res,
                att.prompts_by_cell[cell.cell_id],
                att.categories[cell.workload],
                att.group.engine_id,
            )
            nxt = next((c for c in att.cells if c.cell_id not in att.done), None)
            if nxt is not None:
                self._progress.status(f"{nxt.method.label} {nxt.workload} b{nxt.batch_size}")
        return bool(new)

    def _fail(self, cell: Cell, g: EngineGroup, reason: str) -> None:
        assert self.store is not None and self._progress is not None
        if self._eta is not None:
            self._eta.cell_dropped(cell)
        res = CellResult(cell_id=cell.cell_id, status="failed", error=reason)
        self._ingest(
            cell,
            res,
            {},
            self._prompts[cell.workload].category if cell.workload in self._prompts else "other",
            g.engine_id,
        )

    def _ingest(
        self,
        cell: Cell,
        res: CellResult,
        prompts: dict[str, list[int]],
        category: str,
        engine_id: str,
        count: str | None = None,
    ) -> None:
        """Turn a worker result into the cell's results row (and trace part) and show it. `count`: the
        counter it adds to (default: "ok" or "failed" by its status). A result for repeat r > 1 (its cell id
        is a unit id) adds a run to the cell's row instead."""
        assert self.store is not None
        cid, rep = split_unit(res.cell_id)
        cell = self.by_id.get(cid, cell)
        if rep > 1:
            self._ingest_repeat(cell, res, rep, count)
            return
        trace_part = None
        sampling, own = self._sampling_of(cell) if res.status == "ok" else ({}, set())
        cats = prompt_categories(self.spec, cell.workload) if res.status == "ok" else {}
        if res.status == "ok":
            trace_part = write_trace_part(
                self.run_dir,
                cell.cell_id,
                trace_records(cell, res, prompts, category, self.spec.max_model_len, sampling, cats),
            )
        base_row, base_out = self._baseline_for(cell)
        row = build_row(
            cell,
            res,
            category=category,
            engine_id=engine_id,
            trace_part=trace_part,
            baseline_row=base_row,
            baseline_out=base_out,
        )
        per_cat = category_breakdown(res, cats, cell.is_baseline)
        if per_cat is not None:
            row["per_category"] = per_cat
        if cell.setting.sampling == "as-logged" and res.status == "ok":
            row["requests_own_settings"] = sum(1 for r in res.requests if r.id in own)
        if self.spec.repeats > 1 and res.status == "ok":
            row["runs"] = [run_entry(res, 1, (row.get("host") or {}).get("loadavg_1m"))]
            summarise_runs(row)
            if base_row is not None and base_row.get("status") == "ok":
                apply_pairs(row, base_row)
        self.store.put(row)
        self.counts[count or ("ok" if res.status == "ok" else "failed")] += 1
        if self._progress is not None:
            self._progress.line(
                format_cell_line(row) + (f"  [repeat 1/{self.spec.repeats}]" if self.spec.repeats > 1 else "")
            )
            self._progress.advance()

    def _sampling_of(self, cell: Cell) -> tuple[dict[str, dict[str, Any]], set[str]]:
        """Each request's sampling in the cell (prompt id -> PromptSpec.sampling; empty for greedy cells) and
        the ids of the requests that ran with their own logged settings (bench/sampling.py)."""
        if not cell.sampled:
            return {}, set()
        specs, own = cell_prompts(
            cell.setting, cell.seed, self.prompts_for(cell.workload), self.spec.max_model_len
        )
        return {p.id: p.sampling for p in specs if p.sampling}, own

    def _baseline_for(self, cell: Cell) -> tuple[dict[str, Any] | None, dict[str, list[int]] | None]:
        assert self.store is not None
        if cell.is_baseline:
            return None, None
        base = next((c for c in self.cells if c.is_baseline and c.baseline_key == cell.baseline_key), None)
        if base is None:
            return None, None
        row = self.store.rows.get(base.cell_id)
        if row is None or row.get("status") != "ok":
            return row, None
        out = self._baseline_out_cache.get(base.cell_id)
        if out is None:
            out = self._baseline_out_cache[base.cell_id] = baseline_outputs(self.run_dir, row)
        return row, out

    def _refresh_baselines(self) -> None:
        """Bring SD rows up to date with their baseline: fill speedup and token-exactness of rows that finished
        before it (e.g. the baseline failed once), and recompute speedups against a re-measured baseline
        (--redo). Token-exactness is taken from the trace parts (first copy of each request)."""
        assert self.store is not None
        for c in self.cells:
            row = self.store.rows.get(c.cell_id)
            if c.is_baseline or row is None or row.get("status") != "ok":
                continue
            base_row, base_out = self._baseline_for(c)
            if base_row is None or base_out is None:
                continue
            if row.get("runs"):  # matched pairs with the baseline's repeats as they are now
                apply_pairs(row, base_row)
                self.store.put(row)
            redone = base_row["cell_id"] in self._redone
            exact_done = (
                row.get("lossless") is not None or c.sampled
            )  # sampled: token-exactness does not apply
            if row.get("speedup") is not None and exact_done and not redone:
                continue
            mine = baseline_outputs(self.run_dir, row)
            fake = CellResult(
                cell_id=c.cell_id,
                status="ok",
                requests=[
                    RequestResult(id=k, copy=0, prompt_len=0, output_token_ids=v) for k, v in mine.items()
                ],
            )
            keep = (row.get("lossless"), row.get("lossless_detail"))
            apply_baseline(row, fake, base_row, base_out)
            if keep[0] is not None and not redone:
                row["lossless"], row["lossless_detail"] = keep
            self.store.put(row)


def run_sweep(
    spec: SweepSpec,
    run_dir: str | Path,
    prompt_provider: PromptProvider,
    **kwargs: Any,
) -> SweepOutcome:
    return SweepRunner(spec, run_dir, prompt_provider, **kwargs).run()
