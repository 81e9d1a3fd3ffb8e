"""`speclab bench SWEEP --endpoint URL`: an existing OpenAI-compatible server driven by vLLM's load generator,
against a fake server (tests/fake_openai.py) that produces each remote fault: one line, exit 2, the requests
that completed kept in the row. Needs the vLLM stack (the load generator is vllm bench serve)."""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path

import pytest

from fake_openai import FakeOpenAI
from speclab.errors import ConfigError
from speclab.server.endpoint import parse_endpoints
from speclab.server.faults import classify

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs the vLLM stack")
SRC = str(Path(__file__).resolve().parents[1] / "src")
KEY = "sk-test-1234567890-secret"

SWEEP = """
name = "endpoint-test"
target = "smollm2-135m"
workloads = ["offline-code-edit"]
batch_sizes = [1]
num_prompts = 4
max_tokens = 8
seed = 42

[server]
concurrency = [1]
slo = { ttft_ms = 60000 }
cell_timeout_s = 120

[[methods]]
name = "ngram"
k = 2
"""


def _bench(tmp_path: Path, monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    from speclab.cli import main

    monkeypatch.setenv("PYTHONPATH", SRC)  # the load generator child imports this speclab
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(SWEEP)
    try:
        main(["bench", str(sweep), "--out", str(tmp_path / "run"), *args])
        rc = 0
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out = capsys.readouterr()
    return rc, out.out, out.err


def _rows(tmp_path: Path) -> list[dict]:
    path = tmp_path / "run" / "results.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _all_text(root: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


def test_parse_endpoints():
    a, b = parse_endpoints(["sd=http://127.0.0.1:8001/v1/", "none=http://127.0.0.1:8000"])
    assert (a.label, a.url, a.baseline, a.expects_sd) == ("none", "http://127.0.0.1:8000", True, False)
    assert (b.label, b.url, b.baseline, b.expects_sd) == ("sd", "http://127.0.0.1:8001", False, True)
    (one,) = parse_endpoints(["http://127.0.0.1:9/x?"])
    assert (one.label, one.expects_sd, one.baseline) == ("endpoint", None, True)
    for bad in (["ftp://h"], ["http://u:p@h:1"], ["http://h:1?key=x"], [], ["a=http://h", "a=http://g"]):
        with pytest.raises(ConfigError):
            parse_endpoints(bad)


def test_classify_errors():
    assert classify("Unauthorized").startswith("HTTP 401")
    assert classify("Too Many Requests").startswith("HTTP 429")
    assert classify("Service Unavailable").startswith("HTTP 503")
    assert "refused" in classify("aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host")
    assert "dropped" in classify(
        "Traceback...\naiohttp.ClientPayloadError: Response payload is not completed"
    )
    assert "SSE" in classify("Traceback...\njson.decoder.JSONDecodeError: Expecting property name")
    assert classify("TimeoutError: no answer within 2 s", 2).startswith("timeout")


@needs_vllm
def test_endpoint_ok_with_key_and_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECLAB_TEST_KEY", KEY)
    with FakeOpenAI("ok", api_key=KEY) as srv:
        rc, out, err = _bench(
            tmp_path,
            monkeypatch,
            capsys,
            "--endpoint",
            f"ngram={srv.url}",
            "--api-key-env",
            "SPECLAB_TEST_KEY",
        )
        assert rc == 0, err
        (row,) = _rows(tmp_path)
        assert row["status"] == "ok" and row["completed"] == 4 and row["mode"] == "server"
        assert row["endpoint"] == {"label": "ngram", "url": srv.url, "model": "fake-model"}
        assert row["latency_ms"]["ttft"]["p50"] > 0 and row["request_goodput"] is not None
        assert row["spec_counters"]["num_drafts"] == 16 and row["mean_acceptance_length"] == 2.0
        assert all(a == f"Bearer {KEY}" for a in srv.auth_seen)
        assert "ngram" in out and "1 endpoint cell(s) run" in out  # the server table and the summary
        n = srv.completions
        rc, _, err = _bench(
            tmp_path,
            monkeypatch,
            capsys,
            "--endpoint",
            f"ngram={srv.url}",
            "--api-key-env",
            "SPECLAB_TEST_KEY",
        )
        assert rc == 0 and srv.completions == n and "already done" in err  # resumed: nothing sent again
    assert KEY not in _all_text(tmp_path / "run") + out + err


@needs_vllm
def test_connection_refused(tmp_path, monkeypatch, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, _, err = _bench(tmp_path, monkeypatch, capsys, "--endpoint", f"http://127.0.0.1:{port}")
    assert rc == 2
    assert err.strip().splitlines()[-1].startswith("speclab: error: endpoint endpoint")
    assert "connection refused; 0 of 4 requests completed" in err
    (row,) = _rows(tmp_path)
    assert row["status"] == "failed" and row["completed"] == 0


FAULTS = [
    ("refuse", "connection refused"),
    ("unauthorized", "HTTP 401 Unauthorized"),
    ("forbidden", "HTTP 403 Forbidden"),
    ("ratelimit", "HTTP 429 Too Many Requests"),
    ("error", "HTTP 500 Internal Server Error"),
    ("timeout", "timeout: no full answer within 2 s"),
    ("drop", "the stream was dropped before its end"),
    ("badsse", "malformed SSE chunk"),
    ("nometrics", "/metrics has no spec-decode counters"),
]


@needs_vllm
@pytest.mark.parametrize(("mode", "cause"), FAULTS)
def test_remote_fault_is_one_line_exit_2_completed_kept(tmp_path, monkeypatch, capsys, mode, cause):
    with FakeOpenAI(mode, ok_first=2) as srv:
        rc, _, err = _bench(
            tmp_path, monkeypatch, capsys, "--endpoint", f"sd={srv.url}", "--request-timeout", "2"
        )
    assert rc == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"speclab: error: endpoint sd ({srv.url}): {cause}"), last
    (row,) = _rows(tmp_path)
    assert row["status"] == "failed" and cause in row["error"]
    kept = 4 if mode == "nometrics" else 2
    assert row["completed"] == kept and f"{kept} of 4 requests completed" in last
    if mode != "nometrics":
        assert row["failed_requests"] == 2
    result = json.loads((tmp_path / "run" / row["result_file"]).read_text())
    assert sum(1 for t in result["generated_texts"] if t) >= kept


def test_cli_dry_run_and_usage(tmp_path, monkeypatch, capsys):
    rc, out, _ = _bench(
        tmp_path,
        monkeypatch,
        capsys,
        "--endpoint",
        "ngram=http://127.0.0.1:9",
        "--endpoint",
        "none=http://127.0.0.1:8/v1",
        "--dry-run",
    )
    assert rc == 0 and "endpoint mode: 2 cells" in out
    assert out.index("endpoint none: http://127.0.0.1:8 (baseline)") < out.index("endpoint ngram")
    assert "none.offline-code-edit.ep-c1." in out and not (tmp_path / "run").exists()
    rc, _, err = _bench(tmp_path, monkeypatch, capsys, "--endpoint", "http://127.0.0.1:9", "--server")
    assert rc == 2 and "cannot be combined" in err
    rc, _, err = _bench(tmp_path, monkeypatch, capsys, "--endpoint", "http://127.0.0.1:9", "--redo", "x.*")
    assert rc == 2 and "matches no cell" in err
    monkeypatch.delenv("SPECLAB_UNSET_KEY", raising=False)
    rc, _, err = _bench(
        tmp_path,
        monkeypatch,
        capsys,
        "--endpoint",
        "http://127.0.0.1:9",
        "--api-key-env",
        "SPECLAB_UNSET_KEY",
    )
    assert rc == 2 and "SPECLAB_UNSET_KEY: that environment variable is not set" in err


def test_missing_key_fails_at_the_model_list(tmp_path, monkeypatch, capsys):
    with FakeOpenAI("ok", api_key=KEY) as srv:
        rc, _, err = _bench(tmp_path, monkeypatch, capsys, "--endpoint", f"none={srv.url}")
        assert srv.completions == 0  # nothing measured against a server that refuses us
    last = err.strip().splitlines()[-1]
    assert rc == 2 and "HTTP 401 Unauthorized: the server refuses the API key" in last
    assert "0 of 4 requests completed" in last


def test_unreadable_metrics_is_a_fault(tmp_path, monkeypatch, capsys):
    with FakeOpenAI("badmetrics") as srv:
        rc, _, err = _bench(tmp_path, monkeypatch, capsys, "--endpoint", f"sd={srv.url}")
        assert srv.completions == 0
    last = err.strip().splitlines()[-1]
    assert rc == 2 and "/metrics line 1: not a number" in last and "0 of 4 requests completed" in last
    (row,) = _rows(tmp_path)
    assert row["status"] == "failed" and row["completed"] == 0


def test_endpoint_cells_replay_logged_arrivals():
    from speclab.bench.spec import parse_sweep_text
    from speclab.server.arrivals import apply_arrivals
    from speclab.server.endpoint import expand_endpoint_cells

    spec = parse_sweep_text(SWEEP, "s.toml")
    eps = parse_endpoints(["ngram=http://127.0.0.1:9", "none=http://127.0.0.1:8"])
    plain = {c.cell_id for c in expand_endpoint_cells(spec, eps)}
    apply_arrivals(spec, "logged:2")
    cells = expand_endpoint_cells(spec, eps)
    assert cells and all(c.arrivals == "logged:2" and ".ep-logged2." in c.cell_id for c in cells)
    assert all(c.describe(spec)["load"]["arrivals"] == "logged:2" for c in cells)
    assert not plain & {c.cell_id for c in cells}  # a replay is its own cell, never a resumed rate cell
