"""Judge an `adaptive-cpu` bench run against issue 12 item 4's bar, per workload and batch size:

    .venv/bin/python benchmarks/check_adaptive.py RUN [RUN ...] [--label adaptive] [--startups]

For each (workload, B): the adaptive entry's median speedup over no SD with its spread (min-max of the
matched-pair ratios), the best static entry (every other SD label except vLLM's schedule) and the schedule
entry (labels starting with "schedule"), and whether adaptive is >= both and >= 0.98x, and token-exact.
Medians are the bench's own (repeat i of SD over repeat i of no SD). On a loaded machine the verdict is
noise: run it on a quiet one (docs/bench.md, "Noise").

Several runs of the same sweep (the same preset on the same machine): a table per run, then one over the
pairs of all of them (each run's pairs chosen as the bench chooses them: its quiet ones where any are quiet),
so more start-ups stand behind each median.

`--startups` prints a second table beside the measured one: each pair's ratio with both engines' start-up
speed factors divided out (`speclab.bench.show.startup_adjusted_speedup`; docs/adaptive.md, "Engines
differ"). It is a model-based correction for reading the measured table, not a measurement.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path
from typing import Any

from speclab.bench.repeats import chosen_pairs, pair_summary
from speclab.bench.results import parse_rows


def _fmt(r: dict[str, Any] | None) -> str:
    if r is None or r.get("speedup") is None:
        return "-"
    s = r.get("speedup_spread") or {}
    rng = f" [{s['min']:.2f}-{s['max']:.2f}]" if s.get("min") is not None else ""
    return f"{r['speedup']:.3f}x{rng}"


def _adjusted(
    rows: dict[str, dict[str, Any]], factors: dict[tuple[str, int | None], float]
) -> dict[str, dict[str, Any]]:
    """Copies of the SD rows whose speedup and spread are the start-up-adjusted ones (rows without factors
    keep speedup None, so they show as "-")."""
    from speclab.bench.show import startup_adjusted_speedup

    out = {}
    for cid, r in rows.items():
        base = rows.get(r.get("baseline_cell_id") or "")
        adj = startup_adjusted_speedup(r, base, factors) if base else None
        out[cid] = {**r, "speedup": adj and adj["median"], "speedup_spread": adj}
    return out


def pooled(runs: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """One row per (workload, B, label) over several runs: speedup = the median of every run's pairs,
    spread their min-max and n; token-exact only if every run's cell was."""
    by: dict[tuple[str, int, str], list[dict[str, Any]]] = defaultdict(list)
    for rows in runs:
        for r in rows.values():
            if r.get("status") == "ok" and r.get("method") != "none":
                by[(r["workload"], int(r["batch_size"]), r.get("label") or r["method"])].append(r)
    out = {}
    for (wl, b, label), rs in by.items():
        pairs = [p for r in rs for p in chosen_pairs(r.get("speedup_runs") or [])]
        sp, spread = pair_summary(pairs) if pairs else (None, None)
        exact = all(r.get("lossless") for r in rs)
        out[f"{wl}.{b}.{label}"] = {**rs[0], "speedup": sp, "speedup_spread": spread, "lossless": exact}
    return out


def judge(rows: dict[str, dict[str, Any]], label: str = "adaptive") -> tuple[list[str], bool]:
    cells: dict[tuple[str, int], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in rows.values():
        if r.get("status") == "ok" and r.get("method") != "none":
            cells[(r["workload"], int(r["batch_size"]))][r.get("label") or r["method"]] = r
    lines = ["| workload | B | adaptive | best static | vLLM schedule | >= static | >= schedule | >= 0.98x | exact |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    ok_all = True
    for (wl, b), by in sorted(cells.items()):
        ad = by.get(label)
        # static entries: everything but the judged one, vLLM's schedules and other adaptive entries
        static = {k: v for k, v in by.items() if k != label and not k.startswith(("schedule", "adaptive"))}
        sched = next((v for k, v in by.items() if k.startswith("schedule")), None)
        best_k = max(static, key=lambda k: static[k].get("speedup") or 0.0) if static else None
        best = static.get(best_k) if best_k else None
        sp = (ad or {}).get("speedup")
        # no static entry in the cell: not judged (n/a), and the verdict cannot be "met"; no schedule entry
        # (a sweep without one): n/a, left out of the verdict and said so below the table
        ge_static = None if best is None else sp is not None and sp >= (best.get("speedup") or 0.0)
        ge_sched = None if sched is None else sp is not None and sp >= (sched.get("speedup") or 0.0)
        ge_098 = sp is not None and sp >= 0.98
        exact = bool(ad and ad.get("lossless"))
        ok_all &= bool(ge_static) and ge_sched is not False and ge_098 and exact
        yes = {True: "yes", False: "NO", None: "n/a"}
        lines.append(
            f"| {wl} | {b} | {_fmt(ad)} | {best_k or '-'} {_fmt(best)} | {_fmt(sched)} | {yes[ge_static]} | "
            f"{yes[ge_sched]} | {yes[ge_098]} | {yes[exact]} |"
        )
    return lines, ok_all


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, nargs="+")
    ap.add_argument("--label", default="adaptive")
    ap.add_argument("--startups", action="store_true", help="also print start-up-adjusted speedups")
    a = ap.parse_args()
    every = []
    for run in a.run:
        rows = parse_rows(run / "results.jsonl")
        every.append(rows)
        lines, ok = judge(rows, a.label)
        print(f"{run}:")
        print("\n".join(lines))
        print("all criteria met" if ok else "some criteria NOT met (see NO above)")
        if a.startups:
            from speclab.bench.show import startup_factors

            lines, ok = judge(_adjusted(rows, startup_factors(run)), a.label)
            print("\nWith each engine start-up's speed factor divided out (model-based; not a measurement):")
            print("\n".join(lines))
            print("all criteria met (adjusted)" if ok else "some criteria NOT met (adjusted)")
        print()
    if len(every) > 1:
        lines, ok = judge(pooled(every), a.label)
        print(f"Pooled over the {len(every)} runs' pairs:")
        print("\n".join(lines))
        print("all criteria met (pooled)" if ok else "some criteria NOT met (pooled)")


if __name__ == "__main__":
    main()
