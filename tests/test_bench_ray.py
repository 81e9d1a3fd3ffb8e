"""`speclab bench --ray`: the node-side stream, the dispatcher (against an in-process stand-in for Ray), the
resource requests, and one run on a real local Ray cluster on loopback with a fake engine worker."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from speclab import raycluster
from speclab.bench import raybench
from speclab.bench.attempts import attempt_dirs, new_attempt
from speclab.bench.cells import expand_cells, group_engines
from speclab.bench.compare import compare_runs, format_comparison
from speclab.bench.results import ResultsStore
from speclab.bench.runner import run_sweep
from speclab.bench.show import load_rows
from speclab.engine.protocol import EngineSpec, read_results
from speclab.errors import ConfigError
from test_bench_runner import FAKE_WORKER, SWEEP, fake_prompts, ran, spec_of

# the fake worker, recording which process started it (the Ray worker process that runs the engine task)
PARENT_LOGGING_WORKER = (
    "import os\n"
    "if os.environ.get('FAKE_PARENTS'):\n"
    "    with open(os.environ['FAKE_PARENTS'], 'a') as f:\n"
    "        f.write(f'{os.getppid()}\\n')\n" + FAKE_WORKER
)


@pytest.fixture
def fake_env(tmp_path, monkeypatch):
    script = tmp_path / "fake_worker.py"
    script.write_text(PARENT_LOGGING_WORKER)
    log = tmp_path / "worker.log"
    monkeypatch.setenv("SPECLAB_WORKER_CMD", f"{sys.executable} {script}")
    monkeypatch.setenv("FAKE_LOG", str(log))
    return log


def cells_streamed(run: Path) -> list[str]:
    """Every cell id any attempt recorded as finished (what reached the driver), with repeats."""
    return [r.cell_id for ad in attempt_dirs(run) for r in read_results(ad / "cells.jsonl")]


# --- node side ---------------------------------------------------------------------------------------------
def test_stream_job_yields_every_cell_line_then_the_exit(tmp_path, fake_env, monkeypatch):
    node_tmp = tmp_path / "node-tmp"
    node_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(node_tmp))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = node_tmp / f"{raybench.TMP_PREFIX}killed"  # left by a task whose process was SIGKILLed
    stale.mkdir()
    (stale / "owner.pid").write_text(str(dead.pid))
    spec, _ = spec_of(SWEEP.replace("[1, 4, 16]", "[1, 4]"), tmp_path)
    g = group_engines(spec, expand_cells(spec))[1]  # ngram
    att = new_attempt(tmp_path / "run", g, g.cells, {w: fake_prompts(w) for w in spec.workloads})
    job = json.loads(att.job_path.read_text())
    items = list(raybench.stream_job(job, poll_s=0.02))
    assert items[0]["pid"] == os.getpid() and items[0]["node"]
    assert items[-1]["exit"] == 0 and "log" in items[-1]
    lines = "".join(i.get("cells", "") for i in items).splitlines()
    assert [json.loads(ln)["cell_id"] for ln in lines] == [c.cell_id for c in g.cells]
    timings = "".join(i.get("timings", "") for i in items)
    assert timings.startswith("kind,") and "draft:ngram" in timings
    assert not list(node_tmp.iterdir()), "a task's temporary directory was left behind"


def test_stream_job_closed_early_stops_the_worker(tmp_path, fake_env, monkeypatch):
    monkeypatch.setenv("FAKE_SLEEP", "0.3")
    spec, _ = spec_of(tmp=tmp_path)
    g = group_engines(spec, expand_cells(spec))[0]
    att = new_attempt(tmp_path / "run", g, g.cells, {w: fake_prompts(w) for w in spec.workloads})
    gen = raybench.stream_job(json.loads(att.job_path.read_text()), poll_s=0.02)
    got = 0
    for item in gen:
        got += item.get("cells", "").count("\n")
        if got >= 1:
            break
    gen.close()  # what a cancelled or lost task amounts to on the node
    n = len(ran(fake_env))
    time.sleep(1.0)
    assert len(ran(fake_env)) == n < len(g.cells), "the worker outlived its closed stream"


# --- resources -----------------------------------------------------------------------------------------------
def test_engine_requests_gpus_by_tensor_parallel_size_or_one_engine_slot_per_machine():
    cpu = EngineSpec(target="t", method="none")
    assert raybench.engine_request(cpu, 0) == {"num_cpus": 1, "resources": {raybench.ENGINE_RESOURCE: 1}}
    tp4 = EngineSpec(target="t", method="none", llm_kwargs={"tensor_parallel_size": 4})
    assert raybench.engine_request(tp4, 8) == {"num_cpus": 1, "num_gpus": 4}
    assert raybench.engine_request(cpu, 8) == {"num_cpus": 1, "num_gpus": 1}
    with pytest.raises(ConfigError, match="needs 4 GPUs"):
        raybench.engine_request(tp4, 2)
    nodes = [{"Alive": True, "Resources": {"CPU": 2.0}}, {"Alive": False, "Resources": {"GPU": 8.0}}]
    with pytest.raises(ConfigError, match="speclab_engine"):
        raybench.cluster_gpus(nodes, {"CPU": 2.0})
    assert raybench.cluster_gpus(nodes, {"CPU": 2.0, raybench.ENGINE_RESOURCE: 1.0}) == 0
    nodes[1]["Alive"] = True
    assert raybench.cluster_gpus(nodes, {"CPU": 2.0}) == 8.0


def test_ray_missing_is_one_clear_error(monkeypatch):
    from speclab.raycluster import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match=r"pip install 'speclab\[ray\]'"):
        import_ray()


# --- the dispatcher against a stand-in for Ray ------------------------------------------------------------
class InProcessTasks:
    """TaskLayer stand-in: each task is stream_job run here; `lose_after` = {engine method: n}: the first
    task of that engine is lost (as if its Ray worker died) after it streamed n cells."""

    gpus_per_node = 0.0

    def __init__(self, lose_after: dict[str, int] | None = None) -> None:
        self.lose_after = dict(lose_after or {})
        self.jobs: list[dict[str, Any]] = []
        self.gens: dict[int, Any] = {}
        self.cells_seen: dict[int, int] = {}

    def submit(self, job: dict[str, Any], request: dict[str, Any], cell_timeout_s: float | None) -> Any:
        assert request == {"num_cpus": 1, "resources": {raybench.ENGINE_RESOURCE: 1}}
        handle = object()
        self.jobs.append(job)
        self.gens[id(handle)] = (job["engine"]["method"], raybench.stream_job(job, cell_timeout_s, 0.02))
        self.cells_seen[id(handle)] = 0
        return handle

    def poll(self, handles: list[Any], timeout_s: float) -> list[tuple[Any, str, Any]]:
        out = []
        for h in handles[:1]:  # one engine at a time, as one speclab_engine slot allows
            method, gen = self.gens[id(h)]
            if self.lose_after.get(method) is not None and self.cells_seen[id(h)] >= self.lose_after[method]:
                del self.lose_after[method]
                gen.close()
                out.append((h, "lost", "WorkerCrashedError: the worker died"))
                continue
            try:
                item = next(gen)
            except StopIteration:
                out.append((h, "end", None))
                continue
            self.cells_seen[id(h)] += item.get("cells", "").count("\n")
            out.append((h, "item", item))
        return out

    def cancel(self, handle: Any) -> None:
        self.gens[id(handle)][1].close()


def run_fake_ray(spec, run: Path, layer: InProcessTasks, monkeypatch, **kw):
    @contextlib.contextmanager
    def no_cluster(*a, **k):
        yield None

    monkeypatch.setattr(raybench, "ray_cluster", no_cluster)
    monkeypatch.setattr(raybench, "RayTasks", lambda ray, poll_s: layer)
    return run_sweep(
        spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.02, ray_address="auto", **kw
    )


def test_ray_path_gives_the_serial_cells_and_outputs(tmp_path, fake_env, monkeypatch):
    spec, _ = spec_of(tmp=tmp_path)
    serial = run_sweep(
        spec, tmp_path / "serial", fake_prompts, progress=False, echo=lambda s: None, poll_s=0.02
    )
    out = run_fake_ray(spec, tmp_path / "ray", InProcessTasks(), monkeypatch)
    assert out.ok == serial.ok == 18 and out.failed == 0
    a, b = ResultsStore(tmp_path / "serial").rows, ResultsStore(tmp_path / "ray").rows
    assert set(a) == set(b)
    for cid in a:
        for key in (
            "status",
            "output_tokens",
            "throughput_tok_s",
            "speedup",
            "lossless",
            "mean_acceptance_length",
        ):
            assert a[cid][key] == b[cid][key], (cid, key)
    assert (tmp_path / "ray" / "timings.csv").read_text() == (tmp_path / "serial" / "timings.csv").read_text()
    assert sorted(cells_streamed(tmp_path / "ray")) == sorted(a)
    c = compare_runs(tmp_path / "serial", tmp_path / "ray")
    assert c.same and len(c.ratios) == 18 and all(t == pytest.approx(1.0) for _, t, _ in c.ratios)


def test_compare_finds_different_outputs_and_missing_cells(tmp_path, fake_env, monkeypatch):
    spec, _ = spec_of(SWEEP.replace("[1, 4, 16]", "[1, 4]"), tmp_path)
    run_sweep(spec, tmp_path / "a", fake_prompts, progress=False, echo=lambda s: None, poll_s=0.02)
    monkeypatch.setenv("FAKE_LOSSY_METHOD", "ngram")
    spec_b, _ = spec_of(SWEEP.replace("[1, 4, 16]", "[1, 4, 16]"), tmp_path)
    run_sweep(spec_b, tmp_path / "b", fake_prompts, progress=False, echo=lambda s: None, poll_s=0.02)
    c = compare_runs(tmp_path / "a", tmp_path / "b")
    assert not c.same
    assert len(c.only_b) == 6 and not c.only_a
    assert sorted(cid.split(".")[0] for cid, _ in c.differ) == ["ngram-k3"] * 4
    assert "DIFFERENT" in format_comparison(c, "a", "b")


def test_a_lost_task_is_resubmitted_without_its_finished_cells(tmp_path, fake_env, monkeypatch):
    monkeypatch.setenv("FAKE_SLEEP", "0.15")  # cells stream one by one
    spec, _ = spec_of(tmp=tmp_path)
    layer = InProcessTasks(lose_after={"ngram": 2})
    out = run_fake_ray(spec, tmp_path / "run", layer, monkeypatch)
    assert out.ok == 18 and out.failed == 0
    ngram_jobs = [j for j in layer.jobs if j["engine"]["method"] == "ngram"]
    assert [len(j["cells"]) for j in ngram_jobs] == [6, 4]  # the retry got the 4 cells still missing
    first, retry = ({c["cell_id"] for c in j["cells"]} for j in ngram_jobs)
    streamed = cells_streamed(tmp_path / "run")
    assert len(streamed) == len(set(streamed)) == 18, "a finished cell was run (or recorded) twice"
    assert not (first - retry) & retry and len(first - retry) == 2
    rows = load_rows(tmp_path / "run")
    assert len(rows) == 18 and all(r["status"] == "ok" for r in rows)


def test_an_engine_crash_under_ray_fails_only_its_cell(tmp_path, fake_env, monkeypatch):
    monkeypatch.setenv("FAKE_CRASH_CELL", "draft_model-k3.offline-math.cont.b4")
    spec, _ = spec_of(tmp=tmp_path)
    out = run_fake_ray(spec, tmp_path / "run", InProcessTasks(), monkeypatch)
    rows = {r["cell_id"]: r for r in load_rows(tmp_path / "run")}
    bad = [cid for cid, r in rows.items() if r["status"] != "ok"]
    assert out.failed == 1 and len(bad) == 1 and bad[0].startswith("draft_model-k3.offline-math.cont.b4")
    assert "SIGKILL" in rows[bad[0]]["error"]
    assert len(rows) == 18


def test_repeats_under_ray_run_back_to_back_in_rounds_and_pair_up(tmp_path, fake_env, monkeypatch):
    spec, _ = spec_of(SWEEP.replace("seed = 42", "seed = 42\nrepeats = 2"), tmp_path)
    layer = InProcessTasks()
    out = run_fake_ray(spec, tmp_path / "run", layer, monkeypatch)
    assert out.failed == 0
    rows = load_rows(tmp_path / "run")
    assert len(rows) == 18 and all(r["repeats"] == 2 for r in rows)
    sd = [r for r in rows if r["method"] != "none"]
    assert all(r["speedup_spread"]["n"] == 2 for r in sd)
    order = [c["cell_id"] for c in layer.jobs[0]["cells"]]
    assert all("#r2" not in u for u in order[:6]) and all(u.endswith("#r2") for u in order[6:])


# --- a real local Ray cluster on loopback ------------------------------------------------------------------
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_ray_cluster(env: dict[str, str], timeout_s: float = 120) -> Any:
    """`ray start --head` on 127.0.0.1 with 2 CPU workers and one engine slot, in its own process group;
    stopped (the whole group) on exit, also on failure."""
    ray_bin = Path(sys.executable).with_name("ray")
    port = _free_port()
    tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths have a length limit
    env = dict(env, **raycluster.LOOPBACK_ENV, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    cmd = [
        str(ray_bin), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port),
        "--num-cpus", "2", "--resources", json.dumps({raybench.ENGINE_RESOURCE: 1}),
        "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", tmp,
    ]  # fmt: skip
    log = open(Path(tmp) / "start.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout_s
        while True:
            chk = subprocess.run(
                [str(ray_bin), "health-check", "--address", address], env=env, capture_output=True, timeout=60
            )
            if chk.returncode == 0:
                break
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"ray start failed: {(Path(tmp) / 'start.log').read_text()[-2000:]}")
            time.sleep(1)
        yield address, env
        assert set(listening(proc.pid)) <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening(proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def listening(pgid: int) -> list[str]:
    """The addresses the cluster's processes (its process group) listen on, from `ss` (TCP)."""
    pids = set(
        subprocess.run(["ps", "-o", "pid=", "-g", str(pgid)], capture_output=True, text=True).stdout.split()
    )
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    addrs = []
    for line in out.splitlines():
        if any(f"pid={p}," in line for p in pids):
            local = line.split()[3]
            addrs.append(local.rsplit(":", 1)[0].strip("[]"))
    assert addrs, "found no listening socket of the cluster (ss?)"
    return addrs


