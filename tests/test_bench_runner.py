"""The sweep runner against a fake engine worker that honours the worker protocol (no vLLM, seconds)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from speclab.bench.api import load_sweep_source
from speclab.bench.cells import expand_cells
from speclab.bench.preflight import PromptSet
from speclab.bench.results import ResultsStore
from speclab.bench.runner import run_sweep
from speclab.bench.show import format_run, load_rows
from speclab.engine.protocol import PromptSpec
from speclab.errors import ConfigError
from speclab.traces import read_store

FAKE_WORKER = r"""
import json, os, signal, sys, time
from speclab.engine.protocol import (CellResult, MemoryInfo, RequestResult, SpecCounters, TimeSplit,
                                     append_result, gate_lines, gate_ready_path, read_job)

args = sys.argv[1:]
job = read_job(args[args.index("--job") + 1])
out = args[args.index("--out") + 1]
log = os.environ.get("FAKE_LOG")
sleep = float(os.environ.get("FAKE_SLEEP", "0"))
crash = os.environ.get("FAKE_CRASH_CELL")
crash_once = os.environ.get("FAKE_CRASH_ONCE")  # a marker file: crash only if it does not exist yet
lossy = os.environ.get("FAKE_LOSSY_METHOD")
e = job.engine
if log:
    with open(log, "a") as f:
        f.write(f"start {e.method} max_num_seqs={e.max_num_seqs}\n")
if job.timings_csv:
    with open(job.timings_csv, "a") as f:
        if f.tell() == 0:
            f.write("kind,kv_tokens,batched_tokens,num_spec_tokens,num_requests,seconds\n")
        for i in range(1, 6):
            f.write(f"target,{100 * i},{i * (1 + (e.k or 0))},{i * (e.k or 0)},{i},{0.01 + 0.001 * i + 1e-5 * 100 * i}\n")
            f.write(f"overhead,0,0,0,{i},0.001\n")
            if e.method != "none":
                f.write(f"draft:{e.method},{100 * i},{i},{i * e.k},{i},{0.0005 * i + 0.0001}\n")
jitter = float(os.environ.get("FAKE_REPEAT_JITTER", "0"))  # SD rate x (1 + jitter * (repeat - 1))
cells = job.cells
if job.gate:  # gated (repeats): ready once "warm", then the cells the runner names, in its order
    by_id = {c.cell_id: c for c in job.cells}
    open(gate_ready_path(job.gate), "w").close()
    cells = (by_id[u] for u in gate_lines(job.gate) if u in by_id)
