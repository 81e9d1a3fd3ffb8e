"""Atomic file writes: a reader never sees half a file, and a killed run leaves no partial output. And the one
exclusive file lock that writers of shared caches and stores hold."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive_lock(lock_file: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive flock on `lock_file` (created, with its parents, if missing), waiting for any other
    holder; released when the block ends or the process dies. OSError if the file cannot be created."""
    lock_file = Path(lock_file)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def replace_dir(built: Path, out: Path) -> None:
    """Put a finished directory `built` (beside `out`) in place of `out`: an existing `out` (stale or corrupt)
    is moved aside first, then removed, so readers see the old directory or the new one."""
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(built, out)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `target`; on success it is renamed onto `target`, else removed.
    A symlinked `target` is written through to the file it points to (the link stays)."""
    target = Path(target)
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    if target.exists() and not target.is_file() and not target.is_dir():
        # a device or pipe (--out /dev/null, /dev/stdout): write through; renaming a file onto it would
        # replace the device node itself (as root), and there is nothing to make atomic
        yield target
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    # mkstemp creates 0600; give the final file the usual permissions (0666 minus the umask).
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def atomic_write_text(target: str | os.PathLike[str], text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)


def atomic_write_bytes(target: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
