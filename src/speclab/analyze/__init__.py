"""Acceptance analysis (`speclab analyze`): statistics from a trace store, oracle gaps against a bench run.

`analyze(...)` returns one JSON-able dict (schema "speclab.analysis/1"); `format_tables(analysis)` prints it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from speclab.analyze.acceptance import acceptance_stats, observed_stats
from speclab.analyze.oracle import DEFAULT_MAX_REQUESTS, load_cost_model, oracle_gap
from speclab.analyze.overlap import overlap_vs_advantage
from speclab.analyze.tables import format_tables
from speclab.bench.rows import entry_labels, read_rows
from speclab.errors import SpeclabError
from speclab.traces import RequestTrace, read_store

SCHEMA = "speclab.analysis/1"

__all__ = [
    "SCHEMA",
    "acceptance_stats",
    "analyze",
    "format_tables",
    "observed_stats",
    "oracle_gap",
    "overlap_vs_advantage",
]


def dedupe(records: list[RequestTrace]) -> tuple[list[RequestTrace], int]:
    """One record per (workload, target, prompt, output): a bench stores each prompt once per cell, so a
    replayed RUN/traces holds the same request under every method and batch size. Returns (kept, dropped)."""
    seen: set[tuple[Any, ...]] = set()
    kept = []
    for r in records:
        meta = r.meta if isinstance(r.meta, dict) else {}
        out = None if r.output_token_ids is None else hashlib.sha1(r.output_token_ids.tobytes()).hexdigest()
        key = (r.workload, meta.get("target"), meta.get("prompt_id", r.id), out, tuple(sorted(r.methods)))
        if out is not None and key in seen:
            continue
        seen.add(key)
        kept.append(r)
    return kept, len(records) - len(kept)


def analyze(
    traces: str | Path | None,
    run: str | Path | None = None,
    cost_model: str | None = None,
    batch_sizes: list[int] | None = None,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    n_bins: int = 10,
    seed: int = 42,
    oracle: bool = True,
    command: str | None = None,
) -> dict[str, Any]:
    """Full analysis. `traces` defaults to RUN/traces when a run is given."""
    warnings: list[str] = []
    run_path = Path(run) if run else None
    rows = read_rows(run_path) if run_path else None
    # cell_id -> sweep-entry label: engine-observed acceptance is grouped per entry, like the results
    labels = (
        None if rows is None else dict(zip((r["cell_id"] for r in rows), entry_labels(rows), strict=True))
    )
    if traces is None and run_path is not None and (run_path / "traces").exists():
        traces = run_path / "traces"
    if traces is None:
        raise SpeclabError("no trace store: give --traces STORE (or a --run that has RUN/traces)")
    records = read_store(traces)
    if not records:
        raise SpeclabError(f"{traces}: trace store is empty")
    with_methods, n_dup = dedupe([r for r in records if r.methods])
    if n_dup:
        warnings.append(
            f"{n_dup} duplicate record(s) skipped for acceptance statistics (same workload, target, prompt "
            "and output under several bench cells)"
        )
    if not with_methods:
        warnings.append(
            f"{traces}: no record has replayed per-position methods (run `speclab trace` first); "
            "only engine-observed acceptance is summarised"
        )
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "generated_by": {"command": command or "speclab.analyze.analyze() (Python API)"},
        "inputs": {
            "traces": str(traces),
            "run": str(run_path) if run_path else None,
            "n_records": len(records),
            "n_records_with_methods": len(with_methods),
            "n_results_rows": None if rows is None else len(rows),
            "workloads": sorted({r.workload for r in records}),
        },
        "acceptance": acceptance_stats(with_methods, n_bins=n_bins),
        "observed": observed_stats(records, labels),
        "overlap": overlap_vs_advantage(with_methods),
        "warnings": warnings,
    }
    if not oracle:
        out["oracle_gap"] = {"status": "skipped", "reason": "disabled (--no-oracle)", "rows": []}
    elif not with_methods:
        out["oracle_gap"] = {"status": "skipped", "reason": "no replayed methods in the traces", "rows": []}
    else:
        try:
            model, desc = load_cost_model(cost_model, run_path)
        except SpeclabError as exc:
            out["oracle_gap"] = {"status": "skipped", "reason": str(exc), "rows": []}
        else:
            out["oracle_gap"] = oracle_gap(
                with_methods, rows, model, desc, batch_sizes=batch_sizes, max_requests=max_requests, seed=seed
            )
    return out
