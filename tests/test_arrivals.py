"""Logged arrivals: the schedule, the prompts file, and a replay through vLLM's own load generator against a
tiny local HTTP server that records when each request arrives and the max_tokens it asks for."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from speclab.errors import ConfigError, SpeclabError
from speclab.server.arrivals import parse_arrivals, schedule
from speclab.server.loadgen import read_prompts, write_prompts
from speclab.workloads.arrivals import pattern, pattern_lines

SRC = Path(__file__).resolve().parent.parent / "src"


def test_parse_arrivals():
    assert not parse_arrivals(None).logged
    assert parse_arrivals("logged").speed == 1.0
    a = parse_arrivals("logged:2.5")
    assert a.logged and a.speed == 2.5 and a.label() == "logged:2.5"
    for bad in ("logged:0", "logged:x", "gamma", "logged:-1"):
        with pytest.raises(ConfigError):
            parse_arrivals(bad)


def test_schedule_orders_scales_and_needs_every_time():
    order, offs = schedule([10.0, 9.0, 12.0, 9.0], speed=2.0)
    assert order == [1, 3, 0, 2]
    assert offs == [0.0, 0.0, 0.5, 1.5]
    with pytest.raises(ConfigError, match="1 of 2"):
        schedule([1.0, None])


def test_pattern_rate_and_burstiness():
    even = pattern([float(i) for i in range(13)], bins=4)
    assert even is not None and even["gap_cv"] == pytest.approx(0.0)
    assert even["rate_per_s"] == pytest.approx(1.0) and sum(even["per_bin"]) == 13
    bursty = pattern([0, 0.01, 0.02, 0.03, 10, 10.01, 10.02, 10.03], bins=4)
    assert bursty is not None and bursty["gap_cv"] > 1.3 and bursty["per_bin"] == [4, 0, 0, 4]
    assert bursty["peak_to_mean"] == pytest.approx(2.0)
    text = "\n".join(pattern_lines(bursty))
    assert "bursty" in text and "4 0 0 4" in text
    assert pattern([1.0]) is None


def test_prompts_file_carries_arrivals_and_own_max_tokens(tmp_path: Path):
    p = tmp_path / "p.jsonl"
    write_prompts(p, [("a", [1, 2]), ("b", [3])], 32, arrival_s=[0.0, 0.25], own_max_tokens=[7, None])
    got = read_prompts(p)
    assert [(x["max_tokens"], x["arrival_s"]) for x in got] == [(7, 0.0), (32, 0.25)]
    lines = p.read_text().splitlines()
    del_one = json.loads(lines[1])
    del del_one["arrival_s"]
    p.write_text(lines[0] + "\n" + json.dumps(del_one) + "\n")
    with pytest.raises(SpeclabError, match="all or none"):
        read_prompts(p)


# --- a replay against a local server ------------------------------------------------------------------------
class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # a burst must not wait in the listen backlog
    daemon_threads = True


class _Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[float, list[int], int]] = []
    lock = threading.Lock()

    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        t = time.time()
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            self.seen.append((t, list(body["prompt"]), int(body["max_tokens"])))
        n = int(body["max_tokens"])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(n):
            chunk = {"choices": [{"index": 0, "text": "x"}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.05)  # a slow response: the next send must not wait for it
        usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM's benchmark code")
def test_logged_replay_send_times_and_max_tokens(tmp_path: Path):
    # a bursty log (seconds): 16 bursts of 3-7 requests 6 ms apart, 0.2-1.4 s between bursts; replayed at
    # twice the speed
    logged = []
    t = 1_700_000_000.0
    for b in range(16):
        logged += [t + 0.006 * j for j in range(3 + b % 5)]
        t += 0.2 + 0.4 * (b % 4)
    n = len(logged)
    shuffled = logged[1::2] + logged[0::2]  # the log's line order need not be arrival order
    order, offsets = schedule(shuffled, speed=2.0)
    max_tokens = [2 + (i % 4) for i in range(n)]
    prompts = [(f"r{i}", [1000 + i, 7, 7]) for i in order]
    path = tmp_path / "prompts.jsonl"
    write_prompts(path, prompts, 16, arrival_s=offsets, own_max_tokens=[max_tokens[i] for i in order])

    _Recorder.seen = []
    server = _Server(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    cmd = [
        sys.executable, "-m", "speclab.server.loadgen", "--speclab-prompts", str(path),
        "--dataset-name", "custom", "--dataset-path", str(path), "--backend", "vllm", "--base-url", url,
        "--endpoint", "/v1/completions", "--model", "fake", "--skip-tokenizer-init", "--num-prompts", str(n),
        "--request-rate", "inf", "--ready-check-timeout-sec", "0", "--disable-tqdm", "--temperature", "0",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(SRC), "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    seen = sorted(_Recorder.seen)
    assert len(seen) == n
    by_prompt = {tuple(p): (t, m) for t, p, m in seen}
    start = by_prompt[tuple(prompts[0][1])][0]
    errors = []
    for (pid, ids), off in zip(prompts, offsets, strict=True):
        t_recv, m = by_prompt[tuple(ids)]
        assert m == max_tokens[int(pid[1:])]  # each request's own max_tokens reached the server
        errors.append((abs((t_recv - start) - off), off))
    errors.sort()
    p99 = float(np.percentile([e for e, _ in errors], 99))
    print(f"{n} requests: send-time error p50 {errors[n // 2][0] * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms")
    assert offsets[-1] == pytest.approx((logged[-1] - logged[0]) / 2.0)
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if p99 > 0.050 and load > cpus:  # a saturated machine delays any sender; the bound is for a free one
        pytest.skip(f"send-time p99 {p99 * 1e3:.0f} ms not judged: load average {load:.1f} on {cpus} CPUs")
    assert p99 <= 0.050, (p99, errors[-5:])


# --- server cells of a logged replay ------------------------------------------------------------------------
SWEEP = """
target = "/nonexistent/target"
workloads = ["offline-code-edit"]
batch_sizes = [1]
num_prompts = 4
max_tokens = 16

