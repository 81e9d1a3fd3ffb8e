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
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speclab.atomic import atomic_write_text
from speclab.bench.cells import Cell, EngineGroup, expand_cells, group_engines
from speclab.bench.preflight import PromptSet
from speclab.bench.results import (
    ResultsStore,
    apply_baseline,
    baseline_outputs,
    build_row,
    trace_records,
    write_trace_part,
)
from speclab.bench.spec import SweepSpec
from speclab.engine.protocol import TIMINGS_COLUMNS, CellResult, CellSpec, Job, read_results, write_job
from speclab.errors import ConfigError

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


def worker_command() -> list[str]:
    """The command that runs the engine worker (SPECLAB_WORKER_CMD overrides it, e.g. for tests)."""
    override = os.environ.get("SPECLAB_WORKER_CMD")
    if override:
        return shlex.split(override)
    return [sys.executable, "-m", "speclab.engine.worker"]


def worker_env(kv_cache_gib: float) -> dict[str, str]:
    """Environment for the worker: the engine's launcher knows what vLLM needs on this machine."""
    try:
        from speclab.engine.launch import worker_env as _engine_env
    except ImportError:  # pragma: no cover - the engine package ships with speclab
        env = dict(os.environ)
    else:
        env = dict(_engine_env(kv_cache_gib, dict(os.environ)))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    # Linux: the worker gets SIGKILL if the runner dies (even by SIGKILL), so no orphan keeps running.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def _run_lock(run_dir: Path) -> Iterator[None]:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{run_dir}: another `speclab bench` is running on this directory") from None
        yield


class _Terminated(Exception):
    pass


def _sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


class _Eta:
    """Time left: engine start-ups still to come plus each remaining cell's tokens at a learned rate.

    tqdm's own ETA assumes equal steps, but here an engine start (a minute or more) dwarfs a cell at batch 16,
    and a batch-1 cell takes several times as long as a batch-16 one. Rates are learned as cells finish."""

    DRAFT_METHODS = ("draft_model", "eagle", "eagle3", "mtp")

    def __init__(self, groups: list[EngineGroup], eager: bool) -> None:
        self.base_start = 20.0 if eager else 90.0  # s; the facts seen on 2 CPU cores
        self.start_samples: list[float] = []
        self.rate_samples: list[float] = []  # tokens / (s * batch_factor)
        self.pending_starts = {g.engine_id: self._draft_factor(g) for g in groups}
        self.pending_cells = {c.cell_id: self._work(c) for g in groups for c in g.cells}
        self.current_start: tuple[str, float] | None = None  # (engine id, when it was launched)

    def _draft_factor(self, g: EngineGroup) -> float:
        return 2.0 if g.engine.method in self.DRAFT_METHODS else 1.0

    @staticmethod
    def _work(c: Cell) -> float:
        tokens = c.num_prompts * c.max_tokens * (c.batch_size if c.batching == "replicate" else 1)
        return tokens / min(c.batch_size, 16) ** 0.6  # throughput grows sub-linearly with the batch

    def launched(self, g: EngineGroup) -> None:
        self.current_start = (g.engine_id, time.time())

    def cell_done(self, cell: Cell, elapsed_s: float, startup_s: float | None) -> None:
        work = self.pending_cells.pop(cell.cell_id, None)
        if work and elapsed_s > 0:
            self.rate_samples.append(work / elapsed_s)
        if self.current_start is not None:
            eid, _ = self.current_start
            factor = self.pending_starts.pop(eid, None)
            if startup_s is not None and factor:
                self.start_samples.append(startup_s / factor)
            self.current_start = None

    def cell_dropped(self, cell: Cell) -> None:
        self.pending_cells.pop(cell.cell_id, None)

    def engine_done(self, g: EngineGroup) -> None:
        self.pending_starts.pop(g.engine_id, None)
        self.current_start = None

    def remaining_s(self) -> float:
        start = sum(self.start_samples) / len(self.start_samples) if self.start_samples else self.base_start
        rate = sum(self.rate_samples) / len(self.rate_samples) if self.rate_samples else 30.0
        left = sum(self.pending_starts.values()) * start + sum(self.pending_cells.values()) / rate
        if self.current_start is not None:  # part of the running engine's start is already behind us
            eid, t0 = self.current_start
            left -= min(time.time() - t0, self.pending_starts.get(eid, 0.0) * start)
        return max(left, 0.0)


