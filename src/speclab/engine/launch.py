"""Launch the engine worker in its own subprocess with the environment vLLM needs on this machine, follow
its output, stop it, and say in one line why it ended.

A crash, OOM kill or hang of the worker is then a failed cell for the sweep runner, not a dead sweep.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from speclab.engine.protocol import CellResult
from speclab.errors import ConfigError
from speclab.models.prepare import cache_root
from speclab.procs import kill_group


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


def kv_cache_env(kv_cache_gib: float) -> dict[str, str]:
    """VLLM_CPU_KVCACHE_SPACE for a whole number of GiB (vLLM's CPU build parses it with int()); nothing for a
    fractional size, which engine.worker.llm_kwargs passes as kv_cache_memory_bytes instead."""
    return {"VLLM_CPU_KVCACHE_SPACE": f"{int(kv_cache_gib)}"} if float(kv_cache_gib).is_integer() else {}


def worker_env(kv_cache_gib: float | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a worker process: in-process engine, Intel OpenMP preloaded, KV cache size,
    a persistent compile cache. Existing LD_PRELOAD entries are kept."""
    env = dict(os.environ if base is None else base)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env.setdefault("VLLM_CACHE_ROOT", str(compile_cache_dir()))
    if kv_cache_gib is not None:
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        env.update(kv_cache_env(kv_cache_gib))
    iomp = venv_libiomp()
    if iomp is not None:
        pre = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
        if str(iomp) not in pre:
            env["LD_PRELOAD"] = ":".join([str(iomp), *pre])
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def worker_command() -> list[str]:
    """The command that runs the engine worker (SPECLAB_WORKER_CMD overrides it, e.g. a fake worker in tests)."""
    override = os.environ.get("SPECLAB_WORKER_CMD")
    if override:
        return shlex.split(override)
    return [sys.executable, "-m", "speclab.engine.worker"]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    # Linux: the worker gets SIGKILL if its parent dies (even by SIGKILL), so no orphan keeps running.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def launch_worker(
    job_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    kv_cache_gib: float | None = None,
    log: IO[Any] | int | None = None,
    env: dict[str, str] | None = None,
    python: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start the worker (`worker_command()`, or `python -m speclab.engine.worker` for a given `python`) with
    `--job JOB --out OUT` in a new process session and return it.

    `log`: where the worker's stdout/stderr go (a file object, subprocess.DEVNULL, or None to inherit).
    The caller waits on the Popen (with its own timeout) and stops it with `stop_worker`; results are in OUT
    as they complete (`ResultTail` follows them). The worker dies with its parent.
    If kv_cache_gib is None it is read from the job file.
    """
    if kv_cache_gib is None:
        try:
            kv_cache_gib = float(json.loads(Path(job_path).read_text())["engine"].get("kv_cache_gib", 2.0))
        except (OSError, ValueError, KeyError, TypeError):
            kv_cache_gib = None
    base = [python, "-m", "speclab.engine.worker"] if python else worker_command()
    cmd = [*base, "--job", str(job_path), "--out", str(out_path)]
    return spawn_child(cmd, worker_env(kv_cache_gib, env), log)


def spawn_child(cmd: list[str], env: dict[str, str], log: IO[Any] | int | None) -> subprocess.Popen[bytes]:
    """Start a child process the way every speclab child runs (engine worker, vllm serve, the load generator):
    stdout and stderr to `log` (None: inherited), no stdin, dies with its parent. Its own session: Ctrl-C
    reaches only the caller, which then stops the child's whole process group cleanly (stop_worker)."""
    return subprocess.Popen(
        cmd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT if log is not None else None,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """Stop the worker and anything it started (its own session), politely first."""
    if proc.poll() is None:
        kill_group(proc)


def describe_exit(rc: int) -> str:
    """A worker's return code in words, for a one-line error."""
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        hint = " (killed: out of memory?)" if -rc == signal.SIGKILL else ""
        return f"died with {name}{hint}"
    if rc == 137:
        return "exited with 137 (killed: out of memory?)"
    return f"exited with code {rc}"


def log_tail(path: str | os.PathLike[str]) -> str:
    """The last meaningful line of a worker log, for a one-line error."""
    try:
        lines = [ln.strip() for ln in Path(path).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    for ln in reversed(lines):
        if "Error" in ln or "error" in ln or "Killed" in ln:
            return ln[:300]
    return lines[-1][:300] if lines else ""


class ResultTail:
    """Follows a running worker's CELLS.jsonl: each `read()` returns the results of the complete lines
    appended since the last one (a line still being written is left for later; a bad line is skipped)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.offset = 0

    def read(self) -> list[CellResult]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        out = []
        for line in data[: end + 1].decode("utf-8", "replace").splitlines():
            if not line.strip():
                continue
            try:
                out.append(CellResult.from_dict(json.loads(line), str(self.path)))
            except (json.JSONDecodeError, ConfigError):
                continue
        return out
