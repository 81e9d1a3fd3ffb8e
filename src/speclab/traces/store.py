"""Columnar trace store (Apache Parquet via pyarrow).

A store is either one `.parquet` file or a directory of part files (`part-*.parquet`), so that a bench can
append each finished cell as its own part atomically and a killed run loses nothing it completed.

Writers are crash-safe and locked (see docs/dev/errors.md):
- one writer at a time: an flock on `.<store name>.lock` beside the store (so it survives a directory swap);
- append: a new part with a unique name (time + random, never derived from the part count), written to a
  hidden temporary file and renamed into place;
- replace (write_store onto an existing directory): the new store is written complete into a hidden sibling
  directory, then swapped with the old one in one atomic rename (Linux renameat2 RENAME_EXCHANGE), then the
  old one is removed. A kill at any point leaves either the old store or the new one;
- stale temporaries of killed writers (hidden sibling directories, hidden part files) are removed by the next
  writer that holds the lock. Readers ignore hidden files.

One row per request. Per-method data is a list of structs, so records may carry different method sets:
  id, workload, category: string; prompt_len, output_len: int32;
  prompt_token_ids, output_token_ids: list<int32> (nullable);
  methods: list<struct<name: string, k_max: int32, acc_len: list<int32>, num_proposed: list<int32> (nullable),
  accept_prob: list<float32> (row-major output_len x k_max, nullable), accept_source: string (nullable)>>;
  meta: string (JSON, nullable).
Schema 1 stored acc_len/num_proposed as int16 (values above 32767 wrapped); such stores still read.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import io
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from speclab.atomic import atomic_path, exclusive_lock
from speclab.errors import TraceError
from speclab.inputs import open_binary
from speclab.outputs import check_no_loop, check_writable, conflicting_input, describe_entries
from speclab.traces.model import MethodTrace, RequestTrace, dumps_jsonl_line, json_lines, prob_rows

SCHEMA_VERSION = "2"

METHOD_TYPE = pa.struct(
    [
        ("name", pa.string()),
        # a method's own output where recorded (each method's arrays have their own length); absent in
        # stores written before it existed, read as null
        ("output_token_ids", pa.list_(pa.int32())),
        ("k_max", pa.int32()),
        ("acc_len", pa.list_(pa.int32())),
        ("num_proposed", pa.list_(pa.int32())),
        ("accept_prob", pa.list_(pa.float32())),  # sampled traces only; absent in older stores (null)
        ("accept_source", pa.string()),
    ]
)

SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("workload", pa.string()),
        ("category", pa.string()),
        ("prompt_len", pa.int32()),
        ("output_len", pa.int32()),
        ("prompt_token_ids", pa.list_(pa.int32())),
        ("output_token_ids", pa.list_(pa.int32())),
        ("methods", pa.list_(METHOD_TYPE)),
        ("meta", pa.string()),
    ],
    metadata={"speclab.trace_schema": SCHEMA_VERSION},
)


def records_to_table(records: Iterable[RequestTrace], validate: bool = True) -> pa.Table:
    cols: dict[str, list] = {name: [] for name in SCHEMA.names}
    for i, r in enumerate(records):
        if validate:
            r.validate(f"record {i}")
        cols["id"].append(r.id)
        cols["workload"].append(r.workload)
        cols["category"].append(r.category)
        cols["prompt_len"].append(int(r.prompt_len))
        cols["output_len"].append(int(r.output_len))
        cols["prompt_token_ids"].append(None if r.prompt_token_ids is None else r.prompt_token_ids)
        cols["output_token_ids"].append(None if r.output_token_ids is None else r.output_token_ids)
        cols["methods"].append(
            [
                {
                    "name": name,
                    "output_token_ids": m.output_token_ids,
                    "k_max": int(m.k_max),
                    "acc_len": m.acc_len.astype(np.int32),
                    "num_proposed": None if m.num_proposed is None else m.num_proposed.astype(np.int32),
                    "accept_prob": None if m.accept_prob is None else m.accept_prob.reshape(-1),
                    "accept_source": m.accept_source,
                }
                for name, m in r.methods.items()
            ]
        )
        cols["meta"].append(json.dumps(r.meta) if r.meta else None)
    return pa.Table.from_pydict(cols, schema=SCHEMA)


def table_to_records(table: pa.Table, source: str, validate: bool = True) -> list[RequestTrace]:
    missing = [n for n in SCHEMA.names if n not in table.column_names]
    if missing:
        raise TraceError(f"{source}: not a speclab trace table (missing columns: {', '.join(missing)})")
    out: list[RequestTrace] = []
    rows = table.to_pylist()
    for i, row in enumerate(rows):
        where = f"{source}: record {i}"
        methods = {}
        for m in row["methods"] or []:
            methods[m["name"]] = MethodTrace(
                output_token_ids=m.get("output_token_ids"),
                k_max=int(m["k_max"]),
                acc_len=np.asarray(m["acc_len"], dtype=np.int32),
                num_proposed=None if m["num_proposed"] is None else np.asarray(m["num_proposed"], np.int32),
                accept_prob=prob_rows(m.get("accept_prob"), m["k_max"]),
                accept_source=m.get("accept_source"),
            )
        rec = RequestTrace(
            id=row["id"],
            workload=row["workload"],
            category=row["category"],
            prompt_len=int(row["prompt_len"]),
            output_len=int(row["output_len"]),
            methods=methods,
            prompt_token_ids=row["prompt_token_ids"],
            output_token_ids=row["output_token_ids"],
            meta=json.loads(row["meta"]) if row["meta"] else {},
        )
        if validate:
            rec.validate(where)
        out.append(rec)
    return out


def _part_files(path: Path) -> list[Path]:
    return sorted(p for p in path.glob("part-*.parquet") if not p.name.startswith("."))


# temporaries a killed writer may leave: atomic_path's hidden part files, write_store's hidden directories
_TMP_PART_GLOB = ".part-*.tmp"
_STALE_TMP_PART_S = 120.0  # a bench writes its parts outside this lock: leave young ones alone


def _lock_path(path: Path) -> Path:
    return path.parent / f".{path.name}.lock"


@contextlib.contextmanager
def store_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the store's writer lock (blocking): concurrent writers run one after the other."""
    path = Path(path)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(exclusive_lock(_lock_path(path)))
        except OSError as exc:
            why = (
                "a parent is a file"
                if isinstance(exc, FileExistsError | NotADirectoryError)
                else exc.strerror
            )
            raise TraceError(f"{path}: cannot write the store here ({why})") from None
        yield


