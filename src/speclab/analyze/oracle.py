"""The oracle gap: measured speedup (bench) next to simulated single-method oracle and oracle-combine bounds.

Per (workload, batching, batch size):
- measured: every SD cell's speedup from RUN/results.jsonl (status ok, speedup not null) by sweep-entry
  label, best of them;
- simulated with speclab.simulate.simulate on the workload's traces: `fixed:M:K` for the measured
  (method, k) pairs (a check of the simulator against the engine), `oracle:M` per traced method and
  `oracle-combine:M1,...` over all traced methods;
- gaps: oracle-combine / best measured and best single oracle / best measured.

Cost model: fitted from RUN/timings.csv (speclab.costmodel.fit_cost_model) unless a name is given.
"""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path
from typing import Any

from speclab.bench.rows import entry_labels
from speclab.costmodel import CostModel, fit_cost_model, get_cost_model
from speclab.errors import SpeclabError
from speclab.simulate import simulate
from speclab.traces import RequestTrace

DEFAULT_BATCH_SIZES = (1, 8, 16, 32, 64)
DEFAULT_MAX_REQUESTS = 200


def load_cost_model(name: str | None, run: Path | None) -> tuple[CostModel, str]:
    """A cost model by registry name, or fitted from RUN/timings.csv. Returns (model, description)."""
    if name:
        return get_cost_model(name), f"preset {name}"
    if run is not None and (run / "timings.csv").is_file():
        return fit_cost_model(run / "timings.csv"), f"fitted from {run / 'timings.csv'}"
    raise SpeclabError("no cost model: give --cost-model NAME or a --run with timings.csv")


def _sample(records: list[RequestTrace], n: int, seed: int) -> list[RequestTrace]:
    if len(records) <= n:
        return records
    rng = random.Random(seed)
    return rng.sample(records, n)


def _simulate_each(
    simulate: Any,
    sample: list[RequestTrace],
    cost_model: Any,
    policies: list[str],
    batching: str,
    sizes: list[int],
    seed: int,
    warnings: list[str],
    workload: str,
) -> list[Any]:
    """All policies in one call; if that fails, one call per policy so one bad policy loses only itself."""
    try:
        return list(
            simulate(sample, cost_model, policies=policies, batching=batching, batch_sizes=sizes, seed=seed)
        )
    except SpeclabError:
        pass
    results: list[Any] = []
    for p in policies:
        if p == "none":
            continue
        try:
            results += simulate(
                sample, cost_model, policies=[p], batching=batching, batch_sizes=sizes, seed=seed
            )
        except SpeclabError as exc:
            warnings.append(f"{workload}/{batching}: {p}: simulation failed: {exc}")
    return results


def _measured(
    rows: list[dict[str, Any]], warnings: list[str]
) -> tuple[dict[tuple[str, str, int], dict[str, float]], dict[tuple[str, str], set[tuple[str, int]]]]:
    """The bench's measured speedups per (workload, batching, batch size) and sweep entry, and the (method, k)
    pairs measured per (workload, batching)."""
    measured: dict[tuple[str, str, int], dict[str, float]] = defaultdict(dict)
    measured_pairs: dict[tuple[str, str], set[tuple[str, int]]] = defaultdict(set)
    targets = set()
    for label, row in zip(entry_labels(rows), rows, strict=True):
        if row.get("status") != "ok" or row.get("method") in (None, "none") or row.get("speedup") is None:
            continue
        key = (str(row.get("workload")), str(row.get("batching", "replicate")), int(row["batch_size"]))
        targets.add(row.get("target"))
        # keyed by sweep entry (label); several targets or seeds for one cell: keep the best (said below)
        measured[key][label] = max(float(row["speedup"]), measured[key].get(label, 0.0))
        if row.get("k") is not None:
            measured_pairs[(key[0], key[1])].add((str(row["method"]), int(row["k"])))
    if len(targets) > 1:
        warnings.append(f"results hold several targets ({sorted(map(str, targets))}); measured = best")
    return measured, measured_pairs


