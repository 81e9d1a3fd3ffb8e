"""Stopping a child that runs in its own process group (an engine worker, `vllm serve`, a load generator):
the group gets each signal in turn, with a grace period for the leader to exit after each, so a child that
shuts down cleanly on the first signal is never killed, and one that hangs is killed in the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence

# SIGTERM, then SIGKILL: what an engine worker or a load generator gets
TERM_THEN_KILL: tuple[tuple[int, float], ...] = ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0))


def kill_group(
    proc: subprocess.Popen[bytes],
    steps: Sequence[tuple[int, float]] = TERM_THEN_KILL,
    sweep: bool = False,
) -> None:
    """Send each (signal, seconds) of `steps` to the process group led by `proc` and wait up to that long for
    the leader to exit; stop at the first signal it exits after. `sweep`: then SIGKILL the group once more, for
    members (e.g. an engine core) that outlive the leader. A group that is already gone is not an error."""
    for sig, wait in steps:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    if sweep:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
