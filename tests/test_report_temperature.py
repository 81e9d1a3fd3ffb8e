"""The report's temperature section, from a synthetic run with three temperatures, two batch sizes and two
SD methods (made-up numbers; the target's name says so)."""

import json
import re
from pathlib import Path

import pytest

from helpers import fake_simulator, report_with_rows  # tests/ is on sys.path (pytest prepend mode)
from speclab.analyze.synthetic import write_synthetic_run
from speclab.report import build_report
from speclab.report.sampling import cells, greedy_view, has_sampling, says, sentences

TEMPS = (0.0, 0.7, 1.0)
SIZES = (1, 4)
# matched-pair speedups per (method, batch size, temperature): ngram pays at T = 0 and is slower beyond (3
# quiet pairs each side of 1.00x); eagle's pairs straddle 1.00x at every T > 0 (cannot tell there)
PAIRS = {
    ("ngram", 1, 0.0): [1.28, 1.30, 1.33],
    ("ngram", 1, 0.7): [0.88, 0.90, 0.93],
    ("ngram", 1, 1.0): [0.84, 0.85, 0.87],
    ("ngram", 4, 0.0): [1.10, 1.12, 1.15],
    ("ngram", 4, 0.7): [0.80, 0.82, 0.85],
    ("ngram", 4, 1.0): [0.78, 0.80, 0.81],
    ("eagle", 1, 0.0): [1.50, 1.55, 1.60],
    ("eagle", 1, 0.7): [0.95, 1.02, 1.08],
    ("eagle", 1, 1.0): [0.92, 0.99, 1.04],
    ("eagle", 4, 0.0): [1.20, 1.22, 1.25],
    ("eagle", 4, 0.7): [0.97, 1.01, 1.03],
    ("eagle", 4, 1.0): [0.96, 1.00, 1.02],
}


def sampled_rows(workload: str = "offline-chat") -> list[dict]:
    rows = []
    for bs in SIZES:
        for t in TEMPS:
            base_id = f"{workload}-none-bs{bs}-t{t}"
            common = {
                "status": "ok",
                "target": "synthetic-target (made-up numbers)",
                "dtype": "float32",
                "workload": workload,
                "batching": "replicate",
                "batch_size": bs,
                "num_prompts": 8,
                "max_tokens": 128,
                "seed": 42,
                "temperature": t,
                "top_p": 1.0,
                "top_k": 0,
                "sampling": "fixed",
                "repeats": 3,
            }
            rows.append({**common, "cell_id": base_id, "method": "none", "k": None, "throughput_tok_s": 50.0})
            for method in ("ngram", "eagle"):
                pairs = PAIRS[(method, bs, t)]
                acc = [round(0.7 * 0.8**j * (1 - t / 1.2) ** (j + 1), 3) for j in range(3)]
                row = {
                    **common,
                    "cell_id": f"{workload}-{method}-k3-bs{bs}-t{t}",
                    "baseline_cell_id": base_id,
                    "method": method,
                    "k": 3,
                    "speedup": pairs[1],
                    "throughput_tok_s": 50.0 * pairs[1],
                    "speedup_runs": [
                        {"repeat": i + 1, "speedup": x, "contended": False} for i, x in enumerate(pairs)
                    ],
                    "speedup_spread": {"min": pairs[0], "max": pairs[2], "n": 3},
                    "mean_acceptance_length": round(1 + sum(acc) + (0.01 if method == "eagle" else 0), 3),
                    "acceptance_rate_per_pos": acc,
                    "lossless": True if t == 0 else None,
                }
                if t > 0:
                    row["lossless_detail"] = (
                        "sampled: token-exactness does not apply (see the distribution check)"
                    )
                rows.append(row)
    for r in rows:  # one failed distribution check, one engine fault from the acceptance replay
        if r["cell_id"] == f"{workload}-ngram-k3-bs1-t1.0":
            r["distribution_check"] = {"p_value": 1e-6, "tv_detectable_80": 0.04, "samples": 2000,
                                       "positions": 4, "verdict": "fail"}  # fmt: skip
        if r["cell_id"] == f"{workload}-eagle-k3-bs4-t1.0":
            r["engine_fault"] = "engine acceptance far below the replayed expectation (0.01 vs 0.45)"
        if r["cell_id"] == f"{workload}-eagle-k3-bs1-t0.7":
            r["distribution_check"] = {"p_value": 0.41, "tv_detectable_80": 0.05, "samples": 2000,
                                       "positions": 4, "verdict": "pass"}  # fmt: skip
    return rows


@pytest.fixture(scope="module")
def sampled_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("temperature")
    return report_with_rows(
        tmp, lambda _: sampled_rows(), "SYNTHETIC test data: temperature section", n_per_workload=4
    )