def _gap_row(
    workload: str, batching: str, bs: int, meas: dict[str, float], sim: dict[int, dict[str, float]]
) -> dict[str, Any]:
    """One (workload, batching, batch size): the best measured entry beside the simulated oracles."""
    s = sim.get(bs, {})
    best_label = max(meas, key=meas.get) if meas else None
    best = meas.get(best_label) if best_label else None
    singles = {p: v for p, v in s.items() if p.startswith("oracle:")}
    best_single = max(singles, key=singles.get) if singles else None
    fixed_sim = {p: v for p, v in s.items() if p.startswith("fixed:")}
    best_fixed = max(fixed_sim, key=fixed_sim.get) if fixed_sim else None
    combine = next((v for p, v in s.items() if p.startswith("oracle-combine:")), None)
    return {
        "workload": workload,
        "batching": batching,
        "batch_size": bs,
        "measured": meas,
        "best_measured": best,
        "best_measured_method": best_label,
        "simulated": s,
        "sim_best_fixed": fixed_sim.get(best_fixed) if best_fixed else None,
        "sim_best_fixed_policy": best_fixed,
        "oracle_best_single": singles.get(best_single) if best_single else None,
        "oracle_best_single_policy": best_single,
        "oracle_combine": combine,
        "gap_single": (singles[best_single] / best) if best and best_single else None,
        "gap_combine": (combine / best) if best and combine else None,
    }


def oracle_gap(
    records: list[RequestTrace],
    rows: list[dict[str, Any]] | None,
    cost_model: Any,
    cost_model_desc: str,
    batch_sizes: list[int] | None = None,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    seed: int = 42,
) -> dict[str, Any]:
    """See module doc. Returns {"status", "cost_model", "rows": [...], "warnings": [...]}."""
    warnings: list[str] = []
    measured, measured_pairs = _measured(rows or [], warnings)

    by_workload: dict[str, list[RequestTrace]] = defaultdict(list)
    for r in records:
        by_workload[r.workload].append(r)

    out_rows = []
    for workload, recs in sorted(by_workload.items()):
        methods = sorted({m for r in recs for m in r.methods})
        drafts = getattr(cost_model, "draft", None)
        if isinstance(drafts, dict):
            uncosted = [m for m in methods if m not in drafts]
            if uncosted:
                warnings.append(
                    f"{workload}: cost model ({cost_model_desc}) has no drafting cost for "
                    f"{', '.join(uncosted)}: not simulated"
                )
            methods = [m for m in methods if m in drafts]
        if not methods:
            continue
        k_max = {m: min(r.methods[m].k_max for r in recs if m in r.methods) for m in methods}
        batchings = sorted({b for (w, b, _) in measured if w == workload}) or ["replicate"]
        sample = _sample(recs, max_requests, seed)
        for batching in batchings:
            sizes = sorted({bs for (w, b, bs) in measured if w == workload and b == batching})
            sizes = sorted(set(batch_sizes)) if batch_sizes else sizes or list(DEFAULT_BATCH_SIZES)
            policies = ["none"] + [f"oracle:{m}" for m in methods]
            if len(methods) > 1:
                policies.append(f"oracle-combine:{','.join(methods)}")
            fixed = sorted(
                (m, k)
                for (m, k) in measured_pairs.get((workload, batching), set())
                if m in k_max and k <= k_max[m]
            )
            if not fixed:  # no bench run: simulate each method at the k it was traced with, capped at 3
                fixed = [(m, min(3, k_max[m])) for m in methods]
            policies += [f"fixed:{m}:{k}" for m, k in fixed]
            results = _simulate_each(
                simulate, sample, cost_model, policies, batching, sizes, seed, warnings, workload
            )
            if not results:
                continue
            sim: dict[int, dict[str, float]] = defaultdict(dict)
            for res in results:
                d = res.to_dict()
                sim[int(d["batch_size"])][str(d["policy"])] = float(d["speedup"])
            for bs in sizes:
                out_rows.append(
                    _gap_row(workload, batching, bs, measured.get((workload, batching, bs), {}), sim)
                )
    if not out_rows:
        return {
            "status": "skipped",
            "reason": "nothing simulated" + (f": {'; '.join(warnings)}" if warnings else ""),
            "rows": [],
            "warnings": warnings,
        }
    return {
        "status": "ok",
        "cost_model": cost_model_desc,
        "max_requests": max_requests,
        "seed": seed,
        "rows": out_rows,
        "warnings": warnings,
    }
