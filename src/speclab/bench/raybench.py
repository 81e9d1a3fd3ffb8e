"""`speclab bench SWEEP --ray [ADDRESS]`: every engine configuration of a sweep as one Ray task.

Node side (`stream_job`, run as a Ray streaming-generator task): the task writes the engine's job to a
temporary directory on its node, runs the usual engine worker subprocess there (engine/launch.py) and
yields each cell line the worker appends to its CELLS.jsonl (and its new timing rows) as soon as the line is
complete, then the worker's exit status and log. Nothing needs a shared filesystem: the job travels as the
task's argument, results come back in the stream. The node needs speclab, vLLM and the sweep's models (the
worker resolves a preset name in that node's $SPECLAB_CACHE).

Driver side (`RayDispatcher`): for each engine it makes the attempt directory exactly as the serial path does
(RUN/engines/<engine>/attempt-<n>/job.json), appends each streamed line to that attempt's cells.jsonl and
timings.csv, and hands it to the runner's own ingest (`SweepHost.take_results`, bench/strategy.py). So results.jsonl,
traces and resume are those of the serial path, and a killed driver resumes from them.

Resources: an engine on a GPU cluster asks for `num_gpus = tensor_parallel_size`; on CPUs it asks for one
unit of the custom resource `speclab_engine`, which a machine declares once (`ray start ... --resources
'{"speclab_engine": 1}'`): a CPU engine uses every core of its machine, so one unit per machine lets one
engine run there at a time however many Ray workers (CPU slots) the node has.

Failures: Ray's own task retry would replay the stream from the start with the original job (and Ray fails
a replayed stream whose length differs), so tasks run with max_retries=0 and the dispatcher retries itself:
when Ray loses a task (its worker process or node died) it submits a new task for the cells still missing
(the done set left out), without failing the cell that was in flight; after LOST_RETRIES losses in a row
without a finished cell the engine's cells fail. A crash of the engine worker itself (exit status, hang) is
treated as in the serial path (`SweepHost.attempt_over`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from speclab.bench.attempts import Attempt, new_attempt
from speclab.bench.cells import Cell, EngineGroup
from speclab.bench.repeats import split_unit
from speclab.bench.strategy import SweepHost
from speclab.engine.launch import ResultTail, describe_exit, launch_worker, log_tail, stop_worker
from speclab.engine.protocol import EngineSpec
from speclab.errors import ConfigError
from speclab.raycluster import ray_cluster

ENGINE_RESOURCE = "speclab_engine"
LOST_RETRIES = 3  # Ray losing an engine's task this many times in a row without a finished cell: give up
LOG_BYTES = 64 << 10  # the end of the worker log sent back with the exit status
TMP_PREFIX = "speclab-ray-"  # a task's directory on its node (job, cells, timings, log), removed at its end


# --- node side -----------------------------------------------------------------------------------------------
class _Lines:
    """The complete lines appended to a file since the last read (a line still being written waits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> str:
        if not self.path.exists():
            return ""
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n")
        if end < 0:
            return ""
        self.offset += end + 1
        return data[: end + 1].decode("utf-8", "replace")


def stream_job(
    job: dict[str, Any],
    cell_timeout_s: float | None = None,
    poll_s: float = 0.5,
    omp_threads: str | None = None,
) -> Iterator[dict]:
    """Run the engine worker over `job` (Job.to_dict()) on this machine and yield, in order:
    {"node": host, "pid": this process} once; {"cells": lines, "timings": lines} whenever the worker wrote
    complete lines; {"exit": status, "reason": one line, "log": the log's end} last. `cell_timeout_s`: stop a
    worker that finishes no cell for that long (start-up included), as the serial runner does."""
    _sweep_stale_dirs()
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
    (tmp / "owner.pid").write_text(str(os.getpid()))
    proc = None
    try:
        job = dict(job, timings_csv=str(tmp / "timings.csv"))
        job.pop("gate", None)  # repeats run back to back in the task, not gated
        (tmp / "job.json").write_text(json.dumps(job))
        cells, timings = _Lines(tmp / "cells.jsonl"), _Lines(tmp / "timings.csv")
        yield {"node": socket.gethostname(), "pid": os.getpid()}
        reason = ""
        with open(tmp / "worker.log", "wb") as log:
            env = worker_threads_env(dict(os.environ), omp_threads)
            proc = launch_worker(tmp / "job.json", tmp / "cells.jsonl", log=log, env=env)
            last = time.time()
            while True:
                rc = proc.poll()
                new_cells, new_timings = cells.read(), timings.read()
                if new_cells or new_timings:
                    yield {"cells": new_cells, "timings": new_timings}
                    if new_cells:
                        last = time.time()
                if rc is not None:
                    break
                if cell_timeout_s and time.time() - last > cell_timeout_s:
                    stop_worker(proc)
                    rc = proc.returncode if proc.returncode is not None else -9
                    reason = f"no cell finished within {cell_timeout_s:.0f} s (hung? stopped)"
                    break
                time.sleep(poll_s)
        new_cells, new_timings = cells.read(), timings.read()  # what it wrote while being stopped
        if new_cells or new_timings:
            yield {"cells": new_cells, "timings": new_timings}
        if not reason:
            tail = log_tail(tmp / "worker.log")
            reason = f"engine worker {describe_exit(rc)}" + (f": {tail}" if tail else "")
        with open(tmp / "worker.log", "rb") as fh:
            fh.seek(max(0, (tmp / "worker.log").stat().st_size - LOG_BYTES))
            log_end = fh.read().decode("utf-8", "replace")
        yield {"exit": rc, "reason": reason, "log": log_end}
    finally:
        if proc is not None:  # the stream was closed or cancelled: the engine goes with it
            stop_worker(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def _sweep_stale_dirs() -> None:
    """Remove the directories of earlier tasks on this node whose process was killed (no finally ran)."""
    for d in Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}*"):
        try:
            pid = int((d / "owner.pid").read_text())
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (OSError, ValueError):  # being created, or not ours to judge
            continue


def engine_task(
    job: dict[str, Any], cell_timeout_s: float | None, poll_s: float, omp_threads: str | None = None
) -> Iterator[dict]:
    """The Ray task body (a module-level generator, so Ray ships it by reference to speclab)."""
    yield from stream_job(job, cell_timeout_s, poll_s, omp_threads=omp_threads)


def worker_threads_env(base: dict[str, str], omp_threads: str | None) -> dict[str, str]:
    """The engine worker's environment on a Ray node. Ray sets OMP_NUM_THREADS to the task's num_cpus (1)
    in its workers; the engine holds the node's one engine slot and must use its cores as the serial path
    does (measured: a B=1 engine ran ~1.5x slower with Ray's 1 thread). The driver's own setting, if any,
    is kept."""
    env = dict(base)
    env.pop("OMP_NUM_THREADS", None)
    if omp_threads:
        env["OMP_NUM_THREADS"] = omp_threads
    return env


# --- resources -----------------------------------------------------------------------------------------------
def engine_request(engine: EngineSpec, gpus_per_node: float) -> dict[str, Any]:
    """The Ray resource request of one engine: its tensor-parallel GPUs on a GPU cluster, else one unit of
    ENGINE_RESOURCE (one engine per machine at a time). One CPU for the task that tends the worker."""
    if gpus_per_node > 0:
        tp = engine.llm_kwargs.get("tensor_parallel_size", 1)
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise ConfigError(f"llm_kwargs.tensor_parallel_size {tp!r}: need an integer >= 1")
        if tp > gpus_per_node:
            raise ConfigError(
                f"engine {engine.method} needs {tp} GPUs (tensor_parallel_size) but no Ray node has more "
                f"than {gpus_per_node:g}"
            )
        return {"num_cpus": 1, "num_gpus": tp}
    return {"num_cpus": 1, "resources": {ENGINE_RESOURCE: 1}}


def cluster_gpus(nodes: list[dict[str, Any]], totals: dict[str, float]) -> float:
    """The most GPUs on one alive node (0: a CPU cluster); checks that a CPU cluster can run an engine."""
    gpus = max((float(n.get("Resources", {}).get("GPU", 0)) for n in nodes if n.get("Alive")), default=0.0)
    if gpus <= 0 and totals.get(ENGINE_RESOURCE, 0) < 1:
        raise ConfigError(
            f"the Ray cluster has no GPU and no {ENGINE_RESOURCE!r} resource, so no engine could be placed: "
            f"start each CPU machine's node with --resources '{{\"{ENGINE_RESOURCE}\": 1}}' (one engine per "
            "machine at a time; docs/bench.md)"
        )
    return gpus


# --- the task layer (Ray, or a stand-in in tests) --------------------------------------------------------------
class TaskLayer(Protocol):
    gpus_per_node: float

    def submit(self, job: dict[str, Any], request: dict[str, Any], cell_timeout_s: float | None) -> Any: ...

    def poll(self, handles: list[Any], timeout_s: float) -> list[tuple[Any, str, Any]]:
        """Events of the given tasks: (handle, "item", dict) | (handle, "end", None) | (handle, "error",
        message: the task raised) | (handle, "lost", message: Ray lost the task or its node)."""
        ...

    def cancel(self, handle: Any) -> None: ...


class RayTasks:
    """TaskLayer on a Ray cluster: streaming-generator tasks, polled with ray.wait."""

    def __init__(self, ray: Any, poll_s: float) -> None:
        self.ray = ray
        self.poll_s = poll_s
        self.fn = ray.remote(num_returns="streaming", max_retries=0)(engine_task)
        self.gpus_per_node = cluster_gpus(ray.nodes(), ray.cluster_resources())

    def submit(self, job: dict[str, Any], request: dict[str, Any], cell_timeout_s: float | None) -> Any:
        threads = os.environ.get("OMP_NUM_THREADS")  # the driver's, not Ray's per-task 1
        return self.fn.options(**request).remote(job, cell_timeout_s, self.poll_s, threads)

    def poll(self, handles: list[Any], timeout_s: float) -> list[tuple[Any, str, Any]]:
        if not handles:
            return []
        ray = self.ray
        ready, _ = ray.wait(handles, num_returns=len(handles), timeout=timeout_s)
        out: list[tuple[Any, str, Any]] = []
        for gen in ready:
            try:
                ref = next(gen)
            except StopIteration:
                out.append((gen, "end", None))
                continue
            try:
                out.append((gen, "item", ray.get(ref)))
            except ray.exceptions.RayTaskError as exc:  # raised inside the task: its own failure
                out.append((gen, "error", _one_line(exc)))
            except ray.exceptions.RayError as exc:  # worker process or node died, object lost, ...
                out.append((gen, "lost", f"{type(exc).__name__}: {_one_line(exc)}"))
        return out

    def cancel(self, handle: Any) -> None:
        # not force: the task gets KeyboardInterrupt, so stream_job stops its worker and removes its
        # directory (a driver that exits kills its tasks' processes anyway; the worker dies with them)
        with contextlib.suppress(Exception):
            self.ray.cancel(handle)


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]


