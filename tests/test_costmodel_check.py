"""`speclab cost-models check`: a model's relative price of a verified draft token against measured forwards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from speclab.cli.cost_models import command
from speclab.costmodel import CostModel
from speclab.costmodel.check import check_cost_model, mismatches
from speclab.costmodel.model import TargetCost
from speclab.errors import ConfigError
from speclab.timings import append_timings


def engine_rows(const: float, per_token: float, seed: int, noise: float = 0.01) -> list[list[object]]:
    """Decode/verify forwards of an engine whose step is const + per_token * tokens (+1% noise), at 1, 4 and 16
    requests with 0-5 drafts each, plus prefills (which the check leaves out)."""
    rng = np.random.default_rng(seed)
    rows: list[list[object]] = []
    for req in (1, 4, 16):
        for _ in range(60):
            drafts = int(rng.integers(0, 6)) * req
            tokens = req + drafts
            sec = (const + per_token * tokens) * (1 + noise * rng.standard_normal())
            rows.append(["target", 500 * req, tokens, drafts, req, sec])
        rows.append(["target", 0, 300 * req, 0, req, const + per_token * 300 * req])
    return rows


def model(const: float, per_token: float) -> CostModel:
    return CostModel(
        name="m", target=TargetCost(kv=0.0, batched=per_token, const=const), overhead_per_step=0.0
    )


def test_matching_shape_passes_whatever_the_absolute_speed(tmp_path: Path) -> None:
    """A machine 2.5x slower in every forward has the same relative token price: no mismatch."""
    csv = tmp_path / "t.csv"
    append_timings(csv, engine_rows(0.05, 0.002, seed=1))
    bands = check_cost_model([csv], model(0.02, 0.0008))
    assert [b.requests for b in bands] == [(1, 1), (2, 4), (9, 16)]
    for b in bands:
        assert b.ratio == pytest.approx(2.5, rel=0.03)
        assert b.token_share == pytest.approx(b.model_token_share, rel=0.1)
    assert mismatches(bands) == []


def test_fixed_cost_machine_flags_overpriced_tokens(tmp_path: Path) -> None:
    """Measured: a large fixed step cost, cheap tokens; the model prices tokens at 4x the measured share."""
    csv = tmp_path / "t.csv"
    append_timings(csv, engine_rows(0.10, 0.001, seed=2))
    bands = check_cost_model([csv], model(0.025, 0.001))
    b16 = next(b for b in bands if b.requests == (9, 16))
    assert b16.token_share == pytest.approx(0.001 / (0.10 + 0.001 * 16), rel=0.15)
    assert b16.model_token_share == pytest.approx(0.001 / (0.025 + 0.001 * 16), rel=0.01)
    assert b16 in mismatches(bands)
    res = CliRunner().invoke(command, ["check", str(csv), "--cost-model", "smollm2-135m-cpu-live"])
    assert res.exit_code == 0, res.output
    assert "9-16" in res.output and "cost-models fit" in res.output


def test_run_directory_engines_and_bad_input(tmp_path: Path) -> None:
    """A bench run directory is read per engine (a slow start-up divided out); no target rows is an error."""
    run = tmp_path / "run"
    for i, slow in enumerate((1.0, 1.2)):
        rows = engine_rows(0.05, 0.002, seed=10 + i)
        rows = [r[:5] + [float(r[5]) * slow] for r in rows]
        append_timings(run / "engines" / f"e{i}" / "attempt-1" / "timings.csv", rows)
    bands = check_cost_model([run], model(0.05, 0.002))
    assert all(0.9 < b.ratio < 1.25 for b in bands)
    assert mismatches(bands) == []
    empty = tmp_path / "empty.csv"
    append_timings(empty, [["overhead", 0, 1, 0, 1, 0.001]])
    with pytest.raises(ConfigError, match="no rows of kind 'target'"):
        check_cost_model([empty], model(0.05, 0.002))


def test_bench_show_notes_an_adaptive_entrys_mismatched_cost_model(tmp_path: Path) -> None:
    """`speclab bench show` (format_run) notes the cost model that priced an adaptive entry when it does not
    fit the run's own engines, and says nothing when it does."""
    import json

    from speclab.bench.show import cost_model_notes

    run = tmp_path / "run"
    append_timings(
        run / "engines" / "adaptive-0" / "attempt-1" / "timings.csv", engine_rows(0.10, 0.001, seed=3)
    )
    fitting, wrong = tmp_path / "fitting.toml", tmp_path / "wrong.toml"
    fitting.write_text(model(0.10, 0.001).to_toml())
    wrong.write_text(model(0.025, 0.001).to_toml())

    def sweep(cm: Path) -> None:
        entry = {
            "model": "speclab.live.vllm_custom.SpeclabAdaptiveProposer",
            "proposer_options": {"cost_model": str(cm)},
        }
        methods = [{"name": "none"}, {"name": "custom_class", "label": "adaptive", "options": entry}]
        (run / "sweep.json").write_text(json.dumps({"methods": methods}))

    sweep(wrong)
    notes = cost_model_notes(run)
    assert len(notes) == 1 and "pricing adaptive" in notes[0] and "cost-models fit" in notes[0]
    sweep(fitting)
    assert cost_model_notes(run) == []
    (run / "sweep.json").write_text("{not json")
    assert cost_model_notes(run) == []


def test_first_draft_jump_of_a_table_is_flagged(tmp_path: Path) -> None:
    """A table keyed on batched tokens whose 17-token entry came from other request counts prices the first
    draft of a 16-request step at +15%; its least-squares share over the band's wide verifies still matches the
    engine, so only the first-draft price says it."""
    from speclab.costmodel.forms import TableTargetCost

    csv = tmp_path / "t.csv"
    append_timings(csv, engine_rows(0.05, 0.002, seed=4))
    lin = {n: 0.05 + 0.002 * n for n in (16, 32, 48, 64, 80, 96, 112)}
    table = sorted({**lin, 17: lin[16] * 1.15}.items())
    target = TableTargetCost(
        kv=0.0, batched=0.002, const=0.05, knee=1.0, batched_hi=0.002, table=tuple(table)
    )
    cm = CostModel(name="jumpy", target=target, overhead_per_step=0.0)
    b16 = next(b for b in check_cost_model([csv], cm) if b.requests == (9, 16))
    assert b16.model_token_share == pytest.approx(b16.token_share, rel=0.1)
    assert b16.model_first_share == pytest.approx(0.15, rel=0.01)
    assert b16 in mismatches([b16])
    assert mismatches(check_cost_model([csv], model(0.05, 0.002))) == []


def test_a_band_whose_measured_price_is_noise_is_not_judged() -> None:
    """A measured share <= 0 (too few or too narrow verifies) says nothing; a model share <= 0 against a
    positive measured one is flagged (the model says a draft costs nothing or less)."""
    from speclab.costmodel.check import BandCheck

    def band(measured: float, modelled: float) -> BandCheck:
        return BandCheck((5, 8), 21, 0.1, 0.1, 1.0, measured, modelled, modelled)

    assert mismatches([band(-0.05, 0.04)]) == []
    assert band(-0.05, 0.04).deviation() == 0.0
    flagged = band(0.05, -0.02)
    assert mismatches([flagged]) == [flagged]
