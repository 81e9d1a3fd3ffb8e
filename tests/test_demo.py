"""`speclab demo` orchestration with a fake engine worker and fake prompts (no vLLM, no model)."""

from __future__ import annotations

import json
import sys

import pytest

import speclab.bench.api as bench_api
import speclab.bench.noise as noise
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
    # the machine's A/A noise: a fixed record instead of seconds of timing (the probe has its own tests)
    calm = {"pairs": 12, "sd_log": 0.02, "ratios": [1.0] * 12, "unit_s": 0.3, "measured_at": "t"}
    monkeypatch.setattr(noise, "measure_noise", lambda **kw: dict(calm))
    return prepared


def test_demo_pipeline_end_to_end(tmp_path, fake_stack, monkeypatch):
    probes: list[int] = []
    probe = noise.measure_noise
    monkeypatch.setattr(noise, "measure_noise", lambda **kw: probes.append(1) or probe(**kw))
    lines: list[str] = []
    res = demo.run_demo(
        tmp_path / "demo", overrides={"num_prompts": 3, "max_tokens": 16}, progress=False, echo=lines.append
    )
    assert fake_stack == ["smollm2-135m", "smollm2-135m-distilled", "smollm2-135m-eagle3"]
    rows = (res.run_dir / "results.jsonl").read_text().splitlines()
    assert len(rows) == 16  # none / ngram / distilled / eagle3 x 2 workloads x batch 1 and 16
    assert all(json.loads(r)["repeats"] == 2 for r in rows)  # the preset measures each cell twice
    assert res.traces is not None and res.traces.exists()
    text = "\n".join(lines)
    assert "speedup over no-SD" in text
    if res.simulation is not None:
        assert "simulated speedup over no-SD" in text
    assert res.report is not None and res.report.exists(), res.notes
    html = res.report.read_text()
    assert html.startswith("<!DOCTYPE html>")
    # the noise is measured once per run, kept, shown beside the verdicts, and reused on a rerun
    assert res.noise == res.run_dir / "noise.json" and res.noise.exists()
    assert "A/A noise: +-4.5% on one matched pair" in text and "+-4.5% on one matched pair" in html
    # a rerun resumes: no cell is run again
    lines2: list[str] = []
    res2 = demo.run_demo(
        tmp_path / "demo",
        overrides={"num_prompts": 3, "max_tokens": 16},
        progress=False,
        echo=lines2.append,
        skip=("trace", "simulate", "report"),
    )
    assert any("16 of 16 cells already done" in ln for ln in lines2)
    assert any("A/A noise" in ln for ln in lines2) and probes == [1]  # measured once per run
    assert res2.report is None
