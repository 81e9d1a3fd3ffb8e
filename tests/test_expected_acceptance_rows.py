"""RUN/expected_acceptance.json merged into a run's rows: `bench show` and the report's temperature section
carry the expected mean acceptance length and the engine fault; a missing file changes nothing; a corrupt
one is one warning line and changes nothing. Synthetic runs (made-up numbers; no engine)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import report_with_rows  # tests/ is on sys.path (pytest prepend mode)
from speclab.bench.expected_acceptance import (
    CELL_FIELDS,
    EXPECTED_FILE,
    merge_expected,
    read_expected,
    write_expected,
)
from speclab.bench.show import format_run, load_rows
from test_report_temperature import sampled_rows, section_html, table_rows

FAULT = (
    "engine accepted 0.01 drafts per step, below 50% of the 0.45 the replayed expectation gives (64 steps)"
)


def _entry(exp: float, meas: float, fault: str | None = None, t: float = 0.7) -> dict:
    return {"expected_mean_acc": exp, "measured_mean_acc": meas, "rel_error": (meas - exp) / exp,
            "engine_fault": fault, "method": "ngram", "temperature": t, "steps": 64}  # fmt: skip


def _rows() -> list[dict]:
    common = {"status": "ok", "workload": "offline-chat", "batching": "replicate", "batch_size": 1,
              "target": "synthetic-target (made-up numbers)", "num_prompts": 4, "max_tokens": 32, "seed": 1,
              "sampling": "fixed", "top_p": 1.0, "top_k": 0}  # fmt: skip
    rows = []
    for t in (0.7, 1.0):
        base = f"none.t{t}"
        rows.append({**common, "cell_id": base, "method": "none", "label": "none", "temperature": t,
                     "throughput_tok_s": 50.0})  # fmt: skip
        rows.append({**common, "cell_id": f"ngram.t{t}", "method": "ngram", "label": "ngram@k3", "k": 3,
                     "temperature": t, "baseline_cell_id": base, "throughput_tok_s": 40.0, "lossless": None,
                     "mean_acceptance_length": 1.01 if t == 1.0 else 1.6,
                     "acceptance_rate_per_pos": [0.3, 0.2, 0.1]})  # fmt: skip
    return rows


def _run(tmp_path: Path, expected: str | dict | None) -> Path:
    run = tmp_path / "run"
    run.mkdir(parents=True)
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    if isinstance(expected, dict):
        write_expected(run, expected, {"command": "test"})
    elif expected is not None:
        (run / EXPECTED_FILE).write_text(expected)
    return run


CELLS = {"ngram.t0.7": _entry(1.62, 1.6), "ngram.t1.0": _entry(1.45, 1.01, FAULT, t=1.0)}


def test_write_and_read_back(tmp_path):
    run = _run(tmp_path, CELLS)
    data = json.loads((run / EXPECTED_FILE).read_text())
    assert data["settings"] == {"command": "test"} and data["written_at"] and data["skipped_methods"] == {}
    got = read_expected(run)
    assert got == CELLS and set(CELL_FIELDS) <= set(got["ngram.t1.0"])
    assert read_expected(run / "results.jsonl") == CELLS  # the results file names its run
    # NaN is written as null (strict JSON), and then not merged as a figure
    write_expected(run, {"ngram.t0.7": _entry(float("nan"), 1.6)}, {})
    assert "NaN" not in (run / EXPECTED_FILE).read_text()
    assert "expected_mean_acceptance_length" not in merge_expected(_rows(), run)[1]


def test_merge_by_cell_id(tmp_path):
    run = _run(tmp_path, CELLS)
    rows = {r["cell_id"]: r for r in merge_expected(_rows(), run)}
    assert rows["ngram.t0.7"]["expected_mean_acceptance_length"] == 1.62
    assert "engine_fault" not in rows["ngram.t0.7"]  # null fault: nothing added
    assert rows["ngram.t1.0"]["engine_fault"] == FAULT
    assert rows["ngram.t1.0"]["expected_mean_acceptance_length"] == 1.45
    # a cell the file does not name: unchanged
    assert rows["none.t0.7"] == next(r for r in _rows() if r["cell_id"] == "none.t0.7")


def test_missing_file_changes_nothing(tmp_path):
    warned: list[str] = []
    run = _run(tmp_path, None)
    assert read_expected(run, warned.append) is None
    assert merge_expected(_rows(), run, warned.append) == _rows() and warned == []


@pytest.mark.parametrize(
    "text", ["{not json", '{"cells": [1, 2]}', '{"cells": {"ngram.t0.7": 3}}', "[]", "\xff\xfe"]
)
def test_unreadable_file_is_one_warning_and_changes_nothing(tmp_path, text):
    warned: list[str] = []
    run = _run(tmp_path, None)
    (run / EXPECTED_FILE).write_bytes(text.encode("latin-1"))
    assert merge_expected(_rows(), run, warned.append) == _rows()
    assert len(warned) == 1 and "\n" not in warned[0]
    assert warned[0].startswith("warning: ") and EXPECTED_FILE in warned[0]


def test_show_prints_expected_and_the_fault(tmp_path):
    run = _run(tmp_path, CELLS)
    text = format_run(run)
    header = next(ln for ln in text.splitlines() if ln.startswith("workload"))
    cols = header.split()
    assert cols[cols.index("acc.len") + 1] == "exp.acc"
    line = next(ln for ln in text.splitlines() if "ngram@k3" in ln and " 1  " in ln and "1.01" in ln)
    assert "1.45" in line and line.rstrip().endswith("ok, ENGINE FAULT")
    ok = next(ln for ln in text.splitlines() if "ngram@k3" in ln and "1.62" in ln)
    assert "ENGINE FAULT" not in ok
    assert "ngram@k3 offline-chat replicate B=1 T=0.7: measured 1.60 expected 1.62" in text
    assert f"T=1: measured 1.01 expected 1.45  ENGINE FAULT: {FAULT}" in text


def test_show_cli(tmp_path, capsys):
    from speclab.cli import main

    run = _run(tmp_path, CELLS)
    assert main(["bench", "show", str(run), "--json"]) in (0, None)
    rows = {r["cell_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["ngram.t1.0"]["engine_fault"] == FAULT
    assert rows["ngram.t0.7"]["expected_mean_acceptance_length"] == 1.62
    assert main(["bench", "show", str(run)]) in (0, None)
    out = capsys.readouterr()
    assert "ENGINE FAULT" in out.out and out.err == ""


def test_show_without_or_with_a_corrupt_file(tmp_path, capsys):
    from speclab.cli import main

    plain = format_run(_run(tmp_path / "a", None))
    assert "exp.acc" not in plain and "ENGINE FAULT" not in plain and "expected acceptance" not in plain
    run = _run(tmp_path / "b", "{torn")
    assert main(["bench", "show", str(run)]) in (0, None)
    out = capsys.readouterr()
    assert out.out.strip() == plain.strip()
    assert len(out.err.strip().splitlines()) == 1 and out.err.startswith("warning: ")
    assert load_rows(run) == load_rows(tmp_path / "a" / "run")
    capsys.readouterr()


# --- the report -------------------------------------------------------------------------------------------


def _report_rows(_: list[dict]) -> list[dict]:
    rows = sampled_rows()
    for r in rows:
        r.pop("engine_fault", None)  # the fault comes from the file only
    return rows


def _report(tmp: Path, expected: str | dict | None) -> tuple[str, list[dict]]:
    """A report over the temperature section's synthetic run with this expected_acceptance.json."""
    import speclab.report.build as build

    real = build.read_rows

    def read_rows(run, *a, **k):  # write the file beside results.jsonl just before the report reads it
        path = Path(run) / EXPECTED_FILE
        if isinstance(expected, dict):
            write_expected(run, expected, {})
        elif expected is not None:
            path.write_text(expected)
        return real(run, *a, **k)

    mp = pytest.MonkeyPatch()
    mp.setattr(build, "read_rows", read_rows)
    try:
        path, rows = report_with_rows(tmp, _report_rows, "SYNTHETIC test data: expected acceptance", 4)
    finally:
        mp.undo()
    return path.read_text(), rows


