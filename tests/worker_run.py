"""Running one speclab worker (one real vLLM engine) from an engine test: shared by the `engine`-marked tests
that drive the worker directly (tests/ is on sys.path)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any


def run_worker_job(d: Path, job: Any, timeout: float = 900) -> str:
    """Write `job` (speclab.engine.protocol.Job) to D/job.json, run a worker on it with results in
    D/cells.jsonl and its log in D/worker.log (killed after `timeout` seconds), assert it exited 0; returns the log."""
    from speclab.engine.launch import launch_worker
    from speclab.engine.protocol import write_job

    write_job(job, d / "job.json")
    with open(d / "worker.log", "w") as log:
        proc = launch_worker(d / "job.json", d / "cells.jsonl", log=log)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    text = (d / "worker.log").read_text()
    assert rc == 0, text[-3000:]
    return text
