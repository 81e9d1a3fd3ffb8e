"""speclab validate on sampled runs: SD cells pair with the baseline of their own sampling setting (row fields
sampling, temperature, top_p, top_k; rows without them are greedy), errors are summarised per setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speclab.validate import format_table, sampling_key, sampling_label, validate_run
from test_validate import CM, _write_run

SAMPLED = {"sampling": "fixed", "temperature": 0.7, "top_p": 1.0, "top_k": 0}


def test_sampling_keys_and_labels():
    assert sampling_key({}) == ("greedy",)
    assert sampling_key({"sampling": "fixed", "temperature": 0.0, "top_p": 0.9}) == ("greedy",)
    assert sampling_key({"sampling": "as-logged", "temperature": None}) == ("as-logged",)
    assert sampling_key(SAMPLED) == ("fixed", 0.7, 1.0, 0)
    assert sampling_label(sampling_key({**SAMPLED, "top_p": 0.9, "top_k": 5})) == "T=0.7 top-p=0.9 top-k=5"
    assert sampling_label(("greedy",)) == "greedy"


def _add_sampled_cells(run: Path) -> None:
    """Each greedy cell again at T = 0.7 (same traces): the sampled baseline measured half as fast, so a
    sampled SD cell's measured speedup doubles; its recorded baseline_cell_id wrongly names the greedy one."""
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    extra = []
    for r in rows:
        if r["status"] != "ok":
            continue
        s = {**r, **SAMPLED, "cell_id": r["cell_id"] + ".t07"}
        if r["method"] == "none":
            s["throughput_tok_s"] = r["throughput_tok_s"] / 2
        else:
            s["speedup"] = r["speedup"] * 2
        extra.append(s)
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + extra))


def test_sampled_cells_pair_with_their_own_baseline(tmp_path: Path) -> None:
    _write_run(tmp_path)
    _add_sampled_cells(tmp_path)
    val = validate_run(tmp_path, CM)
    cells = {c.cell_id: c for c in val.cells}
    greedy, samp = cells["ngram.w.rep.b4"], cells["ngram.w.rep.b4.t07"]
    assert greedy.sampling == "greedy" and samp.sampling == "T=0.7"
    assert greedy.baseline_cell_id == "none.w.rep.b4"
    assert samp.baseline_cell_id == "none.w.rep.b4.t07"  # not the greedy one its row named
    assert greedy.speedup_err == pytest.approx(0.0, abs=1e-9)
    assert samp.predicted_speedup == pytest.approx(greedy.predicted_speedup, rel=1e-12)
    assert samp.speedup_err == pytest.approx(-0.5, rel=1e-9)  # measured twice the prediction
    by = val.summary()["by_sampling"]
    assert by["greedy"] == {"sd_cells": 2, "mean_abs_speedup_err": pytest.approx(0.0, abs=1e-9)}
    assert by["T=0.7"] == {"sd_cells": 2, "mean_abs_speedup_err": pytest.approx(0.5, rel=1e-9)}
    text = "\n".join(format_table(val))
    assert "ngram-k3 w repl T=0.7" in text and "  T=0.7: 50.0% over 2 SD cell(s)" in text


def test_sampled_cell_without_a_sampled_baseline_is_not_paired(tmp_path: Path) -> None:
    _write_run(tmp_path)
    _add_sampled_cells(tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    rows = [r for r in rows if not (r["cell_id"].endswith(".t07") and r["method"] == "none")]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    val = validate_run(tmp_path, CM)
    c = next(c for c in val.cells if c.cell_id == "ngram.w.rep.b1.t07")
    assert c.speedup_err is None and c.note == "no baseline cell to compare with"
    assert set(val.summary()["by_sampling"]) == {"greedy"}
