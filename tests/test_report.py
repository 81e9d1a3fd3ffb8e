import base64
import json
import re

import pytest
from click.testing import CliRunner

from helpers import fake_simulator  # tests/ is on sys.path (pytest prepend mode)
from speclab.analyze import analyze
from speclab.analyze.synthetic import synthetic_results, write_synthetic_run
from speclab.errors import SpeclabError
from speclab.report import build_report
from speclab.report.recommend import headline, recommendations

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def embedded_pngs(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)]


def test_recommendations_measured_off_and_simulated():
    rows = synthetic_results()
    gap = {
        "rows": [
            {
                "workload": "synthetic-code",
                "batching": "replicate",
                "batch_size": 128,
                "simulated": {"none": 1.0, "oracle:ngram": 1.5, "fixed:ngram:3": 0.8, "fixed:eagle:3": 0.7},
            },
            {
                "workload": "synthetic-code",
                "batching": "replicate",
                "batch_size": 1,
                "simulated": {"fixed:eagle:3": 9.0},
            },  # measured exists: ignored
        ]
    }
    # single runs: each one pair, decided by a quiet machine's A/A noise (2% log spread over 12 pairs)
    calm = {"pairs": 12, "sd_log": 0.02}
    recs = {(r["workload"], r["batch_size"]): r for r in recommendations(rows, gap, calm)}
    assert recs[("synthetic-code", 1)]["recommend"] == "ngram@k3"
    assert recs[("synthetic-code", 1)]["source"] == "measured"
    assert recs[("synthetic-chat", 1)]["recommend"] == "eagle@k3"
    assert recs[("synthetic-chat", 32)]["recommend"] == "SD off"  # every SD cell < 1
    sim = recs[("synthetic-code", 128)]
    # oracle ignored (a bound); best fixed 0.8 < 1 -> off, from the simulator
    assert (sim["recommend"], sim["source"], sim["best_method"]) == ("SD off", "simulated", "ngram@k3")
    # the failed bs64 cell does not produce a recommendation
    assert ("synthetic-chat", 64) not in recs
    assert any("should be off in" in line for line in headline(list(recs.values())))


def test_report_full_inputs(tmp_path, monkeypatch):
    fake_simulator(monkeypatch)
    run = write_synthetic_run(tmp_path / "run", n_per_workload=6)
    out = tmp_path / "rep"
    path = build_report(out, run=run, title="SYNTHETIC test data", cost_model=None)
    html = path.read_text()
    assert "SYNTHETIC test data" in html
    pngs = embedded_pngs(html)
    files = sorted(p.name for p in out.glob("*.png"))
    assert len(pngs) == len(files) == 7
    assert all(p.startswith(PNG_MAGIC) for p in pngs)
    # self-contained: no external references
    assert not re.search(r'(src|href)="(https?:|file:|/)', html)
    for section in (
        "Summary",
        "Results table",
        "Recommendation",
        "Time split",
        "Memory",
        "Acceptance",
        "Oracle gap",
        "Inputs, commands",
    ):
        assert section in html
    # the numbers a reader checks the plot against are in the table
    assert ">2.10<" in html and "SD off" in html
    # the synthetic run's command file is shown
    assert "SYNTHETIC: written by" in html


def test_report_analysis_only_labels_missing_run(tmp_path):
    run = write_synthetic_run(tmp_path / "run", n_per_workload=4)
    a = analyze(run / "traces", oracle=False)
    (tmp_path / "a.json").write_text(json.dumps(a))
    path = build_report(tmp_path / "rep", analysis=tmp_path / "a.json", title="SYNTHETIC")
    html = path.read_text()
    assert "No bench run" in html
    assert "Missing input" in html
    assert len(embedded_pngs(html)) == 4  # acceptance hist, position, spread, overlap


def test_report_cli_and_nothing_to_report(tmp_path):
    with pytest.raises(SpeclabError, match="nothing to report"):
        build_report(tmp_path / "x")
    run = write_synthetic_run(tmp_path / "run", n_per_workload=4)
    from speclab.cli.report import command

    res = CliRunner().invoke(
        command, ["--run", str(run), "--out", str(tmp_path / "rep"), "--title", "SYNTHETIC"]
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / "rep" / "report.html").exists()


def test_entries_with_same_method_and_k_but_other_options_stay_apart(tmp_path, monkeypatch):
    """Rows are keyed by sweep-entry label: a second ngram k=3 entry with other options is not merged into
    the first by max() (it used to be: both were "ngram@k3")."""
    fake_simulator(monkeypatch)
    rows = synthetic_results()
    wide = []
    for r in rows:
        if r.get("method") == "ngram":
            r["label"] = "ngram-k3"
            if r["workload"] == "synthetic-code":
                w = dict(r, cell_id=r["cell_id"] + "-wide", label="ngram-wide")
                w["method_options"] = {"prompt_lookup_min": 2, "prompt_lookup_max": 9}
                # better than ngram-k3 at batch 1 only
                w["speedup"] = 2.5 if r["batch_size"] == 1 else round(r["speedup"] - 0.05, 3)
                wide.append(w)
    rows += wide
    calm = {"pairs": 12, "sd_log": 0.02}  # single runs decide by a quiet machine's A/A noise
    recs = {(r["workload"], r["batch_size"]): r for r in recommendations(rows, None, calm)}
    r1, r8 = recs[("synthetic-code", 1)], recs[("synthetic-code", 8)]
    assert (r1["recommend"], r1["best_speedup"], r1["runner_up"]) == ("ngram-wide", 2.5, "ngram-k3")
    assert (r8["recommend"], r8["runner_up"]) == ("ngram-k3", "ngram-wide")
    assert r1["candidates"] == r8["candidates"] == 3  # ngram-k3, ngram-wide, eagle@k3

    run = write_synthetic_run(tmp_path / "run", n_per_workload=4)
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    a = analyze(None, run=run, max_requests=4, cost_model=None)
    g1 = next(g for g in a["oracle_gap"]["rows"] if (g["workload"], g["batch_size"]) == ("synthetic-code", 1))
    assert g1["measured"] == {
        "ngram-k3": pytest.approx(2.1),
        "ngram-wide": 2.5,
        "eagle@k3": pytest.approx(1.7),
    }
    assert g1["best_measured_method"] == "ngram-wide"
    html = build_report(tmp_path / "rep", run=run, analysis=a).read_text()
    # every row in the results table under its own name: 3 batch sizes of synthetic-code each
    results = html.split("<b>Results table</b>")[1].split("</table>")[0]
    assert results.count('<td class="l">ngram-wide</td>') == 3
    assert (
        results.count('<td class="l">ngram-k3</td>') == 3 + 3
    )  # synthetic-code and synthetic-chat at 1, 8, 32
    # and once per workload in "where each configuration stops paying"
    stops = html.split("Where each configuration stops paying")[1].split("</table>")[0]
    assert (
        stops.count('<td class="l">ngram-wide</td>') == 1 and stops.count('<td class="l">ngram-k3</td>') == 2
    )
