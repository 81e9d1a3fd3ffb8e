"""`trace crosscheck --expected` (sampled runs): the engine's mean acceptance length beside the one expected
from accept_prob, walked over the engine's observed steps; MAE per method and temperature; engine faults
flagged. Synthetic data only: probabilities, observed steps and a bench-shaped run are made up here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from speclab.bench.results import write_trace_part
from speclab.replay.crosscheck import ENGINE_FAULT_MIN_STEPS, ExpectedCheck, expected_check, expected_summary
from speclab.replay.runs import record_sampling_in_run
from speclab.traces import MethodTrace, RequestTrace


def _rec(n: int, meta: dict | None = None) -> RequestTrace:
    return RequestTrace("r", "w", "chat", 4, n, prompt_token_ids=[1, 2, 3, 4], output_token_ids=list(range(n)),
                        meta=meta or {})  # fmt: skip


def test_expected_check_walks_the_observed_steps():
    n = 10
    nprop = np.array([3, 3, 0, 3, 3, 3, 3, 3, 3, 3])
    ap = np.where(np.arange(3)[None, :] < nprop[:, None], 0.5, 0.0).astype(np.float32)
    ap[4] = [1.0, 0.5, 0.25]
    mt = MethodTrace(k_max=3, acc_len=np.ones(n), num_proposed=nprop, accept_prob=ap, accept_source="t")
    obs = {"per_step_accepted": [0, 2, 3, 1], "per_step_drafted": [3, 3, 2, 3]}
    c = expected_check(_rec(n), mt, "ngram", 3, obs, 0.7)
    # steps at p = 1 (a=0), p = 2 a miss (nothing proposed), p = 3 (a=2), p = 6 (2 drafted: two terms),
    # then p = 10 is the output's end, before the 4th observed step
    assert c.steps == 3 and c.measured_accepted == 5
    assert c.expected_accepted == pytest.approx(0.875 + 0.875 + 0.75)
    assert c.measured_len == pytest.approx(1 + 5 / 3) and c.expected_len == pytest.approx(1 + 2.5 / 3)


def _check(
    meas: int,
    exp: float,
    steps: int,
    method: str = "ngram",
    t: float = 0.7,
    cell: str = "c1",
    var: float = 0.0,
):
    return ExpectedCheck("r", method, 3, t, cell, steps, meas, exp, var)


def test_summary_mae_per_method_and_temperature_and_engine_fault():
    checks = [
        _check(10, 10.0, 10),  # exact
        _check(15, 10.0, 10),  # measured length 2.5 vs expected 2.0: 25% off
        _check(2, 20.0, 30, t=1.0, cell="c2"),  # 0.07 accepted per step against 0.67: an engine fault
        _check(0, 0.0, 0, t=1.0, cell="c2"),  # no steps: left out
    ]
    s = expected_summary(checks)
    assert set(s) == {"ngram T=0.7", "ngram T=1"}
    a = s["ngram T=0.7"]
    assert a["requests"] == 2 and a["steps"] == 20
    assert a["measured_mean_acceptance_length"] == pytest.approx(1 + 25 / 20)
    assert a["expected_mean_acceptance_length"] == pytest.approx(2.0)
    assert a["mae_rel"] == pytest.approx((0 + 0.25) / 2) and "engine_fault" not in a
    assert "below 50% of the 0.67" in s["ngram T=1"]["engine_fault"]
    by_cell = expected_summary(checks, by="cell")
    assert "engine_fault" in by_cell["c2"] and "engine_fault" not in by_cell["c1"]
    few = expected_summary([_check(0, 10.0, ENGINE_FAULT_MIN_STEPS - 1)])
    assert "engine_fault" not in few["ngram T=0.7"]  # too few steps to call it
    # 1 accepted where 3.4 were expected over 67 steps of rare drafts (variance ~3.3): chance, not a fault
    rare = expected_summary([_check(1, 3.4, 67, var=3.3)])["ngram T=0.7"]
    assert "engine_fault" not in rare and rare["chance_sd_rel"] == pytest.approx(
        3.3**0.5 / 67 / (1 + 3.4 / 67)
    )
    # the same shortfall over 20x the steps is far beyond chance
    assert "engine_fault" in expected_summary([_check(20, 68.0, 1340, var=66.0)])["ngram T=0.7"]
    two = expected_summary([_check(10, 10.0, 10, cell="a"), _check(15, 10.0, 10, cell="b")])["ngram T=0.7"]
    assert two["cell_mae_rel"] == pytest.approx(0.25 / 2) and two["rel_error"] == pytest.approx(0.25 / 2)


def test_expected_variance_of_a_step():
    """One step with accept_prob (0.5, 0.5): accepted 0 w.p. 0.5, 1 w.p. 0.25, 2 w.p. 0.25: mean 0.75,
    variance 0.6875."""
    mt = MethodTrace(k_max=2, acc_len=np.ones(4, dtype=np.int32), num_proposed=np.full(4, 2, dtype=np.int32))
    mt.accept_prob = np.full((4, 2), 0.5, dtype=np.float32)
    c = expected_check(_rec(4), mt, "ngram", 2, {"per_step_accepted": [0], "per_step_drafted": [2]}, 0.7)
    assert c.expected_accepted == pytest.approx(0.75) and c.expected_var == pytest.approx(0.6875)


def test_record_sampling_from_meta_or_row():
    rows = {"c": {"temperature": 0.5, "top_p": 0.9, "top_k": 0}, "g": {"temperature": 0.0}}
    assert record_sampling_in_run(_rec(3, {"cell_id": "c"}), rows) == {
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 0,
    }
    assert record_sampling_in_run(_rec(3, {"cell_id": "g"}), rows) is None
    assert record_sampling_in_run(_rec(3, {"cell_id": "x"}), rows) is None  # no fields: greedy
    meta = {"cell_id": "g", "sampling": {"temperature": 1.0, "seed": 3}}
    assert record_sampling_in_run(_rec(3, meta), rows) == {"temperature": 1.0, "top_p": 1.0, "top_k": 0}


class HalfScorer:
    """Every token has probability 0.5 (not a distribution; enough to know each draft's acceptance)."""

    def probs(self, prompt_ids, output_ids, sampling):
        import torch

        return torch.full((len(output_ids) + 1, 50), 0.5)


def _run(tmp_path: Path, accepted: int, own_sampling: bool = False) -> Path:
    """A bench-shaped run: one n-gram k=3 cell at T = 0.7 whose repetitive outputs always get 3 drafts
    (own_sampling: the records carry their sampling, as bench records do, not only the row)."""
    recs = []
    for i in range(3):
        out = [7, 8, 9] * 12
        obs = {"method": "ngram", "k": 3, "options": {"prompt_lookup_min": 1, "prompt_lookup_max": 3},
               "per_step_accepted": [accepted] * 40, "per_step_drafted": [3] * 40}  # fmt: skip
        recs.append(RequestTrace(f"cell:p{i}", "w", "chat", 6, len(out), prompt_token_ids=[7, 8, 9, 7, 8, 9],
                                 output_token_ids=out, meta={"cell_id": "cell", "observed": obs}))  # fmt: skip
        if own_sampling:
            recs[-1].meta["sampling"] = {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "seed": i}
    part = write_trace_part(tmp_path, "cell", recs)
    row = {"cell_id": "cell", "status": "ok", "method": "ngram", "k": 3, "trace_part": part,
           "workload": "w", "batching": "replicate", "batch_size": 1, "mean_acceptance_length": 1.0 + accepted,
           "sampling": "fixed", "temperature": 0.7, "top_p": 1.0, "top_k": 0}  # fmt: skip
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n")
    return tmp_path


@pytest.mark.parametrize(("accepted", "fault"), [(0, True), (1, False)])
def test_cli_expected_on_a_run(tmp_path, monkeypatch, capsys, accepted, fault):
    import speclab.cli.trace_sampled as ts
    from speclab.cli import main

    monkeypatch.setattr(ts, "make_scorer", lambda *a: HalfScorer())
    run = _run(tmp_path, accepted)
    group = "traces" if fault else "trace"  # `speclab traces crosscheck` is `speclab trace crosscheck`
    assert main([group, "crosscheck", str(run), "--expected", "--out", str(tmp_path / "x.json")]) in (
        0,
        None,
    )
    text = capsys.readouterr().out
    payload = json.loads((tmp_path / "x.json").read_text())
    s = payload["expected"]["ngram T=0.7"]
    # every step drafts 3 tokens at probability 0.5 each: 0.5 + 0.25 + 0.125 expected accepted per step
    # (less at the output's end, where drafts past the last known position count 0)
    assert s["expected_mean_acceptance_length"] == pytest.approx(1.875, abs=0.01)
    assert s["measured_mean_acceptance_length"] == pytest.approx(1.0 + accepted)
    assert ("engine_fault" in payload["by_cell"]["cell"]) is fault
    assert ("ENGINE FAULT" in text) is fault and "MAE" in text


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(("accepted", "fault"), [(0, True), (1, False)])
def test_cli_expected_saves_the_cells_in_the_run(tmp_path, monkeypatch, capsys, accepted, fault):
    """Without --out, --expected on a bench run writes RUN/expected_acceptance.json and nothing else; a second
    run rewrites it; `bench show` then reads the expected figure and the fault from it."""
    import speclab.cli.trace_sampled as ts
    from speclab.bench.expected_acceptance import EXPECTED_FILE
    from speclab.bench.show import format_run, load_rows
    from speclab.cli import main

    monkeypatch.setattr(ts, "make_scorer", lambda *a: HalfScorer())
    run = _run(tmp_path / "run", accepted)
    before = _files(tmp_path)
    assert main(["trace", "crosscheck", str(run), "--expected", "--json"]) in (0, None)
    out = capsys.readouterr()
    payload = json.loads(out.out)  # stdout stays the JSON; the note on the saved file goes to stderr
    assert EXPECTED_FILE in out.err
    assert _files(tmp_path) == before | {f"run/{EXPECTED_FILE}"}
    saved = json.loads((run / EXPECTED_FILE).read_text())
    cell = saved["cells"]["cell"]
    s = payload["by_cell"]["cell"]
    assert cell["expected_mean_acc"] == pytest.approx(s["expected_mean_acceptance_length"])
    assert cell["measured_mean_acc"] == pytest.approx(1.0 + accepted)
    assert cell["rel_error"] == pytest.approx((1.0 + accepted) / cell["expected_mean_acc"] - 1)
    assert cell["method"] == "ngram" and cell["k"] == 3 and cell["temperature"] == 0.7
    assert cell["steps"] == s["steps"] > 0
    assert (cell["engine_fault"] is not None) is fault
    if fault:
        assert "below 50%" in cell["engine_fault"]
    assert saved["settings"]["draft_sampling"] is None and "written_at" in saved
    # rewritten on every run: a stale cell of an earlier one is gone
    saved["cells"]["stale"] = dict(cell)
    (run / EXPECTED_FILE).write_text(json.dumps(saved))
    assert main(["traces", "crosscheck", str(run), "--expected"]) in (0, None)
    assert set(json.loads((run / EXPECTED_FILE).read_text())["cells"]) == {"cell"}
    assert _files(tmp_path) == before | {f"run/{EXPECTED_FILE}"}
    capsys.readouterr()
    row = load_rows(run)[0]
    assert row["expected_mean_acceptance_length"] == pytest.approx(cell["expected_mean_acc"])
    assert ("engine_fault" in row) is fault
    assert ("ENGINE FAULT" in format_run(run)) is fault


def test_cli_expected_on_a_store_writes_nothing_beside_it(tmp_path, monkeypatch, capsys):
    """A trace store (not a run directory) gets no expected_acceptance.json: only --out writes."""
    import speclab.cli.trace_sampled as ts
    from speclab.cli import main

    monkeypatch.setattr(ts, "make_scorer", lambda *a: HalfScorer())
    run = _run(tmp_path / "run", 0, own_sampling=True)
    store = run / "traces"
    before = _files(tmp_path)
    assert main(["trace", "crosscheck", str(store), "--expected"]) in (0, None)
    assert "ENGINE FAULT" in capsys.readouterr().out
    assert _files(tmp_path) == before


def test_cli_expected_on_a_read_only_run_still_prints(tmp_path, monkeypatch, capsys):
    """A run directory that cannot be written: one warning, the result is printed all the same."""
    import speclab.cli.trace_sampled as ts
    from speclab.bench import expected_acceptance
    from speclab.cli import main

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(ts, "make_scorer", lambda *a: HalfScorer())
    monkeypatch.setattr(expected_acceptance, "write_expected", refuse)
    run = _run(tmp_path / "run", 0)
    assert main(["trace", "crosscheck", str(run), "--expected"]) in (0, None)
    out = capsys.readouterr()
    assert "ENGINE FAULT" in out.out and "MAE" in out.out
    assert out.err.count("warning: cannot save the expected acceptance") == 1
    assert not (run / "expected_acceptance.json").exists()