for cell in cells:
    if crash and crash in cell.cell_id and not (crash_once and os.path.exists(crash_once)):
        if crash_once:
            open(crash_once, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    hang = os.environ.get("FAKE_HANG_CELL")
    if hang and hang in cell.cell_id and not (crash_once and os.path.exists(crash_once)):
        if crash_once:
            open(crash_once, "w").close()
        time.sleep(1000)
    time.sleep(sleep)
    B = cell.batch_size
    reqs = []
    n_tokens = 0
    copies = B if cell.batching == "replicate" else 1
    for p in cell.prompts:
        toks = [(sum(p.prompt_token_ids) + i) % 97 for i in range(cell.max_tokens)]
        if lossy and e.method == lossy:
            toks[3] = 96 - toks[3]
        for c in range(copies):
            acc = drafted = None
            if e.method != "none":
                n = (cell.max_tokens - 1) // 3
                acc = [i % (e.k + 1) for i in range(n)]
                drafted = [e.k] * n
            reqs.append(RequestResult(id=p.id, copy=c, prompt_len=len(p.prompt_token_ids),
                                      output_token_ids=toks, finish_reason="length",
                                      per_step_accepted=acc, per_step_drafted=drafted))
            n_tokens += len(toks)
    # speedup of SD falls with the batch size: 2.0x at B=1 down to ~1.1x at B=16
    base_rate = 30.0 * B ** 0.6
    rate = base_rate * (1.0 if e.method == "none" else 1.0 + 1.0 / B ** 0.5)
    repeat = int(cell.cell_id.rsplit("#r", 1)[1]) if "#r" in cell.cell_id else 1
    if e.method != "none":
        rate *= 1.0 + jitter * (repeat - 1)
    info = {"startup_s": 0.1}
    pressure = os.environ.get("FAKE_PRESSURE")  # a CPU hog beside the bench: it biases SD's ratio, not only noise
    if pressure:
        info["cpu_pressure"] = float(pressure)
        if e.method != "none":
            rate *= 0.4
    sc = None
    if e.method != "none":
        sc = SpecCounters(num_drafts=100, num_draft_tokens=100 * e.k, num_accepted_tokens=150,
                          accepted_per_pos=[70, 50, 30][: e.k])
    res = CellResult(cell_id=cell.cell_id, status="ok", output_tokens=n_tokens, elapsed_s=n_tokens / rate,
                     steps=10, requests=reqs, time_split_s=TimeSplit(propose=0.1, verify=0.7, other=0.2),
                     memory=MemoryInfo(peak_rss_bytes=10 << 20, weights_bytes=5 << 20, kv_cache_bytes=1 << 20,
                                       draft_weights_bytes=0 if e.method != "draft_model" else 2 << 20),
                     spec_counters=sc, engine_info=info)
    if log:  # before the result: once the runner sees it, it may start the next cell on another engine
        with open(log, "a") as f:
            f.write(f"ran {cell.cell_id}\n")
    append_result(out, res)
"""

SWEEP = """
name = "fake"
target = "fake-target"
dtype = "float32"
workloads = ["offline-code-edit", "offline-math"]
batch_sizes = [1, 4, 16]
batching = "continuous"
num_prompts = 3
max_tokens = 16
seed = 42

[[methods]]
name = "none"

[[methods]]
name = "ngram"
k = 3
prompt_lookup_min = 2
prompt_lookup_max = 4

[[methods]]
name = "draft_model"
k = 3
model = "fake-drafter"
"""


def fake_prompts(workload: str) -> PromptSet:
    cat = {"offline-code-edit": "code-editing", "offline-math": "math"}[workload]
    prompts = [
        PromptSpec(id=f"{workload}-p{i}", prompt_token_ids=[1, 2, 3 + i, len(workload)]) for i in range(3)
    ]
    return PromptSet(workload=workload, category=cat, prompts=prompts)


@pytest.fixture
def fake_env(tmp_path, monkeypatch):
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    log = tmp_path / "worker.log"
    monkeypatch.setenv("SPECLAB_WORKER_CMD", f"{sys.executable} {script}")
    monkeypatch.setenv("FAKE_LOG", str(log))
    return log


def spec_of(text: str = SWEEP, tmp: Path | None = None):
    assert tmp is not None
    f = tmp / "sweep.toml"
    f.write_text(text)
    return load_sweep_source(f)


def ran(log: Path) -> list[str]:
    return (
        [ln.split()[1] for ln in log.read_text().splitlines() if ln.startswith("ran ")]
        if log.exists()
        else []
    )


def test_full_sweep_speedup_lossless_traces(tmp_path, fake_env):
    spec, text = spec_of(tmp=tmp_path)
    run = tmp_path / "run"
    out = run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, spec_text=text, poll_s=0.05)
    assert out.total == 18 and out.ok == 18 and out.failed == 0
    rows = load_rows(run)
    assert len(rows) == 18 and all(r["status"] == "ok" for r in rows)
    # one engine per configuration, baseline first, sized for the largest batch
    starts = [ln for ln in fake_env.read_text().splitlines() if ln.startswith("start")]
    assert starts == [f"start {m} max_num_seqs=16" for m in ("none", "ngram", "draft_model")]
    sd = [r for r in rows if r["method"] != "none"]
    for r in sd:
        assert r["lossless"] is True, r["lossless_detail"]
        assert r["baseline_cell_id"].startswith("none.")
        assert r["mean_acceptance_length"] == pytest.approx(2.5)
        assert r["acceptance_rate_per_pos"] == pytest.approx([0.7, 0.5, 0.3])
    # speedup falls as batch size grows
    for w in spec.workloads:
        s = {r["batch_size"]: r["speedup"] for r in sd if r["workload"] == w and r["method"] == "ngram"}
        assert s[1] == pytest.approx(2.0) and s[1] > s[4] > s[16] > 1.0
    for r in rows:
        if r["method"] == "none":
            assert r["speedup"] == 1.0
    # traces: one part per cell, token ids and observed per-step arrays
    recs = read_store(run / "traces")
    assert len(recs) == 18 * 3
    ng = [r for r in recs if r.meta.get("observed", {}).get("method") == "ngram"]
    assert ng and ng[0].methods == {} and ng[0].output_token_ids is not None
    assert ng[0].meta["observed"]["k"] == 3 and len(ng[0].meta["observed"]["per_step_accepted"]) == 5
    # the cross-check reads the options the method ran with and the engine's context limit from here
    assert ng[0].meta["observed"]["options"] == {"prompt_lookup_min": 2, "prompt_lookup_max": 4}
    assert ng[0].meta["observed"]["max_model_len"] == spec.max_model_len
    assert all("observed" not in r.meta for r in recs if r.meta["cell_id"].startswith("none."))
    # timings merged with one header (and the temperature column, empty where the attempts cannot say:
    # the fake worker writes its rows once per engine, not per step of its cells)
    lines = (run / "timings.csv").read_text().splitlines()
    assert (
        lines[0] == "kind,kv_tokens,batched_tokens,num_spec_tokens,num_requests,seconds,temperature"
        and len(lines) == 1 + 10 + 15 + 15
    )
    text_out = format_run(run)
    assert "speedup over no-SD" in text_out and "token-exact vs no-SD: 12/12" in text_out

    # a rerun skips every completed cell and starts no engine
    before = fake_env.read_text()
    out2 = run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.05)
    assert out2.skipped == 18 and out2.ok == 0
    assert fake_env.read_text() == before


def test_replicate_copies_and_lossy_detection(tmp_path, fake_env, monkeypatch):
    monkeypatch.setenv("FAKE_LOSSY_METHOD", "ngram")
    spec, _ = spec_of(SWEEP.replace('"continuous"', '"replicate"').replace("[1, 4, 16]", "[1, 4]"), tmp_path)
    run = tmp_path / "run"
    run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.05)
    rows = load_rows(run)
    b4 = [r for r in rows if r["batch_size"] == 4]
    assert all(r["copies_identical"] is True for r in b4)
    assert all(r["num_requests"] == 12 for r in b4)
    ng = [r for r in rows if r["method"] == "ngram"]
    assert all(r["lossless"] is False for r in ng)
    assert "outputs differ" in ng[0]["lossless_detail"] and "position 3" in ng[0]["lossless_detail"]
    assert all(r["lossless"] is True for r in rows if r["method"] == "draft_model")
    # traces keep one record per prompt, not per copy
    assert len(read_store(run / "traces")) == len(rows) * 3


def test_crash_fails_only_the_cell_it_hit_and_sweep_goes_on(tmp_path, fake_env, monkeypatch):
    spec, _ = spec_of(tmp=tmp_path)
    target = next(c for c in expand_cells(spec) if c.cell_id.startswith("ngram-k3.offline-code-edit.cont.b4"))
    monkeypatch.setenv("FAKE_CRASH_CELL", target.cell_id)
    monkeypatch.setenv("FAKE_CRASH_ONCE", str(tmp_path / "crashed"))
    run = tmp_path / "run"
    out = run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.05)
    assert out.failed == 1 and out.ok == 17
    row = ResultsStore(run).rows[target.cell_id]
    assert row["status"] == "failed" and "SIGKILL" in row["error"]
    # the ngram engine was restarted for its remaining cells
    starts = [ln for ln in fake_env.read_text().splitlines() if ln.startswith("start ngram")]
    assert len(starts) == 2
    # rerun: only the failed cell runs
    n_before = len(ran(fake_env))
    out2 = run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.05)
    assert out2.ok == 1 and out2.failed == 0 and ran(fake_env)[n_before:] == [target.cell_id]
    assert all(r["status"] == "ok" for r in load_rows(run))


def test_engine_that_never_starts_fails_its_cells_after_two_tries(tmp_path, fake_env, monkeypatch):
    bad = tmp_path / "bad_worker.py"
    bad.write_text("import sys\nprint('RuntimeError: engine could not start')\nsys.exit(3)\n")
    monkeypatch.setenv("SPECLAB_WORKER_CMD", f"{sys.executable} {bad}")
    spec, _ = spec_of(SWEEP.replace("[1, 4, 16]", "[1]"), tmp_path)
    out = run_sweep(spec, tmp_path / "run", fake_prompts, progress=False, echo=lambda s: None, poll_s=0.05)
    assert out.failed == 6 and out.ok == 0
    rows = load_rows(tmp_path / "run")
    assert all("engine could not start" in r["error"] for r in rows)
    # 3 engines x 2 tries
    assert len(list((tmp_path / "run" / "engines").glob("*/attempt-*"))) == 6


def test_recovers_cells_a_killed_runner_never_recorded(tmp_path, fake_env):
    spec, _ = spec_of(tmp=tmp_path)
    run = tmp_path / "run"
    run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.05)
    # as if the runner died right after the worker wrote these cells: drop their rows and trace parts
    store = ResultsStore(run)
    lost = [cid for cid in list(store.rows) if cid.startswith(("ngram", "none.offline-math"))]
    for cid in lost:
        (run / store.rows[cid]["trace_part"]).unlink()
        del store.rows[cid]
    store._flush()
    n_before = len(ran(fake_env))
    msgs: list[str] = []
    out = run_sweep(spec, run, fake_prompts, progress=False, echo=msgs.append, poll_s=0.05)
    assert out.recovered == len(lost) and out.ok == 0
    assert len(ran(fake_env)) == n_before  # nothing was run again
    assert any("recovered" in m for m in msgs)
    rows = load_rows(run)
    assert len(rows) == 18 and all(r["status"] == "ok" for r in rows)
    assert len(read_store(run / "traces")) == 18 * 3


def test_kill_the_sweep_halfway_and_rerun(tmp_path, fake_env):
    """SIGKILL the `speclab bench` process mid-sweep: no completed cell is lost, none is run twice."""
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(
        SWEEP.replace('model = "fake-drafter"', 'model = "fake-drafter"').replace(
            "num_prompts = 3", "num_prompts = 3"
        )
    )
    driver = tmp_path / "driver.py"
    # the CLI with the fake prompt provider (no tokenizer needed)
    driver.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_bench_runner import fake_prompts\n"
        "from speclab.bench.api import load_sweep_source\n"
        "from speclab.bench.runner import run_sweep\n"
        "spec, _ = load_sweep_source(sys.argv[1])\n"
        "run_sweep(spec, sys.argv[2], fake_prompts, progress=False, poll_s=0.05)\n"
    )
    run = tmp_path / "run"
    env = dict(os.environ, FAKE_SLEEP="0.3")
    proc = subprocess.Popen([sys.executable, str(driver), str(sweep), str(run)], env=env)
    deadline = time.time() + 60
    while time.time() < deadline:
        if (run / "results.jsonl").exists() and len((run / "results.jsonl").read_text().splitlines()) >= 8:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)  # the worker dies with its parent (PR_SET_PDEATHSIG)
    done_before = {cid for cid, r in ResultsStore(run).rows.items() if r["status"] == "ok"}
    assert 8 <= len(done_before) < 18
    ran_before = ran(fake_env)
    time.sleep(0.5)
    assert ran(fake_env) == ran_before, "the worker outlived the killed runner"
    proc2 = subprocess.run(
        [sys.executable, str(driver), str(sweep), str(run)], env=dict(os.environ), timeout=120
    )
    assert proc2.returncode == 0
    rows = load_rows(run)
    assert len(rows) == 18 and all(r["status"] == "ok" for r in rows)
    rerun = ran(fake_env)[len(ran_before) :]
    assert not set(rerun) & done_before, "a completed cell was run again"
    # every cell ran to completion at least once; the only cell run twice is the one in flight at the kill
    assert set(ran(fake_env)) == {r["cell_id"] for r in rows}
    assert len(ran(fake_env)) - 18 <= 1
    lines = (run / "results.jsonl").read_text().splitlines()
    assert len(lines) == 18 and len({json.loads(ln)["cell_id"] for ln in lines}) == 18


def test_hung_engine_is_stopped_and_its_cell_failed(tmp_path, fake_env, monkeypatch):
    spec, _ = spec_of(SWEEP.replace("[1, 4, 16]", "[1, 4]"), tmp_path)
    target = next(c for c in expand_cells(spec) if c.cell_id.startswith("none.offline-math.cont.b1"))
    monkeypatch.setenv("FAKE_HANG_CELL", target.cell_id)
    monkeypatch.setenv("FAKE_CRASH_ONCE", str(tmp_path / "hung"))
    run = tmp_path / "run"
    t0 = time.time()
    out = run_sweep(
        spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.05, cell_timeout_s=6
    )
    assert time.time() - t0 < 60
    assert out.failed == 1 and out.ok == 11
    row = ResultsStore(run).rows[target.cell_id]
    assert row["status"] == "failed" and "no cell finished within 6 s" in row["error"]


def test_redo_measures_cells_again_and_updates_speedups(tmp_path, fake_env, monkeypatch):
    spec, _ = spec_of(SWEEP.replace("[1, 4, 16]", "[1, 4]"), tmp_path)
    run = tmp_path / "run"
    run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.05)
    before = {r["cell_id"]: r for r in load_rows(run)}
    n = len(ran(fake_env))
    msgs: list[str] = []
    out = run_sweep(
        spec, run, fake_prompts, progress=False, echo=msgs.append, poll_s=0.05, redo=["none.*.b1.*"]
    )
    again = ran(fake_env)[n:]
    assert len(again) == 2 and all(c.startswith("none.") and ".b1." in c for c in again)
    assert out.ok == 2 and any("measuring 2 cell(s) again" in m for m in msgs)
    after = {r["cell_id"]: r for r in load_rows(run)}
    assert set(after) == set(before)
    for cid, r in after.items():
        if r["method"] != "none":
            assert r["speedup"] == pytest.approx(before[cid]["speedup"]) and r["lossless"] is True
    with pytest.raises(ConfigError, match="matches no cell"):
        run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, redo=["nope*"])


# --- repeats -------------------------------------------------------------------------------------------

REPEATS_SWEEP = SWEEP.replace("seed = 42", "seed = 42\nrepeats = 3").replace("[1, 4, 16]", "[1, 16]")


def test_repeats_interleave_with_the_baseline_and_pair_up(tmp_path, fake_env, monkeypatch):
    monkeypatch.setenv("FAKE_REPEAT_JITTER", "0.05")
    spec, _ = spec_of(REPEATS_SWEEP, tmp_path)
    assert spec.repeats == 3
    # repeats are not part of cell ids: the same sweep with repeats = 1 has the same cells
    plain, _ = spec_of(SWEEP.replace("[1, 4, 16]", "[1, 16]"), tmp_path)
    assert [c.cell_id for c in expand_cells(spec)] == [c.cell_id for c in expand_cells(plain)]
    run = tmp_path / "run"
    out = run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.02)
    assert out.failed == 0 and out.ok == 12 * 3
    # each engine started once, all three before any repeat 2
    starts = [ln for ln in fake_env.read_text().splitlines() if ln.startswith("start")]
    assert starts == [f"start {m} max_num_seqs=16" for m in ("none", "ngram", "draft_model")]
    order = ran(fake_env)
    assert len(order) == 36 and len(set(order)) == 36
    # rounds of repeats; in each, per (workload, batch size): none, ngram, draft_model, one after the other
    first = order[:3]
    assert [u.split(".")[0] for u in first] == ["none", "ngram-k3", "draft_model-k3"]
    assert all(".offline-code-edit.cont.b1." in u and "#r" not in u for u in first)
    assert all("#r" not in u for u in order[:12]), order
    assert all(u.endswith("#r2") for u in order[12:24]), order
    assert [u.split(".")[0] for u in order[12:15]] == ["none", "ngram-k3", "draft_model-k3"]
    rows = load_rows(run)
    assert len(rows) == 12
    for r in rows:
        assert r["repeats"] == 3 and [x["repeat"] for x in r["runs"]] == [1, 2, 3]
        tps = [x["throughput_tok_s"] for x in r["runs"]]
        assert r["throughput_tok_s"] == pytest.approx(sorted(tps)[1])
        assert r["throughput_spread"] == {"min": pytest.approx(min(tps)), "max": pytest.approx(max(tps))}
    ng = next(r for r in rows if r["label"] == "ngram-k3" and r["batch_size"] == 1)
    # matched pairs: 2.0x at repeat 1, then +5% per repeat (the fake's jitter); the median is repeat 2's
    assert [p["speedup"] for p in ng["speedup_runs"]] == pytest.approx([2.0, 2.1, 2.2])
    assert ng["speedup"] == pytest.approx(2.1)
    assert ng["speedup_spread"] == {"min": pytest.approx(2.0), "max": pytest.approx(2.2), "n": 3}
    assert ng["lossless"] is True  # repeat 1's check
    text = format_run(run)
    assert "2.00-2.20" in text and "repeats: 3" in text
    # a rerun runs nothing
    n = len(ran(fake_env))
    out2 = run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.02)
    assert out2.skipped == 12 and out2.ok == 0 and len(ran(fake_env)) == n


def test_restart_each_repeat_starts_every_engine_anew_per_round(tmp_path, fake_env):
    spec, _ = spec_of(
        REPEATS_SWEEP.replace("repeats = 3", "repeats = 3\nrestart_each_repeat = true"), tmp_path
    )
    assert spec.restart_each_repeat is True and spec.to_dict()["restart_each_repeat"] is True
    run = tmp_path / "run"
    out = run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.02)
    assert out.failed == 0 and out.ok == 12 * 3
    # three rounds, each engine started once per round, each round's starts before its units
    lines = [ln for ln in fake_env.read_text().splitlines() if ln.startswith(("start", "ran "))]
    starts = [ln for ln in lines if ln.startswith("start")]
    assert starts == [f"start {m} max_num_seqs=16" for m in ("none", "ngram", "draft_model")] * 3
    # the second round's first start comes after the first round's 12 units
    fourth = [i for i, ln in enumerate(lines) if ln.startswith("start")][3]
    assert sum(ln.startswith("ran ") for ln in lines[:fourth]) == 12
    order = ran(fake_env)
    assert all("#r" not in u for u in order[:12]) and all(u.endswith("#r3") for u in order[24:])
    rows = load_rows(run)
    assert all(r["repeats"] == 3 and [x["repeat"] for x in r["runs"]] == [1, 2, 3] for r in rows)
    with pytest.raises(ConfigError, match="restart_each_repeat"):
        spec_of(REPEATS_SWEEP.replace("repeats = 3", "repeats = 3\nrestart_each_repeat = 1"), tmp_path)


def test_repeats_resume_at_the_repeat_where_the_run_died(tmp_path, fake_env):
    spec, _ = spec_of(REPEATS_SWEEP, tmp_path)
    run = tmp_path / "run"
    run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.02)
    # as if the run had died after repeat 2 of some cells: drop their third run (and one row's second)
    store = ResultsStore(run)
    from speclab.bench.repeats import summarise_runs

    cut = [cid for cid in store.rows if cid.startswith(("none.offline-math", "ngram-k3.offline-math"))]
    for cid in cut:
        store.rows[cid]["runs"] = store.rows[cid]["runs"][:2]
        summarise_runs(store.rows[cid])
    store.rows[cut[0]]["runs"] = store.rows[cut[0]]["runs"][:1]
    store._flush()
    # and the workers' own output lines of those repeats are gone too (else they would be recovered)
    for f in run.glob("engines/*/attempt-*/cells.jsonl"):
        keep = [
            ln
            for ln in f.read_text().splitlines()
            if not any(json.loads(ln)["cell_id"] in (f"{c}#r3", f"{cut[0]}#r2") for c in cut)
        ]
        f.write_text("".join(ln + "\n" for ln in keep))
    n = len(ran(fake_env))
    out = run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.02)
    again = ran(fake_env)[n:]
    assert sorted(again) == sorted([f"{c}#r3" for c in cut] + [f"{cut[0]}#r2"])
    assert out.ok == len(again)
    assert all(r["repeats"] == 3 for r in load_rows(run))


def test_repeats_recovered_from_a_killed_runner(tmp_path, fake_env):
    spec, _ = spec_of(REPEATS_SWEEP, tmp_path)
    run = tmp_path / "run"
    run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.02)
    full = {r["cell_id"]: r for r in load_rows(run)}
    store = ResultsStore(run)
    for row in store.rows.values():  # the runner recorded only repeat 1 before it was killed
        row["runs"] = row["runs"][:1]
    store._flush()
    n = len(ran(fake_env))
    out = run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.02)
    assert len(ran(fake_env)) == n and out.recovered == 24
    for r in load_rows(run):
        assert r["repeats"] == 3 and r["speedup"] == pytest.approx(full[r["cell_id"]]["speedup"])


def test_repeat_crash_fails_only_that_repeat_and_engine_restarts(tmp_path, fake_env, monkeypatch):
    spec, _ = spec_of(REPEATS_SWEEP, tmp_path)
    target = next(c for c in expand_cells(spec) if c.cell_id.startswith("ngram-k3.offline-math.cont.b16"))
    monkeypatch.setenv("FAKE_CRASH_CELL", f"{target.cell_id}#r2")
    monkeypatch.setenv("FAKE_CRASH_ONCE", str(tmp_path / "crashed"))
    run = tmp_path / "run"
    out = run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.02)
    assert out.failed == 1 and out.ok == 35
    row = ResultsStore(run).rows[target.cell_id]
    assert row["status"] == "ok" and [x["repeat"] for x in row["runs"]] == [1, 3]
    assert row["speedup_spread"]["n"] == 2
    starts = [ln for ln in fake_env.read_text().splitlines() if ln.startswith("start ngram")]
    assert len(starts) == 2
    # a rerun measures the missing repeat only
    n = len(ran(fake_env))
    run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.02)
    assert ran(fake_env)[n:] == [f"{target.cell_id}#r2"]
    assert ResultsStore(run).rows[target.cell_id]["repeats"] == 3


def test_a_sweep_beside_a_cpu_hog_says_cannot_tell_not_sd_off(tmp_path, fake_env, monkeypatch):
    """The contention case with the fake worker: the quiet run says "use SD"; the same sweep beside a CPU hog
    (every cell reports high CPU pressure, and SD measures below 1.0x) says "cannot tell", not "SD off"."""
    import speclab.bench.repeat_units as repeat_units
    import speclab.bench.results as results
    from speclab.report.recommend import CANNOT_TELL, recommendations

    # this machine's own load must not decide the test: the runner sees a quiet host
    monkeypatch.setattr(results, "loadavg", lambda: 0.1)
    monkeypatch.setattr(repeat_units, "loadavg", lambda: 0.1)
    spec, _ = spec_of(REPEATS_SWEEP, tmp_path)
    run_sweep(spec, tmp_path / "quiet", fake_prompts, progress=False, echo=lambda s: None, poll_s=0.02)
    quiet = recommendations(load_rows(tmp_path / "quiet"), None)
    assert len(quiet) == 4 and all(r["verdict"] == "use SD" for r in quiet), quiet
    monkeypatch.setenv("FAKE_PRESSURE", "0.95")
    run_sweep(spec, tmp_path / "busy", fake_prompts, progress=False, echo=lambda s: None, poll_s=0.02)
    rows = load_rows(tmp_path / "busy")
    assert all(r["speedup"] < 1.0 for r in rows if r["method"] != "none")  # the biased figures
    busy = recommendations(rows, None)
    assert len(busy) == 4 and all(r["verdict"] == CANNOT_TELL for r in busy), busy
    assert all("competed for the CPUs" in r["why"] for r in busy)
    assert "some task waiting for a CPU up to 95% of the time" in format_run(tmp_path / "busy")
