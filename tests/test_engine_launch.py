"""Worker launching and following (speclab.engine.launch) and the worker's step loop, without vLLM."""

import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from speclab.engine import worker
from speclab.engine.instrument import StepProfiler
from speclab.engine.launch import ResultTail, describe_exit, launch_worker, log_tail, stop_worker
from speclab.engine.protocol import CellResult


def test_describe_exit() -> None:
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(137) == "exited with 137 (killed: out of memory?)"
    assert describe_exit(-signal.SIGKILL) == "died with SIGKILL (killed: out of memory?)"
    assert describe_exit(-signal.SIGSEGV) == "died with SIGSEGV"


def test_log_tail_prefers_the_last_error(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text("starting\nRuntimeError: boom\nshutting down\n\n")
    assert log_tail(log) == "RuntimeError: boom"
    log.write_text("a\nlast line\n")
    assert log_tail(log) == "last line"
    assert log_tail(tmp_path / "missing.log") == ""


def test_result_tail_reads_only_complete_new_lines(tmp_path: Path) -> None:
    p = tmp_path / "cells.jsonl"
    tail = ResultTail(p)
    assert tail.read() == []  # not written yet
    one = CellResult(cell_id="a", status="ok", output_tokens=3).to_json_line()
    two = CellResult(cell_id="b", status="failed", error="x").to_json_line()
    p.write_text(one + "\nnot json\n" + two[:10])  # the second result is still being written
    assert [r.cell_id for r in tail.read()] == ["a"]
    assert tail.read() == []
    with open(p, "a") as f:
        f.write(two[10:] + "\n")
    got = tail.read()
    assert [(r.cell_id, r.status, r.error) for r in got] == [("b", "failed", "x")]


def test_launch_worker_uses_the_override_and_stop_ends_it(tmp_path: Path, monkeypatch) -> None:
    script = tmp_path / "fake.py"
    script.write_text(
        "import sys, time\nout = sys.argv[sys.argv.index('--out') + 1]\n"
        "open(out, 'w').write('started\\n')\ntime.sleep(60)\n"
    )
    monkeypatch.setenv("SPECLAB_WORKER_CMD", f"{sys.executable} {script}")
    out = tmp_path / "cells.jsonl"
    proc = launch_worker(tmp_path / "job.json", out, kv_cache_gib=1.0, log=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if out.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert out.read_text() == "started\n"
        assert proc.poll() is None  # still running until stopped
    finally:
        stop_worker(proc)
    assert proc.returncode == -signal.SIGTERM


class _FakeEngine:
    """Steps that give no output at all (`stuck`), or one token per step until each request finishes."""

    def __init__(self, stuck: bool, tokens: int = 3) -> None:
        self.stuck, self.tokens = stuck, tokens
        self.reqs: dict[str, int] = {}

    def add_request(self, rid: str, prompt: dict, params: object) -> str:
        self.reqs[rid] = 0
        return rid

    def step(self) -> list:
        if self.stuck:
            return []
        outs = []
        for rid in list(self.reqs):
            self.reqs[rid] += 1
            outs.append(SimpleNamespace(request_id=rid, finished=self.reqs[rid] >= self.tokens))
            if outs[-1].finished:
                del self.reqs[rid]
        return outs

    def abort_request(self, ids: list[str]) -> None:
        for rid in ids:
            self.reqs.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.reqs)


def _engine(fake: _FakeEngine) -> worker.Engine:
    eng = worker.Engine.__new__(worker.Engine)  # no vLLM: only what drive() uses
    eng.engine = fake
    eng.profiler = StepProfiler(method="none")
    eng._req_counter = 0
    eng._SamplingParams = lambda **kw: kw
    return eng


def test_drive_runs_long_requests_and_stops_an_engine_that_makes_no_progress(monkeypatch) -> None:
    monkeypatch.setattr(worker, "MAX_IDLE_STEPS", 50)
    # more steps in all than the idle limit is fine as long as tokens keep coming
    eng = _engine(_FakeEngine(stuck=False, tokens=40))
    done, steps = eng.drive([("a", [1], eng._params(40)), ("b", [2], eng._params(40))], 1)
    assert set(done) == {"a", "b"} and steps == 80
    with pytest.raises(RuntimeError, match="no progress in 51 steps"):
        eng = _engine(_FakeEngine(stuck=True))
        eng.drive([("a", [1], eng._params(8))], 1)
