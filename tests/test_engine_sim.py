"""Re-enacting a suffix engine from a bench run (speclab.replay.engine_sim), without vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from speclab.engine.protocol import (
    CellResult,
    CellSpec,
    EngineSpec,
    Job,
    PromptSpec,
    RequestResult,
    write_job,
)
from speclab.methods.suffix import SuffixSpeculator
from speclab.replay.crosscheck import crosscheck_records, expected_engine_steps
from speclab.replay.engine_sim import (
    UNKNOWN,
    EngineSim,
    SimCell,
    SimRequest,
    _condense,
    attempt_dirs,
    per_position,
)
from speclab.replay.runs import make_run_replay_fn
from speclab.traces import RequestTrace, write_store

pytest.importorskip("arctic_inference")  # suffix decoding is arctic-inference's cache


def _data(seed: int, n: int = 4) -> list[tuple[np.ndarray, list[int]]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        p = rng.integers(0, 8, 30).astype(np.int32)
        o = np.concatenate([p[3:20], rng.integers(0, 8, 10), p[5:15]]).tolist()
        out.append((p, o))
    return out


def test_condense_moves_last_rows_into_the_lowest_holes() -> None:
    a, b, c, d, e = "abcde"
    slots = [a, None, c, None, e, d, None]
    _condense(slots)  # type: ignore[arg-type]
    assert slots == [a, d, c, e]  # vLLM's InputBatch.condense: the last live row fills the lowest hole


def test_batch_one_equals_the_per_position_replay_walked_like_the_engine() -> None:
    data = _data(1)
    spec = SuffixSpeculator()
    walks = [expected_engine_steps(*spec.replay(p, o, 5), k=5) for p, o in data]
    sim = EngineSim(SuffixSpeculator(), 5, None)
    reqs = [SimRequest(i, p, o) for i, (p, o) in enumerate(data)]
    sim.run_cell(SimCell("c", "continuous", 1, reqs))
    assert [r.steps for r in reqs][:1] == walks[:1]
    # later requests agree too unless an earlier one ended past its recorded output (UNKNOWN bonus token)
    assert sum(r.steps == w for r, w in zip(reqs, walks, strict=True)) >= 3
    assert any(a > 0 for r in reqs for _, a, _ in r.steps)


def test_batching_changes_what_suffix_proposes() -> None:
    """Requests running together see each other's partial responses: batch 4 differs from batch 1."""
    p = np.arange(100, 130, dtype=np.int32)
    o = list(range(1, 40))  # every request gives the same answer to a different prompt
    steps = {}
    for b in (1, 4):
        reqs = [SimRequest(i, p + 50 * i, o) for i in range(4)]
        EngineSim(SuffixSpeculator(), 4, None).run_cell(SimCell("c", "continuous", b, reqs))
        steps[b] = [r.steps for r in reqs]
    assert steps[1][0] == steps[4][0] == []  # the first request has nothing to go on
    assert steps[1][1] != steps[4][1]  # at batch 1 the second sees the whole first answer


def test_last_step_past_the_output_uses_the_observed_count() -> None:
    p = np.array([1, 2, 3, 4, 5, 6, 7, 8], dtype=np.int32)
    o = [1, 2, 3, 4]  # the prompt repeats: the draft after "1" is 2 3 4 5 6 ..., the output ends at 4
    req = SimRequest("r", p, o, observed_accepted=[5])
    EngineSim(SuffixSpeculator(max_spec_factor=10.0), 6, None).drive([req], 1)
    pos, a, d = req.steps[0]
    assert (pos, a) == (1, 3) and d >= 5
    # the engine accepted 5 (two past the end): the proposer was given 2 3 4 5 6 and a bonus token
    assert req.tokens == [1, 2, 3, 4, 5, 6, UNKNOWN]


