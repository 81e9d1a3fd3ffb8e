"""A logged replay on a real vLLM (n-gram SD, loopback) while `speclab watch` reads the same server: the
acceptance per position watch reads over the cell's window equals the row the bench wrote, and each request
ran with its own logged max_tokens (slow: one engine start)."""

from __future__ import annotations

import importlib.util
import json
import threading

import pytest

pytestmark = pytest.mark.engine

PROMPTS = [
    "Repeat this code exactly: def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n",
    "Copy this list exactly: apple, banana, cherry, apple, banana, cherry, apple, banana, cherry",
    "Rewrite with the name total instead of s: s = 0\nfor x in xs:\n    s = s + x\nprint(s)\n",
    "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog.",
]
TIMES = [0.0, 0.04, 1.0, 1.02]  # two bursts of two, 1 s apart
MAX_TOKENS = [32, 8, 24, 16]

SWEEP = """
name = "arrivals-engine-test"
target = "smollm2-135m"
dtype = "float32"
batch_sizes = [1]
num_prompts = 4
max_tokens = 32
seed = 42

[workloads.my-log]
path = "LOG"

[engine]
max_model_len = 1024
enforce_eager = true
llm_kwargs = { enable_prefix_caching = false }

[server]
concurrency = [4]
startup_timeout_s = 600
cell_timeout_s = 300

[[methods]]
name = "ngram"
k = 3
prompt_lookup_min = 2
prompt_lookup_max = 4
"""


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="needs the vLLM stack (scripts/setup.sh)"
)
def test_logged_replay_and_watch_on_a_real_server(tmp_path, monkeypatch):
    from speclab.bench.api import default_prompt_provider, load_sweep_source
    from speclab.bench.rows import read_rows
    from speclab.cli.watch import _what_if
    from speclab.models import prepare_model
    from speclab.server import runner as R
    from speclab.server.arrivals import apply_arrivals
    from speclab.server.process import http_get
    from speclab.server.watch import context_estimate, watch

    prepare_model("smollm2-135m", "float32")
    log = [
        {
            "custom_id": f"r{i}",
            "timestamp": 1_767_225_600 + TIMES[i],
            "body": {
                "messages": [{"role": "user", "content": p}],
                "max_tokens": MAX_TOKENS[i],
                "temperature": 0,
            },
        }
        for i, p in enumerate(PROMPTS)
    ]
    log[1], log[2] = log[2], log[1]  # file order is not arrival order
    (tmp_path / "requests.log").write_text("".join(json.dumps(r) + "\n" for r in log))
    (tmp_path / "sweep.toml").write_text(SWEEP.replace("LOG", str(tmp_path / "requests.log")))
    spec, _ = load_sweep_source(tmp_path / "sweep.toml")
    spec.methods = [m for m in spec.methods if m.name == "ngram"]
    apply_arrivals(spec, "logged:2")

    readings: list[dict] = []
    real_run_cell = R.ServerRunner._run_cell

    def run_cell_watched(self, server, *a, **kw):
        stop, first = threading.Event(), threading.Event()

        def get(url):
            status, text = http_get(url, 30)
            assert status == 200
            first.set()
            return text

        th = threading.Thread(
            target=lambda: readings.append(watch(server.url, 600, 0.5, get=get, stop=stop)), daemon=True
        )
        th.start()
        assert first.wait(60)  # watch's window opens before the cell's first scrape
        try:
            return real_run_cell(self, server, *a, **kw)
        finally:
            stop.set()
            th.join(60)

    monkeypatch.setattr(R.ServerRunner, "_run_cell", run_cell_watched)
    out = R.run_server_bench(spec, tmp_path / "run", default_prompt_provider(spec), echo=print)
    assert (out.ok, out.failed) == (1, 0), [r.get("error") for r in out.rows]
    (row,) = read_rows(tmp_path / "run", mode="server")
    assert row["load"]["arrivals"] == "logged:2" and ".srv-logged2." in row["cell_id"]

    # the requests: sent in arrival order, at the scaled times, each with its own max_tokens
    (prompts_file,) = (tmp_path / "run" / "server" / "prompts").glob("*.jsonl")
    sent = [json.loads(x) for x in prompts_file.read_text().splitlines()]
    assert [d["arrival_s"] for d in sent] == pytest.approx([0.0, 0.02, 0.5, 0.51])
    assert [d["max_tokens"] for d in sent] == MAX_TOKENS
    result = json.loads((tmp_path / "run" / row["result_file"]).read_text())
    assert all(n <= m for n, m in zip(result["output_lens"], MAX_TOKENS, strict=True)), result["output_lens"]
    assert row["server_counters"]["generation_tokens"] <= sum(MAX_TOKENS)

    # watch over the same window read what the bench read
    (r,) = readings
    sc = row["spec_counters"]
    assert r["num_drafts"] == sc["num_drafts"] > 0
    assert r["num_accepted_tokens"] == sc["num_accepted_tokens"]
    assert r["accepted_per_pos"] == sc["accepted_per_pos"]
    assert r["acceptance_rate_per_pos"] == row["acceptance_rate_per_pos"]
    assert r["mean_acceptance_length"] == row["mean_acceptance_length"]
    assert r["running"]["max"] >= 1
    wi = _what_if(r, "smollm2-135m-cpu", "ngram", None, context_estimate(r))
    print("watch:", json.dumps({k: r[k] for k in ("acceptance_rate_per_pos", "running", "draft_share")}))
    print("what-if:", json.dumps(wi["rows"]))
    assert [x["k"] for x in wi["rows"]] == [0, 1, 2, 3] and wi["rows"][3]["vs_observed"] == pytest.approx(1.0)
