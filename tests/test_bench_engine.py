"""End to end on a real vLLM engine: a tiny sweep through `speclab bench` (slow: starts two engines)."""

from __future__ import annotations

import importlib.util

import pytest

from helpers import NONE_AND_NGRAM, run_engine_sweep
from speclab.cli import main

pytestmark = pytest.mark.engine

SWEEP = (
    """
name = "engine-test"
target = "smollm2-135m"
dtype = "float32"
workloads = ["offline-code-edit"]
batch_sizes = [1, 2]
batching = "continuous"
num_prompts = 2
max_tokens = 16
seed = 42

[engine]
max_model_len = 1024
enforce_eager = true
llm_kwargs = { enable_prefix_caching = false }
"""
    + NONE_AND_NGRAM
)


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="needs the vLLM stack (scripts/setup.sh)"
)
def test_tiny_sweep_on_a_real_engine(tmp_path, capsys):
    run, rows = run_engine_sweep(tmp_path, SWEEP)
    out = capsys.readouterr().out
    assert "token-exact vs no-SD: 2/2 SD cells" in out
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows), [r.get("error") for r in rows]
    for r in rows:
        assert r["output_tokens"] > 0 and r["throughput_tok_s"] > 0
        assert r["time_split_s"]["verify"] > 0
        if r["method"] == "ngram":
            assert r["lossless"] is True and r["speedup"] is not None
            assert r["mean_acceptance_length"] is not None and len(r["acceptance_rate_per_pos"]) == 3
    from speclab.traces import read_store

    recs = read_store(run / "traces")
    assert len(recs) == 8
    assert any(r.meta.get("observed", {}).get("method") == "ngram" for r in recs)
    assert (run / "timings.csv").read_text().startswith("kind,kv_tokens,")
    # rerun: nothing to do, no engine started
    main(["bench", str(tmp_path / "sweep.toml"), "--out", str(run), "--no-progress"])
    assert len(list((run / "engines").glob("*/attempt-*"))) == 2
