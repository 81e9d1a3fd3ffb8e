"""Run a sweep's server cells: per engine configuration one `vllm serve` on loopback, each of its cells one
`vllm bench serve` run (speclab.server.loadgen) bracketed by two /metrics scrapes; rows go into the same
RUN/results.jsonl as the offline cells (marked `"mode": "server"`).

Layout added to a run directory:
  server/prompts/<workload>-<hash>.jsonl      the token-id prompts (and each request's sampling settings) the
                                              server cells of that workload and sampling setting send
  server/<engine>/attempt-<n>/                serve.yaml (the server's settings), command.txt, server.log
  server/cells/<cell>/result.json, loadgen.log   vllm bench serve's own result (per-request detail) and output

Bounded: a server not healthy within `startup_timeout_s` fails its cells; a load generator still running after
`cell_timeout_s` is stopped and its cell fails; every cell has `num_prompts` requests. Resumable: a cell whose
row is ok is not run again; a killed run loses at most the cell in flight. Servers and load generators are
stopped (process group) on every exit path, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speclab.atomic import atomic_write_text
from speclab.bench.preflight import PromptSet
from speclab.bench.repeats import contended, row_pressure
from speclab.bench.results import ResultsStore, run_lock, write_run_files
from speclab.bench.runner import SweepOutcome
from speclab.bench.sampling import cell_prompts, is_sampled_row
from speclab.bench.spec import SweepSpec
from speclab.engine.launch import describe_exit, log_tail, spawn_child
from speclab.engine.worker import cpu_stall_us
from speclab.errors import ConfigError, SpeclabError
from speclab.procs import kill_group
from speclab.server.arrivals import logged_schedule
from speclab.server.cells import ServerCell, ServerGroup, expand_server_cells, group_server_engines
from speclab.server.loadgen import loadgen_command, write_prompts
from speclab.server.metrics import ServerCounters
from speclab.server.process import Server, loopback_env
from speclab.server.rows import apply_server_baseline, build_server_row, generated_texts, read_result

SERVER_DIR = "server"
# a cell's prompts: the file, the first prompt's ids, the category, the count, how many run with own settings
Prompts = tuple[Path, list[int], str, int, int]


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


# a load generator past its time: SIGTERM, then SIGKILL, 5 s apart
LOADGEN_STOP = ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0))


class _Terminated(Exception):
    pass


def _sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


class ServerRunner:
    def __init__(
        self,
        spec: SweepSpec,
        run_dir: str | Path,
        prompt_provider: Callable[[str], PromptSet],
        *,
        echo: Callable[[str], None] = print,
        spec_text: str | None = None,
        command_line: str | None = None,
        redo: list[str] | None = None,
    ) -> None:
        if spec.server is None:
            raise ConfigError(f"{spec.source}: --server needs a [server] table (request_rates / concurrency)")
        self.spec = spec
        self.sv = spec.server
        self.run_dir = Path(run_dir)
        self.provider = prompt_provider
        self.echo = echo
        self.spec_text = spec_text
        self.command_line = command_line
        self.redo = list(redo or [])
        self.cells = expand_server_cells(spec)
        self.store: ResultsStore | None = None
        self.counts = {"ok": 0, "failed": 0}

    def run(self) -> SweepOutcome:
        with run_lock(self.run_dir):
            old = signal.signal(signal.SIGTERM, _sigterm)
            try:
                return self._run()
            except _Terminated:
                raise KeyboardInterrupt from None
            finally:
                signal.signal(signal.SIGTERM, old)

    # --- internals ---------------------------------------------------------------------------------------
    def _run(self) -> SweepOutcome:
        rd = self.run_dir
        self.store = store = ResultsStore(rd)
        write_run_files(rd, self.spec, self.spec_text, self.command_line)
        if self.redo:
            store.redo([c.cell_id for c in self.cells], self.redo, "server cell")
        skipped = sum(1 for c in self.cells if store.is_ok(c.cell_id))
        if skipped:
            self.echo(f"resuming {rd}: {skipped} of {len(self.cells)} server cells already done")
        groups = group_server_engines(self.spec, self.cells)
        todo: list[ServerGroup] = []
        for g in groups:
            g.cells = [c for c in g.cells if not store.is_ok(c.cell_id)]
            if g.cells:
                todo.append(g)
        try:
            for i, g in enumerate(todo, 1):
                self._run_group(g, i, len(todo))
        except KeyboardInterrupt:
            self.echo(f"interrupted: completed cells are kept in {rd}; rerun the same command to resume")
            raise
        self._refresh_lossless()
        rows = [store.rows[c.cell_id] for c in self.cells if c.cell_id in store.rows]
        return SweepOutcome(
            run_dir=rd,
            total=len(self.cells),
            skipped=skipped,
            recovered=0,
            ok=self.counts["ok"],
            failed=self.counts["failed"],
            rows=rows,
        )

    def _prompts_file(self, cell: ServerCell) -> Prompts:
        """The prompts file of a cell's workload and sampling setting (first n prompts, each with its sampling
        settings), the first prompt's ids, its category, the count and how many run with their own logged
        settings (sampling = "as-logged")."""
        workload, n = cell.workload, cell.num_prompts
        ps = self.provider(workload)
        specs, own = cell_prompts(cell.setting, self.spec.seed, ps, self.spec.max_model_len)
        specs = specs[:n]
        timed = logged_schedule(cell.arrivals, specs, ps, self.spec.max_model_len, workload)
        if timed is not None:
            specs = [specs[i] for i in timed[0]]  # sent in arrival order
        prompts = [(p.id, list(p.prompt_token_ids)) for p in specs]
        sampling = [p.sampling for p in specs]
        if len(prompts) < n:
            self.echo(f"note: {workload}: only {len(prompts)} prompts (asked for {n})")
        # greedy: the blob (and file name) every greedy run had
        blob = json.dumps(
            [prompts, self.spec.max_tokens]
            + ([sampling] if any(sampling) else [])
            + ([timed[1:]] if timed is not None else []),
            separators=(",", ":"),
        )
        digest = hashlib.sha1(blob.encode()).hexdigest()[:8]
        path = self.run_dir / SERVER_DIR / "prompts" / f"{_safe(workload)}-{digest}.jsonl"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            arrival_s, own_max = (timed[1], timed[2]) if timed is not None else (None, None)
            write_prompts(path, prompts, self.spec.max_tokens, sampling, arrival_s, own_max)
        return path, prompts[0][1], ps.category, len(prompts), sum(1 for p in specs if p.id in own)

    def _attempt_dir(self, g: ServerGroup) -> Path:
        base = self.run_dir / SERVER_DIR / g.engine_id
        n = 1
        while (base / f"attempt-{n}").exists():
            n += 1
        return base / f"attempt-{n}"

    def _run_group(self, g: ServerGroup, gi: int, ng: int) -> None:
        files = {c.cell_id: self._prompts_file(c) for c in g.cells}
        workdir = self._attempt_dir(g)
        self.echo(f"[server {gi}/{ng}] {g.engine_id}: starting vllm serve ({len(g.cells)} cell(s))")
        server = Server(g.engine, workdir, self.sv.startup_timeout_s)
        remaining = list(g.cells)
        try:
            with server:
                self.echo(f"  healthy at {server.url} after {server.startup_s:.0f} s")
                first = files[remaining[0].cell_id][1]
                server.warmup(first[:32])
                while remaining:
                    cell = remaining[0]  # popped once recorded: a crash mid-cell fails this cell too
                    self._run_cell(server, g, cell, files[cell.cell_id], workdir)
                    remaining.pop(0)
                    if server.proc is not None and server.proc.poll() is not None:
                        rc = server.proc.returncode
                        raise SpeclabError(f"vllm serve {describe_exit(rc)}: {log_tail(server.log_path)}")
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # a server that did not start or died: its remaining cells fail
            reason = str(exc) if isinstance(exc, SpeclabError) else f"{type(exc).__name__}: {exc}"
            for c in remaining:
                self._fail(c, g, reason[:2000], workdir)

    def _fail(self, cell: ServerCell, g: ServerGroup, reason: str, workdir: Path) -> None:
        assert self.store is not None
        row = build_server_row(
            cell.describe(self.spec),
            None,
            None,
            category="other",
            engine_id=g.engine_id,
            result_file=None,
            server={"log": str(workdir.relative_to(self.run_dir) / "server.log")},
            error=reason,
        )
        self.store.put(row)
        self.counts["failed"] += 1
        self.echo(f"  {cell.cell_id}: failed ({reason[:300]})")

    def _run_cell(
        self,
        server: Server,
        g: ServerGroup,
        cell: ServerCell,
        prompts: Prompts,
        workdir: Path,
    ) -> None:
        assert self.store is not None
        path, _, category, n, own = prompts
        celldir = self.run_dir / SERVER_DIR / "cells" / _safe(cell.cell_id)
        celldir.mkdir(parents=True, exist_ok=True)
        result_path = celldir / "result.json"
        result_path.unlink(missing_ok=True)
        settings = cell.describe(self.spec)
        settings["num_prompts"] = n
        if cell.setting.sampling == "as-logged":
            settings["requests_own_settings"] = own
        cmd = loadgen_command(
            prompts=path.resolve(),
            base_url=server.url,
            tokenizer=server.target,
            num_prompts=n,
            request_rate=cell.request_rate,
            concurrency=cell.concurrency,
            burstiness=self.sv.burstiness,
            seed=self.spec.seed,
            ignore_eos=self.sv.ignore_eos,
            goodput=self.sv.goodput_args(),
            result_dir=celldir.resolve(),
            request_id_prefix=f"{_safe(cell.cell_id)}-",
        )
        atomic_write_text(celldir / "command.txt", " ".join(cmd) + "\n")
        error: str | None = None
        before = server.scrape()
        stall0 = cpu_stall_us()
        t0 = time.time()
        env = loopback_env()
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env["PYTHONUNBUFFERED"] = "1"
        with open(celldir / "loadgen.log", "wb") as log:
            proc = spawn_child(cmd, env, log)
            try:
                rc = proc.wait(timeout=self.sv.cell_timeout_s)
            except subprocess.TimeoutExpired:
                kill_group(proc, LOADGEN_STOP)
                rc = None
                error = f"load generator did not finish within {self.sv.cell_timeout_s:g} s (stopped)"
            except BaseException:
                kill_group(proc, LOADGEN_STOP)
                raise
        elapsed = time.time() - t0
        stall1 = cpu_stall_us()
        pressure = (
            round((stall1 - stall0) / 1e6 / elapsed, 3)
            if stall0 is not None and stall1 is not None and elapsed > 0
            else None
        )
        if rc not in (0, None) and error is None:
            error = f"vllm bench serve {describe_exit(rc)}: {log_tail(celldir / 'loadgen.log')}"
        counters: ServerCounters | None = None
        result = None
        if error is None:
            counters = server.scrape().minus(before)
            try:
                result = read_result(result_path)
            except SpeclabError as exc:
                error = str(exc)
        row = build_server_row(
            settings,
            result,
            counters,
            category=category,
            engine_id=g.engine_id,
            result_file=str(result_path.relative_to(self.run_dir)) if result is not None else None,
            server={
                "startup_s": server.startup_s,
                "log": str((workdir / "server.log").relative_to(self.run_dir)),
                "config": str((workdir / "serve.yaml").relative_to(self.run_dir)),
            },
            error=error,
            cpu_pressure=pressure,
        )
        if row["status"] == "ok" and not cell.is_baseline:
            base_row, base_texts = self._baseline(cell)
            apply_server_baseline(row, generated_texts(result), base_row, base_texts)
        self.store.put(row)
        self.counts["ok" if row["status"] == "ok" else "failed"] += 1
        self.echo("  " + format_server_line(row))

    def _baseline(self, cell: ServerCell) -> tuple[dict[str, Any] | None, list[str] | None]:
        assert self.store is not None
        base = next((c for c in self.cells if c.is_baseline and c.baseline_key == cell.baseline_key), None)
        row = self.store.rows.get(base.cell_id) if base is not None else None
        if row is None or row.get("status") != "ok" or not row.get("result_file"):
            return row, None
        try:
            return row, generated_texts(read_result(self.run_dir / row["result_file"]))
        except SpeclabError:
            return row, None

    def _refresh_lossless(self) -> None:
        """Fill token-exactness of SD rows whose baseline finished after them (e.g. it failed once)."""
        assert self.store is not None
        for c in self.cells:
            row = self.store.rows.get(c.cell_id)
            if c.is_baseline or row is None or row.get("status") != "ok" or row.get("lossless") is not None:
                continue
            if is_sampled_row(row):  # token-exactness does not apply
                continue
            base_row, base_texts = self._baseline(c)
            if base_texts is None or not row.get("result_file"):
                continue
            with contextlib.suppress(SpeclabError):
                mine = generated_texts(read_result(self.run_dir / row["result_file"]))
                apply_server_baseline(row, mine, base_row, base_texts)
                self.store.put(row)


def _ms(lat: dict[str, Any] | None, metric: str, p: str) -> str:
    v = ((lat or {}).get(metric) or {}).get(p)
    return "-" if v is None else f"{v:.0f}"


def format_server_line(row: dict[str, Any]) -> str:
    """One line per finished server cell."""
    load = row.get("load") or {}
    lt = (
        f"{load['request_rate']:g} req/s"
        if load.get("request_rate") is not None
        else f"arrivals {load['arrivals']}"
        if load.get("arrivals")
        else f"conc {load.get('max_concurrency')}"
    )
    head = f"{row.get('label')} {row.get('workload')} @ {lt}"
    if row.get("status") != "ok":
        return f"{head}: failed ({str(row.get('error'))[:300]})"
    lat = row.get("latency_ms")
    parts = [
        f"{row.get('throughput_tok_s') or 0:.1f} tok/s",
        f"TTFT p50/p99 {_ms(lat, 'ttft', 'p50')}/{_ms(lat, 'ttft', 'p99')} ms",
        f"TPOT p50/p99 {_ms(lat, 'tpot', 'p50')}/{_ms(lat, 'tpot', 'p99')} ms",
    ]
    if row.get("request_goodput") is not None:
        parts.append(f"goodput {row['request_goodput']:.2f} req/s")
    if row.get("mean_acceptance_length") is not None:
        parts.append(f"acc.len {row['mean_acceptance_length']:.2f}")
    if row.get("lossless") is not None:
        parts.append("token-exact" if row["lossless"] else "NOT token-exact")
    if contended(row):  # the offline bench's rule (bench.repeats)
        p = row_pressure(row)
        parts.append("contended" + ("" if p is None else f" (CPU pressure {p:.0%})"))
    return f"{head}: " + ", ".join(parts)


def run_server_bench(
    spec: SweepSpec,
    run_dir: str | Path,
    prompt_provider: Callable[[str], PromptSet],
    **kwargs: Any,
) -> SweepOutcome:
    return ServerRunner(spec, run_dir, prompt_provider, **kwargs).run()


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: speclab bench SWEEP --server --out RUN")