def _clean_stale(path: Path) -> None:
    """Remove temporaries of killed writers (call with the lock held). An old store moved aside by an
    interrupted fallback replace (no new store in place) is put back instead."""
    aside = sorted(path.parent.glob(f".{path.name}.old-*"), key=lambda p: p.stat().st_mtime)
    if aside and not path.exists():
        os.rename(aside.pop(), path)
    for d in [*path.parent.glob(f".{path.name}.new-*"), *aside]:
        shutil.rmtree(d, ignore_errors=True) if d.is_dir() else d.unlink(missing_ok=True)
    if path.is_dir():
        now = time.time()
        for f in path.glob(_TMP_PART_GLOB):
            with contextlib.suppress(OSError):
                if now - f.stat().st_mtime > _STALE_TMP_PART_S:
                    f.unlink()


def store_exists(path: str | os.PathLike[str]) -> bool:
    """A file, or a directory holding at least one part (leftovers of a killed writer do not count)."""
    path = Path(path)
    return path.is_file() or (path.is_dir() and bool(_part_files(path)))


def _foreign_entries(path: Path) -> list[str]:
    """What a store directory holds besides trace parts and writers' temporaries (hidden names count)."""
    parts = set(_part_files(path))
    return sorted(
        p.name
        for p in path.iterdir()
        if not (p in parts or (p.name.startswith(".part-") and p.suffix == ".tmp"))
    )


