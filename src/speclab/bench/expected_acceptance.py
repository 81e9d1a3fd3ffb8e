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

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speclab.bench.run_files import read_run_json, run_file, write_run_json

EXPECTED_FILE = "expected_acceptance.json"
# each cell entry's fields (a cell may carry more)
CELL_FIELDS = ("expected_mean_acc", "measured_mean_acc", "rel_error", "engine_fault", "method", "temperature",
               "steps")  # fmt: skip


def expected_path(run: str | Path) -> Path:
    """The file of a run directory (or of the run whose results.jsonl `run` is)."""
    return run_file(run, EXPECTED_FILE)


def write_expected(
    run: str | Path,
    cells: dict[str, dict[str, Any]],
    settings: dict[str, Any],
    skipped: dict[str, str] | None = None,
) -> Path:
    """Replace the run's file (atomically) with these cells (and the methods that could not be replayed,
    with why); returns its path."""
    fields = {"settings": settings, "cells": cells, "skipped_methods": dict(skipped or {})}
    return write_run_json(expected_path(run), fields)


def read_expected(
    run: str | Path, warn: Callable[[str], None] | None = None
) -> dict[str, dict[str, Any]] | None:
    """{cell id: entry} from the run's file; None where there is none, or (after one warning line through
    `warn`, default stderr) where it cannot be read or is not such a file."""
    return read_run_json(
        expected_path(run),
        "cells",
        lambda e: isinstance(e, dict),
        "an expected-acceptance",
        "shown without the expected acceptance (`speclab trace crosscheck RUN --expected` rewrites it)",
        warn,
    )


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
