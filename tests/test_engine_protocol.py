"""Engine worker protocol: round trips, validation, and the pieces of the worker that need no engine."""

from __future__ import annotations

import json

import pytest

from speclab.engine.instrument import StepProfiler, _count_drafts
from speclab.engine.launch import worker_env
from speclab.engine.protocol import (
    CellResult,
    CellSpec,
    EngineSpec,
    Job,
    MemoryInfo,
    PromptSpec,
    RequestResult,
    SpecCounters,
    TimeSplit,
    append_result,
    read_job,
    read_results,
    write_job,
)
from speclab.engine.settings import llm_kwargs, speculative_config
from speclab.errors import ConfigError


def _job(**engine: object) -> Job:
    spec = {"target": "smollm2-135m", "method": "ngram", "k": 3, "max_num_seqs": 4}
    spec.update(engine)
    return Job(
        engine=EngineSpec(**spec),  # type: ignore[arg-type]
        cells=[
            CellSpec("c1", "replicate", 2, 16, [PromptSpec("a", [1, 2, 3]), PromptSpec("b", [4, 5])]),
            CellSpec("c2", "continuous", 4, 8, [PromptSpec("a", [1, 2, 3])]),
        ],
        timings_csv="t.csv",
    )


def test_job_round_trip(tmp_path):
    job = _job(options={"prompt_lookup_min": 2, "prompt_lookup_max": 4})
    write_job(job, tmp_path / "job.json")
    assert read_job(tmp_path / "job.json") == job
    assert Job.from_dict(json.loads(json.dumps(job.to_dict()))) == job


def test_result_round_trip_and_torn_line(tmp_path):
    out = tmp_path / "cells.jsonl"
    r1 = CellResult(
        "c1",
        "ok",
        output_tokens=2,
        elapsed_s=0.5,
        steps=3,
        requests=[RequestResult("a", 0, 3, [7, 8], "length", [1, 0], [3, 3])],
        time_split_s=TimeSplit(0.1, 0.3, 0.1),
        memory=MemoryInfo(1, 2, 3, 0),
        spec_counters=SpecCounters(2, 6, 1, [1, 0, 0]),
        engine_info={"startup_s": 1.0},
    )
    r2 = CellResult("c2", "failed", error="boom")
    append_result(out, r1)
    append_result(out, r2)
    with open(out, "a") as f:
        f.write('{"cell_id": "c3", "sta')  # a worker killed mid-write
    assert read_results(out) == [r1, r2]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"method": "magic"}, "field method"),
        ({"method": "ngram", "k": None}, "needs an integer k"),
        ({"method": "none", "k": 3}, "must be null"),
        ({"method": "draft_model", "k": 3}, "options.model"),
        ({"method": "custom_class", "k": 3}, "dotted class path"),
        ({"dtype": "int4"}, "field dtype"),
        ({"max_num_seqs": 2}, "largest batch_size"),
        ({"options": {"prompt_lookup_min": 5, "prompt_lookup_max": 2}}, "prompt_lookup_min/max"),
    ],
)
def test_job_validation(change, message):
    with pytest.raises(ConfigError, match=message):
        _job(**change).validate()


def test_job_from_dict_errors():
    d = _job().to_dict()
    d["cells"][0]["prompts"][0]["prompt_token_ids"] = []
    with pytest.raises(ConfigError, match=r"job.cells\[0\].prompts\[0\]: field prompt_token_ids"):
        Job.from_dict(d)
    d = _job().to_dict()
    d["cells"][1]["cell_id"] = "c1"
    with pytest.raises(ConfigError, match="duplicate cell_id"):
        Job.from_dict(d)
    d = _job().to_dict()
    d["engine"]["max_model_len"] = 10
    with pytest.raises(ConfigError, match="exceeds engine.max_model_len"):
        Job.from_dict(d)
    d = _job().to_dict()
    d["engine"]["bogus"] = 1
    with pytest.raises(ConfigError, match="unknown field"):
        Job.from_dict(d)
    d = _job().to_dict()
    d["cells"][0]["batch_size"] = True
    with pytest.raises(ConfigError, match="batch_size"):
        Job.from_dict(d)


def test_read_job_bad_file(tmp_path):
    p = tmp_path / "job.json"
    p.write_text("{nope")
    with pytest.raises(ConfigError, match="invalid JSON"):
        read_job(p)


def test_llm_kwargs_mapping():
    spec = EngineSpec("t", method="ngram", k=4, options={"prompt_lookup_min": 3, "prompt_lookup_max": 7})
    kw = llm_kwargs(spec, "/m", None)
    assert kw["speculative_config"] == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 3,
        "prompt_lookup_max": 7,
    }
    assert kw["per_request_spec_decode_metrics"] == "detailed"
    assert kw["enable_prefix_caching"] is False and kw["async_scheduling"] is False
    assert kw["distributed_executor_backend"] == "uni"
    none = llm_kwargs(EngineSpec("t"), "/m", None)
    # vLLM refuses per-request spec metrics without a speculative config
    assert "speculative_config" not in none and "per_request_spec_decode_metrics" not in none
    dm = speculative_config(EngineSpec("t", method="draft_model", k=3, options={"model": "x"}), "/d")
    assert dm == {"method": "draft_model", "num_speculative_tokens": 3, "model": "/d"}
    tp = llm_kwargs(EngineSpec("t", llm_kwargs={"tensor_parallel_size": 4}), "/m", None)
    assert "distributed_executor_backend" not in tp


def test_worker_env_sets_engine_variables():
    env = worker_env(2.0, base={"LD_PRELOAD": "/x/other.so"})
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"  # vLLM's CPU build parses it with int()
    assert env["VLLM_CACHE_ROOT"]
    assert env["LD_PRELOAD"].endswith("/x/other.so")


