"""Verdicts the noise supports: 3 quiet pairs all on one side of 1.00x, or an interval from the machine's
measured A/A noise that clears 1.00x; otherwise "cannot tell", with the repeats that would decide."""

from __future__ import annotations

import json
import math

import pytest

from speclab.bench.noise import (
    describe,
    load_noise,
    measure_noise,
    repeats_to_decide,
    save_noise,
    speedup_interval,
    t95,
)
from speclab.bench.repeats import apply_pairs, evidence
from speclab.report.recommend import CANNOT_TELL, recommendations
from speclab.report.sections import ReportData, recommend, summary
from test_bench_repeats import row

NOISY = {"pairs": 12, "sd_log": 0.05, "unit_s": 0.3, "measured_at": "t"}  # ~+-11% on one pair


def cell(label: str, method: str, tps: list[float], batch: int = 1) -> dict:
    return row(label, method, tps, workload="offline-math", batch_size=batch)


def run_of(sd_tps: list[float], base_tps: list[float] | None = None) -> list[dict]:
    base = cell("none", "none", base_tps or [10.0] * len(sd_tps))
    sd = cell("draft-k3", "draft_model", sd_tps)
    sd["baseline_cell_id"] = base["cell_id"]
    apply_pairs(sd, base)
    return [base, sd]


def verdict(rows: list[dict], noise: dict | None = None) -> dict:
    (rec,) = recommendations(rows, None, noise)
    return rec


def test_one_pair_at_1_07x_cannot_tell_and_says_what_would_decide():
    rows = run_of([10.7])
    rec = verdict(rows)
    assert (rec["verdict"], rec["recommend"]) == (CANNOT_TELL, CANNOT_TELL)
    assert rec["best_speedup"] == pytest.approx(1.07)
    assert "1 quiet matched pair(s): 1.07x" in rec["why"]
    assert "2 more repeats would decide if they measure the same (repeats 3)" in rec["why"]
    # the machine's A/A noise (+-11% on a pair) does not clear it either: its interval straddles 1.00x
    rec = verdict(rows, NOISY)
    assert (
        rec["verdict"] == CANNOT_TELL
        and "95% interval 0.96x-1.19x from this machine's A/A noise" in rec["why"]
    )
    assert "2 more repeats would decide" in rec["why"]


def test_three_quiet_pairs_all_above_one_use_sd():
    rec = verdict(run_of([11.2, 10.9, 11.5]))
    assert (rec["verdict"], rec["recommend"]) == ("use SD", "draft-k3")
    assert rec["why"] == "draft-k3: 3 quiet matched pair(s): 1.09x-1.15x, all above 1.00x"
    assert verdict(run_of([8.0, 8.5, 9.0]))["verdict"] == "SD off"
    # two pairs on one side are not enough without a noise measurement: one more would decide
    rec = verdict(run_of([11.2, 11.5]))
    assert rec["verdict"] == CANNOT_TELL and "1 more repeat would decide" in rec["why"]


def test_mixed_pairs_cannot_tell():
    rec = verdict(run_of([9.5, 11.0, 10.4]))
    assert rec["verdict"] == CANNOT_TELL and "0.95x-1.10x straddles 1.00x" in rec["why"]
    assert "only an interval from this machine's A/A noise" in rec["why"]
    # with the noise: the interval straddles too, and a mean this close to 1.00x needs many more pairs (the
    # pairs' own spread, wider than the A/A noise, sets the interval)
    rec = verdict(run_of([9.5, 11.0, 10.4]), NOISY)
    assert rec["verdict"] == CANNOT_TELL and "95% interval 0.94x-1.13x" in rec["why"]
    assert "31 more repeats would decide if they measure the same (repeats 34)" in rec["why"]
    rec = verdict(run_of([9.9, 10.1, 10.0]), NOISY)
    assert rec["verdict"] == CANNOT_TELL and "below what 50 repeats on this machine resolve" in rec["why"]