def section_html(html: str) -> str:
    return html.split('<h2 id="temperature">')[1].split("<h2 ")[0]


def table_rows(html: str, caption: str) -> list[list[str]]:
    body = html.split(caption, 1)[1].split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [re.findall(r"<td[^>]*>(.*?)</td>", tr) for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", body)]


def test_section_table_matches_the_rows(sampled_report):
    path, rows = sampled_report
    html = path.read_text()
    assert '<a href="#temperature">Temperature</a>' in html
    sec = section_html(html)
    got = {(r[0], int(r[2]), r[3], r[4]): r for r in table_rows(sec, "<b>Cells by temperature</b>")}
    sd = [r for r in rows if r["method"] != "none"]
    assert len(got) == len(sd) == 12
    for r in sd:
        cell = got[(r["workload"], r["batch_size"], f"T = {r['temperature']:g}", f"{r['method']}@k3")]
        assert cell[5] == f"{r['speedup']:.2f}"
        sp = r["speedup_spread"]
        assert cell[6] == f"{sp['min']:.2f}-{sp['max']:.2f} (n=3)"
        assert cell[8] == f"{r['mean_acceptance_length']:.2f}"
        assert cell[9] == " ".join(f"{a:.2f}" for a in r["acceptance_rate_per_pos"])
    # verdicts by the noise rule: ngram's pairs all on one side; eagle's straddle at T > 0
    assert got[("offline-chat", 1, "T = 0", "ngram@k3")][7] == "faster"
    assert got[("offline-chat", 1, "T = 0.7", "ngram@k3")][7] == "slower"
    assert got[("offline-chat", 1, "T = 0.7", "eagle@k3")][7] == "cannot tell"
    # the distribution check with its power, and the engine faults, on their cells
    assert (
        "pass (p = 0.41, detects TV &gt;= 0.05 at 80% power, 2000 samples)"
        in got[("offline-chat", 1, "T = 0.7", "eagle@k3")][10]
    )
    assert got[("offline-chat", 1, "T = 1", "ngram@k3")][11].startswith("ENGINE FAULT: output distribution")
    assert "far below the replayed expectation" in got[("offline-chat", 4, "T = 1", "eagle@k3")][11]
    assert got[("offline-chat", 1, "T = 0", "ngram@k3")][11] == "-"
    assert "2 cell(s) flagged" in sec
    words = {(w["batch_size"], w["configuration"]): w["says"] for w in sentences(cells(rows))}
    assert words[(4, "eagle@k3")].endswith("(engine fault flagged at T = 1)")
    recs = {(r[2], r[3]): r for r in table_rows(sec, "Recommendations per temperature")}
    assert recs[("4", "T = 1")][8].startswith("engine fault flagged on eagle@k3; ")


def test_plots_written(sampled_report):
    path, _ = sampled_report
    for name in ("speedup_vs_temperature.png", "acceptance_vs_temperature.png"):
        png = path.parent / name
        assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
        assert f'data-file="{name}"' in path.read_text()


def test_recommendations_in_words_follow_the_verdicts(sampled_report):
    path, rows = sampled_report
    words = {(w["batch_size"], w["configuration"]): w["says"] for w in sentences(cells(rows))}
    assert words[(1, "ngram@k3")] == (
        "pays at T = 0 (1.30x) and stops at T >= 0.7: T = 0.7 (0.90x), T = 1 (0.85x)"
        " (engine fault flagged at T = 1)"
    )
    assert (
        words[(4, "ngram@k3")]
        == "pays at T = 0 (1.12x) and stops at T >= 0.7: T = 0.7 (0.82x), T = 1 (0.80x)"
    )
    assert words[(1, "eagle@k3")] == "pays at T = 0 (1.55x); cannot tell at T = 0.7 (1.02x), T = 1 (0.99x)"
    sec = section_html(path.read_text())
    assert "pays at T = 0 (1.12x) and stops at T &gt;= 0.7" in sec
    # per temperature, the best configuration by the recommendation rules
    recs = {(r[2], r[3]): r for r in table_rows(sec, "Recommendations per temperature")}
    assert recs[("1", "T = 0")][4] == "eagle@k3" and recs[("1", "T = 0")][6] == "use SD"
    # T = 0.7, batch 1: ngram is slower, eagle cannot tell -> the table cannot tell either
    assert recs[("1", "T = 0.7")][6] == "cannot tell"
    # T = 0.7, batch 4: ngram slower, eagle straddles -> cannot tell; never "SD off" without the evidence
    assert recs[("4", "T = 0.7")][6] == "cannot tell"


def test_says_cannot_tell_with_too_few_pairs():
    """Two quiet pairs each side of 1.00x and no A/A noise: nothing is supported."""
    rows = sampled_rows()
    for r in rows:
        if r.get("speedup_runs"):
            r["speedup_runs"] = r["speedup_runs"][:2]
    w = {(s["batch_size"], s["configuration"]): s["says"] for s in sentences(cells(rows))}
    assert (
        w[(4, "ngram@k3")]
        == "cannot tell at any temperature measured: T = 0 (1.11x), T = 0.7 (0.81x), T = 1 (0.79x)"
    )
    assert "pays" not in w[(4, "eagle@k3")]


def test_says_other_patterns():
    def c(t, status, fig):
        return {"key": (0, t, 1.0, 0), "setting": f"T = {t:g}", "status": status, "figure": fig}

    assert says([c(0.0, "faster", 1.3), c(0.7, "faster", 1.1)]).startswith("pays at every temperature")
    assert says([c(0.0, "slower", 0.9), c(0.7, "slower", 0.8)]).startswith("does not pay at any")
    # slower, then faster again: no "stops at"
    assert says([c(0.0, "faster", 1.3), c(0.7, "slower", 0.9), c(1.0, "faster", 1.2)]) == (
        "pays at T = 0 (1.30x), T = 1 (1.20x); does not pay at T = 0.7 (0.90x)"
    )


def test_greedy_sections_read_t0_only(sampled_report):
    path, rows = sampled_report
    html = path.read_text()
    results = table_rows(html, "<b>Results table</b>")
    assert len(results) == len(SIZES) * 3  # none, ngram, eagle at T = 0 per batch size
    assert {r[3] for r in results if r[1] == "ngram@k3"} == {"1.30", "1.12"}
    assert "T = 0 (greedy) cells only" in html.split('<h2 id="speedup">')[1].split("<h2 ")[0]
    assert "several sampling settings (T = 0, T = 0.7, T = 1)" in html
    assert [r["temperature"] for r in greedy_view(rows)] == [0.0] * 6


def test_greedy_only_run_has_no_temperature_section(tmp_path, monkeypatch):
    fake_simulator(monkeypatch)
    run = write_synthetic_run(tmp_path / "run", n_per_workload=4)
    html = build_report(tmp_path / "rep", run=run, title="SYNTHETIC").read_text()
    assert 'id="temperature"' not in html and "#temperature" not in html
    assert "T = 0 (greedy) cells only" not in html
    assert not list((tmp_path / "rep").glob("*temperature*.png"))
    # rows that carry the sampling fields at T = 0 only are greedy-only as well
    rows = sampled_rows()
    greedy = [r for r in rows if r["temperature"] == 0.0]
    assert not has_sampling(greedy) and greedy_view(greedy) is greedy
    assert has_sampling([dict(greedy[0], sampling="as-logged", temperature=None)])


def test_temperature_section_fits_a_1300_pixel_window(sampled_report, tmp_path):
    from test_report_render import CHROMIUM, width_check

    if not Path(CHROMIUM).exists():
        pytest.skip("chromium not installed: cannot render the report")
    path, _ = sampled_report
    width, last, bad = width_check(tmp_path, path, 1300)
    assert width < 1300 and "across temperatures" in last and "flag" in last  # the section's tables measured
    assert bad == "", f"overflowing at 1,300 px: {bad}"


def test_sampled_only_run_with_an_as_logged_cell(tmp_path, monkeypatch):
    """A run at T = 0.7 and as logged, no greedy cell: the temperature section carries everything."""
    fake_simulator(monkeypatch)
    run = write_synthetic_run(tmp_path / "run", n_per_workload=4)
    rows = [r for r in sampled_rows() if r["temperature"] == 0.7 and r["batch_size"] == 1]
    logged = [
        dict(
            r,
            cell_id=r["cell_id"] + "-logged",
            sampling="as-logged",
            temperature=None,
            requests_own_settings=8,
        )
        for r in rows
    ]
    for r in logged:
        if r.get("baseline_cell_id"):
            r["baseline_cell_id"] += "-logged"
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + logged))
    html = build_report(tmp_path / "rep", run=run, title="SYNTHETIC").read_text()
    assert "This run has no T = 0 cell (T = 0.7, as logged only)" in html
    sec = section_html(html)
    assert "8 of 8 requests with their own logged settings" in sec
    got = {(r[3], r[4]): r for r in table_rows(sec, "<b>Cells by temperature</b>")}
    assert got[("as logged", "ngram@k3")][7] == "slower" and got[("T = 0.7", "ngram@k3")][5] == "0.90"
    words = {w["configuration"]: w["says"] for w in sentences(cells(rows + logged))}
    assert words["ngram@k3"] == "does not pay at any temperature measured: T = 0.7 (0.90x), as logged (0.90x)"
    assert (tmp_path / "rep" / "speedup_vs_temperature.png").exists()
