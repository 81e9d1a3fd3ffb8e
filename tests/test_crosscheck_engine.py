"""Live cross-check: run vLLM (fp32, greedy) with n-gram speculation, built-in and through speclab's
custom_class adapter, then check that replay predicts every observed step (CONTRACTS: engine test);
and vLLM's built-in suffix decoding through speclab's engine worker, re-enacted by speclab.replay.engine_sim.

Also a script: `python tests/test_crosscheck_engine.py --run-dir RUN --method ngram|custom-ngram|draft`
writes a minimal bench-like run (RUN/results.jsonl + RUN/traces/part-*.parquet with meta["observed"]) that
`speclab trace crosscheck RUN` reads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ENGINE_METHODS = {
    "ngram": ("ngram", {"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 7}),
    "custom-ngram": (
        "custom:SpeclabNgramProposer",
        {"method": "custom_class", "model": "speclab.methods.vllm_custom.SpeclabNgramProposer"},
    ),
    "draft": ("draft_model", {"method": "draft_model"}),
    "draft-self": ("draft_model", {"method": "draft_model"}),
}


def run_engine(run_dir: Path, method: str, workload: str, limit: int, max_tokens: int, k: int) -> None:
    from vllm import LLM, SamplingParams

    from speclab.models.prepare import resolve_model
    from speclab.replay.generate import output_record
    from speclab.traces import append_to_store
    from speclab.workloads import load_workload, render_prompt

    target = str(resolve_model("smollm2-135m", prepare=False))
    trace_name, spec = ENGINE_METHODS[method]
    spec = {**spec, "num_speculative_tokens": k}
    if method == "draft":
        spec["model"] = str(resolve_model("smollm2-135m-draft-l8", prepare=False))
    if method == "draft-self":  # the target drafting for itself: long chains, a deep test of draft replay
        spec["model"] = target
    os.environ["SPECLAB_PROPOSER_OPTIONS"] = json.dumps({"ngram": {"min_n": 3, "max_n": 7}})
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    llm = LLM(
        model=target,
        dtype="float32",
        max_model_len=2048,
        enforce_eager=True,
        seed=0,
        distributed_executor_backend="uni",
        speculative_config=spec,
        per_request_spec_decode_metrics="detailed",
        disable_log_stats=False,
        max_num_seqs=8,
    )
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    run_dir.mkdir(parents=True, exist_ok=True)
    for wl in workload.split(","):  # one engine, one cell per workload
        prompts = load_workload(wl, limit=limit)
        ids = [render_prompt(p, tok, max_prompt_tokens=768)[0] for p in prompts]
        outs = llm.generate([{"prompt_token_ids": i} for i in ids], sp, use_tqdm=False)
        cell_id = f"{method}-k{k}-{wl}"
        recs = []
        for pr, pid, o in zip(prompts, ids, outs, strict=True):
            m = o.outputs[0].spec_decode_metrics.to_dict()
            out_ids = list(o.outputs[0].token_ids)
            observed = {
                "method": trace_name,
                "k": k,
                "per_step_accepted": list(m["per_step_accepted"]),
                "per_step_drafted": list(m["per_step_drafted"]),
            }
            meta = {"cell_id": cell_id, "finish_reason": o.outputs[0].finish_reason, "observed": observed}
            recs.append(output_record(pr, pid, out_ids, meta, rid=f"{cell_id}:{pr.id}"))
        append_to_store(run_dir / "traces", recs, tag=cell_id)
        opts = {k_: v for k_, v in spec.items() if k_ not in ("method", "num_speculative_tokens")}
        row = {"cell_id": cell_id, "status": "ok", "method": spec["method"], "k": k, "workload": wl,
               "method_options": opts, "batching": "continuous", "batch_size": 8, "max_tokens": max_tokens}  # fmt: skip
        with open(run_dir / "results.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")


def _spawn(run_dir: Path, method: str, workload: str, limit: int, max_tokens: int, k: int) -> None:
    env = dict(os.environ)
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if iomp.exists():
        env.setdefault("LD_PRELOAD", str(iomp))
    cmd = [sys.executable, __file__, "--run-dir", str(run_dir), "--method", method, "--workload", workload,
           "--limit", str(limit), "--max-tokens", str(max_tokens), "--k", str(k)]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, timeout=1200)


@pytest.mark.engine
def test_ngram_replay_matches_vllm(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from speclab.models.prepare import resolve_model

    try:
        resolve_model("smollm2-135m", prepare=False)
    except Exception:
        pytest.skip("smollm2-135m not prepared (speclab models prepare smollm2-135m)")
    from speclab.replay.crosscheck import crosscheck_records
    from speclab.replay.replay import load_records
    from speclab.replay.runs import make_run_replay_fn

    for method in ("ngram", "custom-ngram"):
        _spawn(tmp_path, method, "offline-code-edit", limit=4, max_tokens=96, k=4)
    records = load_records(tmp_path)
    fn, skipped = make_run_replay_fn(tmp_path, {"ngram_min": 3, "ngram_max": 7, "max_model_len": None})
    res = crosscheck_records(records, fn)
    summary = res.summary()
    assert set(summary) == {"ngram", "custom:SpeclabNgramProposer"}, (summary, skipped)
    for s in summary.values():
        assert s["mismatch"] == 0 and s["max_model_len"] == 0, (summary, [vars(m) for m in res.mismatches()])
        assert s["steps_observed"] > 0


@pytest.mark.engine
def test_suffix_replay_matches_vllm_builtin_suffix(tmp_path: Path) -> None:
    """speclab's worker runs vLLM's built-in `suffix` (warmup, a batch-1 then a batch-4 continuous cell on
    one engine, so the global tree carries across cells and requests share it within a step); the engine
    re-enactment must predict every observed step. Suffix decoding has no per-request replay that could."""
    pytest.importorskip("vllm")
    pytest.importorskip("arctic_inference")
    from transformers import AutoTokenizer

    from speclab.engine.launch import worker_env
    from speclab.engine.protocol import CellSpec, EngineSpec, Job, PromptSpec, read_results, write_job
    from speclab.methods.suffix import SuffixSpeculator
    from speclab.models.prepare import resolve_model
    from speclab.replay.crosscheck import check_request
    from speclab.replay.engine_sim import per_position, replay_attempt
    from speclab.traces import RequestTrace
    from speclab.workloads import load_workload, render_prompt

    try:
        target = str(resolve_model("smollm2-135m", prepare=False))
    except Exception:
        pytest.skip("smollm2-135m not prepared (speclab models prepare smollm2-135m)")
    tok = AutoTokenizer.from_pretrained(target)
    prompts = [PromptSpec(p.id, render_prompt(p, tok, max_prompt_tokens=512)[0])
               for p in load_workload("offline-code-edit", limit=4)]  # fmt: skip
    k = 8
    engine = EngineSpec(target=target, method="suffix", k=k, max_model_len=2048, max_num_seqs=4,
                        enforce_eager=True, kv_cache_gib=1.0)  # fmt: skip
    cells = [CellSpec(f"b{b}", "continuous", b, 48, prompts) for b in (1, 4)]
    ad = tmp_path / "engines" / "suffix" / "attempt-1"
    ad.mkdir(parents=True)
    write_job(Job(engine=engine, cells=cells), ad / "job.json")
    cmd = [sys.executable, "-m", "speclab.engine.worker", "--job", str(ad / "job.json"), "--out",
           str(ad / "cells.jsonl")]  # fmt: skip
    subprocess.run(cmd, check=True, env=worker_env(1.0), cwd=ROOT, timeout=900)
    results = {r.cell_id: r for r in read_results(ad / "cells.jsonl")}
    assert all(r.status == "ok" for r in results.values()) and len(results) == 2
    sim = replay_attempt(ad, lambda method, opts, k_: (SuffixSpeculator(), int(k_)))
    assert not isinstance(sim, str), sim
    statuses, steps = [], 0
    for cell in cells:
        for r in results[cell.cell_id].requests:
            pids = next(p.prompt_token_ids for p in prompts if p.id == r.id)
            rec = RequestTrace(r.id, "w", "other", len(pids), len(r.output_token_ids),
                               prompt_token_ids=pids, output_token_ids=r.output_token_ids)  # fmt: skip
            obs = {"per_step_accepted": r.per_step_accepted, "per_step_drafted": r.per_step_drafted}
            acc, nprop = per_position(sim[(cell.cell_id, r.id, 0)])
            rc = check_request(rec, acc, nprop, "suffix", k, obs, 2048)
            statuses.append((cell.cell_id, r.id, rc.status, rc.first_diff))
            steps += rc.steps_observed
    assert all(s[2] in ("agree", "output_end") for s in statuses), statuses
    assert steps > 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--method", choices=sorted(ENGINE_METHODS), required=True)
    ap.add_argument("--workload", default="offline-code-edit", help="comma list: one cell each")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--spawn", action="store_true", help="run in a subprocess with the engine env set")
    a = ap.parse_args()
    if a.spawn:
        _spawn(a.run_dir, a.method, a.workload, a.limit, a.max_tokens, a.k)
    else:
        run_engine(a.run_dir, a.method, a.workload, a.limit, a.max_tokens, a.k)
