"""Opening an input once: files, pipes, FIFOs and /dev/stdin alike.

A stream can be read only once, so an input is opened once and its kind is told from a buffered peek (a
gzip header) instead of opening it a second time. A FIFO is opened without blocking and waited on for at most
SPECLAB_PIPE_TIMEOUT seconds (default 60) for its writer: a FIFO nobody writes to is one clear error, not a
command that hangs forever.
"""

from __future__ import annotations

import gzip
import io
import os
import select
import stat
from typing import IO

from speclab.errors import SpeclabError
from speclab.outputs import check_no_loop

PIPE_TIMEOUT_ENV = "SPECLAB_PIPE_TIMEOUT"
DEFAULT_PIPE_TIMEOUT_S = 60.0
GZIP_MAGIC = b"\x1f\x8b"


def pipe_timeout_s() -> float:
    raw = os.environ.get(PIPE_TIMEOUT_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_PIPE_TIMEOUT_S
    except ValueError:
        raise SpeclabError(f"{PIPE_TIMEOUT_ENV}={raw!r}: expected a number of seconds") from None
    if not 0 < value <= 1e6:
        raise SpeclabError(f"{PIPE_TIMEOUT_ENV}={raw!r}: expected seconds in (0, 1e6]")
    return value


def _open_fifo(path: str, error: type[SpeclabError]) -> io.BufferedReader:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP)
        timeout = pipe_timeout_s()
        if not poller.poll(int(timeout * 1000)):
            raise error(
                f"{path}: a pipe with no writer after {timeout:g} s (start the writer first, or set "
                f"{PIPE_TIMEOUT_ENV})"
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb")  # noqa: SIM115 (the caller closes it)


def open_binary(path: str | os.PathLike[str], error: type[SpeclabError] = SpeclabError) -> io.BufferedReader:
    """`path` opened once for reading bytes, buffered (so it can be peeked). A symlink loop is named as
    such; OSError (missing, unreadable) is left to the caller."""
    path = os.fspath(path)
    check_no_loop(path)
    if stat.S_ISFIFO(os.stat(path).st_mode):
        return _open_fifo(path, error)
    return open(path, "rb")  # noqa: SIM115 (the caller closes it)


def open_maybe_gzip(path: str | os.PathLike[str], error: type[SpeclabError] = SpeclabError) -> IO[bytes]:
    """open_binary, decompressed when the first bytes are a gzip header (told from a peek, not a reopen)."""
    fh = open_binary(path, error)
    if fh.peek(2)[:2] == GZIP_MAGIC:
        return _GzipOwning(fh)
    return fh


class _GzipOwning(gzip.GzipFile):
    """A GzipFile that closes the stream it reads."""

    def __init__(self, raw: io.BufferedReader) -> None:
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()