def test_fractional_kv_cache_goes_through_the_engine_argument():
    """vLLM's CPU build reads VLLM_CPU_KVCACHE_SPACE with int(): "0.5" would stop the engine at start-up."""
    env = worker_env(0.5, base={"VLLM_CPU_KVCACHE_SPACE": "4"})
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    kw = llm_kwargs(EngineSpec("t", kv_cache_gib=0.5), "/m", None)
    assert kw["kv_cache_memory_bytes"] == 2**29
    assert "kv_cache_memory_bytes" not in llm_kwargs(EngineSpec("t", kv_cache_gib=2.0), "/m", None)


class _Sched:
    def __init__(self) -> None:
        class New:
            num_computed_tokens = 0

        class Cached:
            num_computed_tokens = [10, 20]

        self.scheduled_new_reqs = [New()]
        self.scheduled_cached_reqs = Cached()
        self.num_scheduled_tokens = {"a": 7, "b": 4, "c": 4}
        self.total_num_scheduled_tokens = 15
        self.scheduled_spec_decode_tokens = {"b": [1, 2, 3], "c": [4, 5, 6]}


def test_step_profiler_split_and_rows():
    import time

    class Model:
        def compute_logits(self, h):
            time.sleep(0.002)
            return h

    class Runner:
        def __init__(self) -> None:
            self.model = Model()

        def execute_model(self, so):
            self._model_forward()
            return self.model.compute_logits(None)

        def _model_forward(self):
            time.sleep(0.01)

        def propose_draft_token_ids(self, *a):
            self.model.compute_logits(None)  # a drafter sharing the lm_head: counted as propose only
            time.sleep(0.005)
            return [[1, 2, 3], [], [4]]

    runner = Runner()
    prof = StepProfiler(method="ngram", enabled=True)
    prof.install(runner)
    prof.begin_step()
    t0 = time.perf_counter()
    runner.execute_model(_Sched())
    runner.propose_draft_token_ids()
    time.sleep(0.003)
    prof.end_step(time.perf_counter() - t0)
    assert prof.steps == 1
    assert 0.012 <= prof.verify_s < 0.5
    assert 0.007 <= prof.propose_s < 0.5
    assert 0.003 <= prof.other_s < 0.5
    kinds = [r.kind for r in prof.rows]
    assert kinds == ["target", "draft:ngram", "overhead"]
    tgt, drf, _ = prof.rows
    assert (tgt.kv_tokens, tgt.batched_tokens, tgt.num_spec_tokens, tgt.num_requests) == (30, 15, 6, 3)
    assert drf.num_spec_tokens == 4
    # disabled: no rows, no time
    prof.reset()
    prof.enabled = False
    prof.begin_step()
    runner.execute_model(_Sched())
    prof.end_step(1.0)
    assert prof.rows == [] and prof.steps == 0


def test_count_drafts():
    assert _count_drafts([[1, 2], [], [3]]) == 3
    assert _count_drafts(None) == 0


def test_worker_writes_failed_cells_when_the_engine_cannot_start(tmp_path):
    from speclab.engine.worker import main

    job = _job(target=str(tmp_path / "no-such-model"))
    write_job(job, tmp_path / "job.json")
    out = tmp_path / "cells.jsonl"
    assert main(["--job", str(tmp_path / "job.json"), "--out", str(out)]) == 1
    res = read_results(out)
    assert [r.cell_id for r in res] == ["c1", "c2"]
    assert all(r.status == "failed" and "no-such-model" in (r.error or "") for r in res)
    (tmp_path / "bad.json").write_text("{}")
    assert main(["--job", str(tmp_path / "bad.json"), "--out", str(out)]) == 2


def test_custom_class_proposer_options_stay_out_of_vllm():
    spec = EngineSpec(
        "t",
        method="custom_class",
        k=3,
        options={
            "model": "speclab.methods.vllm_custom.SpeclabNgramProposer",
            "proposer_options": {"min_n": 3},
        },
    )
    assert speculative_config(spec, None) == {
        "method": "custom_class",
        "num_speculative_tokens": 3,
        "model": "speclab.methods.vllm_custom.SpeclabNgramProposer",
    }


def test_prompt_sampling_round_trip_and_checks(tmp_path):
    s = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 5, "max_tokens": 12}
    job = _job()
    job.cells[0].prompts[0] = PromptSpec("a", [1, 2, 3], sampling=s)
    write_job(job, tmp_path / "job.json")
    back = read_job(tmp_path / "job.json")
    assert back.cells[0].prompts[0].sampling == s
    assert back.cells[0].prompts[0].max_tokens(16) == 12
    assert back.cells[0].prompts[1].sampling is None and back.cells[0].prompts[1].max_tokens(16) == 16
    assert "sampling" not in back.cells[0].prompts[1].to_dict()  # greedy prompts are written as before
    for bad, message in (
        ({"temperature": -1}, "temperature: must be a number >= 0"),
        ({"top_p": 0}, r"top_p: must be in \(0, 1\]"),
        ({"top_k": 1.5}, "top_k: must be an int >= 0"),
        ({"max_tokens": 0}, "max_tokens: must be an int >= 1"),
        ({"temp": 1}, "unknown field"),
        ([1], "expected an object"),
    ):
        with pytest.raises(ConfigError, match=message):
            PromptSpec.from_dict({"id": "a", "prompt_token_ids": [1], "sampling": bad}, "p")


def test_a_request_max_tokens_counts_against_the_model_length():
    job = _job(max_model_len=64)
    job.cells[0].prompts[0] = PromptSpec("a", [1, 2, 3], sampling={"max_tokens": 62})
    with pytest.raises(ConfigError, match="exceeds engine.max_model_len"):
        job.validate()
