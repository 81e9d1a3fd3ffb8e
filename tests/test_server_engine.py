"""Server mode on a real vLLM: `vllm serve` on loopback driven by `vllm bench serve`, and the acceptance it
reports on /metrics against the offline engine's counters for the same requests (slow: two engine starts)."""

from __future__ import annotations

import importlib.util
import os

import pytest

pytestmark = pytest.mark.engine

SWEEP = """
name = "server-engine-test"
target = "smollm2-135m"
dtype = "float32"
workloads = ["offline-code-edit"]
batch_sizes = [4]
batching = "continuous"
num_prompts = 4
max_tokens = 32
seed = 42

[engine]
max_model_len = 1024
enforce_eager = true
llm_kwargs = { enable_prefix_caching = false }

[server]
concurrency = [4]
slo = { ttft_ms = 60000, tpot_ms = 10000 }
startup_timeout_s = 600
cell_timeout_s = 300

[[methods]]
name = "ngram"
k = 3
prompt_lookup_min = 2
prompt_lookup_max = 4
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="needs the vLLM stack (scripts/setup.sh)"
)
def test_server_acceptance_equals_offline_counters(tmp_path, monkeypatch):
    from speclab.bench.api import default_prompt_provider, run_bench
    from speclab.bench.rows import read_rows
    from speclab.bench.spec import parse_sweep_text
    from speclab.models import prepare_model
    from speclab.server import process
    from speclab.server.crosscheck import server_vs_offline
    from speclab.server.runner import run_server_bench

    prepare_model("smollm2-135m", "float32")
    spec = parse_sweep_text(SWEEP, "engine-test")
    # only the n-gram engine on each side (the baseline the parser adds is not needed for this check)
    spec.methods = [m for m in spec.methods if m.name == "ngram"]
    run = tmp_path / "run"
    provider = default_prompt_provider(spec)

    servers: list[process.Server] = []
    real_init = process.Server.__init__

    def remember(self, *a, **kw):  # to check afterwards that nothing of the server is left running
        real_init(self, *a, **kw)
        servers.append(self)

    monkeypatch.setattr(process.Server, "__init__", remember)
    try:
        out = run_server_bench(spec, run, provider, echo=print)
        assert (out.ok, out.failed) == (1, 0), [r.get("error") for r in out.rows]
        run_bench(spec, run, prompt_provider=provider, progress=False, echo=print)
    finally:
        for s in servers:
            s.stop()
    assert servers and all(s.proc is not None and not _alive(s.proc.pid) for s in servers)
    with pytest.raises(ProcessLookupError):
        os.killpg(servers[0].proc.pid, 0)  # the whole process group (engine core included) is gone

    (srv,) = read_rows(run, mode="server")
    (off,) = read_rows(run)
    assert srv["status"] == "ok" and off["status"] == "ok"
    assert srv["completed"] == 4 and srv["output_tokens"] > 0
    for m in ("ttft", "tpot"):
        assert 0 < srv["latency_ms"][m]["p50"] <= srv["latency_ms"][m]["p99"]
    assert srv["request_goodput"] is not None
    sc = srv["spec_counters"]
    assert sc["num_drafts"] > 0 and len(sc["accepted_per_pos"]) == 3
    # vllm bench serve's own reading of /metrics agrees with speclab's scrape
    assert srv["bench_serve_spec"]["num_drafts"] == sc["num_drafts"]
    assert srv["bench_serve_spec"]["accepted_tokens"] == sc["num_accepted_tokens"]
    # the server generated exactly the tokens the offline engine did, by count
    assert srv["server_counters"]["generation_tokens"] == off["output_tokens"] == srv["output_tokens"]
    (check,) = server_vs_offline(read_rows(run, mode="all"))
    print("server vs offline:", check)
    assert check["equal"] is True, check["detail"]
    # rerun: the cell is done, no server starts
    servers.clear()
    out2 = run_server_bench(spec, run, provider, echo=print)
    assert (out2.ok, out2.skipped) == (0, 1) and servers == []
