"""The one rule for every path a command writes, checked before any work starts.

- an output is never one of the command's inputs: not the same file (symlinks and hard links resolved), not
  a directory holding an input;
- an existing file is replaced only with --force; a directory where a file is wanted is refused;
- a directory is replaced only when it is a speclab store (`is_store_dir`), never a directory holding
  anything else (hidden entries count), with or without --force;
- a symlink loop is named as such, not as a missing file;
- the place must be writable and have some free space: probed now, naming the path the user gave, so a long
  run does not fail at its end on a hidden temporary file.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from speclab.errors import ConfigError

# below this much free space a write is refused up front (a trace store or a report needs more than this)
MIN_FREE_BYTES = 1 << 20


def check_no_loop(path: str | os.PathLike[str], what: str = "") -> None:
    """ConfigError when `path` is a symlink loop (otherwise it reads as a missing file)."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{what}{path}: symlink loop (too many levels of symbolic links)") from None


def resolved(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.realpath(os.path.expanduser(path)))


def _under(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def conflicting_input(out: str | os.PathLike[str], inputs: Iterable[object]) -> str | None:
    """The first input that `out` would overwrite: the same file (symlinks and hard links resolved) or a
    directory holding it. Inputs that are not paths on disk (preset names) are ignored."""
    real_out = resolved(out)
    for inp in inputs:
        if inp is None or not isinstance(inp, str | os.PathLike):
            continue
        if not os.path.lexists(inp):
            continue
        with_real = resolved(inp)
        try:
            if os.path.exists(out) and os.path.samefile(out, inp):
                return str(inp)
        except OSError:
            pass
        if _under(with_real, real_out):
            return str(inp)
    return None


def _nearest_dir(p: Path) -> Path:
    p = p.parent
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_writable(
    target: str | os.PathLike[str], shown: str, noun: str = "the output", min_free: int = MIN_FREE_BYTES
) -> None:
    """Probe that a file can be created beside `target` (its nearest existing parent) and that the file
    system has `min_free` bytes free. Errors name `shown` (the path the user gave)."""
    real = resolved(target)
    base = _nearest_dir(real)
    if not base.is_dir():
        raise ConfigError(f"{shown}: cannot write {noun} here ({base} is a file, not a directory)")
    try:
        fd, probe = tempfile.mkstemp(prefix=".speclab-write-probe-", dir=base)
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot write {noun} here ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)
    try:
        free = shutil.disk_usage(base).free
    except OSError:
        return
    if free < min_free:
        raise ConfigError(f"{shown}: no space to write {noun} here ({free} bytes free on its file system)")


def output_file(
    out: str | os.PathLike[str],
    inputs: Iterable[object] = (),
    *,
    force: bool = False,
    what: str = "--out",
) -> Path:
    """Check a file output (see the module docstring); returns it as a Path. A device or pipe
    (/dev/null, /dev/stdout) is written through and needs no --force."""
    p = Path(out).expanduser()
    shown = f"{what} {out}" if what else str(out)
    check_no_loop(p, f"{what} " if what else "")
    if p.exists() and not (p.is_file() or p.is_dir()):
        return p  # a device or a pipe
    hit = conflicting_input(p, inputs)
    if hit is not None:
        raise ConfigError(f"{shown}: is (or holds) the input {hit}; refusing to overwrite an input")
    if p.is_dir():
        raise ConfigError(f"{shown}: is a directory; give a file name")
    if p.exists() and not force:
        raise ConfigError(f"{shown}: exists (use --force to replace it)")
    check_writable(p, shown)
    return p


def output_files(outs: dict[str, str | None], inputs: Iterable[object] = (), *, force: bool = False) -> None:
    """output_file for each of a command's file outputs (option -> path or None), and no two the same."""
    given = {opt: p for opt, p in outs.items() if p}
    seen: dict[Path, str] = {}
    for opt, p in given.items():
        output_file(p, inputs, force=force, what=opt)
        other = seen.setdefault(resolved(p), opt)
        if other != opt:
            raise ConfigError(f"{other} and {opt} name the same file {p}")


def describe_entries(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(sorted(names)[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def output_dir(
    out: str | os.PathLike[str],
    inputs: Iterable[object] = (),
    *,
    force: bool = False,
    owned: Iterable[str] = (),
    what: str = "--out",
) -> Path:
    """Check a directory output whose files the command writes (a report): not an input, not inside one;
    an existing non-empty directory is written into only with --force, and only when every entry is one
    of `owned` (glob patterns of what the command itself writes), so nothing else is ever overwritten."""
    p = Path(out).expanduser()
    shown = f"{what} {out}" if what else str(out)
    check_no_loop(p, f"{what} " if what else "")
    hit = conflicting_input(p, inputs)
    if hit is not None:
        raise ConfigError(f"{shown}: is (or holds) the input {hit}; refusing to write over an input")
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{shown}: exists and is a file, not a directory")
    if p.is_dir():
        entries = [e.name for e in p.iterdir()]
        patterns = list(owned)
        foreign = [n for n in entries if not any(Path(n).match(g) for g in patterns)]
        if foreign:
            raise ConfigError(
                f"{shown}: holds other files ({describe_entries(foreign)}); refusing to write into it "
                "(choose a new or empty directory)"
            )
        if entries and not force:
            raise ConfigError(f"{shown}: holds an earlier output (use --force to replace it)")
    check_writable(p / "x", shown)
    return p
