"""What every report section reads: the inputs, the analysis and what was computed from them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speclab.report import figures as F


@dataclass
class ReportData:
    """Everything the sections read: the inputs, the analysis and what was computed from them."""

    rows: list[dict[str, Any]] | None  # RUN/results.jsonl, None without a bench run
    run_path: Path | None
    traces: str | Path | None
    analysis: dict[str, Any]
    recs: list[dict[str, Any]]
    figs: dict[str, F.Figure | None]
    command: str | None = None  # this report's command line (default: the process's argv)
    server_rows: list[dict[str, Any]] | None = None  # server-mode cells of the run (speclab.server)
    noise: dict[str, Any] | None = (
        None  # the run's A/A machine noise (RUN/noise.json), None where not measured
    )
    # every offline / server row at every sampling setting (rows and server_rows: the T = 0 ones where the
    # run also has sampled cells, report.sampling.greedy_view)
    all_rows: list[dict[str, Any]] | None = None
    server_rows_all: list[dict[str, Any]] | None = None

    @property
    def acc(self) -> list[dict[str, Any]]:
        return self.analysis.get("acceptance") or []

    @property
    def gap(self) -> dict[str, Any]:
        return self.analysis.get("oracle_gap") or {}

    @property
    def overlap(self) -> dict[str, Any]:
        return self.analysis.get("overlap") or {}
