"""Every file a command writes loads in the command meant to read it, used as a newcomer would: the demo's
outputs (bench run, replayed traces, fitted cost model, analysis) fed to `simulate --recommend` as the README
writes it, `bench show`, `validate`, `analyze`, `report`; and the same for `cost-models fit`, `profile`,
`trace --out X.jsonl` and `traces export`. The engine is the fake worker of the bench runner's tests, so the
demo runs here in seconds; paths are relative to the working directory, as a user types them."""

from __future__ import annotations

import json
import sys

import pytest

import speclab.bench.api as bench_api
import speclab.demo as demo
import speclab.models as models
from speclab.cli import main
from speclab.costmodel import get_cost_model
from speclab.costmodel.forms import PiecewiseTargetCost, TableTargetCost, TargetCost
from speclab.costmodel.model import CostModel, DraftCost
from speclab.traces import export_jsonl, read_store
from test_bench_runner import FAKE_WORKER, fake_prompts  # tests/ is on sys.path
from test_profile import FAKE_WORKER as FAKE_PROFILE_WORKER

OUT = "speclab-demo"


def cli(capsys, *argv: str) -> str:
    """Run `speclab ARGV` in this process; assert it exits 0 and return its stdout."""
    code = 0
    try:
        main(list(argv))
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    assert code == 0, f"speclab {' '.join(argv)}: exit {code}: {out.err.strip()[-600:]}"
    return out.out


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A working directory holding speclab-demo/ as `speclab demo` leaves it (fake engine, fake prompts)."""
    d = tmp_path_factory.mktemp("newcomer")
    mp = pytest.MonkeyPatch()
    (d / "fake_worker.py").write_text(FAKE_WORKER)
    mp.setenv("SPECLAB_WORKER_CMD", f"{sys.executable} {d / 'fake_worker.py'}")
    mp.setattr(models, "prepare_model", lambda name, dtype="float32", **kw: None)
    mp.setattr(bench_api, "default_prompt_provider", lambda spec, check_models=True: fake_prompts)
    mp.setattr(demo, "DEMO_REPLAY_METHODS", ("ngram", "suffix"))  # no draft checkpoint needed
    mp.chdir(d)
    try:
        res = demo.run_demo(
            OUT,
            overrides={"num_prompts": 2, "max_tokens": 16, "batch_sizes": [1]},
            progress=False,
            echo=lambda s: None,
        )
    finally:
        mp.undo()
    assert not res.notes, res.notes
    assert res.simulation is not None and res.analysis is not None and res.report is not None
    return d


@pytest.fixture
def here(work, monkeypatch):
    monkeypatch.chdir(work)
    return work


def test_cost_model_header_is_comments_and_strings_are_escaped(tmp_path):
    m = CostModel(
        name='odd "name" \\ here',
        target=TargetCost(kv=1e-7, batched=1e-5, const=1e-3),
        draft={
            "ngram": DraftCost("verify_fraction", fraction=0.01),
            "é-method": DraftCost("linear", const=1e-4),
        },
        overhead_per_step=1e-4,
        description="two\nlines\tand a tab",
        source="C:\\runs\\timings.csv",
    )
    header = "fitted by speclab demo from runs/x/timings.csv\n\n# already a comment\n  indented text"
    text = m.to_toml(header)
    assert text.splitlines()[:4] == [
        "# fitted by speclab demo from runs/x/timings.csv",
        "#",
        "# already a comment",
        "#   indented text",
    ]
    back = CostModel.from_toml(text, "written")
    assert (back.name, back.description, back.source) == (m.name, m.description, m.source)
    assert back.target == m.target and back.draft == m.draft
    # a fitted table form without any count of its own is the piecewise form, and is written as one
    pw = PiecewiseTargetCost(kv=1e-7, batched=1e-5, const=1e-3, knee=16.0, batched_hi=2e-5)
    empty = TableTargetCost(kv=1e-7, batched=1e-5, const=1e-3, knee=16.0, batched_hi=2e-5, table=())
    p = tmp_path / "t.toml"
    p.write_text(CostModel(name="t", target=empty, overhead_per_step=0.0).to_toml())
    loaded = get_cost_model(str(p))
    assert loaded.target == pw and loaded.target_time(100, 40) == pytest.approx(empty.time(100, 40))


def test_demo_cost_model_in_simulate_recommend_as_the_readme_writes_it(here, capsys):
    first = (here / OUT / "cost_model.toml").read_text().splitlines()[0]
    assert first.startswith("# fitted by speclab demo from ")
    out = cli(
        capsys,
        "simulate", "--traces", f"{OUT}/traced", "--cost-model", f"{OUT}/cost_model.toml",
        "--policy", "adaptive", "--batch-sizes", "1,4,16,64", "--recommend",
    )  # fmt: skip
    config = json.loads(out.split("speculative config", 1)[1].splitlines()[1])
    assert config["method"] == "ngram" and "num_speculative_tokens" in config
    out = cli(capsys, "simulate", "--traces", f"{OUT}/traced", "--cost-model", f"{OUT}/cost_model.toml",
              "--recommend")  # fmt: skip
    assert "speculative config" in out
    # the simulation the demo wrote names the cost model by the path it printed
    sim = json.loads((here / OUT / "simulation.json").read_text())
    assert sim["cost_model"] == f"{OUT}/cost_model.toml" and sim["results"]
    assert get_cost_model(sim["cost_model"]).name == "demo-fitted"
    out = cli(capsys, "cost-models", "show", f"{OUT}/cost_model.toml")
    assert CostModel.from_toml(out, "shown").name == "demo-fitted"


def test_demo_traces_in_simulate_analyze_and_traces(here, capsys):
    traced = f"{OUT}/traced"
    out = cli(capsys, "simulate", "--traces", traced, "--cost-model", f"{OUT}/cost_model.toml",
              "--policy", "fixed:ngram:3", "--policy", "oracle:ngram", "--batch-sizes", "1,4",
              "--csv", "sim.csv", "--json")  # fmt: skip
    rows = json.loads(out)
    assert {r["policy"] for r in rows} == {"fixed:ngram:3", "oracle:ngram"}
    assert len((here / "sim.csv").read_text().splitlines()) == len(rows) + 1  # a header and a line per row
    cli(capsys, "analyze", "--traces", traced, "--run", f"{OUT}/run", "--out", "analysis-again.json")
    assert json.loads((here / "analysis-again.json").read_text())
    assert "ok:" in cli(capsys, "traces", "validate", traced)
    assert "ngram" in cli(capsys, "traces", "info", traced)
    # a replay from the demo's traces, and the demo's run, both read back by `trace --from`
    cli(capsys, "trace", "--from", traced, "--methods", "ngram", "--k-max", "5", "--out", "again.parquet")
    assert len(read_store(here / "again.parquet")) == len(read_store(here / traced))


def test_demo_run_in_bench_show_validate_and_report(here, capsys):
    run = f"{OUT}/run"
    assert "token-exact" in cli(capsys, "bench", "show", run)
    assert json.loads(cli(capsys, "bench", "show", run, "--json"))
    out = cli(capsys, "validate", run)
    assert "mean absolute error of the predicted speedup" in out
    assert json.loads((here / run / "validation.json").read_text())
    out = cli(capsys, "validate", run, "--cost-model", f"{OUT}/cost_model.toml", "--json", "-")
    assert json.loads(out)
    out = cli(capsys, "report", "--run", run, "--traces", f"{OUT}/traced", "--analysis", f"{OUT}/analysis.json",
              "--cost-model", f"{OUT}/cost_model.toml", "--out", "report-again")  # fmt: skip
    html = (here / "report-again" / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "from validation.json" in html  # RUN/validation.json read
    assert "token-exact outputs in all" in cli(capsys, "bench", "compare", run, run)
    cli(capsys, "trace", "crosscheck", run, "--out", "crosscheck.json")
    assert "summary" in json.loads((here / "crosscheck.json").read_text())


FIT_FORMS = {
    "linear": (),
    "table": ("--target-form", "table"),  # here no count has enough rows for its own entry
    "piecewise-chained": (
        "--target-form",
        "piecewise",
        "--draft-form",
        "chained",
        "--overhead-form",
        "linear",
    ),
    "table-bins-forwards": ("--target-form", "table", "--table-bins", "--draft-form", "forwards"),
}


@pytest.mark.parametrize("form", list(FIT_FORMS))
def test_cost_models_fit_output_in_simulate_validate_and_check(here, capsys, form):
    path = f"fit-{form}.toml"
    timings = f"{OUT}/run/timings.csv" if form == "linear" else f"{OUT}/run"  # the run's CSV, or the run
    cli(capsys, "cost-models", "fit", timings, "--out", path, *FIT_FORMS[form])
    assert get_cost_model(path).draft.keys() >= {"ngram", "draft_model"}
    out = cli(capsys, "simulate", "--traces", f"{OUT}/traced", "--cost-model", path, "--recommend")
    assert "speculative config" in out
    assert "mean absolute error" in cli(
        capsys, "validate", f"{OUT}/run", "--cost-model", path, "--json", f"validate-{form}.json"
    )
    assert "name =" in cli(capsys, "cost-models", "show", path)


def test_jsonl_traces_from_trace_and_export_read_where_a_store_is(here, capsys):
    cli(
        capsys,
        "trace",
        "--from",
        f"{OUT}/run",
        "--methods",
        "ngram",
        "--k-max",
        "5",
        "--out",
        "replayed.jsonl",
    )
    cli(capsys, "traces", "export", f"{OUT}/traced", "--out", "exported.jsonl")
    n = len(read_store(here / OUT / "traced"))
    for f in ("replayed.jsonl", "exported.jsonl"):
        assert len(read_store(here / f)) > 0
        assert "ok:" in cli(capsys, "traces", "validate", f)
        out = cli(capsys, "simulate", "--traces", f, "--cost-model", f"{OUT}/cost_model.toml",
                  "--policy", "fixed:ngram:3", "--batch-sizes", "1,4")  # fmt: skip
        assert "fixed:ngram:3" in out
        cli(capsys, "analyze", "--traces", f, "--no-oracle", "--out", f"{f}.analysis.json")
        assert cli(capsys, "trace", "--from", f, "--methods", "ngram", "--out", f"{f}.parquet")
    out = cli(capsys, "traces", "import", "--format", "speclab-jsonl", "exported.jsonl", "--out", "imported")
    assert len(read_store(here / "imported")) == n
    export_jsonl(read_store(here / "imported"), here / "round.jsonl")
    assert (here / "round.jsonl").read_text() == (here / "exported.jsonl").read_text()


def test_profile_output_in_simulate_as_it_prints(tmp_path, monkeypatch, capsys, work):
    (tmp_path / "fake_profile_worker.py").write_text(FAKE_PROFILE_WORKER)
    monkeypatch.setenv("SPECLAB_WORKER_CMD", f"{sys.executable} {tmp_path / 'fake_profile_worker.py'}")
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(work)
    for out_arg in ("fake-cpu", "profiled.toml"):
        out = cli(capsys, "profile", "--target", "fake-target", "--methods", "ngram:3", "--out", out_arg)
        given = out.rsplit("(use --cost-model ", 1)[1].split(")")[0]
        assert given == out_arg
        sim = cli(capsys, "simulate", "--traces", f"{OUT}/traced", "--cost-model", given,
                  "--policy", "fixed:ngram:3", "--batch-sizes", "1,4")  # fmt: skip
        assert "fixed:ngram:3" in sim
        assert "name =" in cli(capsys, "cost-models", "show", given)


def test_workloads_export_output_is_a_file_workload(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cli(capsys, "workloads", "export", "offline-math", "--limit", "2", "--out", "prompts.jsonl")
    assert "2 requests -> 2 prompts" in cli(capsys, "workloads", "inspect", "prompts.jsonl")
    shown = cli(capsys, "workloads", "show", "file:prompts.jsonl", "--limit", "2")
    exported = [json.loads(ln) for ln in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    assert all(p["messages"][0]["content"].splitlines()[0] in shown for p in exported)
