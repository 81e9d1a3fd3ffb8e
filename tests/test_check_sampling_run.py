"""`speclab bench check-sampling --run RUN`: the distribution check of every sampled SD cell of a bench run
(fake engine worker; no vLLM): the plan and the engines' jobs, RUN/distribution_checks.json, its merge into the
run's rows (bench show, the report's fault), resuming, as-logged runs and unreadable files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speclab.bench import preflight as preflight_mod
from speclab.bench.api import load_sweep_source, run_bench
from speclab.bench.distribution_checks import check_key, checks_path, merge_checks, read_checks
from speclab.bench.rows import read_rows
from speclab.bench.run_sampling_check import (
    DrawSettings,
    check_job,
    check_run,
    load_run_sweep,
    plan_checks,
)
from speclab.bench.sampling_check import PRIME
from speclab.bench.show import format_run, load_rows
from speclab.cli import main
from speclab.errors import ConfigError
from speclab.report.sampling import fault, output_check
from test_bench_runner import FAKE_WORKER, fake_prompts  # tests/ is on sys.path
from test_workloads_files import CharTokenizer, write_lines

SWEEP = """
name = "sampled"
target = "fake-target"
workloads = ["offline-code-edit", "offline-math"]
batch_sizes = [1, 2]
batching = ["continuous"]
num_prompts = 3
max_tokens = 8
seed = 5
temperatures = [0, 0.7, 1.0]
top_k = 20

[engine]
max_model_len = 512

[[methods]]
name = "none"

[[methods]]
name = "ngram"
k = 3
prompt_lookup_min = 2
prompt_lookup_max = 5

[[methods]]
name = "suffix"
label = "sfx"
k = 4
workloads = ["offline-math"]
"""

DS = DrawSettings(samples=60, positions=4, limit=2, max_tokens=5, seed=3, chunk=25)


def _test(sd, base):
    from speclab.analyze.distcheck import distribution_check

    return distribution_check(sd, base, positions=DS.positions)


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A finished fake run of SWEEP, run with --num-prompts 2 (an override sweep.toml does not show)."""
    import sys

    script = tmp_path / "fake_worker.py"
    # (the lossy method's flip of the 4th token, kept off the one-token prime cells)
    script.write_text(
        FAKE_WORKER.replace("toks[3] = 96 - toks[3]", "toks[3:4] = [96 - t for t in toks[3:4]]")
    )
    monkeypatch.setenv("SPECLAB_WORKER_CMD", f"{sys.executable} {script}")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "worker.log"))
    monkeypatch.setitem(preflight_mod._TOKENIZERS, "fake-target", CharTokenizer())
    f = tmp_path / "sweep.toml"
    f.write_text(SWEEP)
    spec, text = load_sweep_source(f, overrides={"num_prompts": 2})
    out = run_bench(spec, tmp_path / "run", spec_text=text, prompt_provider=fake_prompts, progress=False,
                    echo=lambda s: None)  # fmt: skip
    assert out.failed == 0
    (tmp_path / "worker.log").unlink()
    return tmp_path / "run"


def _started(run: Path) -> list[str]:
    log = run.parent / "worker.log"
    return [ln for ln in log.read_text().splitlines() if ln.startswith("start")] if log.exists() else []


def test_plan_and_jobs_are_the_runs(run: Path):
    spec = load_run_sweep(run)
    assert spec.num_prompts == 2  # the override the run ran with, from sweep.json
    plan = plan_checks(spec, read_rows(run))
    assert [m.label for m, _ in plan.entries] == ["ngram-k3", "sfx"]
    groups = dict((m.label, gs) for m, gs in plan.entries)
    assert [(w, st.temperature, st.top_k) for w, st in groups["ngram-k3"]] == [
        ("offline-code-edit", 0.7, 20), ("offline-code-edit", 1.0, 20),
        ("offline-math", 0.7, 20), ("offline-math", 1.0, 20),
    ]  # fmt: skip
    assert [w for w, _ in groups["sfx"]] == ["offline-math"] * 2  # the entry's own workloads only
    prompts = {w: fake_prompts(w).prompts[: DS.limit] for w in spec.workloads}
    base = check_job(spec, plan.baseline, groups["ngram-k3"], prompts, DS)
    sd = check_job(spec, plan.entries[0][0], groups["ngram-k3"], prompts, DS)
    assert base.engine.method == "none" and base.engine.k is None
    e = sd.engine
    assert (e.method, e.k, e.target, e.seed) == ("ngram", 3, "fake-target", 5)
    assert e.options == {"prompt_lookup_min": 2, "prompt_lookup_max": 5}  # the sweep's, not the defaults
    assert e.max_model_len == 512 and e.enforce_eager is True and e.max_num_seqs == 25
    assert e.llm_kwargs == {"enable_prefix_caching": True, "enable_chunked_prefill": False}
    for job, first in ((base, 3), (sd, 63)):
        primes = [c for c in job.cells if c.cell_id.startswith(PRIME)]
        assert [c.cell_id for c in primes] == ["prime:offline-code-edit", "prime:offline-math"]
        draws = [c for c in job.cells if not c.cell_id.startswith(PRIME)]
        assert len(draws) == 4 * 3 and [c.batch_size for c in draws[:3]] == [25, 25, 10]  # 60 draws per group
        assert [len(c.prompts) for c in draws] == [2] * 12  # the first --limit prompts
        hot = [c for c in draws if c.cell_id.startswith("offline-math|t1|")]
        assert hot[0].prompts[0].sampling == {"temperature": 1.0, "top_k": 20, "seed": first}
        job.validate()


