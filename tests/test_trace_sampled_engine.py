"""`speclab trace --workload ... --temperature 0.7` on a real vLLM engine: the target's sampled outputs (a seed
per prompt) replayed for n-gram give accept_prob in [0, 1], zero beyond the proposals, positive wherever the
first draft is the token the engine sampled. Marked `engine` (one eager engine, 2 prompts x 16 tokens)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM stack not installed"),
]


def test_trace_sampled_ngram_accept_prob(tmp_path):
    from speclab.cli import main
    from speclab.models import prepare_model
    from speclab.replay.expected import LOOKUP_SOURCE
    from speclab.traces import read_store

    prepare_model("smollm2-135m", "float32")
    texts = [
        "Repeat this line three times: the quick brown fox jumps over the lazy dog.",
        "Copy exactly: alpha beta gamma delta, alpha beta gamma delta, alpha beta gamma delta.",
    ]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": t}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "t.parquet"
    args = ["trace", "--workload", f"file:{prompts}", "--target", "smollm2-135m", "--limit", "2"]
    args += [
        "--max-tokens",
        "16",
        "--temperature",
        "0.7",
        "--seed",
        "3",
        "--methods",
        "ngram",
        "--k-max",
        "4",
    ]
    args += ["--ngram-min", "1", "--ngram-max", "3", "--out", str(out)]
    assert main(args) in (0, None)
    recs = read_store(out)
    assert len(recs) == 2
    for r in recs:
        assert r.meta["sampling"]["temperature"] == 0.7 and isinstance(r.meta["sampling"]["seed"], int)
        mt = r.methods["ngram"]
        ap = mt.accept_prob
        assert mt.accept_source == LOOKUP_SOURCE and ap.shape == (r.output_len, 4)
        assert ((ap >= 0) & (ap <= 1)).all()
        assert (ap[np.arange(4)[None, :] >= mt.num_proposed[:, None]] == 0).all()
        # where the first draft is the token the engine sampled there, the target gave it probability > 0
        hit = mt.acc_len >= 2
        assert (ap[hit, 0] > 0).all()
        assert (mt.expected_acc_len() >= 1).all()
    assert any((r.methods["ngram"].num_proposed > 0).any() for r in recs)  # the lookups found something