# --- driver side ---------------------------------------------------------------------------------------------
@dataclass
class _Task:
    group: EngineGroup
    att: Attempt
    handle: Any
    tail: ResultTail
    started: float
    exit: tuple[int, str] | None = None  # the worker's status and why it ended, once streamed
    node: str = ""


class RayDispatcher:
    """Runs the runner's pending engine groups as Ray tasks and ingests their cells as they stream in."""

    def __init__(
        self, host: SweepHost, groups: list[EngineGroup], address: str, layer: TaskLayer | None = None
    ) -> None:
        self.r = host
        self.groups = [_in_rounds(g, host.spec.workloads) for g in groups]
        self.address = address
        self.layer = layer
        self.live: dict[int, _Task] = {}  # id(handle) -> task
        self.crashes: dict[str, int] = {}
        self.lost: dict[str, int] = {}

    def run(self) -> None:
        if self.layer is not None:
            self._dispatch(self.layer)
            return
        with ray_cluster(self.address, {ENGINE_RESOURCE: 1}, self.r.echo) as ray:
            self._dispatch(RayTasks(ray, self.r.poll_s))

    def _dispatch(self, layer: TaskLayer) -> None:
        self.layer = layer
        requests = {g.engine_id: engine_request(g.engine, layer.gpus_per_node) for g in self.groups}
        try:
            for g in self.groups:  # Ray queues them; baseline engines first (group_engines' order)
                self._submit(g, g.cells, requests[g.engine_id])
            while self.live:
                for handle, kind, payload in layer.poll(
                    [t.handle for t in self.live.values()], self.r.poll_s
                ):
                    task = self.live.get(id(handle))
                    if task is not None:
                        self._event(task, kind, payload, requests[task.group.engine_id])
                self.r.progress.tick()
        finally:
            for t in self.live.values():  # interrupted: the engines stop with their tasks
                layer.cancel(t.handle)
                self._write_log(t, "")
            self.live.clear()

    def _submit(self, g: EngineGroup, cells: list[Cell], request: dict[str, Any]) -> None:
        r = self.r
        assert self.layer is not None
        prompt_sets = {c.workload: r.prompts_for(c.workload) for c in cells}
        att = new_attempt(r.run_dir, g, cells, prompt_sets)
        job = json.loads(att.job_path.read_text())  # the job as written for this attempt, sent whole
        handle = self.layer.submit(job, request, r.cell_timeout_s)
        self.live[id(handle)] = _Task(g, att, handle, ResultTail(att.cells_path), time.time())
        r.launched(g)
        r.progress.status(f"{g.engine_id}: queued on Ray ({len(self.live)} engine task(s) submitted)")

    def _event(self, t: _Task, kind: str, payload: Any, request: dict[str, Any]) -> None:
        r = self.r
        eid = t.group.engine_id
        if kind == "item":
            if "node" in payload:
                t.node = f"{payload['node']} pid {payload['pid']}"
                r.progress.status(f"{eid}: starting on {t.node}")
            if payload.get("cells"):
                with open(t.att.cells_path, "a") as fh:  # the attempt's record, as the serial worker's
                    fh.write(payload["cells"])
                    fh.flush()
                    os.fsync(fh.fileno())
            if payload.get("timings"):
                with open(t.att.dir / "timings.csv", "a") as fh:
                    fh.write(payload["timings"])
            if payload.get("cells") and r.take_results(t.att, t.tail, t.started):
                self.crashes[eid] = self.lost[eid] = 0
            if "exit" in payload:
                t.exit = (int(payload["exit"]), str(payload.get("reason") or ""))
                self._write_log(t, str(payload.get("log") or ""))
            return
        del self.live[id(t.handle)]
        if kind == "lost":
            self._write_log(t, f"ray lost the task: {payload}\n")
            self._lost(t, str(payload), request)
            return
        if kind == "error":
            rc, reason = 1, f"engine task failed on Ray: {payload}"
            self._write_log(t, reason + "\n")
        elif t.exit is None:  # a stream that ended without its exit line
            rc, reason = 1, "engine task ended without the worker's exit status"
        else:
            rc, reason = t.exit
        remaining, self.crashes[eid] = r.attempt_over(t.att, rc, reason, self.crashes.get(eid, 0))
        if remaining:
            self._submit(t.group, remaining, request)

    def _lost(self, t: _Task, why: str, request: dict[str, Any]) -> None:
        """Ray lost the task (its worker or node died): the cells it finished are in; run the rest again."""
        r = self.r
        eid = t.group.engine_id
        remaining = [c for c in t.att.cells if c.cell_id not in t.att.done]
        if not remaining:
            return
        self.lost[eid] = 0 if t.att.done else self.lost.get(eid, 0) + 1
        if self.lost[eid] > LOST_RETRIES:
            for c in remaining:
                r.fail_unit(c, t.group, f"not run: Ray lost the engine task {self.lost[eid]} times ({why})")
            return
        r.progress.line(
            f"  ray lost engine {eid}'s task ({why}); resubmitting its {len(remaining)} remaining cell(s)"
        )
        self._submit(t.group, remaining, request)

    @staticmethod
    def _write_log(t: _Task, text: str) -> None:
        head = f"# engine task on Ray{f' ({t.node})' if t.node else ''}; the worker's log (its end) follows\n"
        with contextlib.suppress(OSError):
            mode = "a" if t.att.log_path.exists() else "w"
            with open(t.att.log_path, mode) as fh:
                fh.write((head if mode == "w" else "") + text)


def _in_rounds(g: EngineGroup, workloads: list[str]) -> EngineGroup:
    """The group's units in rounds: repeat 1 of every cell, then repeat 2, ... (a no-op without repeats).
    Under --ray the repeats of an engine run back to back in its task; rounds keep a cell's repeats apart."""
    key = {
        c.cell_id: (
            split_unit(c.cell_id)[1],
            workloads.index(c.workload),
            c.batching,
            c.batch_size,
            c.setting_rank,
        )
        for c in g.cells
    }
    return replace(g, cells=sorted(g.cells, key=lambda c: key[c.cell_id]))
