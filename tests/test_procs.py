"""speclab.procs.kill_group: the escalating stop of a child's process group."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from speclab.procs import kill_group


def _child(setup: str, then: str = "") -> subprocess.Popen[bytes]:
    """A Python child in its own process group: runs `setup`, says ready, runs `then`, sleeps."""
    code = (
        f"import signal, subprocess, sys, time\n{setup}\nprint('ready', flush=True)\n{then}\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"  # its handlers are installed
    return proc


def test_a_child_that_stops_on_the_first_signal_gets_only_that_one():
    proc = _child("signal.signal(signal.SIGINT, lambda *a: sys.exit(7))")
    t0 = time.monotonic()
    kill_group(proc, ((signal.SIGINT, 10.0), (signal.SIGKILL, 10.0)))
    assert proc.returncode == 7  # exited by its own handler, not killed
    assert time.monotonic() - t0 < 5.0


def test_a_child_that_ignores_the_polite_signal_is_killed_after_its_grace():
    proc = _child("signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    t0 = time.monotonic()
    kill_group(proc, ((signal.SIGTERM, 0.5), (signal.SIGKILL, 5.0)))
    assert proc.returncode == -signal.SIGKILL
    assert time.monotonic() - t0 >= 0.5


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie has stopped running; its reaper may be slow


def test_sweep_kills_a_group_member_that_outlives_the_leader():
    # the leader exits on SIGTERM; its child (same group) ignores SIGTERM and would live on without the sweep
    proc = _child(
        "code = 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
        "time.sleep(60)'\n"
        "kid = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE)\n"
        "kid.stdout.readline()\n",
        then="print(kid.pid, flush=True)",
    )
    assert proc.stdout is not None
    kid = int(proc.stdout.readline())
    assert _alive(kid)
    kill_group(proc, ((signal.SIGTERM, 5.0),), sweep=True)
    assert proc.returncode == -signal.SIGTERM
    deadline = time.monotonic() + 5.0
    while _alive(kid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(kid)


def test_a_group_that_is_gone_is_not_an_error():
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    kill_group(proc, sweep=True)
    assert proc.returncode == 0
