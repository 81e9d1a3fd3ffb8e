"""A mixed cell on a real vLLM engine: 2 categories, 4 prompts, 16 tokens, no SD and n-gram (slow: two
engines). Rows and traces break the cell down per category."""

from __future__ import annotations

import importlib.util

import pytest

from helpers import NONE_AND_NGRAM, run_engine_sweep
from speclab.cli import main

pytestmark = pytest.mark.engine

SWEEP = (
    """
name = "mix-engine-test"
target = "smollm2-135m"
dtype = "float32"
batch_sizes = [4]
batching = "continuous"
num_prompts = 4
max_tokens = 16
seed = 42
mix = { offline-code-edit = 0.5, offline-chat = 0.5 }

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
def test_a_mixed_cell_is_broken_down_per_category(tmp_path, capsys):
    from speclab.traces import read_store

    run, rows = run_engine_sweep(tmp_path, SWEEP)
    capsys.readouterr()
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows), [r.get("error") for r in rows]
    for r in rows:
        assert r["workload"] == "mix" and ".mix.cont.b4." in r["cell_id"]
        per = r["per_category"]
        assert set(per) == {"code-editing", "chat"}
        assert all(v["num_requests"] == 2 and v["output_tokens"] > 0 for v in per.values())
        assert sum(v["output_tokens"] for v in per.values()) == r["output_tokens"]
        if r["method"] == "ngram":
            assert r["speedup"] is not None and r["lossless"] is True
            assert all(v["mean_tokens_per_step"] is not None for v in per.values())
    recs = read_store(run / "traces")
    assert len(recs) == 8
    assert sorted(t.category for t in recs) == ["chat"] * 4 + ["code-editing"] * 4
    main(["bench", "show", str(run)])
    assert "per category" in capsys.readouterr().out
