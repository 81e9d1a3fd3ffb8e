"""`speclab trace --workload` generation: every prompt batched on one real vLLM engine gives, token for token,
the outputs of the one-request-at-a-time transformers path (fp32, greedy). Marked `engine`: one engine starts
with the bench's settings (torch.compile on), so this takes minutes on a small CPU machine."""

from __future__ import annotations

import importlib.util
import json

import pytest

from speclab.engine.smoke import SMOKE_PROMPTS
from speclab.replay.generate import generate_records

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM stack not installed"),
]

MAX_TOKENS = 16


def test_batched_engine_outputs_equal_one_at_a_time(tmp_path):
    from speclab.models import prepare_model

    prepare_model("smollm2-135m", "float32")
    prompts = tmp_path / "prompts.jsonl"
    texts = [*SMOKE_PROMPTS[:3], "Answer with one word only: what colour is a clear sky at noon?"]
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": t}) + "\n" for i, t in enumerate(texts)))
    kw = dict(workload=f"file:{prompts}", target="smollm2-135m", limit=4, max_tokens=MAX_TOKENS)
    batched = generate_records(**kw, generator="engine", echo=lambda s: None)
    single = generate_records(**kw, generator="transformers")
    assert [r.id for r in batched] == [r.id for r in single]
    assert [r.id.rsplit("-", 1)[1] for r in batched] == ["q0", "q1", "q2", "q3"]  # in the file's order
    for b, s in zip(batched, single, strict=True):
        assert list(b.prompt_token_ids) == list(s.prompt_token_ids)
        assert 1 <= b.output_len <= MAX_TOKENS
        assert list(b.output_token_ids) == list(s.output_token_ids), b.id
