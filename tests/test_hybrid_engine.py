"""speclab's hybrid (speclab.methods.hybrid_live: the adaptive rule choosing per step among n-gram, suffix and
vLLM's own EAGLE-3 drafter) inside a real vLLM engine (marked `engine`): fp32, greedy, continuous batching at
B = 1 and 4, outputs token-exact against no SD, with steps that draft (the rejection sampler) and steps that
do not (sampled by vLLM's plain sampler: `plain_sampling`). The head is untrained (initialised from the
target as training starts), so no training runs here: the rule tries it on its prior and learns it is
rarely right; what is checked is that every path keeps the output exact."""

from __future__ import annotations

import importlib.util
import re

import pytest

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM stack not installed"),
    pytest.mark.skipif(importlib.util.find_spec("arctic_inference") is None, reason="no arctic-inference"),
]

MAX_TOKENS = 24


def _save_untrained_head(target, out) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from speclab.models.eagle3 import Eagle3Head, head_config

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
    tcfg = model.config.to_dict()
    n = int(tcfg["num_hidden_layers"])
    vocab, draft_vocab = int(tcfg["vocab_size"]), 2048
    ids = torch.arange(draft_vocab)  # the first ids: a reduced vocabulary with a trivial mapping
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    head = Eagle3Head(
        head_config(tcfg, [2, n // 2, n - 1], draft_vocab),
        model.get_input_embeddings().weight.detach(),
        ids - torch.arange(draft_vocab),
        t2d,
    )
    head.init_from_target(model.model.norm.weight.detach(), model.get_output_embeddings().weight, 0)
    head.save(out)


def _run(d, engine, cells):
    from speclab.engine.protocol import Job, read_results
    from worker_run import run_worker_job

    d.mkdir()
    text = run_worker_job(d, Job(engine, cells, timings_csv=str(d / "timings.csv")))
    res = {r.cell_id: r for r in read_results(d / "cells.jsonl")}
    assert all(r.status == "ok" for r in res.values()), {k: r.error for k, r in res.items()}
    return res, text


def test_hybrid_token_exact_with_and_without_drafts(tmp_path) -> None:
    from speclab.engine.protocol import CellSpec, EngineSpec, PromptSpec
    from speclab.engine.smoke import SMOKE_PROMPTS, render_chat
    from speclab.models import prepare_model

    target = prepare_model("smollm2-135m", "float32")
    head = tmp_path / "head"
    _save_untrained_head(target, head)
    texts = SMOKE_PROMPTS[:4]
    prompts = [PromptSpec(f"p{i}", x) for i, x in enumerate(render_chat(target, texts))]
    cells = [CellSpec(f"b{b}", "continuous", b, MAX_TOKENS, prompts) for b in (1, 4)]

    def spec(method, k, options):
        return EngineSpec(str(target), "float32", method, k, options, 1024, 4, True, 1.0, 42)

    base, _ = _run(tmp_path / "none", spec("none", None, {}), cells)
    hybrid_options = {
        "model": str(head),
        "proposer_options": {"kmax_model": 3, "suffix": {"max_cached_requests": 0}},
    }
    sd, log = _run(tmp_path / "hybrid", spec("eagle3", 8, hybrid_options), cells)
    for cid, r in base.items():
        want = {q.id: q.output_token_ids for q in r.requests}
        assert {q.id: q.output_token_ids for q in sd[cid].requests} == want, cid  # lossless in fp32
    # both paths ran: steps that verified drafts (the head's on its prior, at least) and steps without,
    # sampled plainly
    drafted = [d for r in sd.values() for q in r.requests for d in (q.per_step_drafted or [])]
    assert any(d > 0 for d in drafted), drafted
    plain = [int(x) for x in re.findall(r"steps sampled plainly (\d+)", log)]
    assert len(plain) == 2 and sum(plain) > 0, plain
    heads = [int(x) for x in re.findall(r"hybrid decisions \{[^}]*'eagle3': (\d+)", log)]
    assert len(heads) == 2 and sum(heads) > 0, heads  # the head's drafts were taken somewhere
