"""The live adaptive proposer over vLLM's own EAGLE-3 drafter (speclab.live.vllm_eagle) inside a real engine,
through speclab's worker: fp32, greedy, 3 prompts x 32 tokens at B = 2. Outputs token-exact against no SD,
and the choice made per row and step: some steps keep the head's drafts, some take the n-gram lookup's,
some draft nothing (the worker's `adaptive_counts`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
K = 3
MAX_TOKENS = 32


def _run(tmp: Path, name: str, engine, cells) -> dict:
    from speclab.engine.launch import worker_env
    from speclab.engine.protocol import Job, read_results, write_job

    ad = tmp / name
    ad.mkdir(parents=True)
    write_job(Job(engine=engine, cells=cells), ad / "job.json")
    cmd = [sys.executable, "-m", "speclab.engine.worker", "--job", str(ad / "job.json"), "--out",
           str(ad / "cells.jsonl")]  # fmt: skip
    subprocess.run(cmd, check=True, env=worker_env(1.0), cwd=ROOT, timeout=900)
    res = {r.cell_id: r for r in read_results(ad / "cells.jsonl")}
    assert len(res) == len(cells) and all(r.status == "ok" for r in res.values()), res
    return res


@pytest.mark.engine
def test_adaptive_eagle_token_exact_and_chooses_per_row(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from transformers import AutoTokenizer

    from speclab.engine.protocol import CellSpec, EngineSpec, PromptSpec
    from speclab.models.prepare import resolve_model
    from speclab.workloads import load_workload, render_prompt

    try:
        target = str(resolve_model("smollm2-135m", prepare=False))
        resolve_model("smollm2-135m-eagle3", prepare=False)
    except Exception:
        pytest.skip("smollm2-135m or its EAGLE-3 head not prepared (speclab models prepare ...)")
    tok = AutoTokenizer.from_pretrained(target)
    code = load_workload("offline-code-edit", limit=2)
    chat = load_workload("offline-chat", limit=1)
    prompts = [PromptSpec(p.id, render_prompt(p, tok, max_prompt_tokens=512)[0]) for p in code + chat]
    cells = [CellSpec("b2", "continuous", 2, MAX_TOKENS, prompts)]
    common = dict(target=target, max_model_len=2048, max_num_seqs=2, enforce_eager=True, kv_cache_gib=1.0)
    base = _run(tmp_path, "none", EngineSpec(method="none", **common), cells)
    opts = {"model": "smollm2-135m-eagle3",
            "proposer_options": {"methods": ["ngram", "eagle3"], "policy": "adaptive",
                                 "cost_model": "smollm2-135m-cpu-live"}}  # fmt: skip
    ad = _run(tmp_path, "adaptive", EngineSpec(method="eagle3", k=K, options=opts, **common), cells)

    ref = {r.id: r.output_token_ids for r in base["b2"].requests}
    cell = ad["b2"]
    drafted = []
    for r in cell.requests:
        assert r.output_token_ids == ref[r.id], r.id  # lossless
        assert r.per_step_drafted is not None
        drafted += r.per_step_drafted
    counts = cell.engine_info["adaptive_counts"]
    print("adaptive EAGLE-3 decisions per row:", counts, "drafts per step:", drafted)
    assert set(counts) == {"off", "ngram", "eagle3"}
    # the choice happened per row and step: the head's drafts on some, the lookup's on others
    assert counts["eagle3"] > 0 and counts["ngram"] > 0, counts
    # the engine verified what the rows were given: drafting steps <= rows given a draft, each <= k
    assert 0 < len(drafted) <= counts["eagle3"] + counts["ngram"]
    assert max(drafted) <= K