[server]
concurrency = [2]
arrivals = "logged:2"

[[methods]]
name = "ngram"
k = 3
"""

FAKE_LOADGEN = r"""
import json, shutil, sys
result_dir, prompts, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
shutil.copy(prompts, result_dir + "/sent.jsonl")
r = {"completed": n, "failed": 0, "duration": 1.0, "total_output_tokens": 8 * n, "output_throughput": 8.0 * n,
     "request_throughput": float(n), "generated_texts": ["same"] * n, "errors": [""] * n}
open(result_dir + "/result.json", "w").write(json.dumps(r))
"""


class _FakeServer:
    def __init__(self, spec, workdir, startup_timeout_s=900.0):
        self.workdir = Path(workdir)
        self.url, self.target, self.startup_s, self.proc = "http://127.0.0.1:1", "/m", 0.1, None
        self.log_path = self.workdir / "server.log"

    def __enter__(self):
        self.workdir.mkdir(parents=True)
        self.log_path.write_text("fake\n")
        return self

    def __exit__(self, *a):
        return None

    def warmup(self, ids):
        pass

    def scrape(self):
        from speclab.server.metrics import ServerCounters

        return ServerCounters()


def test_server_cells_replay_the_log(tmp_path: Path, monkeypatch):
    from speclab.bench.preflight import PromptSet
    from speclab.bench.spec import parse_sweep_text
    from speclab.engine.protocol import PromptSpec
    from speclab.server import runner as R
    from speclab.server.arrivals import apply_arrivals
    from speclab.server.cells import expand_server_cells

    spec = parse_sweep_text(SWEEP, "s.toml")
    ids = sorted(c.cell_id for c in expand_server_cells(spec))
    assert (
        len(ids) == 4
        and sum(".srv-logged2." in i for i in ids) == 2
        and sum(".srv-c2." in i for i in ids) == 2
    )
    apply_arrivals(spec, "logged:4")
    cells = expand_server_cells(spec)
    assert [c.load_text for c in cells] == ["arrivals logged:4"] * 2
    assert cells[0].describe(spec)["load"]["arrivals"] == "logged:4"

    monkeypatch.setattr(R, "Server", _FakeServer)
    monkeypatch.setattr(
        R,
        "loadgen_command",
        lambda **kw: [sys.executable, "-c", FAKE_LOADGEN, str(kw["result_dir"]), str(kw["prompts"]), "4"],
    )

    def provider(w: str) -> PromptSet:
        ps = [PromptSpec(f"p{i}", [1, 2, 3, i]) for i in range(4)]
        arrivals = {"p0": 100.0, "p1": 108.0, "p2": 100.4, "p3": 104.0}
        logged = {"p0": {"max_tokens": 5}, "p2": {"max_tokens": 9}, "p3": {"max_tokens": 4000}}
        return PromptSet(w, "code", ps, logged=logged, arrivals=arrivals)

    spec.max_model_len = 64
    out = R.run_server_bench(spec, tmp_path / "run", provider, echo=lambda s: None, spec_text=SWEEP)
    assert out.ok == 2 and out.failed == 0
    sent = [json.loads(x) for x in next((tmp_path / "run").rglob("sent.jsonl")).read_text().splitlines()]
    assert [d["id"] for d in sent] == ["p0", "p2", "p3", "p1"]  # arrival order
    assert [d["arrival_s"] for d in sent] == [0.0, 0.1, 1.0, 2.0]  # (t - t0) / 4
    assert [d["max_tokens"] for d in sent] == [5, 9, 60, 16]  # own, own cut to the model length, sweep's


def test_inspect_shows_the_arrival_pattern(tmp_path: Path):
    from speclab.workloads.summary import format_summary, summarize_file

    times = [0, 0.01, 0.02, 0.03, 0.04, 30, 30.01, 30.02, 60, 60.01]
    rows = [
        {"messages": [{"role": "user", "content": f"question {i}"}], "timestamp": 1000 + t, "max_tokens": 8}
        for i, t in enumerate(times)
    ]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = summarize_file(path)
    p = s["requests_asked"]["arrival"]["pattern"]
    assert p["n"] == 10 and p["span_s"] == pytest.approx(60.01) and p["gap_cv"] > 1.3
    assert p["per_bin"][0] == 5 and p["per_bin"][-1] == 2 and sum(p["per_bin"]) == 10
    out = format_summary(s)
    assert "arrival pattern: 10 requests over 60.0 s" in out and "(bursty; 1 = Poisson)" in out
    assert "--arrivals logged" in out


def test_cli_arrivals_dry_run(tmp_path: Path, capsys):
    from speclab.cli import main

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    sweep = tmp_path / "s.toml"
    sweep.write_text(SWEEP.replace('arrivals = "logged:2"\n', "").replace("/nonexistent/target", str(ckpt)))
    argv = [
        "bench",
        "run",
        str(sweep),
        "--server",
        "--arrivals",
        "logged:3",
        "--dry-run",
        "--out",
        str(tmp_path / "r"),
    ]
    main(argv)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "(arrivals logged:3, 4 requests)" in text and "conc" not in text
    with pytest.raises(SystemExit) as ei:
        main(["bench", "run", str(sweep), "--arrivals", "logged", "--dry-run"])
    assert ei.value.code == 2 and "give --server (or --endpoint) too" in capsys.readouterr().err
