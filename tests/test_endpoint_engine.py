"""`speclab bench --endpoint` against two vLLM servers started by hand on 127.0.0.1, as a user would (one with
n-gram SD, one without, both behind an API key): rows like server mode's, spec-decode counters from the SD
server's /metrics, and text-exact outputs at T = 0 between them (slow: two engine starts)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

SRC = str(Path(__file__).resolve().parents[1] / "src")
KEY = "sk-engine-test-secret"
SWEEP = """
name = "endpoint-engine-test"
target = "smollm2-135m"
workloads = ["offline-code-edit"]
batch_sizes = [1]
num_prompts = 3
max_tokens = 16
seed = 42

[server]
concurrency = [1]
slo = { ttft_ms = 60000, tpot_ms = 10000 }
cell_timeout_s = 300

[[methods]]
name = "ngram"
k = 3
"""
NGRAM = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'


def _start(model: str, port: int, log: Path, extra: list[str]) -> subprocess.Popen:
    from speclab.engine.launch import spawn_child, worker_env
    from speclab.server.process import HOST, loopback_env

    env = loopback_env(worker_env(1))
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    env["VLLM_HOST_IP"] = HOST
    cmd = [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", model]
    cmd += ["--host", HOST, "--port", str(port), "--dtype", "float32", "--max-model-len", "1024"]
    cmd += ["--enforce-eager", "--seed", "42", "--api-key", KEY, *extra]
    with open(log, "wb") as fh:
        return spawn_child(cmd, env, fh)


def _wait(proc: subprocess.Popen, url: str, log: Path, timeout: float = 600) -> None:
    import time

    from speclab.server.process import http_get

    t0 = time.time()
    while time.time() - t0 < timeout:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            if http_get(f"{url}/health", timeout=5)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"not healthy: {log.read_text()[-2000:]}")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs the vLLM stack")
def test_endpoint_ab_against_two_hand_started_servers(tmp_path, monkeypatch, capsys):
    import signal

    from speclab.cli import main
    from speclab.models import prepare_model
    from speclab.procs import kill_group
    from speclab.server.process import free_port

    model = str(prepare_model("smollm2-135m", "float32"))
    ports = free_port(), free_port()
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    procs = [
        _start(model, ports[0], tmp_path / "none.log", []),
        _start(model, ports[1], tmp_path / "ngram.log", ["--speculative-config", NGRAM]),
    ]
    try:
        _wait(procs[0], urls[0], tmp_path / "none.log")
        _wait(procs[1], urls[1], tmp_path / "ngram.log")
        monkeypatch.setenv("PYTHONPATH", SRC)
        monkeypatch.setenv("SPECLAB_TEST_KEY", KEY)
        sweep = tmp_path / "sweep.toml"
        sweep.write_text(SWEEP)
        args = ["bench", str(sweep), "--out", str(tmp_path / "run"), "--api-key-env", "SPECLAB_TEST_KEY"]
        try:
            main([*args, "--endpoint", f"none={urls[0]}", "--endpoint", f"ngram={urls[1]}"])
        except SystemExit as exc:
            assert not exc.code, capsys.readouterr().err
    finally:
        for p in procs:
            kill_group(p, ((signal.SIGINT, 30.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)), sweep=True)
    out = capsys.readouterr()
    print(out.out, out.err)
    rows = {
        r["label"]: r for r in map(json.loads, (tmp_path / "run" / "results.jsonl").read_text().splitlines())
    }
    base, sd = rows["none"], rows["ngram"]
    for r, url in ((base, urls[0]), (sd, urls[1])):
        assert r["status"] == "ok" and r["mode"] == "server" and r["completed"] == 3, r.get("error")
        assert r["endpoint"]["url"] == url and r["endpoint"]["model"] == model
        for m in ("ttft", "tpot", "itl", "e2el"):
            assert 0 < r["latency_ms"][m]["p50"] <= r["latency_ms"][m]["p99"]
        assert r["request_goodput"] is not None and r["output_tokens"] > 0
    assert base["spec_counters"] is None
    assert sd["spec_counters"]["num_drafts"] > 0 and len(sd["acceptance_rate_per_pos"]) == 3
    assert sd["bench_serve_spec"]["num_drafts"] == sd["spec_counters"]["num_drafts"]
    assert sd["lossless"] is True and sd["baseline_cell_id"] == base["cell_id"], sd["lossless_detail"]
    texts = [
        json.loads((tmp_path / "run" / r["result_file"]).read_text())["generated_texts"] for r in (base, sd)
    ]
    assert texts[0] == texts[1] and all(texts[0])
    run_text = "".join(p.read_text(errors="replace") for p in (tmp_path / "run").rglob("*") if p.is_file())
    assert KEY not in run_text + out.out + out.err
