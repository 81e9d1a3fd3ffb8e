"""The one reader of RUN/results.jsonl (bench.rows / bench.results.parse_rows), display speedups and entry labels."""

import json

import pytest

from speclab.analyze import analyze
from speclab.analyze.synthetic import write_synthetic_run
from speclab.bench.results import ResultsStore
from speclab.bench.rows import entry_labels, fill_speedups, read_rows
from speclab.bench.show import load_rows
from speclab.errors import ConfigError
from speclab.report import build_report


def row(cell_id, method, k=None, **kw):
    base = {
        "cell_id": cell_id,
        "status": "ok",
        "method": method,
        "k": k,
        "target": "t",
        "dtype": "float32",
        "workload": "w",
        "batching": "replicate",
        "batch_size": 1,
        "num_prompts": 2,
        "max_tokens": 8,
        "seed": 0,
    }
    return {**base, **kw}


def test_bad_line_is_one_error_naming_file_and_line_for_every_reader(tmp_path):
    run = write_synthetic_run(tmp_path / "run", n_per_workload=2)
    lines = (run / "results.jsonl").read_text().splitlines()
    lines[3] = lines[3][:40]  # a hand edit that broke the line
    (run / "results.jsonl").write_text("\n".join(lines) + "\n")
    where = f"{run / 'results.jsonl'}:4: not valid JSON"
    for read in (
        read_rows,
        load_rows,
        ResultsStore,
        lambda r: analyze(None, run=r, oracle=False),
        lambda r: build_report(tmp_path / "rep", run=r),
    ):
        with pytest.raises(ConfigError) as ei:
            read(run)
        assert str(ei.value).startswith(where) and "\n" not in str(ei.value)
    lines[3] = "[1, 2]"
    (run / "results.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"results.jsonl:4: not a results row"):
        read_rows(run)


def test_read_rows_keeps_file_order_and_the_last_row_of_a_cell(tmp_path):
    rows = [row("a", "none"), row("b", "ngram", 3), row("a", "none", status="failed")]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    got = read_rows(tmp_path)
    assert [(r["cell_id"], r["status"]) for r in got] == [("a", "failed"), ("b", "ok")]
    assert read_rows(tmp_path / "results.jsonl") == got  # the file itself works too
    with pytest.raises(ConfigError, match="run directory not found"):
        read_rows(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no results.jsonl here"):
        read_rows(tmp_path / "empty")


def test_fill_speedups_uses_the_runners_apply_baseline():
    mem = {"peak_rss_bytes": 100}
    base = row("none.w", "none", speedup=1.0, throughput_tok_s=50.0, memory=dict(mem))
    sd = row("ngram.w", "ngram", 3, speedup=None, throughput_tok_s=75.0, memory={"peak_rss_bytes": 130})
    other = row("ngram.w2", "ngram", 3, batch_size=4, speedup=None, throughput_tok_s=75.0, memory={})
    rows = [sd, base, other]
    fill_speedups(rows)
    assert sd["speedup"] == pytest.approx(1.5)
    assert sd["baseline_cell_id"] == "none.w" and sd["memory"]["added_peak_rss_bytes"] == 30
    assert other["speedup"] is None  # no no-SD cell at batch size 4


def test_entry_labels_bench_labels_and_derived_names():
    rows = [
        row("1", "none", label="none"),
        row("2", "ngram", 3, label="ngram-k3", method_options={"prompt_lookup_max": 7}),
        row("3", "ngram", 3, label="ngram-wide", method_options={"prompt_lookup_max": 9}),
        # rows made outside the bench carry no label: METHOD@kK, options added only where they would merge
        row("4", "eagle", 3, method_options={}),
        row("5", "eagle", 3, status="failed"),  # no options recorded = no options
        row("6", "ngram", 5, method_options={"prompt_lookup_max": 7}),
        row("7", "ngram", 5, method_options={"prompt_lookup_max": 9, "prompt_lookup_min": 2}),
        row("8", "none"),
    ]
    assert entry_labels(rows) == [
        "none",
        "ngram-k3",
        "ngram-wide",
        "eagle@k3",
        "eagle@k3",
        "ngram@k5(prompt_lookup_max=7)",
        "ngram@k5(prompt_lookup_max=9,prompt_lookup_min=2)",
        "none",
    ]
    assert entry_labels(rows) == entry_labels([dict(r) for r in rows])  # stable
