"""`speclab demo` orchestration with a fake engine worker and fake prompts (no vLLM, no model)."""

from __future__ import annotations

import json
import sys

import pytest

import speclab.bench.api as bench_api
import speclab.demo as demo
import speclab.models as models
from test_bench_runner import FAKE_WORKER, fake_prompts


@pytest.fixture
def fake_stack(tmp_path, monkeypatch):
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    monkeypatch.setenv("SPECLAB_WORKER_CMD", f"{sys.executable} {script}")
    prepared: list[str] = []
    monkeypatch.setattr(models, "prepare_model", lambda name, dtype="float32", **kw: prepared.append(name))
    monkeypatch.setattr(bench_api, "default_prompt_provider", lambda spec, check_models=True: fake_prompts)
    monkeypatch.setattr(demo, "DEMO_REPLAY_METHODS", ("ngram", "suffix"))  # no draft checkpoint needed
    return prepared


def test_demo_pipeline_end_to_end(tmp_path, fake_stack):
    lines: list[str] = []
    res = demo.run_demo(
        tmp_path / "demo", overrides={"num_prompts": 3, "max_tokens": 16}, progress=False, echo=lines.append
    )
    assert fake_stack == ["smollm2-135m", "smollm2-135m-distilled"]
    rows = (res.run_dir / "results.jsonl").read_text().splitlines()
    assert len(rows) == 18
    assert all(json.loads(r)["repeats"] == 2 for r in rows)  # the preset measures each cell twice
    assert res.traces is not None and res.traces.exists()
    text = "\n".join(lines)
    assert "speedup over no-SD" in text
    if res.simulation is not None:
        assert "simulated speedup over no-SD" in text
    assert res.report is not None and res.report.exists(), res.notes
    assert res.report.read_text().startswith("<!DOCTYPE html>")
    # a rerun resumes: no cell is run again
    lines2: list[str] = []
    res2 = demo.run_demo(
        tmp_path / "demo",
        overrides={"num_prompts": 3, "max_tokens": 16},
        progress=False,
        echo=lines2.append,
        skip=("trace", "simulate", "report"),
    )
    assert any("18 of 18 cells already done" in ln for ln in lines2)
    assert res2.report is None