def _check_replaceable(path: Path) -> None:
    if path.suffix == ".parquet":
        if path.is_dir():
            raise TraceError(f"{path}: is a directory; a .parquet store is one file (use another name)")
        return
    if path.exists() and not path.is_dir():
        raise TraceError(
            f"{path}: exists and is a file, not a store directory (give a .parquet name, or remove it)"
        )
    if path.is_dir():
        other = _foreign_entries(path)
        if other:
            raise TraceError(
                f"{path}: holds files that are not trace parts ({describe_entries(other)}); "
                "refusing to replace it (choose another --out)"
            )


def _real(path: str | os.PathLike[str]) -> Path:
    """A symlinked store is written through to its target (the link stays a link)."""
    path = Path(path)
    check_no_loop(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def check_store_output(
    out: str | os.PathLike[str], inputs: Iterable[object], force: bool, append: bool = False
) -> None:
    """Before any work: `out` is no input, an existing store needs --force (or --append), a directory that is
    not a store is refused, the place is writable. (write_store checks again under the lock.)"""
    hit = conflicting_input(out, inputs)
    if hit is not None:
        raise TraceError(f"--out {out}: is (or holds) the input {hit}; refusing to overwrite an input")
    p = _real(out)
    if store_exists(p) and not (append or force):
        raise TraceError(f"{out}: store exists (use --append to add a part, --force to replace)")
    _check_replaceable(p)
    check_writable(p, f"--out {out}", "the store")


def _write_part(table: pa.Table, target: Path) -> None:
    with atomic_path(target) as tmp:
        pq.write_table(table, tmp)
        with open(tmp, "rb") as fh:  # on disk before it becomes visible
            os.fsync(fh.fileno())


def _part_name(tag: str = "") -> str:
    """Unique and in write order: nanosecond time, then random (never derived from the part count)."""
    safe_tag = "".join(c if c.isalnum() or c in "-_" else "_" for c in tag)[:80]
    return (
        f"part-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        + (f"-{safe_tag}" if safe_tag else "")
        + ".parquet"
    )


_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2). False where the system cannot."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def write_store(
    path: str | os.PathLike[str], records: Iterable[RequestTrace], *, replace: bool = True
) -> Path:
    """Write records as a new store (replacing an existing one). `path` ending in .parquet = one file;
    otherwise a directory with a single part. Crash-safe: a kill leaves the old store or the new one.
    replace=False (the caller found no store when it started, check_store_output): refuse (TraceError,
    nothing written) when a store is there once the lock is held: another writer created it meanwhile."""
    shown = Path(path)
    path = _real(path)
    table = records_to_table(records)  # validates before anything on disk changes
    with store_lock(path):
        _clean_stale(path)
        if not replace and store_exists(path):
            raise TraceError(
                f"{shown}: store exists (another writer created it while this command ran); nothing written "
                "(use --append to add a part, --force to replace)"
            )
        _check_replaceable(path)
        if path.suffix == ".parquet":
            _write_part(table, path)
            return path
        new = path.parent / f".{path.name}.new-{uuid.uuid4().hex[:8]}"
        new.mkdir()
        try:
            _write_part(table, new / _part_name())
            if not path.exists():
                os.rename(new, path)
            elif _exchange(new, path):
                shutil.rmtree(new)  # now the old store
            else:
                # no atomic swap here: move the old store aside first; a kill between the two renames
                # leaves it as .NAME.old-* beside the store (named in the "not found" error)
                old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
                os.rename(path, old)
                try:
                    os.rename(new, path)
                except BaseException:
                    os.rename(old, path)
                    raise
                shutil.rmtree(old)
        finally:
            if new.exists():
                shutil.rmtree(new, ignore_errors=True)
    return path


