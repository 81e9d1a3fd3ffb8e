"""Rows of a dataset: from a local file/directory in the dataset's own schema, or from the Hugging Face hub.

Each row comes with a location string ("FILE line N" for JSON Lines, "FILE row N" otherwise, N counted from
0 for rows and from 1 for lines) so a malformed row can be named in one clear error line.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from speclab.inputs import open_maybe_gzip
from speclab.validation import loads_json
from speclab.workloads.base import WorkloadError

SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".arrow")
Row = tuple[str, Any]  # (location, row); row should be a dict, checked by the caller


def _json_rows(path: Path, data: Any, split: str | None) -> Iterator[Row]:
    if isinstance(data, dict):
        for key in (split, "data", "rows", "train", "test", "validation"):
            if key and isinstance(data.get(key), list):
                data = data[key]
                break
        else:
            cols = {k: v for k, v in data.items() if isinstance(v, list)}
            lens = {len(v) for v in cols.values()}
            if cols and len(cols) == len(data) and len(lens) == 1:  # a dict of columns
                n = lens.pop()
                data = [{k: cols[k][i] for k in cols} for i in range(n)]
            else:
                raise WorkloadError(f"{path}: expected a JSON list of rows (objects), got an object")
    if not isinstance(data, list):
        raise WorkloadError(f"{path}: expected a JSON list of rows (objects), got {type(data).__name__}")
    for i, row in enumerate(data):
        yield f"{path} row {i}", row


def jsonl_rows(path: Path, skipped: list[str] | None = None) -> Iterator[Row]:
    """The rows of a JSON Lines file (blank lines skipped); a line that is not JSON fails naming it, or,
    when `skipped` is a list, is left out and its error appended there. A gzip-compressed file is read as is.
    The input is opened once (a pipe, a FIFO or /dev/stdin is read from its first byte)."""
    with open_maybe_gzip(path, WorkloadError) as f:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
                if not line.strip():
                    continue
                row = loads_json(line, f"{path} line {n}", WorkloadError)
            except UnicodeDecodeError:
                err = WorkloadError(f"{path} line {n}: not UTF-8 text")
            except WorkloadError as exc:
                err = exc
            else:
                yield f"{path} line {n}", row
                continue
            if skipped is None:
                raise err
            skipped.append(str(err))


def _read_file(path: Path, split: str | None) -> Iterator[Row]:
    suffix = path.suffix.lower()
    try:
        if suffix == ".jsonl":
            yield from jsonl_rows(path)
        elif suffix == ".json":
            with open_maybe_gzip(path, WorkloadError) as f:
                raw = f.read()
            try:
                text = raw.decode("utf-8-sig")  # a byte-order mark is accepted, as in .jsonl
            except UnicodeDecodeError as exc:
                raise WorkloadError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
            yield from _json_rows(path, loads_json(text, str(path), WorkloadError), split)
        elif suffix in (".parquet", ".csv", ".arrow"):
            for i, row in enumerate(_arrow_table(path).to_pylist()):
                yield f"{path} row {i}", row
        else:
            raise WorkloadError(f"{path}: unsupported file type (use one of {', '.join(SUFFIXES)})")
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read ({exc})") from exc


def _arrow_table(path: Path) -> Any:
    import pyarrow as pa

    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path)
        if path.suffix.lower() == ".csv":
            import pyarrow.csv as pacsv

            return pacsv.read_csv(path)
        try:  # datasets' cache files are Arrow IPC streams
            with pa.memory_map(str(path)) as src:
                return pa.ipc.open_stream(src).read_all()
        except pa.ArrowInvalid:
            with pa.memory_map(str(path)) as src:
                return pa.ipc.open_file(src).read_all()
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise WorkloadError(f"{path}: cannot read as {path.suffix[1:]} ({exc})") from exc


def _pick_files(root: Path, config: str | None, split: str | None) -> list[Path]:
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
    files = [p for p in files if not any(part.startswith(".") for part in p.relative_to(root).parts)]
    if config:
        narrowed = [p for p in files if config in p.relative_to(root).parts[:-1]]
        files = narrowed or files
    if split:

        def is_split(p: Path) -> bool:
            stem = p.name.split(".")[0]
            parts = p.relative_to(root).parts[:-1]
            return stem == split or stem.startswith((f"{split}-", f"{split}_")) or split in parts

        narrowed = [p for p in files if is_split(p)]
        files = narrowed or files
    return files


def read_local(
    source: str | os.PathLike[str], config: str | None = None, split: str | None = None
) -> list[Row]:
    """All rows of a local dataset: one file (.jsonl/.json/.parquet/.csv/.arrow), a directory written by
    `datasets`' save_to_disk, or a directory of such files (a hub snapshot: files under a folder named like
    the config, and named like the split, are preferred when present)."""
    root = Path(source)
    if not root.exists():
        raise WorkloadError(f"source {root} does not exist")
    if root.is_file():
        return list(_read_file(root, split))
    if (root / "dataset_dict.json").exists() or (root / "state.json").exists():
        return _load_from_disk(root, split)
    files = _pick_files(root, config, split)
    if not files:
        raise WorkloadError(f"source {root}: no {'/'.join(SUFFIXES)} files in it")
    rows: list[Row] = []
    for f in files:
        rows.extend(_read_file(f, split))
    return rows


def _load_from_disk(root: Path, split: str | None) -> list[Row]:
    try:
        import datasets
    except ImportError as exc:
        raise WorkloadError(
            f"{root} was written by `datasets` save_to_disk; reading it needs `datasets`"
        ) from exc
    ds = datasets.load_from_disk(str(root))
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise WorkloadError(f"{root}: no split {split!r} (has {', '.join(ds)})")
        ds = ds[split]
    return [(f"{root} row {i}", row) for i, row in enumerate(ds)]


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP probe of the hub, so an offline machine fails in seconds rather than after retries."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # behind a proxy a direct probe says nothing; let `datasets` try
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _offline_flag() -> bool:
    return any(
        os.environ.get(v, "").lower() in ("1", "true", "yes")
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def read_hub(
    name: str,
    hf_id: str,
    config: str | None,
    split: str,
    data_files: str | None = None,
    notes: str = "",
) -> list[Row]:
    """Rows from the hub through `datasets` (its local cache is used when the hub is unreachable).

    Fails with one line that points to --source when neither the hub nor the cache has the dataset.
    """
    what = f"{hf_id}" + (f" ({config})" if config else "") + f" split {split}"
    hint = (
        f"download it where the hub is reachable and pass the file or directory with --source "
        f"(speclab workloads show {name} --source PATH)"
    )
    try:
        import datasets
    except ImportError as exc:
        raise WorkloadError(f"{name}: loading {what} needs the `datasets` package; or {hint}") from exc
    offline = _offline_flag() or not _hub_reachable()
    saved: dict[str, Any] = {}
    if offline:
        # Go straight to the local cache instead of retrying an unreachable hub for half a minute.
        import huggingface_hub.constants as hconst

        saved = {
            "ds": datasets.config.HF_DATASETS_OFFLINE,
            "dshub": getattr(datasets.config, "HF_HUB_OFFLINE", None),
            "hub": hconst.HF_HUB_OFFLINE,
        }
        datasets.config.HF_DATASETS_OFFLINE = True
        datasets.config.HF_HUB_OFFLINE = True
        hconst.HF_HUB_OFFLINE = True
    try:
        kwargs: dict[str, Any] = {"split": split}
        if data_files:
            kwargs["data_files"] = data_files
        ds = datasets.load_dataset(hf_id, config, **kwargs)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        where = (
            "the hub is unreachable from this machine and it is not in the local cache" if offline else reason
        )
        extra = f" ({notes})" if notes else ""
        raise WorkloadError(f"{name}: cannot load {what}: {where}{extra}. Or {hint}") from exc
    finally:
        if saved:
            import huggingface_hub.constants as hconst

            datasets.config.HF_DATASETS_OFFLINE = saved["ds"]
            datasets.config.HF_HUB_OFFLINE = saved["dshub"]
            hconst.HF_HUB_OFFLINE = saved["hub"]
    return [(f"{hf_id} {split} row {i}", row) for i, row in enumerate(ds)]