def _fmt_duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class _Progress:
    """tqdm bar (cells done, time left) plus one printed line per finished cell."""

    def __init__(
        self, total: int, enabled: bool, echo: Callable[[str], None], eta: _Eta | None = None
    ) -> None:
        self.echo = echo
        self.eta = eta
        self.bar = None
        self._last_tick = 0.0
        if enabled and total:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                unit="cell",
                dynamic_ncols=True,
                file=sys.stderr,
                bar_format="{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} cells [{elapsed}{postfix}]",
            )

    def status(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(text[:60], refresh=False)
            self.tick(force=True)

    def tick(self, force: bool = False) -> None:
        """Refresh the time-left estimate (at most once a second)."""
        if self.bar is None or self.eta is None:
            return
        now = time.time()
        if force or now - self._last_tick >= 1.0:
            self._last_tick = now
            self.bar.set_postfix_str(f"~{_fmt_duration(self.eta.remaining_s())} left", refresh=True)

    def line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            self.echo(text)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.tick(force=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class SweepRunner:
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
    ) -> None:
        self.spec = spec
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
        self._progress: _Progress | None = None
        self._eta: _Eta | None = None
        self.counts = {"ok": 0, "failed": 0, "recovered": 0}

    # --- public ------------------------------------------------------------------------------------------
    def run(self) -> SweepOutcome:
        with _run_lock(self.run_dir):
            old = signal.signal(signal.SIGTERM, _sigterm)
            try:
                return self._run()
            finally:
                signal.signal(signal.SIGTERM, old)

    # --- internals ---------------------------------------------------------------------------------------
    def _run(self) -> SweepOutcome:
        rd = self.run_dir
        self.store = store = ResultsStore(rd)
        self._write_run_files()
        if self.redo:
            import fnmatch

            again = [c.cell_id for c in self.cells if any(fnmatch.fnmatch(c.cell_id, g) for g in self.redo)]
            if not again:
                raise ConfigError(f"--redo {' '.join(self.redo)}: matches no cell of this sweep")
            for cid in again:
                store.rows.pop(cid, None)
            self._redone = set(again)
            store.flush()
            self.echo(f"measuring {len(again)} cell(s) again: {', '.join(again)}")
        skipped = sum(1 for c in self.cells if store.is_ok(c.cell_id))
        self._recover()
        self._merge_timings()
        pending = [c for c in self.cells if not store.is_ok(c.cell_id)]
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
        self._eta = _Eta(todo, self.spec.enforce_eager)
        self._progress = _Progress(len(pending), self.progress_enabled, self.echo, self._eta)
        try:
            for gi, g in enumerate(todo, 1):
                self._run_group(g, gi, len(todo))
                self._eta.engine_done(g)
        except (KeyboardInterrupt, _Terminated):
            self._progress.line(
                f"interrupted: completed cells are kept in {rd}; rerun the same command to resume"
            )
            raise KeyboardInterrupt from None
        finally:
            self._progress.close()
            self._merge_timings()
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

    def _write_run_files(self) -> None:
        rd = self.run_dir
        if self.spec_text is not None:
            atomic_write_text(rd / "sweep.toml", self.spec_text)
        atomic_write_text(rd / "sweep.json", json.dumps(self.spec.to_dict(), indent=2) + "\n")
        if self.command_line:
            with open(rd / "command.txt", "a") as fh:
                fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  {self.command_line}\n")

    def _prompts_for(self, workload: str) -> PromptSet:
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

    def _attempt_dirs(self) -> list[Path]:
        base = self.run_dir / "engines"
        if not base.exists():
            return []
        return sorted(p for p in base.glob("*/attempt-*") if p.is_dir())

    def _recover(self) -> None:
        """Ingest cells a previous worker finished but the (killed) runner never recorded."""
        assert self.store is not None
        for ad in self._attempt_dirs():
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
                c["cell_id"]: {p["id"]: p["prompt_token_ids"] for p in c["prompts"]}
                for c in job.get("cells", [])
            }
            for res in results:
                cell = self.by_id.get(res.cell_id)
                if (
                    cell is None
                    or res.status != "ok"
                    or self.store.is_ok(res.cell_id)
                    or cell.cell_id in self._redone
                ):
                    continue
                self._ingest(
                    cell, res, prompts.get(res.cell_id, {}), cats.get(cell.workload, "other"), ad.parent.name
                )
                self.counts["recovered"] += 1
                self.counts["ok"] -= 1  # _ingest counted it as run now

    def _next_attempt_dir(self, g: EngineGroup) -> Path:
        base = self.run_dir / "engines" / g.engine_id
        n = 1
        while (base / f"attempt-{n}").exists():
            n += 1
        d = base / f"attempt-{n}"
        d.mkdir(parents=True)
        return d

    def _run_group(self, g: EngineGroup, gi: int, ng: int) -> None:
        assert self._progress is not None
        remaining = list(g.cells)
        no_progress_crashes = 0
        while remaining:
            prompt_sets = {c.workload: self._prompts_for(c.workload) for c in remaining}
            ad = self._next_attempt_dir(g)
            cell_specs = [
                CellSpec(
                    cell_id=c.cell_id,
                    batching=c.batching,
                    batch_size=c.batch_size,
                    max_tokens=c.max_tokens,
                    prompts=prompt_sets[c.workload].prompts,
                )
                for c in remaining
            ]
            job = Job(engine=g.engine, cells=cell_specs, timings_csv=str((ad / "timings.csv").resolve()))
            write_job(job, ad / "job.json")
            atomic_write_text(
                ad / "categories.json", json.dumps({w: ps.category for w, ps in prompt_sets.items()})
            )
            prompts_by_cell = {
                c.cell_id: {p.id: p.prompt_token_ids for p in prompt_sets[c.workload].prompts}
                for c in remaining
            }
            cats = {w: ps.category for w, ps in prompt_sets.items()}
            self._progress.status(f"[engine {gi}/{ng}] {g.engine_id}: starting")
            done, rc, tail = self._run_attempt(g, ad, remaining, prompts_by_cell, cats)
            remaining = [c for c in remaining if c.cell_id not in done]
            if not remaining:
                break
            if rc == 0:
                reason = "the worker exited without running this cell"
                for c in remaining:
                    self._fail(c, g, reason)
                break
            # a crash (OOM, segfault, kill): the cell in flight is the one it hit; restart for the rest
            reason = f"engine worker {_describe_rc(rc)}" + (f": {tail}" if tail else "")
            self._fail(remaining[0], g, reason)
            remaining = remaining[1:]
            no_progress_crashes = 0 if done else no_progress_crashes + 1
            if remaining and no_progress_crashes >= 2:
                for c in remaining:
                    self._fail(c, g, f"not run: engine failed twice in a row ({reason})")
                break
            if remaining:
                self._progress.line(
                    f"  restarting engine {g.engine_id} for its {len(remaining)} remaining cell(s)"
                )

    def _run_attempt(
        self,
        g: EngineGroup,
        ad: Path,
        cells: list[Cell],
        prompts_by_cell: dict[str, dict[str, list[int]]],
        cats: dict[str, str],
    ) -> tuple[set[str], int, str]:
        assert self._progress is not None
        cells_path = ad / "cells.jsonl"
        log_path = ad / "worker.log"
        cmd = [
            *worker_command(),
            "--job",
            str((ad / "job.json").resolve()),
            "--out",
            str(cells_path.resolve()),
        ]
        by_id = {c.cell_id: c for c in cells}
        done: set[str] = set()
        offset = 0
        t0 = last = time.time()
        hung = False
        if self._eta is not None:
            self._eta.launched(g)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=worker_env(g.engine.kv_cache_gib),
                start_new_session=True,  # Ctrl-C reaches the runner only; it then stops the worker cleanly
                preexec_fn=_die_with_parent,
            )
            try:
                while True:
                    rc = proc.poll()
                    offset, lines = _read_new_lines(cells_path, offset)
                    for line in lines:
                        res = _parse_line(line, cells_path)
                        if res is None or res.cell_id not in by_id or res.cell_id in done:
                            continue
                        cell = by_id[res.cell_id]
                        done.add(cell.cell_id)
                        if self._eta is not None:
                            startup = time.time() - t0 - res.elapsed_s if len(done) == 1 else None
                            self._eta.cell_done(cell, res.elapsed_s, startup)
                        self._ingest(
                            cell, res, prompts_by_cell[cell.cell_id], cats[cell.workload], g.engine_id
                        )
                        nxt = next((c for c in cells if c.cell_id not in done), None)
                        if nxt is not None:
                            self._progress.status(f"{nxt.method.label} {nxt.workload} b{nxt.batch_size}")
                    if rc is not None:
                        break
                    if lines:
                        last = time.time()
                    if self.cell_timeout_s and time.time() - last > self.cell_timeout_s:
                        _stop(proc)
                        hung = True
                        rc = proc.returncode if proc.returncode is not None else -9
                        break
                    self._progress.tick()
                    if not done and time.time() - t0 > 1:
                        self._progress.status(f"{g.engine_id}: starting engine ({time.time() - t0:.0f}s)")
                    time.sleep(self.poll_s)
            except BaseException:
                _stop(proc)
                offset, lines = _read_new_lines(cells_path, offset)
                for line in lines:  # keep what finished while we were stopping
                    res = _parse_line(line, cells_path)
                    if res is not None and res.cell_id in by_id and res.cell_id not in done:
                        done.add(res.cell_id)
                        self._ingest(
                            by_id[res.cell_id],
                            res,
                            prompts_by_cell[res.cell_id],
                            cats[by_id[res.cell_id].workload],
                            g.engine_id,
                        )
                raise
        if hung:
            return done, rc, f"no cell finished within {self.cell_timeout_s:.0f} s (hung? stopped)"
        return done, rc, _log_tail(log_path)

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
        self, cell: Cell, res: CellResult, prompts: dict[str, list[int]], category: str, engine_id: str
    ) -> None:
        assert self.store is not None
        trace_part = None
        if res.status == "ok":
            trace_part = write_trace_part(
                self.run_dir,
                cell.cell_id,
                trace_records(cell, res, prompts, category, self.spec.max_model_len),
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
        self.store.put(row)
        if res.status == "ok":
            self.counts["ok"] += 1
        else:
            self.counts["failed"] += 1
        if self._progress is not None:
            self._progress.line(format_cell_line(row))
            self._progress.advance()

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
        from speclab.engine.protocol import RequestResult

        for c in self.cells:
            row = self.store.rows.get(c.cell_id)
            if c.is_baseline or row is None or row.get("status") != "ok":
                continue
            base_row, base_out = self._baseline_for(c)
            if base_row is None or base_out is None:
                continue
            redone = base_row["cell_id"] in self._redone
            if row.get("speedup") is not None and row.get("lossless") is not None and not redone:
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

    def _merge_timings(self) -> None:
        """RUN/timings.csv = every attempt's timings, one header, torn or malformed lines dropped."""
        header = ",".join(TIMINGS_COLUMNS)
        lines: list[str] = []
        for ad in self._attempt_dirs():
            f = ad / "timings.csv"
            if not f.exists():
                continue
            text = f.read_text()
            if not text.endswith("\n"):
                text = text[: text.rfind("\n") + 1]  # a torn last line from a killed worker
            for line in text.splitlines():
                if not line.strip() or line.strip() == header:
                    continue
                if line.count(",") != len(TIMINGS_COLUMNS) - 1:
                    continue
                lines.append(line)
        if lines or (self.run_dir / "timings.csv").exists():
            atomic_write_text(self.run_dir / "timings.csv", header + "\n" + "".join(x + "\n" for x in lines))


# --- helpers ----------------------------------------------------------------------------------------------


def _read_new_lines(path: Path, offset: int) -> tuple[int, list[str]]:
    """Complete lines appended since `offset` (a line still being written is left for later)."""
    if not path.exists():
        return offset, []
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read()
    end = data.rfind(b"\n")
    if end < 0:
        return offset, []
    chunk = data[: end + 1]
    return offset + len(chunk), [ln for ln in chunk.decode("utf-8", "replace").splitlines() if ln.strip()]


def _parse_line(line: str, path: Path) -> CellResult | None:
    try:
        return CellResult.from_dict(json.loads(line), f"{path}")
    except (json.JSONDecodeError, ConfigError):
        return None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the worker and anything it started (its own session), politely first."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _describe_rc(rc: int) -> str:
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        hint = " (killed: out of memory?)" if -rc == signal.SIGKILL else ""
        return f"died with {name}{hint}"
    if rc == 137:
        return "exited with 137 (killed: out of memory?)"
    return f"exited with code {rc}"


def _log_tail(path: Path) -> str:
    """The last meaningful line of the worker log, for a one-line error."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    for ln in reversed(lines):
        if "Error" in ln or "error" in ln or "Killed" in ln:
            return ln[:300]
    return lines[-1][:300] if lines else ""


def format_cell_line(row: dict[str, Any]) -> str:
    head = f"  {row['label']:<16} {row['workload']:<20} {row['batching'][:4]} b{row['batch_size']:<4}"
    if row.get("status") != "ok":
        return f"{head} FAILED: {row.get('error')}"
    tput = row.get("throughput_tok_s") or 0.0
    parts = [f"{tput:8.1f} tok/s"]
    if row.get("speedup") is not None and row["method"] != "none":
        parts.append(f"{row['speedup']:.2f}x")
    if row.get("mean_acceptance_length") is not None:
        parts.append(f"acc.len {row['mean_acceptance_length']:.2f}")
    if row.get("lossless") is not None:
        parts.append("token-exact" if row["lossless"] else "OUTPUTS DIFFER")
    return f"{head} " + "  ".join(parts)


def run_sweep(
    spec: SweepSpec,
    run_dir: str | Path,
    prompt_provider: PromptProvider,
    **kwargs: Any,
) -> SweepOutcome:
    return SweepRunner(spec, run_dir, prompt_provider, **kwargs).run()
