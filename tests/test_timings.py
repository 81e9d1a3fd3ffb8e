"""The timings table: one writer, one reader (strict for the fit, lenient for a killed worker's file)."""

from pathlib import Path

import pytest

from speclab.bench.attempts import merge_timings
from speclab.errors import ConfigError
from speclab.timings import COLUMNS, append_timings, read_timings


def test_append_then_read_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "sub" / "t.csv"
    append_timings(p, [("target", 10, 4, 0, 1, 0.5)])
    append_timings(p, [("draft:custom:Foo", 10, 1, 3, 1, 0.01), ("overhead", 10, 4, 0, 1, 0.002)])
    text = p.read_text()
    assert text.count(",".join(COLUMNS)) == 1  # header once, written when the file was new
    rows = read_timings(p)
    assert [r.kind for r in rows] == ["target", "draft:custom:Foo", "overhead"]
    assert rows[1].values == (10.0, 1.0, 3.0, 1.0, 0.01)
    assert rows[1].fields == ("draft:custom:Foo", "10", "1", "3", "1", "0.01")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("bogus,1,1,0,1,0.1", "field kind"),
        ("target,1,x,0,1,0.1", "field batched_tokens: not a number"),
        ("target,1,1,0,1,-0.1", r"finite number in 0\.\.1e\+12"),
        ("target,1,1,0,1,nan", r"finite number in 0\.\.1e\+12"),
        ("target,1,1,0,1,2e12", r"finite number in 0\.\.1e\+12"),
        ("target,1,1,0", "4 fields, the header has 6"),
    ],
)
def test_strict_names_the_bad_line(tmp_path: Path, line: str, message: str) -> None:
    p = tmp_path / "t.csv"
    p.write_text(",".join(COLUMNS) + "\ntarget,1,1,0,1,0.1\n" + line + "\n")
    with pytest.raises(ConfigError, match=f"line 3: .*{message}"):
        read_timings(p)
    assert [r.values for r in read_timings(p, strict=False)] == [(1.0, 1.0, 0.0, 1.0, 0.1)]


def test_missing_column_and_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("kind,seconds\ntarget,0.1\n")
    with pytest.raises(ConfigError, match="missing column"):
        read_timings(p)
    assert read_timings(p, strict=False) == []
    with pytest.raises(ConfigError, match="cannot read timings CSV"):
        read_timings(tmp_path / "nope.csv")


def test_merge_keeps_good_rows_of_every_attempt_and_drops_a_torn_line(tmp_path: Path) -> None:
    a1 = tmp_path / "engines" / "e1" / "attempt-1"
    a2 = tmp_path / "engines" / "e2" / "attempt-1"
    append_timings(a1 / "timings.csv", [("target", 1, 1, 0, 1, 0.25)])
    append_timings(a2 / "timings.csv", [("overhead", 2, 2, 0, 1, 0.5)])
    with open(a2 / "timings.csv", "a") as f:
        f.write("target,3,3,0,1,0.")  # a worker killed mid-line
    merge_timings(tmp_path)
    # the merged file has the temperature column; empty where the attempt cannot say (no cells.jsonl)
    assert (tmp_path / "timings.csv").read_text() == (
        ",".join(COLUMNS) + ",temperature\ntarget,1,1,0,1,0.25,\noverhead,2,2,0,1,0.5,\n"
    )
    assert [r.kind for r in read_timings(tmp_path / "timings.csv")] == ["target", "overhead"]