def append_to_store(
    path: str | os.PathLike[str],
    records: Iterable[RequestTrace],
    tag: str = "",
    refuse_existing_ids: bool = False,
) -> Path:
    """Append records to a directory store as a new part file, atomically and under the store's lock.
    refuse_existing_ids: raise TraceError (writing nothing) if a record id is already in the store.
    Returns the part path."""
    path = _real(path)
    if path.suffix == ".parquet":
        raise TraceError(f"{path}: cannot append to a single-file store; use a directory")
    records = list(records)
    table = records_to_table(records)
    with store_lock(path):
        _clean_stale(path)
        if path.exists() and not path.is_dir():
            raise TraceError(f"{path}: exists and is a file, not a store directory")
        if path.is_dir() and _foreign_entries(path):
            raise TraceError(
                f"{path}: holds files that are not trace parts ({describe_entries(_foreign_entries(path))}); "
                "refusing to add a part to it"
            )
        if refuse_existing_ids and store_exists(path):
            old = {r.id for r in read_store(path, validate=False)}
            dup = next((r.id for r in records if r.id in old), None)
            if dup is not None:
                raise TraceError(f"{path}: record id {dup!r} already in the store (import once, or --force)")
        path.mkdir(parents=True, exist_ok=True)
        target = path / _part_name(tag)
        _write_part(table, target)
    return target


def iter_store_files(path: str | os.PathLike[str]) -> Iterator[Path]:
    path = Path(path)
    check_no_loop(path)
    if not path.exists():
        aside = sorted(path.parent.glob(f".{path.name}.old-*")) if path.parent.is_dir() else []
        hint = f" (an interrupted replace left the old store at {aside[0]}: rename it back)" if aside else ""
        raise TraceError(f"{path}: trace store not found{hint}")
    if path.is_dir():
        parts = _part_files(path)
        if not parts:
            hint = (
                f" (a bench run directory? its store is {path / 'traces'})"
                if (path / "traces").is_dir()
                else ""
            )
            raise TraceError(f"{path}: trace store directory has no part-*.parquet files{hint}")
        yield from parts
    else:
        yield path


def read_store(path: str | os.PathLike[str], validate: bool = True) -> list[RequestTrace]:
    """Read every record of a store (file or directory). Readers take no lock: a part that vanishes while
    reading (a writer swapped the store in) makes the read start again on the new store. A .jsonl file is
    speclab's lossless JSON Lines (`trace --out X.jsonl`, `traces export`), read as such."""
    if Path(path).suffix == ".jsonl" and Path(path).is_file():
        return read_jsonl(path)
    for _ in range(4):
        try:
            return _read_parts(path, validate)
        except _PartVanished:
            continue
    raise TraceError(f"{path}: the store kept changing while being read; try again")


class _PartVanished(Exception):
    pass


def _read_parts(path: str | os.PathLike[str], validate: bool) -> list[RequestTrace]:
    records: list[RequestTrace] = []
    try:
        files = list(iter_store_files(path))
    except TraceError:
        if store_exists(path):  # listed the old directory while it was being removed
            raise _PartVanished from None
        raise
    for f in files:
        try:
            table = pq.read_table(f)
        except FileNotFoundError:
            raise _PartVanished from None
        except (pa.ArrowInvalid, OSError) as exc:
            if not f.exists():
                raise _PartVanished from None
            raise TraceError(f"{f}: cannot read as Parquet (truncated or not a trace file): {exc}") from None
        try:
            records.extend(table_to_records(table, str(f), validate=validate))
        except (TypeError, ValueError, KeyError, OverflowError, AttributeError) as exc:
            # right column names, wrong contents (nulls, strings, bad meta JSON): one line, not a traceback
            raise TraceError(f"{f}: not a valid speclab trace part ({type(exc).__name__}: {exc})") from None
    return records


def export_jsonl(records: Iterable[RequestTrace], out: str | os.PathLike[str]) -> None:
    with atomic_path(out) as tmp, open(tmp, "w") as fh:
        for r in records:
            fh.write(dumps_jsonl_line(r) + "\n")


def read_jsonl(path: str | os.PathLike[str]) -> list[RequestTrace]:
    """Read speclab's own lossless JSONL export."""
    path = Path(path)
    out = []
    try:  # opened once: a pipe or FIFO works, a FIFO without a writer times out
        fh = io.TextIOWrapper(open_binary(path, TraceError), encoding="utf-8-sig")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    with fh:
        try:
            for _, where, d in json_lines(fh, path):
                out.append(RequestTrace.from_json_dict(d, where))
        except UnicodeDecodeError as exc:
            raise TraceError(
                f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); binary file?"
            ) from None
    return out