DRIVER = (
    "import sys\n"
    "sys.path.insert(0, {tests!r})\n"
    "from test_bench_runner import fake_prompts\n"
    "from speclab.bench.api import load_sweep_source\n"
    "from speclab.bench.runner import run_sweep\n"
    "spec, _ = load_sweep_source(sys.argv[1])\n"
    "out = run_sweep(spec, sys.argv[2], fake_prompts, progress=False, poll_s=0.1, ray_address=sys.argv[3])\n"
    "sys.exit(1 if out.failed else 0)\n"
)


def test_local_ray_cluster_kill_a_worker_then_the_driver_and_rerun(tmp_path, fake_env):
    """Two CPU workers, one engine slot: kill the Ray worker running an engine mid-run (the dispatcher
    resubmits the rest), then kill the driver mid-run and rerun: every cell once, none lost or repeated."""
    pytest.importorskip("ray")
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(SWEEP)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(tests=str(Path(__file__).parent)))
    run = tmp_path / "run"
    parents = tmp_path / "parents.txt"
    env = dict(os.environ, FAKE_SLEEP="0.4", FAKE_PARENTS=str(parents), RAY_USAGE_STATS_ENABLED="0")
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    with local_ray_cluster(env) as (address, env):
        drv = subprocess.Popen([sys.executable, str(driver), str(sweep), str(run), address], env=env)
        try:
            # 1. the first engine has finished two cells: kill the Ray worker process that runs its task
            deadline = time.time() + 120
            while len(ran(fake_env)) < 2 and time.time() < deadline and drv.poll() is None:
                time.sleep(0.05)
            assert len(ran(fake_env)) >= 2, "no cell ran on the cluster"
            victim = int(parents.read_text().split()[0])
            os.kill(victim, signal.SIGKILL)
            # 2. later: kill the driver itself
            while len(ran(fake_env)) < 10 and time.time() < deadline and drv.poll() is None:
                time.sleep(0.05)
            drv.send_signal(signal.SIGKILL)
            drv.wait(timeout=30)
        finally:
            if drv.poll() is None:
                drv.kill()
                drv.wait()
        done_before = {cid for cid, r in ResultsStore(run).rows.items() if r["status"] == "ok"}
        assert 2 <= len(done_before) < 18
        time.sleep(3.0)  # the engine task goes with its driver, the fake worker with its Ray worker
        ran_before = ran(fake_env)
        time.sleep(1.0)
        assert ran(fake_env) == ran_before, "an engine outlived the killed driver"
        rerun = subprocess.run(
            [sys.executable, str(driver), str(sweep), str(run), address], env=env, timeout=240
        )
        assert rerun.returncode == 0
    rows = load_rows(run)
    assert len(rows) == 18 and all(r["status"] == "ok" for r in rows)
    assert not set(ran(fake_env)[len(ran_before) :]) & done_before, "a finished cell was run again"
    streamed = cells_streamed(run)
    assert sorted(streamed) == sorted(r["cell_id"] for r in rows), "a finished cell was lost or repeated"
    assert len(set(parents.read_text().split())) >= 3  # the killed worker's task was resubmitted elsewhere
    lines = (run / "results.jsonl").read_text().splitlines()
    assert len(lines) == 18
    # one engine slot: engines never ran side by side. Each interruption (the killed worker's engine is
    # resubmitted behind the queued ones; the rerun) adds at most two changes of method to the sequence of
    # finished cells; two engines running at once would interleave theirs at every cell
    methods = [cid.split(".")[0] for cid in ran(fake_env)]
    changes = sum(1 for a, b in zip(methods, methods[1:], strict=False) if a != b)
    assert changes <= 6, methods


def test_engine_worker_env_drops_rays_one_thread():
    from speclab.bench.raybench import worker_threads_env

    ray_env = {"OMP_NUM_THREADS": "1", "PATH": "/bin"}
    assert worker_threads_env(ray_env, None) == {"PATH": "/bin"}  # the engine uses the node's cores
    assert worker_threads_env(ray_env, "2")["OMP_NUM_THREADS"] == "2"  # the driver's own setting is kept
    assert ray_env["OMP_NUM_THREADS"] == "1"  # the task's environment itself is left as it is
