"""RUN/expected_acceptance.json: the expected acceptance of a sampled run's SD cells, beside the engine's.

`speclab trace crosscheck RUN --expected` replays, for each sampled SD cell, the acceptance a correct
rejection sampler would give along the cell's own outputs and writes its per-cell result here (rewritten
whole on every such run). `speclab bench show` and `speclab report` merge it into the run's rows by cell id
(`merge_expected`): a row gains `expected_mean_acceptance_length` and, where the engine accepted far less
than expected, `engine_fault` (its text). results.jsonl itself is never changed.

File layout: {"written_at": time, "settings": the command's settings, "cells": {cell id: {
expected_mean_acc, measured_mean_acc, rel_error, engine_fault (text or null), method, temperature, steps,
...}}, "skipped_methods": {method: why it was not replayed}}. A missing file changes nothing; an unreadable one is one warning line, and the rows stay as they are.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speclab.atomic import atomic_write_text

EXPECTED_FILE = "expected_acceptance.json"
# each cell entry's fields (a cell may carry more)
CELL_FIELDS = ("expected_mean_acc", "measured_mean_acc", "rel_error", "engine_fault", "method", "temperature",
               "steps")  # fmt: skip


def expected_path(run: str | Path) -> Path:
    """The file of a run directory (or of the run whose results.jsonl `run` is)."""
    run = Path(run)
    return (run if run.is_dir() or run.suffix != ".jsonl" else run.parent) / EXPECTED_FILE


def _finite(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def write_expected(
    run: str | Path,
    cells: dict[str, dict[str, Any]],
    settings: dict[str, Any],
    skipped: dict[str, str] | None = None,
) -> Path:
    """Replace the run's file (atomically) with these cells (and the methods that could not be replayed,
    with why); returns its path."""
    payload = {
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": settings,
        "cells": {cid: {k: _finite(v) for k, v in e.items()} for cid, e in cells.items()},
        "skipped_methods": dict(skipped or {}),
    }
    path = expected_path(run)
    atomic_write_text(path, json.dumps(payload, indent=2, default=str) + "\n")
    return path


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def read_expected(
    run: str | Path, warn: Callable[[str], None] | None = None
) -> dict[str, dict[str, Any]] | None:
    """{cell id: entry} from the run's file; None where there is none, or (after one warning line through
    `warn`, default stderr) where it cannot be read or is not such a file."""
    path = expected_path(run)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        why = f"{type(exc).__name__}: {exc}"
    else:
        cells = data.get("cells") if isinstance(data, dict) else None
        if isinstance(cells, dict) and all(isinstance(e, dict) for e in cells.values()):
            return cells
        why = "not an expected-acceptance file (no 'cells' object of cell entries)"
    (warn or _stderr)(
        f"warning: {path}: cannot read ({why}); shown without the expected acceptance "
        "(`speclab trace crosscheck RUN --expected` rewrites it)"
    )
    return None


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def merge_expected(
    rows: list[dict[str, Any]], run: str | Path, warn: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """The rows (changed in place, and returned) with their cell's `expected_mean_acceptance_length` and
    `engine_fault` text from the run's file; rows of cells it does not name, or all of them where there is
    no readable file, stay as they are."""
    cells = read_expected(run, warn)
    if not cells:
        return rows
    for r in rows:
        e = cells.get(str(r.get("cell_id")))
        if e is None:
            continue
        exp = _number(e.get("expected_mean_acc"))
        if exp is not None:
            r["expected_mean_acceptance_length"] = exp
        fault = e.get("engine_fault")
        if isinstance(fault, str) and fault:
            r["engine_fault"] = fault
    return rows