def _write_attempt(run: Path, data, k: int, perturb: bool = False) -> None:
    """A bench run with one suffix engine (warmup + a batch-1 and a batch-2 cell), whose observed
    acceptance comes from re-enacting it (the real engine check is tests/test_crosscheck_engine.py)."""
    ad = run / "engines" / "suffix-k5-x" / "attempt-1"
    ad.mkdir(parents=True)
    prompts = [PromptSpec(f"p{i}", [int(t) for t in p]) for i, (p, _) in enumerate(data)]
    cells = [CellSpec(f"c{b}", "continuous", b, 64, prompts) for b in (1, 2)]
    job = Job(EngineSpec(target="t", method="suffix", k=k, max_num_seqs=2, max_model_len=4096), cells)
    write_job(job, ad / "job.json")
    warm = SimRequest("warmup", np.asarray(data[0][0][:8]), [7, 7, 7, 1])
    sim = EngineSim(SuffixSpeculator(), k, 4096)
    sim.drive([warm], 1)
    info = {"warmup": {"prompt_token_ids": [int(t) for t in data[0][0][:8]], "output_token_ids": [7, 7, 7, 1],
                       "per_step_accepted": [s[1] for s in warm.steps]}}  # fmt: skip
    records = []
    with open(ad / "cells.jsonl", "w") as fh:
        for cell in cells:
            reqs = [SimRequest(i, p, o) for i, (p, o) in enumerate(data)]
            sim.run_cell(SimCell(cell.cell_id, "continuous", cell.batch_size, reqs))
            results = []
            for i, r in enumerate(reqs):
                acc = [s[1] for s in r.steps]
                if perturb and cell.cell_id == "c2" and i == 1:
                    acc[0] += 1
                results.append(RequestResult(f"p{i}", 0, len(r.prompt), r.output, "length", acc,
                                             [s[2] for s in r.steps]))  # fmt: skip
                obs = {"method": "suffix", "k": k, "per_step_accepted": acc,
                       "per_step_drafted": [s[2] for s in r.steps], "options": {}, "max_model_len": 4096}  # fmt: skip
                records.append(RequestTrace(f"{cell.cell_id}:p{i}", "w", "other", len(r.prompt), len(r.output),
                                            prompt_token_ids=r.prompt, output_token_ids=r.output,
                                            meta={"cell_id": cell.cell_id, "prompt_id": f"p{i}", "observed": obs}))  # fmt: skip
            fh.write(
                json.dumps(CellResult(cell.cell_id, "ok", requests=results, engine_info=info).to_dict())
                + "\n"
            )
    write_store(run / "traces", records)


@pytest.mark.parametrize("perturb", [False, True])
def test_crosscheck_of_a_suffix_run_reads_the_engine_attempts(tmp_path: Path, perturb: bool) -> None:
    data = _data(5)
    _write_attempt(tmp_path, data, 5, perturb)
    assert [a.name for a in attempt_dirs(tmp_path)] == ["attempt-1"]
    from speclab.replay.replay import load_records

    fn, skipped = make_run_replay_fn(tmp_path, {"max_model_len": None})
    res = crosscheck_records(load_records(tmp_path), fn)
    s = res.summary()["suffix"]
    assert s["requests"] == 2 * len(data) and not skipped
    if perturb:
        assert s["mismatch"] == 1 and res.mismatches()[0].id == "c2:p1"
    else:
        assert s["mismatch"] == 0 and s["steps_matched"] == s["steps_observed"] > 0


def test_a_run_without_a_recorded_warmup_is_skipped_with_a_reason(tmp_path: Path) -> None:
    data = _data(6, n=2)
    _write_attempt(tmp_path, data, 5)
    cells = tmp_path / "engines" / "suffix-k5-x" / "attempt-1" / "cells.jsonl"
    lines = [json.loads(x) for x in cells.read_text().splitlines()]
    for d in lines:
        d["engine_info"] = {}
    cells.write_text("".join(json.dumps(d) + "\n" for d in lines))
    from speclab.replay.replay import load_records

    fn, skipped = make_run_replay_fn(tmp_path, {"max_model_len": None})
    assert crosscheck_records(load_records(tmp_path), fn).per_request == []
    assert "warmup" in skipped["suffix"]


def test_per_position_marks_only_the_engine_steps() -> None:
    req = SimRequest("r", np.zeros(3, np.int32), [1, 2, 3, 4, 5, 6])
    req.steps = [(1, 2, 3), (4, 0, 1)]
    acc, nprop = per_position(req)
    assert acc.tolist() == [1, 3, 1, 1, 1, 1] and nprop.tolist() == [0, 3, 0, 0, 1, 0]
    assert expected_engine_steps(acc, nprop, 3) == req.steps
