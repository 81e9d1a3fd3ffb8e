"""Progress of a sweep: a tqdm bar with a time-left estimate, and one printed line per finished cell."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from speclab.bench.cells import Cell, EngineGroup
from speclab.bench.sampling import is_sampled_row, setting_text
from speclab.catalog import MODEL_BASED


class Eta:
    """Time left: engine start-ups still to come plus each remaining cell's tokens at a learned rate.

    tqdm's own ETA assumes equal steps, but here an engine start (a minute or more) dwarfs a cell at batch 16,
    and a batch-1 cell takes several times as long as a batch-16 one. Rates are learned as cells finish."""

    def __init__(self, groups: list[EngineGroup], eager: bool) -> None:
        self.base_start = 20.0 if eager else 90.0  # s; the facts seen on 2 CPU cores
        self.start_samples: list[float] = []
        self.rate_samples: list[float] = []  # tokens / (s * batch_factor)
        self.pending_starts = {g.engine_id: self._draft_factor(g) for g in groups}
        self.pending_cells = {c.cell_id: self._work(c) for g in groups for c in g.cells}
        self.current_start: tuple[str, float] | None = None  # (engine id, when it was launched)

    def _draft_factor(self, g: EngineGroup) -> float:
        return 2.0 if g.engine.method in MODEL_BASED else 1.0  # a drafter model loads too

    @staticmethod
    def _work(c: Cell) -> float:
        tokens = c.num_prompts * c.max_tokens * (c.batch_size if c.batching == "replicate" else 1)
        return tokens / min(c.batch_size, 16) ** 0.6  # throughput grows sub-linearly with the batch

    def launched(self, g: EngineGroup) -> None:
        self.current_start = (g.engine_id, time.time())

    def cell_done(self, cell: Cell, elapsed_s: float, startup_s: float | None) -> None:
        work = self.pending_cells.pop(cell.cell_id, None)
        if work and elapsed_s > 0:
            self.rate_samples.append(work / elapsed_s)
        if self.current_start is not None:
            eid, _ = self.current_start
            factor = self.pending_starts.pop(eid, None)
            if startup_s is not None and factor:
                self.start_samples.append(startup_s / factor)
            self.current_start = None

    def cell_dropped(self, cell: Cell) -> None:
        self.pending_cells.pop(cell.cell_id, None)

    def engine_done(self, g: EngineGroup) -> None:
        self.pending_starts.pop(g.engine_id, None)
        self.current_start = None

    def remaining_s(self) -> float:
        start = sum(self.start_samples) / len(self.start_samples) if self.start_samples else self.base_start
        rate = sum(self.rate_samples) / len(self.rate_samples) if self.rate_samples else 30.0
        left = sum(self.pending_starts.values()) * start + sum(self.pending_cells.values()) / rate
        if self.current_start is not None:  # part of the running engine's start is already behind us
            eid, t0 = self.current_start
            left -= min(time.time() - t0, self.pending_starts.get(eid, 0.0) * start)
        return max(left, 0.0)


def fmt_duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    """tqdm bar (cells done, time left) plus one printed line per finished cell."""

    def __init__(
        self, total: int, enabled: bool, echo: Callable[[str], None], eta: Eta | None = None
    ) -> None:
        self.echo = echo
        self.eta = eta
        self.bar = None
        self._last_tick = 0.0
        if enabled and total:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                unit="cell",
                dynamic_ncols=True,
                file=sys.stderr,
                bar_format="{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} cells [{elapsed}{postfix}]",
            )

    def status(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(text[:60], refresh=False)
            self.tick(force=True)

    def tick(self, force: bool = False) -> None:
        """Refresh the time-left estimate (at most once a second)."""
        if self.bar is None or self.eta is None:
            return
        now = time.time()
        if force or now - self._last_tick >= 1.0:
            self._last_tick = now
            self.bar.set_postfix_str(f"~{fmt_duration(self.eta.remaining_s())} left", refresh=True)

    def line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            self.echo(text)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.tick(force=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def format_cell_line(row: dict[str, Any]) -> str:
    head = f"  {row['label']:<16} {row['workload']:<20} {row['batching'][:4]} b{row['batch_size']:<4}"
    if is_sampled_row(row):
        head += f" T={setting_text(row)}"
    if row.get("status") != "ok":
        return f"{head} FAILED: {row.get('error')}"
    tput = row.get("throughput_tok_s") or 0.0
    parts = [f"{tput:8.1f} tok/s"]
    if row.get("speedup") is not None and row["method"] != "none":
        parts.append(f"{row['speedup']:.2f}x")
    if row.get("mean_acceptance_length") is not None:
        parts.append(f"acc.len {row['mean_acceptance_length']:.2f}")
    if row.get("lossless") is not None:
        parts.append("token-exact" if row["lossless"] else "OUTPUTS DIFFER")
    elif is_sampled_row(row) and row["method"] != "none":
        parts.append("sampled (no token-exact check)")
    return f"{head} " + "  ".join(parts)
