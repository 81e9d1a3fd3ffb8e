"""Launch the engine worker in its own subprocess with the environment vLLM needs on this machine.

A crash, OOM kill or hang of the worker is then a failed cell for the sweep runner, not a dead sweep.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from speclab.models.prepare import cache_root


def venv_libiomp() -> Path | None:
    """Intel OpenMP shipped in the venv (vLLM warns that SD on CPU without it is much slower)."""
    for base in {Path(sys.prefix), Path(sys.executable).resolve().parent.parent}:
        p = base / "lib" / "libiomp5.so"
        if p.is_file():
            return p
    return None


def compile_cache_dir() -> Path:
    """A reusable torch.compile / vLLM cache shared by all workers (VLLM_CACHE_ROOT)."""
    return cache_root() / "vllm"


def worker_env(kv_cache_gib: float | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a worker process: in-process engine, Intel OpenMP preloaded, KV cache size,
    a persistent compile cache. Existing LD_PRELOAD entries are kept."""
    env = dict(os.environ if base is None else base)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env.setdefault("VLLM_CACHE_ROOT", str(compile_cache_dir()))
    if kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{kv_cache_gib:g}"
    iomp = venv_libiomp()
    if iomp is not None:
        pre = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
        if str(iomp) not in pre:
            env["LD_PRELOAD"] = ":".join([str(iomp), *pre])
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def launch_worker(
    job_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    kv_cache_gib: float | None = None,
    log: IO[Any] | int | None = None,
    env: dict[str, str] | None = None,
    python: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start `python -m speclab.engine.worker --job JOB --out OUT` in a new process (session) and return it.

    `log`: where the worker's stdout/stderr go (a file object, subprocess.DEVNULL, or None to inherit).
    The caller waits on the Popen (with its own timeout); results are in OUT as they complete.
    If kv_cache_gib is None it is read from the job file.
    """
    if kv_cache_gib is None:
        try:
            import json

            kv_cache_gib = float(json.loads(Path(job_path).read_text())["engine"].get("kv_cache_gib", 2.0))
        except (OSError, ValueError, KeyError, TypeError):
            kv_cache_gib = None
    cmd = [
        python or sys.executable,
        "-m",
        "speclab.engine.worker",
        "--job",
        str(job_path),
        "--out",
        str(out_path),
    ]
    return subprocess.Popen(
        cmd,
        env=worker_env(kv_cache_gib, env),
        stdout=log,
        stderr=subprocess.STDOUT if log is not None else None,
        start_new_session=True,  # so the runner can kill the worker's whole process group on timeout
    )
