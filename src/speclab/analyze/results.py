"""Read a bench run directory (CONTRACTS.md section 4): RUN/results.jsonl, RUN/traces, RUN/timings.csv.

Tolerant: a truncated last line (a killed run) is skipped with a warning instead of failing the analysis.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from speclab.errors import SpeclabError

# Files a bench run may hold that describe how it was produced; shown verbatim in the report.
CONFIG_CANDIDATES = (
    "command.txt",
    "command.json",
    "manifest.json",
    "run.json",
    "config.json",
    "config.toml",
    "sweep.toml",
    "sweep.json",
    "sweep.yaml",
    "environment.json",
    "env.json",
)


def read_results(run: str | Path, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    run = Path(run)
    path = run / "results.jsonl" if run.is_dir() else run
    if not path.exists():
        raise SpeclabError(f"{path}: bench results not found (expected RUN/results.jsonl)")
    rows: list[dict[str, Any]] = []
    with open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                if warnings is not None:
                    warnings.append(f"{path}: line {lineno} skipped (not valid JSON: {exc.msg})")
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def ok_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("status") == "ok"]


def method_label(row: dict[str, Any]) -> str:
    """ngram@k3 style label of a results row (method 'none' stays 'none')."""
    m = str(row.get("method"))
    k = row.get("k")
    return m if m == "none" or k is None else f"{m}@k{k}"


def config_files(run: str | Path, max_bytes: int = 20000) -> dict[str, str]:
    """Text of the files in RUN that record how the run was made (see CONFIG_CANDIDATES)."""
    run = Path(run)
    out = {}
    if not run.is_dir():
        return out
    for name in CONFIG_CANDIDATES:
        p = run / name
        if p.is_file():
            text = p.read_text(errors="replace")
            out[name] = text[:max_bytes] + ("\n... (truncated)" if len(text) > max_bytes else "")
    return out