def test_an_interval_from_the_machine_noise_decides_clear_differences():
    # two pairs at 1.30x and 1.34x: the A/A interval (t 2.18, sd 0.05 / sqrt 2) clears 1.00x
    kind, fig, why = evidence(run_of([13.0, 13.4])[1], noise=NOISY)
    assert (kind, fig) == ("faster", pytest.approx(1.32)) and "from this machine's A/A noise" in why
    # one pair at 0.57x (the draft model on code edits) is far outside the noise: SD off
    assert verdict(run_of([5.7]), NOISY)["verdict"] == "SD off"
    assert verdict(run_of([5.7]))["verdict"] == CANNOT_TELL  # no noise measured: one pair never decides


def test_interval_and_repeats_arithmetic():
    assert t95(12) == pytest.approx(2.179) and t95(13) == pytest.approx(2.179) and t95(500) == 1.96
    assert t95(0) == math.inf
    lo, hi = speedup_interval([1.07], NOISY)
    half = 2.179 * 0.05
    assert (lo, hi) == (pytest.approx(1.07 * math.exp(-half)), pytest.approx(1.07 * math.exp(half)))
    # n pairs at 1.07x clear 1.00x once 2.179 * 0.05 / sqrt(n) < log 1.07, i.e. n >= 3
    assert repeats_to_decide([1.07], NOISY) == 3
    assert speedup_interval([1.07] * 3, NOISY)[0] > 1.0 > speedup_interval([1.07] * 2, NOISY)[0]
    # the pairs' own spread widens the interval where it exceeds the A/A noise
    assert speedup_interval([0.8, 1.4], NOISY)[0] < speedup_interval([1.05, 1.07], NOISY)[0]
    assert repeats_to_decide([1.0], NOISY) is None and repeats_to_decide([1.001], NOISY) is None


def test_report_says_cannot_tell_for_a_one_pair_cell_and_shows_the_noise():
    rows = run_of([10.7])
    recs = recommendations(rows, None, NOISY)
    d = ReportData(rows=rows, run_path=None, traces=None, analysis={}, recs=recs, figs={}, noise=NOISY)
    html = "".join(recommend(d))
    row = next(tr for tr in html.split("<tr") if "draft-k3" in tr and "1.07" in tr)
    assert CANNOT_TELL in row and "use SD" not in row
    assert "2 more repeats would decide" in row
    top = "".join(summary(d))
    assert "the noise cannot tell in 1" in top and "Noise:" in top and "+-11.5% on one matched pair" in top
    bare = "".join(
        summary(ReportData(rows=rows, run_path=None, traces=None, analysis={}, recs=recs, figs={}))
    )
    assert "no A/A noise measurement" in bare


def test_noise_probe_record_round_trip(tmp_path):
    noise = measure_noise(units=4, unit_s=0.005, threads=1, layers=1)
    assert noise["pairs"] == 2 and len(noise["ratios"]) == 2 and noise["sd_log"] >= 0
    assert noise["sd_log"] == pytest.approx(math.sqrt(sum(math.log(r) ** 2 for r in noise["ratios"]) / 2))
    path = save_noise(tmp_path / "run", noise)
    assert path.name == "noise.json" and load_noise(tmp_path / "run") == noise
    assert "2 back-to-back pairs" in describe(noise)
    assert load_noise(tmp_path / "none") is None and load_noise(None) is None
    (tmp_path / "run" / "noise.json").write_text(json.dumps({"pairs": 1, "sd_log": 0.1}))
    assert load_noise(tmp_path / "run") is None  # one pair gives no spread: not used
    with pytest.raises(ValueError, match="at least 4 units"):
        measure_noise(units=2)


def test_bench_show_marks_figures_the_noise_cannot_back(tmp_path):
    from speclab.bench.show import format_speedup_summary

    rows = run_of([10.7]) + [r for r in run_of([11.2, 10.9, 11.5]) if r["method"] != "none"]
    rows[-1] = dict(rows[-1], batch_size=4, cell_id="x", label="draft-k3")
    text = format_speedup_summary(rows)
    line = next(ln for ln in text.splitlines() if ln.startswith("offline-math"))
    assert line.split()[-2:] == ["1.07?", "1.12"]
    assert "?: the noise cannot tell" in text
    # with a quiet machine's A/A noise measured, one pair at 1.07x is still inside it; 1.30x is not
    assert "1.07?" in format_speedup_summary(run_of([10.7]), NOISY)
    assert "1.30?" not in format_speedup_summary(run_of([13.0]), NOISY)
