"""The sweep runner's handling of repeats r > 1 (sweep `repeats = N`): a repeat adds a run to its cell's row
(median, spread, matched pairs with the baseline's repeats); a repeat that did not run is counted failed.
A part of SweepRunner (bench/runner.py), mixed into it, kept here for the runner's size.
"""

from __future__ import annotations

from typing import Any

from speclab.bench.cells import Cell, EngineGroup
from speclab.bench.progress import format_cell_line
from speclab.bench.repeats import add_run, apply_pairs, run_entry, split_unit
from speclab.engine.measure import loadavg
from speclab.engine.protocol import CellResult


class RepeatUnits:
    """The sweep runner's handling of repeats r > 1 (mixed into SweepRunner; uses its store and progress).
    fail_unit and drop_unit are part of the runner's public interface to its strategies (SweepHost)."""

    spec: Any
    store: Any
    cells: list[Cell]
    by_id: dict[str, Cell]
    counts: dict[str, int]
    _progress: Any
    _eta: Any

    def _fail(self, cell: Cell, g: EngineGroup, reason: str) -> None:  # SweepRunner's
        raise NotImplementedError

    def _ingest_repeat(self, cell: Cell, res: CellResult, rep: int, count: str | None) -> None:
        """Add repeat `rep` of a cell to its row: the throughput median, spread and matched-pair speedups of
        the row (and, for a baseline, of the SD rows paired with it) are brought up to date."""
        assert self.store is not None
        row = self.store.rows.get(cell.cell_id)
        line = f"  {cell.method.label:<16} {cell.workload:<20} {cell.batching[:4]} b{cell.batch_size:<4}"
        if res.status != "ok" or row is None or row.get("status") != "ok":
            self.counts[count or "failed"] += 1
            if self._progress is not None:
                self._progress.line(f"{line} repeat {rep} FAILED: {res.error or 'repeat 1 is not ok'}")
                self._progress.advance()
            return
        add_run(row, run_entry(res, rep, loadavg()))
        changed = [row]
        if cell.is_baseline:
            for c in self.cells:
                r = self.store.rows.get(c.cell_id)
                if not c.is_baseline and c.baseline_key == cell.baseline_key and r and r.get("runs"):
                    changed.append(r)
        for r in changed:
            base = self._baseline_row(self.by_id[r["cell_id"]]) if r["method"] != "none" else None
            if base is not None:
                apply_pairs(r, base)
            self.store.put(r)
        self.counts[count or "ok"] += 1
        if self._progress is not None:
            tput = row["runs"][-1]["throughput_tok_s"] if row["runs"] else None
            self._progress.line(
                format_cell_line(row) + f"  [repeat {rep}/{self.spec.repeats}: {tput or 0:.1f} tok/s]"
            )
            self._progress.advance()

    def _baseline_row(self, cell: Cell) -> dict[str, Any] | None:
        """The ok row of the cell's no-SD cell, if any."""
        assert self.store is not None
        base = next((c for c in self.cells if c.is_baseline and c.baseline_key == cell.baseline_key), None)
        row = self.store.rows.get(base.cell_id) if base is not None else None
        return row if row is not None and row.get("status") == "ok" else None

    def fail_unit(self, unit: Cell, g: EngineGroup, reason: str) -> None:
        """A unit that did not run: repeat 1 fails its cell's row; a later repeat is counted failed."""
        cid, rep = split_unit(unit.cell_id)
        if rep == 1:
            self._fail(self.by_id[cid], g, reason)
            return
        if self._eta is not None:
            self._eta.cell_dropped(unit)
        self._ingest_repeat(
            self.by_id[cid], CellResult(cell_id=unit.cell_id, status="failed", error=reason), rep, None
        )

    def drop_unit(self, unit: Cell) -> None:
        """A later repeat of a cell whose repeat 1 failed: nothing to measure it against; not run."""
        if self._eta is not None:
            self._eta.cell_dropped(unit)
        if self._progress is not None:
            self._progress.advance()
