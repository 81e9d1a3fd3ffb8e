"""`speclab watch URL` against a fake /metrics endpoint whose counters advance with every scrape: the
acceptance, rates and occupancy it reads, computed exactly; the what-if priced with a hand-made cost model."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from speclab.cli import main
from speclab.server.metrics import ServerCounters
from speclab.server.watch import metrics_url, reading

# per scrape, the counters grow by these amounts (engine "0" and engine "1" share them)
STEP = {"drafts": 10, "draft_tokens": 30, "accepted": 18, "per_pos": (9, 6, 3), "gen": 40, "prompt": 100}


def metrics_text(i: int) -> str:
    """The i-th scrape (0-based): counters at i * STEP (split over two engines), running = 3 + i % 2."""

    def two(name: str, total: int, extra: str = "") -> str:
        a = total // 2
        return (
            f'{name}{{engine="0",model_name="m"{extra}}} {float(a)}\n'
            f'{name}{{engine="1",model_name="m"{extra}}} {float(total - a)}\n'
        )

    out = "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    out += 'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
    out += f'vllm:num_requests_running{{engine="1",model_name="m"}} {1.0 + i % 2}\n'
    out += 'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
    out += two("vllm:spec_decode_num_drafts_total", STEP["drafts"] * i)
    out += 'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9\n'
    out += two("vllm:spec_decode_num_draft_tokens_total", STEP["draft_tokens"] * i)
    out += two("vllm:spec_decode_num_accepted_tokens_total", STEP["accepted"] * i)
    for pos, n in enumerate(STEP["per_pos"]):
        out += two("vllm:spec_decode_num_accepted_tokens_per_pos_total", n * i, f',position="{pos}"')
    out += two("vllm:generation_tokens_total", STEP["gen"] * i)
    out += two("vllm:prompt_tokens_total", STEP["prompt"] * i)
    out += two("vllm:request_success_total", 2 * i, ',finished_reason="stop"')
    return out


class _Metrics(BaseHTTPRequestHandler):
    scrapes = 0
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path != "/metrics":
            self.send_error(404)
            return
        with self.lock:
            i = _Metrics.scrapes
            _Metrics.scrapes += 1
        body = metrics_text(i).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # watch must never send a request
        raise AssertionError("POST")


@pytest.fixture
def fake_server():
    _Metrics.scrapes = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


COST = """
name = "hand"
[target]
kv = 0.0
batched = 0.001
const = 0.01
[overhead]
per_step = 0.001
[draft.ngram]
form = "verify_fraction"
fraction = 0.5
"""


def test_metrics_url():
    assert metrics_url("127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://h:1/metrics") == "http://h:1/metrics"


def test_watch_reads_the_window_exactly(fake_server: str, tmp_path: Path, capsys):
    cm = tmp_path / "hand.toml"
    cm.write_text(COST)
    argv = ["watch", fake_server, "--window", "0.5", "--interval", "0.1", "--json", "--cost-model", str(cm)]
    main(argv)
    r = json.loads(capsys.readouterr().out)
    n = r["scrapes"]
    assert n == _Metrics.scrapes and n >= 3
    d = n - 1  # counter steps between the first and the last scrape
    assert (
        r["num_drafts"] == 10 * d and r["num_draft_tokens"] == 30 * d and r["num_accepted_tokens"] == 18 * d
    )
    assert r["accepted_per_pos"] == [9 * d, 6 * d, 3 * d]
    assert r["acceptance_rate_per_pos"] == pytest.approx([0.9, 0.6, 0.3], abs=1e-12)
    assert r["mean_acceptance_length"] == pytest.approx(2.8, abs=1e-12) and r["k"] == 3
    assert r["draft_tok_s"] == pytest.approx(30 * d / r["window_s"])
    assert r["accepted_tok_s"] == pytest.approx(18 * d / r["window_s"])
    assert r["draft_share"] == pytest.approx(10 / 22)
    running = [3 + i % 2 for i in range(n)]
    occ = {"mean": sum(running) / n, "max": max(running), "samples": n, "busy_mean": sum(running) / n}
    assert r["running"]["busy_samples"] == n and r["running"]["max"] == 4
    assert {k: r["running"][k] for k in occ} == pytest.approx(occ)
    assert r["waiting_mean"] == 1.0
    # the what-if: B = mean running, f = 10/22, context = (prompt + gen / 2) / finished = (100 + 20) / 2
    wi = r["what_if"]
    b, f, ctx = sum(running) / n, 10 / 22, 60.0
    assert wi["context_tokens"] == pytest.approx(ctx) and wi["observed_k"] == 3
    rates = []
    for k, row in enumerate(wi["rows"]):
        verify = 0.001 * b * (1 + f * k) + 0.01
        step = verify + (0.5 * verify if k else 0.0) + 0.001
        tokens = 1 + f * sum([0.9, 0.6, 0.3][:k])
        assert (
            row["k"] == k
            and row["step_s"] == pytest.approx(step)
            and row["tokens_per_step"] == pytest.approx(tokens)
        )
        rates.append(b * tokens / step)
        assert row["tok_s"] == pytest.approx(rates[-1])
    assert wi["rows"][0]["vs_observed"] == pytest.approx(rates[0] / rates[3])
    assert wi["rows"][3]["vs_observed"] == pytest.approx(1.0)


def test_watch_table(fake_server: str, capsys):
    main(["watch", fake_server, "--window", "0.2", "--interval", "0.1", "--cost-model", "smollm2-135m-cpu"])
    out = capsys.readouterr().out
    assert "acceptance per pos   1: 0.900  2: 0.600  3: 0.300" in out
    assert "mean acceptance len  2.800" in out and "no request sent" in out
    assert "what-if (smollm2-135m-cpu, fixed:ngram:k" in out and " off " in out and "<- now" in out


def test_reading_without_sd():
    r = reading(ServerCounters(generation_tokens=50, requests_finished=1), 2.0, [{}])
    assert not r["spec_decode"] and r["acceptance_rate_per_pos"] == [] and r["generation_tok_s"] == 25.0
    assert r["running"] is None


def test_occupancy_leaves_idle_samples_out_of_the_busy_mean():
    run = "vllm:num_requests_running"
    r = reading(ServerCounters(), 1.0, [{run: 0.0}, {run: 2.0}, {run: 4.0}, {}])
    assert r["running"] == {"mean": 2.0, "max": 4.0, "samples": 3, "busy_mean": 3.0, "busy_samples": 2}
