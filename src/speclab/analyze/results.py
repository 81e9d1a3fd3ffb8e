"""Reading a bench run directory (CONTRACTS.md section 4) in analyze and report.

RUN/results.jsonl itself is read by speclab.bench.rows.read_rows (its format's owner), rows are named by
speclab.bench.rows.entry_labels.
"""

from __future__ import annotations

from pathlib import Path

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
