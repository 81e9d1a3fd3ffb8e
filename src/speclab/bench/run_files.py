"""JSON files a command keeps beside a run's rows (RUN/expected_acceptance.json, RUN/distribution_checks.json):
where they are, how they are written (whole, atomically, non-finite numbers as null) and read (a missing file
is None; an unreadable or wrongly shaped one is one warning line and None, never a crash)."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speclab.atomic import atomic_write_text


def run_file(run: str | Path, name: str) -> Path:
    """The file `name` of a run directory (or of the run whose results.jsonl `run` is)."""
    run = Path(run)
    return (run if run.is_dir() or run.suffix != ".jsonl" else run.parent) / name


def finite(v: Any) -> Any:
    """v with every non-finite float (in nested dicts and lists too) replaced by None."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [finite(x) for x in v]
    return v


def write_run_json(path: Path, fields: dict[str, Any], indent: int = 2) -> Path:
    """Replace `path` (atomically) with {"written_at": now, **fields}, non-finite numbers as null."""
    payload = {"written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **finite(fields)}
    atomic_write_text(path, json.dumps(payload, indent=indent, default=str) + "\n")
    return path


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def read_run_json(
    path: Path,
    key: str,
    entry_ok: Callable[[Any], bool],
    what: str,
    fallback: str,
    warn: Callable[[str], None] | None = None,
) -> dict[str, dict[str, Any]] | None:
    """The `key` object of the file ({id: entry}, every entry passing entry_ok); None where there is no file,
    or (after one warning line through `warn`, default stderr) where it cannot be read or is not a `what`
    file. fallback: what the warning says is shown instead, and how to rewrite the file."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        why = f"{type(exc).__name__}: {exc}"
    else:
        entries = data.get(key) if isinstance(data, dict) else None
        if isinstance(entries, dict) and all(entry_ok(e) for e in entries.values()):
            return entries
        why = f"not {what} file (no '{key}' object of {what} entries)"
    (warn or _stderr)(f"warning: {path}: cannot read ({why}); {fallback}")
    return None
