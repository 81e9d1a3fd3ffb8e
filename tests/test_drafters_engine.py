"""A student checkpoint as `speclab.drafters.distill` saves it runs in vLLM as `method = "draft_model"`
(marked `engine`): fp32, k = 3, 2 prompts x 16 tokens, token-exact against no-SD, and speclab's draft-model
replay accepts what vLLM accepted, step for step. The student is the target's first two layers, untrained
(what training changes is the weights, not the format), so no training runs here."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM stack not installed"),
]

MAX_TOKENS = 16


def _run(d, target, method, k, options, prompts, max_tokens=MAX_TOKENS):
    from speclab.engine.protocol import CellSpec, EngineSpec, Job, read_results
    from worker_run import run_worker_job

    d.mkdir()
    job = Job(
        EngineSpec(str(target), "float32", method, k, options, 512, 2, True, 1.0, 42),
        [CellSpec("replicate-b1", "replicate", 1, max_tokens, prompts)],
        timings_csv=str(d / "timings.csv"),
    )
    run_worker_job(d, job)
    (res,) = read_results(d / "cells.jsonl")
    assert res.status == "ok", res.error
    return res


def test_saved_student_runs_as_vllm_draft_model(tmp_path) -> None:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from speclab.drafters.distill import build_student, save_student
    from speclab.engine.protocol import PromptSpec
    from speclab.engine.smoke import SMOKE_PROMPTS, render_chat
    from speclab.methods.draft_model import DraftModelProposer
    from speclab.models import prepare_model
    from speclab.replay.crosscheck import expected_engine_steps

    target = prepare_model("smollm2-135m", "float32")
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
    student_dir = tmp_path / "student"
    save_student(build_student(model, [0, 1]), target, student_dir)
    del model
    prompts = [PromptSpec(f"p{i}", x) for i, x in enumerate(render_chat(target, SMOKE_PROMPTS[:2]))]
    base = _run(tmp_path / "none", target, "none", None, {}, prompts)
    sd = _run(tmp_path / "draft", target, "draft_model", 3, {"model": str(student_dir)}, prompts)
    out = {q.id: q.output_token_ids for q in base.requests}
    assert {q.id: q.output_token_ids for q in sd.requests} == out  # lossless in fp32
    prop = DraftModelProposer(str(student_dir), max_model_len=512)
    ids = {p.id: p.prompt_token_ids for p in prompts}
    for q in sd.requests:
        assert q.per_step_accepted is not None and all(d == 3 for d in q.per_step_drafted)
        acc, proposed = prop.replay(np.asarray(ids[q.id]), np.asarray(q.output_token_ids), 3)
        exp = [a for _, a, _ in expected_engine_steps(acc, proposed, 3)]
        # the last step may accept drafts past max_tokens that the output no longer holds (crosscheck's
        # "output_end" rule): at least what the replay sees there
        assert len(exp) == len(q.per_step_accepted) and exp[:-1] == q.per_step_accepted[:-1], q.id
        assert q.per_step_accepted[-1] >= exp[-1], q.id


def test_trained_eagle3_head_replay_matches_vllm(tmp_path) -> None:
    """The trained EAGLE-3 head (preset smollm2-135m-eagle3; skipped when not trained here) in vLLM, fp32,
    k = 3, 2 prompts x 48 tokens: `speclab.methods.eagle3`'s replay predicts every step vLLM took (crosscheck's rules:
    exact, or censored at the output end)."""
    import numpy as np

    from speclab.engine.protocol import PromptSpec
    from speclab.engine.smoke import SMOKE_PROMPTS, render_chat
    from speclab.errors import SpeclabError
    from speclab.methods.eagle3 import Eagle3Proposer
    from speclab.models import resolve_model
    from speclab.replay.crosscheck import check_request
    from speclab.traces import RequestTrace

    try:
        target = resolve_model("smollm2-135m", "float32", prepare=False)
        head = resolve_model("smollm2-135m-eagle3", prepare=False)
    except SpeclabError as exc:
        pytest.skip(f"needs the prepared target and the trained head ({exc})")
    prompts = [PromptSpec(f"p{i}", x) for i, x in enumerate(render_chat(target, SMOKE_PROMPTS[2:4]))]
    sd = _run(tmp_path / "eagle3", target, "eagle3", 3, {"model": str(head)}, prompts, max_tokens=48)
    prop = Eagle3Proposer(str(head), str(target), max_model_len=512)
    ids = {p.id: p.prompt_token_ids for p in prompts}
    accepted = 0
    for q in sd.requests:
        assert q.per_step_accepted is not None
        acc, proposed = prop.replay(np.asarray(ids[q.id]), np.asarray(q.output_token_ids), 3)
        rec = RequestTrace(q.id, "w", "chat", len(ids[q.id]), len(q.output_token_ids),
                           prompt_token_ids=ids[q.id], output_token_ids=q.output_token_ids)  # fmt: skip
        observed = {"per_step_accepted": q.per_step_accepted, "per_step_drafted": q.per_step_drafted}
        rc = check_request(rec, acc, proposed, "eagle3", 3, observed, 512)
        assert rc.status in ("agree", "output_end"), (q.id, rc.first_diff)
        accepted += sum(q.per_step_accepted)
    assert accepted > 0  # a trained head: the chains being compared are not all empty