def test_checks_written_merged_shown_and_resumed(run: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FAKE_LOSSY_METHOD", "suffix")  # the 4th output token differs from no SD's
    plan = plan_checks(load_run_sweep(run), read_rows(run))
    said: list[str] = []
    got = check_run(run, plan, fake_prompts, DS, _test, echo=said.append)
    assert len(_started(run)) == 3  # one engine without SD, one per SD entry
    assert any(s.startswith("engine without SD: 4 check(s)") for s in said)
    assert any(s.startswith("engine 2/2 sfx (suffix k=4): 2 check(s)") for s in said)
    data = json.loads(checks_path(run).read_text())
    assert set(data["checks"]) == set(got) and len(got) == 6
    bad = data["checks"][check_key("sfx", "offline-math", 0.7, 1.0, 20)]
    assert (
        bad["check"]["verdict"] == "fail" and bad["method"] == "suffix" and bad["settings"]["samples"] == 60
    )
    good = data["checks"][check_key("ngram-k3", "offline-code-edit", 1.0, 1.0, 20)]
    assert good["check"]["verdict"] != "fail" and good["acceptance"]["draft_tokens"] > 0
    # merged into every batch size of each checked cell, nowhere else
    rows = load_rows(run)
    for r in rows:
        dc = r.get("distribution_check")
        if r["method"] == "none" or r["temperature"] == 0:
            assert dc is None
            continue
        assert dc is not None and dc["samples"] == 60, r["cell_id"]
        assert (dc["verdict"] == "fail") == (r["label"] == "sfx")
        assert (fault(r) or "").startswith("ENGINE FAULT") == (r["label"] == "sfx")
        assert output_check(r).startswith(dc["verdict"])
    text = format_run(run)
    assert "distribution check (`speclab bench check-sampling --run RUN`): 6 sampled SD" in text
    assert "sfx offline-math T=0.7 top-k 20 (B=1,2): FAIL" in text and "ENGINE FAULT" in text
    table = [ln for ln in text.splitlines() if ln.split()[3:4] == ["sfx"] and ln.endswith(("ok", "FAULT"))]
    assert len(table) == 6  # T (the column after the label) 0, 0.7 and 1 at B = 1 and 2; faulty where T > 0
    assert all(ln.rstrip().endswith("ok, ENGINE FAULT") == (ln.split()[4] != "0") for ln in table)
    # a rerun draws nothing; a missing key is drawn again, on the engines it needs only
    check_run(run, plan, fake_prompts, DS, _test, echo=said.append)
    assert len(_started(run)) == 3 and "already" in said[-1]
    data["checks"].pop(check_key("sfx", "offline-math", 1.0, 1.0, 20))
    checks_path(run).write_text(json.dumps(data))
    (run.parent / "worker.log").unlink()
    check_run(run, plan, fake_prompts, DS, _test, echo=said.append)
    assert [s.split()[1] for s in _started(run)] == ["none", "suffix"]
    assert len(read_checks(run)) == 6
    # --force draws everything again
    (run.parent / "worker.log").unlink()
    check_run(run, plan, fake_prompts, DS, _test, force=True, echo=said.append)
    assert len(_started(run)) == 3


def test_the_command(run: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    import speclab.bench.api as api

    monkeypatch.setattr(api, "default_prompt_provider", lambda spec, **kw: fake_prompts)
    args = ["bench", "check-sampling", "--run", str(run), "--samples", "40", "--limit", "1", "--batch", "40"]
    main(args)
    out = capsys.readouterr()
    assert "ngram-k3|offline-math|T=0.7|top_p=1|top_k=20: " in out.out
    assert "engine without SD" in out.err and checks_path(run).exists()
    with pytest.raises(SystemExit) as exc:
        main([*args, "--temperature", "0.5"])
    assert exc.value.code == 2 and "the run decides --temperature" in capsys.readouterr().err


AS_LOGGED = """
name = "logged"
target = "fake-target"
workloads = ["file:{log}"]
batch_sizes = [1]
num_prompts = 2
max_tokens = 8
sampling = "as-logged"

[[methods]]
name = "none"

[[methods]]
name = "ngram"
k = 2
"""


def test_as_logged_is_skipped_with_a_reason(tmp_path: Path):
    log = write_lines(tmp_path / "traffic.jsonl", [{"prompt": "Once upon a time", "temperature": 0.7}] * 2)
    f = tmp_path / "logged.toml"
    f.write_text(AS_LOGGED.format(log=log))
    spec, _ = load_sweep_source(f)
    rows = [{"status": "ok", "method": "ngram", "label": "ngram-k2", "workload": spec.workloads[0],
             "sampling": "as-logged", "temperature": None}]  # fmt: skip
    plan = plan_checks(spec, rows)
    assert plan.entries == []
    assert "own logged temperature" in plan.skipped["as-logged cells"]
    said: list[str] = []
    assert check_run(tmp_path, plan, fake_prompts, DS, _test, echo=said.append) == {}
    assert any(s.startswith("not checked: as-logged cells:") for s in said)
    # nor does an as-logged row take a check
    assert "distribution_check" not in merge_checks(rows, tmp_path)[0]


def test_missing_or_corrupt_file_leaves_rows_alone(tmp_path: Path):
    rows = [{"method": "ngram", "label": "ngram-k3", "workload": "w", "sampling": "fixed", "temperature": 0.7,
             "top_p": 1.0, "top_k": 0, "batch_size": 1}]  # fmt: skip
    warned: list[str] = []
    assert merge_checks(rows, tmp_path, warned.append) == rows and warned == []
    checks_path(tmp_path).write_text("{not json")
    merge_checks(rows, tmp_path, warned.append)
    checks_path(tmp_path).write_text(json.dumps({"checks": {"x": 1}}))
    merge_checks(rows, tmp_path, warned.append)
    assert len(warned) == 2 and all(w.startswith("warning: ") for w in warned)
    assert "distribution_check" not in rows[0]
    good = {"checks": {check_key("ngram-k3", "w", 0.7): {"check": {"verdict": "pass", "samples": 9}}}}
    checks_path(tmp_path).write_text(json.dumps(good))
    assert merge_checks(rows, tmp_path)[0]["distribution_check"]["samples"] == 9


def test_a_run_without_sweep_is_refused(tmp_path: Path):
    with pytest.raises(ConfigError, match="no sweep.toml"):
        load_run_sweep(tmp_path)


def test_the_report_shows_a_failed_check_as_an_engine_fault(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from helpers import fake_simulator
    from speclab.analyze.synthetic import write_synthetic_run
    from speclab.report import build_report
    from test_report_temperature import sampled_rows

    fake_simulator(monkeypatch)
    run = write_synthetic_run(tmp_path / "run", n_per_workload=4)
    rows = [r for r in sampled_rows() if r["temperature"] in (0.0, 0.7)]
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    checks = {
        check_key("ngram", "offline-chat", 0.7): {
            "check": {"verdict": "fail", "p_value": 3e-9, "samples": 300}
        },
        check_key("eagle", "offline-chat", 0.7): {
            "check": {"verdict": "pass", "p_value": 0.4, "tv_detectable_80": 0.18, "samples": 300}
        },
    }
    checks_path(run).write_text(json.dumps({"checks": checks}))
    html = build_report(tmp_path / "rep", run=run, title="SYNTHETIC").read_text()
    assert (
        "ENGINE FAULT: output distribution differs from the target&#x27;s (distribution check p = 3e-09)"
        in html
    )
    assert "pass (p = 0.4, detects TV &gt;= 0.18 at 80% power, 300 samples)" in html


def test_the_run_sweep_keeps_the_command_lines_methods_and_temperatures(tmp_path: Path):
    from speclab.bench.results import write_run_files

    f = tmp_path / "sweep.toml"
    f.write_text(SWEEP)
    spec, text = load_sweep_source(f, overrides={"temperatures": [0.5]}, methods=["sfx"])
    (tmp_path / "run").mkdir()
    write_run_files(tmp_path / "run", spec, text, None)
    got = load_run_sweep(tmp_path / "run")
    assert [m.label for m in got.methods] == ["none", "sfx"] and got.temperatures == [0.5]
    assert got.to_dict() == spec.to_dict()
