"""Columnar trace store (Apache Parquet via pyarrow).

A store is either one `.parquet` file or a directory of part files (`part-*.parquet`), so that a bench can
append each finished cell as its own part atomically and a killed run loses nothing it completed.

One row per request. Per-method data is a list of structs, so records may carry different method sets:
  id, workload, category: string; prompt_len, output_len: int32;
  prompt_token_ids, output_token_ids: list<int32> (nullable);
  methods: list<struct<name: string, k_max: int32, acc_len: list<int16>, num_proposed: list<int16> (nullable)>>;
  meta: string (JSON, nullable).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from speclab.atomic import atomic_path
from speclab.errors import TraceError
from speclab.traces.model import MethodTrace, RequestTrace, dumps_jsonl_line, json_lines

SCHEMA_VERSION = "1"

METHOD_TYPE = pa.struct(
    [
        ("name", pa.string()),
        # a method's own output where recorded (each method's arrays have their own length); absent in
        # stores written before it existed, read as null
        ("output_token_ids", pa.list_(pa.int32())),
        ("k_max", pa.int32()),
        ("acc_len", pa.list_(pa.int16())),
        ("num_proposed", pa.list_(pa.int16())),
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
                    "acc_len": m.acc_len.astype(np.int16),
                    "num_proposed": None if m.num_proposed is None else m.num_proposed.astype(np.int16),
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


def write_store(path: str | os.PathLike[str], records: Iterable[RequestTrace]) -> Path:
    """Write records as a new store (replacing an existing one). `path` ending in .parquet = one file;
    otherwise a directory with a single part."""
    path = Path(path)
    table = records_to_table(records)
    if path.suffix == ".parquet":
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp)
        return path
    path.mkdir(parents=True, exist_ok=True)
    for old in _part_files(path):
        old.unlink()
    target = path / "part-00000.parquet"
    with atomic_path(target) as tmp:
        pq.write_table(table, tmp)
    return path


def append_to_store(path: str | os.PathLike[str], records: Iterable[RequestTrace], tag: str = "") -> Path:
    """Append records to a directory store as a new part file, atomically. Returns the part path."""
    path = Path(path)
    if path.suffix == ".parquet":
        raise TraceError(f"{path}: cannot append to a single-file store; use a directory")
    path.mkdir(parents=True, exist_ok=True)
    table = records_to_table(records)
    n = len(_part_files(path))
    safe_tag = "".join(c if c.isalnum() or c in "-_" else "_" for c in tag)[:80]
    target = path / f"part-{n:05d}-{safe_tag or uuid.uuid4().hex[:8]}.parquet"
    with atomic_path(target) as tmp:
        pq.write_table(table, tmp)
    return target


def iter_store_files(path: str | os.PathLike[str]) -> Iterator[Path]:
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: trace store not found")
    if path.is_dir():
        parts = _part_files(path)
        if not parts:
            raise TraceError(f"{path}: trace store directory has no part-*.parquet files")
        yield from parts
    else:
        yield path


def read_store(path: str | os.PathLike[str], validate: bool = True) -> list[RequestTrace]:
    """Read every record of a store (file or directory)."""
    records: list[RequestTrace] = []
    for f in iter_store_files(path):
        try:
            table = pq.read_table(f)
        except (pa.ArrowInvalid, OSError) as exc:
            raise TraceError(f"{f}: cannot read as Parquet (truncated or not a trace file): {exc}") from None
        records.extend(table_to_records(table, str(f), validate=validate))
    return records


def export_jsonl(records: Iterable[RequestTrace], out: str | os.PathLike[str]) -> None:
    with atomic_path(out) as tmp, open(tmp, "w") as fh:
        for r in records:
            fh.write(dumps_jsonl_line(r) + "\n")


def read_jsonl(path: str | os.PathLike[str]) -> list[RequestTrace]:
    """Read speclab's own lossless JSONL export."""
    path = Path(path)
    out = []
    with open(path) as fh:
        for _, where, d in json_lines(fh, path):
            out.append(RequestTrace.from_json_dict(d, where))
    return out
