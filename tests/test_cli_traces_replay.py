"""`speclab traces replay` and `speclab traces crosscheck`: replay tracing beside the trace stores, the same
commands as `speclab trace` and `speclab trace crosscheck` (which stay)."""

from __future__ import annotations

from pathlib import Path

import pytest

from speclab.cli import main
from speclab.errors import SpeclabError


def run(args: list[str]) -> int:
    """speclab's exit status for `args`."""
    try:
        return int(main(args) or 0)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.fixture
def seen(monkeypatch):
    """Stop crosscheck where it reads the run, keeping what it was given."""
    import speclab.replay.replay as replay

    got: dict = {}

    def load_records(run):
        got["run"] = run
        raise SpeclabError("stopped here")

    monkeypatch.setattr(replay, "load_records", load_records)
    return got


def test_traces_crosscheck_is_trace_crosscheck_with_the_replay_options(tmp_path: Path, seen, capsys):
    assert run(["traces", "crosscheck", str(tmp_path), "--ngram-min", "2", "--show", "3"]) == 2
    assert seen["run"] == str(tmp_path)
    assert capsys.readouterr().err.strip() == "speclab: error: stopped here"
    seen.clear()
    assert run(["trace", "--ngram-min", "2", "crosscheck", str(tmp_path), "--show", "3"]) == 2  # the alias
    assert seen["run"] == str(tmp_path)


def test_traces_crosscheck_passes_the_replay_options_to_the_replay(tmp_path: Path, monkeypatch):
    import speclab.replay.replay as replay
    import speclab.replay.runs as runs

    opts: dict = {}
    monkeypatch.setattr(replay, "load_records", lambda run: [])

    def make_run_replay_fn(run, o):
        opts.update(o)
        raise SpeclabError("stopped here")

    monkeypatch.setattr(runs, "make_run_replay_fn", make_run_replay_fn)
    args = ["traces", "crosscheck", "--ngram-min", "2", "--out", str(tmp_path / "x.json"), str(tmp_path)]
    assert run(args) == 2
    assert opts["ngram_min"] == 2


def test_traces_replay_is_the_replay_command(tmp_path: Path, capsys):
    # the same checks as `speclab trace`: exactly one source
    assert run(["traces", "replay", "--out", str(tmp_path / "t.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("speclab: error:") and "exactly one of --from" in err
    assert run(["traces", "--help"]) == 0
    out = capsys.readouterr().out
    assert "replay" in out and "crosscheck" in out and "import" in out
