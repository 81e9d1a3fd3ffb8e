"""Held-out check of `speclab validate --fit best`: fit the cost model on one workload's cells and validate
the other workload's cells with it (and the other way round), so no validated cell's timings were fitted.

    python benchmarks/validate_holdout.py RUN

RUN is a bench run with per-engine step timings (RUN/engines/<engine>/attempt-*/{timings.csv,cells.jsonl});
each cell's rows are cut from its engine's file by the cell's step count (one `target` row per step). Prints,
per held-out workload, the cost model's forms and the validation's per-cell speedup errors and their mean.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from speclab.bench.rows import read_rows
from speclab.costmodel.holdout import fit_timings_csv
from speclab.timings import TimingsRow, append_timings, read_timings
from speclab.validate import validate_run


def cell_rows(run: Path) -> dict[str, list[TimingsRow]]:
    """Each cell's timing rows, cut from its engine's timings.csv in the order the worker ran the cells."""
    out: dict[str, list[TimingsRow]] = {}
    for att in sorted(run.glob("engines/*/attempt-*")):
        if not (att / "timings.csv").is_file() or not (att / "cells.jsonl").is_file():
            continue
        rows = read_timings(att / "timings.csv", strict=False)
        i = 0
        for line in (att / "cells.jsonl").read_text().splitlines():
            cell = json.loads(line)
            take: list[TimingsRow] = []
            seen = 0
            while i < len(rows) and (seen < int(cell.get("steps") or 0) or rows[i].kind != "target"):
                seen += rows[i].kind == "target"
                take.append(rows[i])
                i += 1
            if cell.get("status") == "ok":
                out[cell["cell_id"]] = take
    return out


def main(run_dir: str) -> None:
    run = Path(run_dir)
    rows = {r["cell_id"]: r for r in read_rows(run) if r.get("status") == "ok"}
    per_cell = cell_rows(run)
    workloads = sorted({str(r["workload"]) for r in rows.values()})
    all_errs = []
    for held in workloads:
        train = [c for c, r in rows.items() if r["workload"] != held and c in per_cell]
        with tempfile.TemporaryDirectory() as tmp:
            csv = Path(tmp) / "train.csv"
            append_timings(csv, (r.fields for c in train for r in per_cell[c]))
            fit = fit_timings_csv(csv, f"fit-without-{held}")
        val = validate_run(run, fit.model)
        errs = [c for c in val.sd_cells if c.workload == held]
        print(f"held out {held}: cost model fitted on {len(train)} cells of the other workload(s)")
        for e in fit.errors:
            if e.chosen:
                print(f"  {e.kind}: {e.form}")
        for c in errs:
            print(f"  {c.label:<16} B={c.batch_size:<3} measured {c.measured_speedup:.2f}x predicted "
                  f"{c.predicted_speedup:.2f}x  error {100 * c.speedup_err:+.1f}%")  # fmt: skip
        mae = float(np.mean([abs(c.speedup_err) for c in errs])) if errs else float("nan")
        print(f"  mean absolute error of the predicted speedup: {100 * mae:.1f}% over {len(errs)} SD cells")
        all_errs += [abs(c.speedup_err) for c in errs]
    if all_errs:
        print(f"all held-out SD cells: {100 * float(np.mean(all_errs)):.1f}% over {len(all_errs)} cells")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
