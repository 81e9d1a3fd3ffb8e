"""`speclab bench compare RUN_A RUN_B`: are two runs of the same sweep the same measurement?

For each cell: present in both, status, every request's output tokens equal (read from the trace parts, which
hold the first copy of each request), and the throughput and speedup of B over A. Used to check that `--ray` reproduces the serial path
(same cells, token-exact outputs, throughputs within noise), or two machines against each other.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speclab.bench.results import parse_rows
from speclab.errors import ConfigError
from speclab.traces import read_store


@dataclass
class Comparison:
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    not_ok: list[str] = field(default_factory=list)  # failed in either run
    differ: list[tuple[str, str]] = field(default_factory=list)  # (cell id, what differs)
    ratios: list[tuple[str, float, float | None]] = field(default_factory=list)  # cell, tput B/A, speedup B/A

    @property
    def same(self) -> bool:
        return not (self.only_a or self.only_b or self.not_ok or self.differ)


def _rows(run: Path) -> dict[str, dict[str, Any]]:
    path = run / "results.jsonl"
    if not path.is_file():
        raise ConfigError(f"{run}: no results.jsonl (not a bench run directory)")
    return parse_rows(path)


def _outputs(run: Path, row: dict[str, Any]) -> dict[str, list[int]] | None:
    """Request id -> output token ids of a cell (its first copy), from its trace part (None: no part)."""
    part = row.get("trace_part")
    if not part or not (run / part).exists():
        return None
    return {
        rec.id: [int(t) for t in rec.output_token_ids]
        for rec in read_store(run / part, validate=False)
        if rec.output_token_ids is not None
    }


def compare_runs(a: str | Path, b: str | Path) -> Comparison:
    a, b = Path(a), Path(b)
    ra, rb = _rows(a), _rows(b)
    out = Comparison(only_a=sorted(set(ra) - set(rb)), only_b=sorted(set(rb) - set(ra)))
    for cid in [c for c in ra if c in rb]:
        x, y = ra[cid], rb[cid]
        if x.get("status") != "ok" or y.get("status") != "ok":
            out.not_ok.append(cid)
            continue
        ox, oy = _outputs(a, x), _outputs(b, y)
        if ox is None or oy is None:
            out.differ.append((cid, "no trace part to compare outputs"))
        elif ox.keys() != oy.keys():
            out.differ.append((cid, f"requests differ ({len(ox)} vs {len(oy)})"))
        else:
            bad = sorted(k for k in ox if ox[k] != oy[k])
            if bad:
                out.differ.append((cid, f"{len(bad)} of {len(ox)} request(s) differ in output tokens"))
        tput = y["throughput_tok_s"] / x["throughput_tok_s"] if x.get("throughput_tok_s") else float("nan")
        sx, sy = x.get("speedup"), y.get("speedup")
        sp = sy / sx if x.get("method") != "none" and sx and sy else None
        out.ratios.append((cid, tput, sp))
    return out


def format_comparison(c: Comparison, a: str, b: str) -> str:
    lines = [f"{'cell':<52} {'tok/s B/A':>9} {'speedup B/A':>11}"]
    for cid, t, s in c.ratios:
        lines.append(f"{cid:<52} {t:>8.3f}x {('-' if s is None else f'{s:.3f}x'):>11}")
    ts = [t for _, t, _ in c.ratios if t == t]
    if ts:
        lines.append(
            f"throughput B/A over {len(ts)} cells: median {statistics.median(ts):.3f}, "
            f"min {min(ts):.3f}, max {max(ts):.3f}"
        )
    for cid in c.only_a:
        lines.append(f"only in {a}: {cid}")
    for cid in c.only_b:
        lines.append(f"only in {b}: {cid}")
    for cid in c.not_ok:
        lines.append(f"not ok in one of the runs: {cid}")
    for cid, why in c.differ:
        lines.append(f"DIFFERENT: {cid}: {why}")
    n = len(c.ratios)
    lines.append(
        f"same cells and token-exact outputs in all {n} cells" if c.same else "the runs differ (see above)"
    )
    return "\n".join(lines)
