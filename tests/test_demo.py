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
from test_drafters_distill import AUX, fake_target, seqs, target  # noqa: F401 - fixtures of the tiny target


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


def test_first_run_trains_both_drafters_by_preset_name_the_head_for_its_budget(fake_target, monkeypatch):  # noqa: F811
    """A tiny end-to-end smoke of the demo's first-use wiring (tiny target, faked data stage): the prepare
    stage says the first run trains, then trains the distilled draft and the EAGLE-3 head by the preset names
    the demo's sweep gives, the head for its preset's budget (4 epochs), once; both are then resolvable."""
    import dataclasses

    import speclab.drafters.train as tr
    import speclab.models.prepare as prep
    from speclab.bench.api import load_sweep_source
    from speclab.models import get_preset, resolve_model

    eagle, distilled = get_preset("smollm2-135m-eagle3"), get_preset("smollm2-135m-distilled")
    assert eagle.train == {"epochs": 4}
    tiny = {"evals": 1, "aux_layers": AUX}
    table = {
        **prep.presets(),
        "smollm2-135m-eagle3": dataclasses.replace(
            eagle, base="tiny", train={**eagle.train, **tiny, "draft_vocab": 30, "batch_size": 4}
        ),
        "smollm2-135m-distilled": dataclasses.replace(
            distilled, base="tiny", train={**tiny, "depth": 1, "epochs": 1, "tokens_per_batch": 64}
        ),
    }
    monkeypatch.setattr(prep, "presets", lambda: table)
    monkeypatch.setattr(prep, "get_preset", lambda name: table[name])
    epochs: list[int] = []
    train = tr.train_eagle
    monkeypatch.setattr(
        tr, "train_eagle", lambda recipe, **kw: epochs.append(recipe.epochs) or train(recipe, **kw)
    )
    real = models.prepare_model
    monkeypatch.setattr(  # the real target is not built here: the tiny one stands in for it
        models,
        "prepare_model",
        lambda name, dtype="float32", **kw: None if name == "smollm2-135m" else real(name, dtype, **kw),
    )
    spec, text = load_sweep_source(preset="demo-cpu")
    lines: list[str] = []
    run = demo._Demo(
        spec, text, demo.DemoOutcome(fake_target[0], fake_target[0] / "run"), lines.append, False, ()
    )
    demo._prepare(run)
    demo._prepare(run)  # cached: nothing trains again
    assert epochs == [4]
    assert "not prepared yet: smollm2-135m-distilled, smollm2-135m-eagle3; the first run trains" in lines[0]
    assert any("smollm2-135m-eagle3: not trained yet; training it now" in ln for ln in lines)
    head = resolve_model("smollm2-135m-eagle3", prepare=False)
    assert json.loads((head / "speclab-manifest.json").read_text())["recipe"]["epochs"] == 4
    assert resolve_model("smollm2-135m-distilled", prepare=False).is_dir()
