"""The DFlash cost probe runs in vLLM 0.32's CPU runner as `method = "dflash"` (marked `engine`): fp32,
k = 3, 2 prompts x 16 tokens, enforce_eager, token-exact against no-SD, every step drafts k tokens, and the
step profiler records one propose call per step (one parallel draft forward)."""

from __future__ import annotations

import importlib.util

import pytest

from speclab.timings import COLUMNS

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM stack not installed"),
]

MAX_TOKENS = 16
K = 3


def _run(d, target, method, k, options, prompts):
    from speclab.engine.protocol import CellSpec, EngineSpec, Job, read_results
    from worker_run import run_worker_job

    d.mkdir()
    job = Job(
        EngineSpec(str(target), "float32", method, k, options, 512, 2, True, 1.0, 42),
        [CellSpec("replicate-b1", "replicate", 1, MAX_TOKENS, prompts)],
        timings_csv=str(d / "timings.csv"),
    )
    run_worker_job(d, job)
    (res,) = read_results(d / "cells.jsonl")
    assert res.status == "ok", res.error
    return res


def test_dflash_probe_runs_lossless_in_vllm(tmp_path) -> None:
    import csv

    from speclab.engine.protocol import PromptSpec
    from speclab.engine.smoke import SMOKE_PROMPTS, render_chat
    from speclab.models import prepare_model
    from speclab.models.dflash import DFlashProbe, build_probe

    target = prepare_model("smollm2-135m", "float32")
    probe = tmp_path / "probe"
    build_probe(target, DFlashProbe(), probe)
    prompts = [PromptSpec(f"p{i}", x) for i, x in enumerate(render_chat(target, SMOKE_PROMPTS[:2]))]
    base = _run(tmp_path / "none", target, "none", None, {}, prompts)
    sd = _run(tmp_path / "dflash", target, "dflash", K, {"model": str(probe)}, prompts)
    assert {q.id: q.output_token_ids for q in sd.requests} == {
        q.id: q.output_token_ids for q in base.requests
    }
    for q in sd.requests:
        assert q.per_step_drafted and all(d == K for d in q.per_step_drafted), q.id
    with open(tmp_path / "dflash" / "timings.csv") as f:
        rows = [r for r in csv.reader(f) if r and r[0] == "draft:dflash"]
    sec = COLUMNS.index("seconds")  # a trailing temperature column may follow it
    assert rows and all(float(r[sec]) > 0 for r in rows)
