"""Sampled cells on a real vLLM engine: a tiny sweep at T = 0 and 0.7, no SD and n-gram (slow: two engines)."""

from __future__ import annotations

import importlib.util

import pytest

from helpers import NONE_AND_NGRAM, run_engine_sweep

pytestmark = pytest.mark.engine

SWEEP = (
    """
name = "sampling-engine-test"
target = "smollm2-135m"
dtype = "float32"
workloads = ["offline-code-edit"]
batch_sizes = [1]
batching = "continuous"
num_prompts = 2
max_tokens = 16
seed = 42
temperatures = [0, 0.7]

[engine]
max_model_len = 1024
enforce_eager = true
kv_cache_gib = 0.5
llm_kwargs = { enable_prefix_caching = false }
"""
    + NONE_AND_NGRAM
)


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="needs the vLLM stack (scripts/setup.sh)"
)
def test_sampled_cells_run_on_a_real_engine(tmp_path, capsys):
    from speclab.traces import read_store

    run, rows = run_engine_sweep(tmp_path, SWEEP)
    out = capsys.readouterr().out
    assert "token-exact vs no-SD: 1/1 SD cells" in out  # the T = 0 cell only
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows), [r.get("error") for r in rows]
    by_id = {r["cell_id"]: r for r in rows}
    for r in rows:
        assert r["output_tokens"] > 0 and r["sampling"] == "fixed" and r["top_p"] == 1.0 and r["top_k"] == 0
        assert r["requests_own_settings"] is None
        if r["method"] == "ngram":
            assert (
                r["speedup"] is not None and by_id[r["baseline_cell_id"]]["temperature"] == r["temperature"]
            )
            assert r["lossless"] is (True if r["temperature"] == 0 else None)
            assert r["mean_acceptance_length"] is not None
    # the T = 0.7 requests drew with their seeds (the same on both sides) and sampled: not the greedy text
    recs = read_store(run / "traces")
    hot = [t for t in recs if t.meta.get("sampling")]
    assert len(hot) == 4 and all(t.meta["sampling"]["temperature"] == 0.7 for t in hot)
    seeds = {}
    for t in hot:
        seeds.setdefault(t.meta["prompt_id"], set()).add(t.meta["sampling"]["seed"])
    assert all(len(s) == 1 for s in seeds.values())
    base = {
        (t.meta["prompt_id"], bool(t.meta.get("sampling"))): list(t.output_token_ids)
        for t in recs
        if t.meta["cell_id"].startswith("none.")
    }
    assert any(base[(p, True)] != base[(p, False)] for p, _ in base), "T = 0.7 gave the greedy outputs"
