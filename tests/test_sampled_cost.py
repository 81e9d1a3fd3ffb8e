"""The cost of sampling: the timings' temperature column (written by the worker, recovered for runs
written before it from the engine attempts, never guessed), the cost model's sampled overhead terms (fit,
TOML) and the simulator charging them for sampled requests only (fast and reference paths alike)."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from speclab.bench.attempts import merge_timings, run_timings
from speclab.costmodel import CostModel, get_cost_model
from speclab.costmodel.fit import fit_cost_model_report, fit_overhead
from speclab.costmodel.holdout import fit_timings_csv
from speclab.simulate import simulate
from speclab.timings import ALL_COLUMNS, COLUMNS, append_timings, cell_temperature, read_timings
from speclab.traces import RequestTrace
from test_simulate_reference import assert_same, random_traces

# per_step, per_request, per_spec_token, sampled: per_step, per_request, per_spec_token, drafter_per_request
TRUE = (2e-3, 1e-4, 2e-4, 3e-4, 8e-4, 5e-4, 1.5e-3)


def synthetic_steps(seed: int, n: int = 400) -> list[list[object]]:
    """Steps of target, draft (engines with a drafter) and overhead rows, the overhead exactly TRUE's terms,
    with the temperature column; half the steps sampled, half in an engine with a drafter."""
    rng = np.random.default_rng(seed)
    rows: list[list[object]] = []
    for _ in range(n):
        nr = int(rng.integers(1, 9))
        drafter = bool(rng.integers(0, 2))
        ns = int(rng.integers(0, 4)) * nr if drafter else 0
        temp = float(rng.choice([0.0, 0.7, 1.0]))
        s = temp > 0
        kv, bt = int(rng.integers(10, 500)), nr + ns
        ovh = TRUE[0] + TRUE[1] * nr + TRUE[2] * ns
        ovh += s * (TRUE[3] + TRUE[4] * nr + TRUE[5] * ns + TRUE[6] * drafter * nr)
        rows.append(["target", kv, bt, ns, nr, 0.01 + 1e-5 * kv + 1e-3 * bt, f"{temp:g}"])
        if drafter:
            rows.append(["draft:eagle", kv + bt, bt, 3 * nr, nr, 0.004 + 1e-6 * kv, f"{temp:g}"])
        rows.append(["overhead", kv, bt, ns, nr, ovh, f"{temp:g}"])
    return rows


def test_fit_recovers_the_sampled_terms(tmp_path: Path) -> None:
    csv = tmp_path / "timings.csv"
    append_timings(csv, synthetic_steps(0))
    assert read_timings(csv)[2].drafted or read_timings(csv)[1].drafted  # the order says which steps drafted
    model, rep = fit_cost_model_report(csv, overhead_form="linear", draft_form="linear")
    got = (
        model.overhead_per_step,
        model.overhead_per_request,
        model.overhead_per_spec_token,
        model.overhead_sampled_per_step,
        model.overhead_sampled_per_request,
        model.overhead_sampled_per_spec_token,
        model.overhead_sampled_drafter_per_request,
    )
    assert got == pytest.approx(TRUE, rel=1e-6, abs=1e-12)
    assert any("sampled overhead terms fitted" in n for n in rep.notes)
    # the held-out fit (what `speclab validate` uses) keeps a sampled form: it is the exact one
    best = fit_timings_csv(csv, "t").model
    assert best.samples_cost and best.overhead_sampled_drafter_per_request == pytest.approx(TRUE[6], rel=1e-3)
    # written and read back
    back = CostModel.from_toml(model.to_toml(), "t.toml")
    assert back.overhead_sampled_per_spec_token == pytest.approx(TRUE[5])
    assert back.overhead_sampled_drafter_per_request == pytest.approx(TRUE[6])


def test_greedy_timings_fit_no_sampled_terms(tmp_path: Path) -> None:
    rows = [r for r in synthetic_steps(1) if r[6] == "0"]
    a = np.array([[*r[1:6], 0.0, 0.0] for r in rows if r[0] == "overhead"], dtype=float)
    assert fit_overhead(a, "linear")[3:] == (0.0, 0.0, 0.0, 0.0)
    # an old file (no temperature column) reads as greedy and fits as before
    old = tmp_path / "old.csv"
    append_timings(old, [r[:6] for r in synthetic_steps(2)])
    assert old.read_text().splitlines()[0] == ",".join(COLUMNS)
    assert all(r.temperature == 0 and not r.recorded for r in read_timings(old))
    model, _ = fit_cost_model_report(old, overhead_form="linear")
    assert not model.samples_cost
    assert "sampled" not in model.to_toml()  # an old-style TOML when nothing samples


def test_old_toml_still_loads() -> None:
    text = "[target]\nkv = 1e-6\nbatched = 1e-4\nconst = 0.01\n[overhead]\nper_step = 0.002\nswitch = 0.0\n"
    cm = CostModel.from_toml(text, "old.toml")
    assert not cm.samples_cost
    assert cm.overhead_time(4, 8, 4, 8, True) == pytest.approx(0.002)
    with pytest.raises(Exception, match="sampled_per_request"):
        CostModel.from_toml(text + "sampled_per_request = -1.0\n", "bad.toml")


def _sampled(traces: list[RequestTrace], which: set[int]) -> list[RequestTrace]:
    return [
        dataclasses.replace(t, meta={"sampling": {"temperature": 0.7, "top_p": 1.0, "top_k": 0}})
        if i in which
        else t
        for i, t in enumerate(traces)
    ]


def _with_terms(name: str = "llama3.1-8b-h100") -> CostModel:
    return dataclasses.replace(
        get_cost_model(name),
        overhead_sampled_per_step=2e-4,
        overhead_sampled_per_request=5e-4,
        overhead_sampled_per_spec_token=3e-4,
        overhead_sampled_drafter_per_request=1e-3,
    )


def test_simulator_charges_only_sampled_requests() -> None:
    tr = random_traces(3, 6, nprop=True)
    cm, plain = _with_terms(), get_cost_model("llama3.1-8b-h100")
    pols = ["none", "fixed:ngram:3"]
    greedy = simulate(tr, cm, pols, "static", [1, 4])
    assert_same(greedy, simulate(tr, plain, pols, "static", [1, 4]))  # no sampled record: no charge
    smp = simulate(_sampled(tr, set(range(len(tr)))), cm, pols, "static", [1])
    for g, s in zip(simulate(tr, cm, pols, "static", [1]), smp, strict=True):
        assert s.steps == g.steps
        extra = s.time_split_s["overhead"] - g.time_split_s["overhead"]
        per_req = 5e-4 + (1e-3 if s.policy != "none" else 0.0)  # the drafter's share only with SD
        # batch 1: every step holds one sampled request
        assert extra >= (2e-4 + per_req) * s.steps * (1 - 1e-9)
        if s.policy == "none":
            assert extra == pytest.approx((2e-4 + per_req) * s.steps)


@pytest.mark.parametrize("batching", ["replicate", "static", "continuous"])
def test_fast_equals_reference_with_sampled_requests(batching: str) -> None:
    tr = _sampled(random_traces(4, 9, nprop=True), {0, 2, 3, 7})
    pols = ["none", "fixed:ngram:3", "fixed:eagle:2", "adaptive-k:ngram:4:2"]
    cm = _with_terms()
    fast = simulate(tr, cm, pols, batching, [1, 3])
    ref = simulate(tr, cm, pols, batching, [1, 3], engine="reference")
    assert_same(fast, ref)


def _attempt(ad: Path, cells: list[tuple[str, float | None, int, str]], steps_rows: int) -> None:
    """An attempt written before the temperature column: job.json (each cell's prompts with its sampling),
    cells.jsonl (status, steps) and steps_rows steps of target/draft/overhead rows (6 columns)."""
    ad.mkdir(parents=True)
    job = {
        "cells": [
            {"cell_id": c, "prompts": [{"id": "p", **({"sampling": {"temperature": t}} if t else {})}]}
            for c, t, _, _ in cells
        ]
    }
    (ad / "job.json").write_text(json.dumps(job))
    (ad / "cells.jsonl").write_text(
        "".join(json.dumps({"cell_id": c, "status": st, "steps": n}) + "\n" for c, _, n, st in cells)
    )
    rows = []
    for i in range(steps_rows):
        rows += [
            ["target", i, 1, 0, 1, 0.01],
            ["draft:ngram", i + 1, 1, 3, 1, 1e-4],
            ["overhead", i, 1, 0, 1, 1e-3],
        ]
    append_timings(ad / "timings.csv", rows)


def test_merge_recovers_the_temperature_from_the_attempts(tmp_path: Path) -> None:
    ad = tmp_path / "engines" / "ngram" / "attempt-1"
    # a failed cell wrote no timings; 3 + 2 steps for the ok ones
    _attempt(ad, [("a", None, 3, "ok"), ("b", 0.7, 9, "failed"), ("c", 0.7, 2, "ok")], 5)
    temps = [r.temperature for r in run_timings(tmp_path)]
    assert temps == [0.0] * 9 + [0.7] * 6
    merge_timings(tmp_path)
    text = (tmp_path / "timings.csv").read_text().splitlines()
    assert text[0] == ",".join(ALL_COLUMNS) and text[1].endswith(",0") and text[-1].endswith(",0.7")
    rows = read_timings(tmp_path / "timings.csv")
    assert all(r.recorded for r in rows) and [r.drafted for r in rows if r.kind == "overhead"] == [True] * 5


@pytest.mark.parametrize("steps", [4, 6])
def test_backfill_refuses_mismatched_counts(tmp_path: Path, steps: int) -> None:
    ad = tmp_path / "engines" / "ngram" / "attempt-1"
    _attempt(ad, [("a", None, 3, "ok"), ("c", 0.7, 2, "ok")], steps)  # 5 steps in the cells
    rows = run_timings(tmp_path)
    assert len(rows) == 3 * steps and not any(r.recorded for r in rows)
    merge_timings(tmp_path)
    assert all(line.endswith(",") for line in (tmp_path / "timings.csv").read_text().splitlines()[1:])


def test_cell_temperature() -> None:
    assert cell_temperature([None, {"temperature": 0.7}, {"temperature": 1.0, "top_p": 0.9}]) == 1.0
    assert cell_temperature([None, {}]) == 0.0 and cell_temperature([]) == 0.0


def _observed(i: int, sampling: dict | None) -> RequestTrace:
    meta = {
        "observed": {"method": "ngram", "k": 3, "per_step_accepted": [2, 1, 3], "per_step_drafted": [3] * 3}
    }
    if sampling:
        meta["sampling"] = sampling
    return RequestTrace(id=f"r{i}", workload="w", category="c", prompt_len=20, output_len=12, meta=meta)


def test_validate_carries_the_sampling_into_the_simulated_records() -> None:
    from speclab.validate import CellCheck, _predict_sd, _with_sampling

    row = {"cell_id": "c", "k": 3, "sampling": "fixed", "temperature": 0.7, "top_p": 1.0, "top_k": 0}
    bare = _observed(0, None)
    assert _with_sampling(bare, row).meta["sampling"]["temperature"] == 0.7  # from the row's fields
    assert "sampling" not in _with_sampling(bare, {"cell_id": "g", "temperature": 0.0}).meta
    cm = _with_terms()
    check = CellCheck("c", "c", "ngram", 3, "w", "continuous", 2, 0, None, None, None, None, None, None, None)
    greedy = _predict_sd([_observed(i, None) for i in range(2)], cm, row, check)
    smp = _predict_sd([_observed(i, {"temperature": 0.7}) for i in range(2)], cm, row, check)
    assert smp[1] == greedy[1] and smp[0] < greedy[0]  # same steps, each costs more: lower throughput


def test_validate_recovers_the_column_of_an_old_run(tmp_path: Path) -> None:
    from speclab.validate import timings_with_sampling

    ad = tmp_path / "engines" / "ngram" / "attempt-1"
    _attempt(ad, [("a", None, 3, "ok"), ("c", 0.7, 2, "ok")], 5)
    old = tmp_path / "timings.csv"
    append_timings(old, [r.fields for r in read_timings(ad / "timings.csv")])  # merged before the column
    rows, note = timings_with_sampling(tmp_path)
    assert [r.temperature for r in rows if r.kind == "target"] == [0.0] * 3 + [0.7] * 2
    assert "recovered" in note and old.read_text().splitlines()[0] == ",".join(COLUMNS)  # file untouched
    append_timings(old, [["target", 1, 1, 0, 1, 0.5]])  # the file no longer matches the attempts: no guess
    rows, note = timings_with_sampling(tmp_path)
    assert not any(r.sampled for r in rows) and "greedy" in note
