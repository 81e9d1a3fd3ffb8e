"""Real vLLM engine runs through the worker subprocess (marked `engine`: slow, need the vLLM stack).

Two engines start (method none and ngram, fp32, enforce_eager for a short start-up); both run the same
two cells, then the tests compare. Models are prepared through speclab.models (cached on disk).
"""

from __future__ import annotations

import csv
import importlib.util

import pytest

from speclab.engine.protocol import CellSpec, EngineSpec, Job, PromptSpec, read_results
from speclab.engine.smoke import SMOKE_PROMPTS, render_chat
from worker_run import run_worker_job  # tests/ is on sys.path

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM stack not installed"),
]

MAX_TOKENS = 32


@pytest.fixture(scope="module")
def target():
    from speclab.models import prepare_model

    return prepare_model("smollm2-135m", "float32")


@pytest.fixture(scope="module")
def prompts(target):
    ids = render_chat(target, SMOKE_PROMPTS[:4])
    return [PromptSpec(f"p{i}", x) for i, x in enumerate(ids)]


def _run(tmp_path_factory, target, prompts, method, k, options):
    d = tmp_path_factory.mktemp(f"engine-{method}")
    cells = [
        CellSpec("replicate-b1", "replicate", 1, MAX_TOKENS, prompts[:3]),
        CellSpec("continuous-b2", "continuous", 2, MAX_TOKENS, prompts),
    ]
    job = Job(
        EngineSpec(str(target), "float32", method, k, options, 512, 2, True, 1.0, 42),
        cells,
        timings_csv=str(d / "timings.csv"),
    )
    run_worker_job(d, job, timeout=600)
    results = {r.cell_id: r for r in read_results(d / "cells.jsonl")}
    assert all(r.status == "ok" for r in results.values()), [r.error for r in results.values()]
    return results, d


@pytest.fixture(scope="module")
def none_run(tmp_path_factory, target, prompts):
    return _run(tmp_path_factory, target, prompts, "none", None, {})


@pytest.fixture(scope="module")
def ngram_run(tmp_path_factory, target, prompts):
    return _run(
        tmp_path_factory, target, prompts, "ngram", 4, {"prompt_lookup_min": 2, "prompt_lookup_max": 4}
    )


def _outputs(results):
    return {(cid, q.id, q.copy): q.output_token_ids for cid, r in results.items() for q in r.requests}


def test_none_vs_ngram_lossless_with_spec_metrics(none_run, ngram_run):
    base, _ = none_run
    sd, _ = ngram_run
    a, b = _outputs(base), _outputs(sd)
    assert a.keys() == b.keys() and len(a) == 3 + 4
    assert a == b  # fp32 greedy: speculative decoding must not change a single token
    for r in sd.values():
        sc = r.spec_counters
        assert sc is not None and sc.num_drafts > 0 and sc.num_draft_tokens >= sc.num_accepted_tokens
        assert len(sc.accepted_per_pos) == 4
        for q in r.requests:
            assert q.per_step_accepted is not None and len(q.per_step_accepted) == len(q.per_step_drafted)
            assert all(
                0 <= acc <= dr <= 4 for acc, dr in zip(q.per_step_accepted, q.per_step_drafted, strict=True)
            )
        # vLLM's per-request metrics add up to its aggregate counters
        assert sum(sum(q.per_step_accepted) for q in r.requests) == sc.num_accepted_tokens
        assert r.time_split_s.propose > 0
    for r in base.values():
        assert r.spec_counters is None and r.time_split_s.propose == 0
        assert all(q.per_step_accepted is None for q in r.requests)


def test_continuous_batching_b2_over_4_prompts(none_run):
    results, _ = none_run
    cont, rep = results["continuous-b2"], results["replicate-b1"]
    assert [q.id for q in cont.requests] == ["p0", "p1", "p2", "p3"]
    assert all(len(q.output_token_ids) > 0 for q in cont.requests)
    assert cont.output_tokens == sum(len(q.output_token_ids) for q in cont.requests)
    # fp32: batch shape does not change greedy outputs
    single = {q.id: q.output_token_ids for q in rep.requests}
    assert all(q.output_token_ids == single[q.id] for q in cont.requests if q.id in single)
    # two requests in flight: fewer steps than running the four one after another
    assert cont.steps < sum(len(q.output_token_ids) for q in cont.requests)


def test_time_split_memory_and_timings_csv(none_run, ngram_run):
    for results, d in (none_run, ngram_run):
        for r in results.values():
            ts = r.time_split_s
            assert ts.verify > 0 and ts.other >= 0
            assert ts.propose + ts.verify + ts.other <= r.elapsed_s * 1.05
            assert r.memory.weights_bytes == 134_515_008 * 4  # fp32 SmolLM2-135M, tied lm_head once
            assert r.memory.kv_cache_bytes and r.memory.peak_rss_bytes
            assert r.memory.draft_weights_bytes == 0
            assert r.engine_info["startup_s"] > 0
        with open(d / "timings.csv") as f:
            rows = list(csv.DictReader(f))
        kinds = {row["kind"] for row in rows}
        assert {"target", "overhead"} <= kinds
        if d.name.startswith("engine-ngram"):
            assert "draft:ngram" in kinds
        steps = sum(r.steps for r in results.values())
        assert sum(1 for row in rows if row["kind"] == "target") <= steps
        assert all(float(row["seconds"]) >= 0 and int(row["num_requests"]) >= 1 for row in rows)
        assert all(row["temperature"] == "0" for row in rows)  # every row says its cell's sampling: greedy