REPORT_CELLS = {
    "offline-chat-eagle-k3-bs4-t1.0": _entry(1.45, 1.01, FAULT, t=1.0),
    "offline-chat-ngram-k3-bs1-t0.7": _entry(1.37, 1.36),
}


@pytest.fixture(scope="module")
def expected_report(tmp_path_factory):
    return _report(tmp_path_factory.mktemp("expected"), REPORT_CELLS)


def _cells_table(html: str) -> tuple[list[str], dict]:
    sec = section_html(html)
    head = sec.split("<b>Cells by temperature</b>", 1)[1].split("<tbody>", 1)[0]
    headers = [re.sub("<[^>]+>", "", h) for h in re.findall(r"<th[^>]*>(.*?)</th>", head)]
    got = {(r[0], int(r[2]), r[3], r[4]): r for r in table_rows(sec, "<b>Cells by temperature</b>")}
    return headers, got


def test_report_shows_expected_beside_measured_and_the_fault(expected_report):
    html, _ = expected_report
    headers, got = _cells_table(html)
    i = headers.index("expected acc")
    assert headers[i - 1] == "mean acc"
    assert got[("offline-chat", 1, "T = 0.7", "ngram@k3")][i] == "1.37"
    assert got[("offline-chat", 1, "T = 1", "ngram@k3")][i] == "-"  # not in the file
    flagged = got[("offline-chat", 4, "T = 1", "eagle@k3")]
    assert flagged[i] == "1.45" and flagged[headers.index("flag")] == f"ENGINE FAULT: {FAULT}"
    assert "2 cell(s) flagged" in section_html(html)  # the distribution check's and the file's
    assert "crosscheck RUN --expected" in section_html(html)


@pytest.mark.parametrize("expected", [None, "{torn"])
def test_report_without_or_with_a_corrupt_file(tmp_path, capsys, expected):
    html, _ = _report(tmp_path, expected)
    headers, got = _cells_table(html)
    assert "expected acc" not in headers
    assert "1 cell(s) flagged" in section_html(html)  # the distribution check's only
    assert not got[("offline-chat", 4, "T = 1", "eagle@k3")][headers.index("flag")].startswith("ENGINE")
    err = [ln for ln in capsys.readouterr().err.splitlines() if EXPECTED_FILE in ln]
    assert len(err) == (0 if expected is None else 1)


def test_expected_column_fits_a_1300_pixel_window(expected_report, tmp_path):
    from test_report_render import CHROMIUM, width_check

    if not Path(CHROMIUM).exists():
        pytest.skip("chromium not installed: cannot render the report")
    html, _ = expected_report
    page = tmp_path / "report.html"
    page.write_text(html)
    width, _, bad = width_check(tmp_path, page, 1300)
    assert width < 1300 and bad == "", f"overflowing at 1,300 px: {bad}"
