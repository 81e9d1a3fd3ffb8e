"""`speclab validate RUN`: simulate every cell of a bench run from its own traces and compare with what the
engine measured.

Per cell: the cell's own requests (RUN/<trace_part>: prompts, output lengths, in the order the engine ran
them), its batching and batch size, and a cost model (default: fitted from RUN/timings.csv). A baseline
(method none) cell is simulated with policy `none`; an SD cell with `fixed:<method>:<k>` over the
acceptance the engine observed for each request (meta["observed"]; see `observed_trace`). Continuous
cells are compared on the single pass's makespan throughput (what a bench cell measures: all its tokens over
its wall time), not the simulator's steady state. Predicted speedup = predicted SD throughput / predicted
throughput of the cell's baseline cell, as the bench computes the measured one.

Why the observed acceptance and not replayed traces: it is what happened in that very cell (same drafts,
same accepted counts, same steps), so the comparison isolates the cost model and the simulator's step
rules. Replayed traces would add the replay's own disagreements with the engine (`speclab trace
crosscheck` measures those separately). vLLM leaves steps without a proposal out of its per-step
metrics; their number is known (output length minus the tokens of the recorded steps) but not their
positions, so they are spread evenly between the recorded steps.

Sampled runs: an SD cell is paired with the baseline cell of the same sampling setting (row fields
sampling, temperature, top_p, top_k; a row without them is greedy, as is temperature 0), and the summary
gives the error per setting too. The observed acceptance of a sampled cell is what its draws accepted, so
it is simulated the same way. The simulated records carry their cell's sampling (meta["sampling"]), so a
cost model's sampled overhead terms are charged for them; the fit from RUN/timings.csv sees which steps
were sampled through the timings' temperature column, recovered in memory from the engine attempts for
runs written before it (timings_with_sampling).
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from speclab.bench.attempts import run_timings
from speclab.bench.repeats import load_is_contended, row_pressure
from speclab.bench.rows import baseline_match, entry_labels, read_rows
from speclab.costmodel import CostModel, fit_cost_model, get_cost_model
from speclab.costmodel.holdout import fit_timings_csv
from speclab.errors import SpeclabError
from speclab.simulate import simulate
from speclab.timings import TimingsRow, append_timings, full_fields, read_timings
from speclab.traces import MethodTrace, RequestTrace, read_store

VALIDATION_JSON = "validation.json"


@dataclass
class CellCheck:
    cell_id: str
    label: str
    method: str
    k: int | None
    workload: str
    batching: str
    batch_size: int
    requests: int
    measured_tok_s: float | None
    predicted_tok_s: float | None
    measured_speedup: float | None
    predicted_speedup: float | None
    speedup_err: float | None  # predicted / measured - 1
    throughput_err: float | None
    loadavg_1m: float | None  # the machine's load when the cell finished (contention)
    cpus: int | None = None
    cpu_pressure: float | None = None  # Linux PSI over the cell, where recorded (bench.repeats decides by it)
    # engine steps: measured (the cell's engine.step() calls) and simulated; equal counts mean the
    # acceptance and batching were reproduced and any error lies in the time per step (the cost model)
    measured_steps: int | None = None
    predicted_steps: int | None = None
    baseline_cell_id: str | None = None
    note: str = ""
    sampling: str = "greedy"  # the cell's sampling setting (sampling_label)


@dataclass
class Validation:
    run: str
    cost_model: str
    cells: list[CellCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def sd_cells(self) -> list[CellCheck]:
        return [c for c in self.cells if c.method != "none" and c.speedup_err is not None]

    def summary(self) -> dict[str, Any]:
        errs = [abs(c.speedup_err) for c in self.sd_cells if c.speedup_err is not None]
        terrs = [abs(c.throughput_err) for c in self.cells if c.throughput_err is not None]
        return {
            "sd_cells": len(errs),
            "mean_abs_speedup_err": float(np.mean(errs)) if errs else None,
            "max_abs_speedup_err": float(np.max(errs)) if errs else None,
            "cells_over_10pct": sum(1 for e in errs if e > 0.10),
            "mean_abs_throughput_err": float(np.mean(terrs)) if terrs else None,
            # cells measured while other processes competed for the CPUs (the bench's own rule): their
            # timings were inflated
            "contended_cells": sum(
                1 for c in self.cells if load_is_contended(c.loadavg_1m, c.cpus, c.cpu_pressure)
            ),
            "by_sampling": {
                lab: {"sd_cells": len(e), "mean_abs_speedup_err": float(np.mean(e))}
                for lab in dict.fromkeys(c.sampling for c in self.sd_cells)
                for e in [[abs(c.speedup_err) for c in self.sd_cells if c.sampling == lab]]
            },
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "cost_model": self.cost_model,
            "summary": self.summary(),
            "cells": [_clean(asdict(c)) for c in self.cells],
            "notes": self.notes,
        }


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def sampling_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """A row's sampling setting, for pairing cells: ("greedy",) (no fields, or temperature 0),
    ("as-logged",), or ("fixed", temperature, top_p, top_k)."""
    if row.get("sampling") == "as-logged":
        return ("as-logged",)
    t = float(row.get("temperature") or 0.0)
    if t <= 0.0:
        return ("greedy",)
    return ("fixed", t, float(row.get("top_p") or 1.0), int(row.get("top_k") or 0))


def sampling_label(key: tuple[Any, ...]) -> str:
    if key[0] != "fixed":
        return str(key[0])
    _, t, top_p, top_k = key
    return f"T={t:g}" + (f" top-p={top_p:g}" if top_p < 1.0 else "") + (f" top-k={top_k}" if top_k else "")


def observed_trace(rec: RequestTrace, k: int) -> MethodTrace | None:
    """A per-position trace that a `fixed:<method>:<k>` walk turns back into exactly the engine's steps.

    The walk starts at position 1 (prefill made position 0); at a recorded step (accepted a, drafted d) the
    trace holds acc_len = a + 1 and num_proposed = d, so the step verifies d drafts and moves a + 1
    positions; a step without a proposal holds num_proposed = 0 (one token). Positions the walk jumps over
    hold 1 / 0. None when the record has no observed acceptance."""
    obs = rec.meta.get("observed") or {}
    acc = [int(a) for a in obs.get("per_step_accepted") or []]
    dr = [int(d) for d in obs.get("per_step_drafted") or []]
    n = int(rec.output_len)
    if "per_step_accepted" not in obs or len(dr) != len(acc) or n < 1:
        return None
    acc_len = np.ones(n, dtype=np.int32)
    nprop = np.zeros(n, dtype=np.int32)
    misses = max(n - 1 - sum(a + 1 for a in acc), 0)
    # interleave the misses evenly among the recorded steps (their positions are not recorded)
    events = [(i + 0.5) / max(len(acc), 1) for i in range(len(acc))]
    order = sorted(
        [(t, 0, i) for i, t in enumerate(events)] + [((j + 0.5) / misses, 1, j) for j in range(misses)]
    )
    p = 1
    for _, is_miss, i in order:
        if p >= n:
            break
        if is_miss:
            p += 1
            continue
        a, d = min(acc[i], dr[i]), min(dr[i], k)
        acc_len[p], nprop[p] = min(a, d) + 1, d
        p += min(a, d) + 1
    return MethodTrace(k_max=k, acc_len=acc_len, num_proposed=nprop)


def _records(run: Path, row: dict[str, Any]) -> list[RequestTrace]:
    part = row.get("trace_part")
    if not part or not (run / part).exists():
        raise SpeclabError(f"cell {row['cell_id']}: no trace part ({part or 'none recorded'})")
    return read_store(run / part, validate=False)


def _predict(
    records: list[RequestTrace], cm: CostModel, policy: str, batching: str, batch_size: int
) -> tuple[float, int, list[str]]:
    res = simulate(
        records,
        cm,
        [policy],
        batching=batching,
        batch_sizes=[batch_size],
        continuous_measure="makespan",
    )
    r = res[0]
    # the simulator's warning about the continuous tail concerns its steady-state figure, not used here
    notes = [n for n in r.notes if "single pass's makespan" not in n]
    return float(r.makespan_throughput_tok_s), int(r.steps), notes


FITS = ("linear", "best")


def _load_cost_model(run: Path, name: str | None, fit: str) -> tuple[CostModel, str]:
    if name:
        cm = get_cost_model(name)
        return cm, cm.name if cm.name == name else f"{cm.name} ({name})"
    path = run / "timings.csv"
    if not path.is_file():
        raise SpeclabError(f"{run}: no timings.csv to fit a cost model from; give --cost-model NAME")
    if fit not in FITS:
        raise SpeclabError(f"fit {fit!r}: use {' or '.join(FITS)}")
    rows, how = timings_with_sampling(run)
    if fit == "best":
        # the profile's choice of forms (e.g. piecewise target, linear lookup drafting) on held-out steps
        model = fit_timings_csv(path, "run-timings", rows=rows).model
        ovh = "linear" if model.overhead_per_request or model.overhead_per_spec_token else "mean"
        forms = ", ".join(
            [getattr(model.target, "form", "linear")]
            + [f"{m} {d.form}" for m, d in model.draft.items()]
            + [f"overhead {ovh}" + ("+sampled" if model.samples_cost else "")]
        )
        return model, f"fitted from {path}{how} (best forms on held-out steps: {forms})"
    with tempfile.TemporaryDirectory() as tmp:
        append_timings(Path(tmp) / "timings.csv", (full_fields(r) for r in rows))
        model = fit_cost_model(Path(tmp) / "timings.csv", name="run-timings")
    model.source = str(path)
    model.description = f"fitted by least squares from {path}"
    return model, f"fitted from {path}{how} (linear, as `speclab cost-models fit`)"


def timings_with_sampling(run: Path) -> tuple[list[TimingsRow], str]:
    """RUN/timings.csv's rows, with the temperature column where the file lacks it recovered from the
    run's engine attempts (speclab.timings.recover_temperatures) when those give the same rows; and a note
    saying so ("" when the file's own rows are used)."""
    rows = read_timings(run / "timings.csv")
    if all(r.recorded for r in rows):
        return rows, ""
    rec = run_timings(run)
    same = len(rec) == len(rows) and all(
        a.kind == b.kind and a.values == b.values for a, b in zip(rec, rows, strict=True)
    )
    if not same or not any(r.recorded for r in rec):
        return rows, " (no sampling recorded: every step read as greedy)"
    n = sum(1 for r in rec if r.recorded)
    return rec, f" (sampling of {n} of {len(rec)} rows recovered from the engine attempts)"


def validate_run(run: str | Path, cost_model: str | CostModel | None = None, fit: str = "best") -> Validation:
    """See the module doc. cost_model: a CostModel, a name or path, or None to fit RUN/timings.csv (`fit`:
    "best" = the profile's choice of forms on held-out steps, the default since it predicted the quiet
    validate-cpu run's speedups 3x better (docs/validate.md); "linear" = `speclab cost-models fit`)."""
    run = Path(run)
    rows = read_rows(run)
    if isinstance(cost_model, CostModel):
        cm, desc = cost_model, cost_model.name
    else:
        cm, desc = _load_cost_model(run, cost_model, fit)
    labels = dict(zip((r["cell_id"] for r in rows), entry_labels(rows), strict=True))
    ok = [r for r in rows if r.get("status") == "ok" and r.get("trace_part")]
    base_by_match = {(baseline_match(r), sampling_key(r)): r for r in ok if r.get("method") == "none"}
    val = Validation(run=str(run), cost_model=desc)
    predicted: dict[str, float] = {}
    notes: list[str] = []
    # baselines first: SD cells need their baseline's prediction
    for r in sorted(ok, key=lambda r: r.get("method") != "none"):
        check = CellCheck(
            cell_id=r["cell_id"],
            label=labels[r["cell_id"]],
            method=str(r["method"]),
            k=r.get("k"),
            workload=str(r.get("workload")),
            batching=str(r.get("batching")),
            batch_size=int(r["batch_size"]),
            requests=0,
            measured_tok_s=r.get("throughput_tok_s"),
            predicted_tok_s=None,
            measured_speedup=r.get("speedup"),
            predicted_speedup=None,
            speedup_err=None,
            throughput_err=None,
            loadavg_1m=(r.get("host") or {}).get("loadavg_1m"),
            cpus=(r.get("host") or {}).get("cpus"),
            cpu_pressure=row_pressure(r),
            sampling=sampling_label(sampling_key(r)),
        )
        val.cells.append(check)
        try:
            recs = _records(run, r)
            check.requests = len(recs)
            recs = [_with_sampling(x, r) for x in recs]
            if r["method"] == "none":
                thr, steps, sim_notes = _predict(recs, cm, "none", check.batching, check.batch_size)
            else:
                thr, steps, sim_notes = _predict_sd(recs, cm, r, check)
        except SpeclabError as exc:
            check.note = str(exc)
            continue
        notes += [n for n in sim_notes if n not in notes]
        predicted[r["cell_id"]] = thr
        check.predicted_tok_s = thr
        check.measured_steps, check.predicted_steps = r.get("steps"), steps
        if check.measured_tok_s:
            check.throughput_err = thr / check.measured_tok_s - 1.0
        if r["method"] == "none":
            check.predicted_speedup = 1.0
            continue
        base = next((b for b in ok if b["cell_id"] == r.get("baseline_cell_id")), None)
        if base is not None and sampling_key(base) != sampling_key(r):
            base = None  # a baseline of another sampling setting is no baseline for this cell
        base = base or base_by_match.get((baseline_match(r), sampling_key(r)))
        if base is None or base["cell_id"] not in predicted:
            check.note = check.note or "no baseline cell to compare with"
            continue
        check.baseline_cell_id = base["cell_id"]
        check.predicted_speedup = thr / predicted[base["cell_id"]]
        if check.measured_speedup:
            check.speedup_err = check.predicted_speedup / float(check.measured_speedup) - 1.0
    order = {r["cell_id"]: i for i, r in enumerate(rows)}
    val.cells.sort(key=lambda c: order[c.cell_id])
    skipped = [r["cell_id"] for r in rows if r.get("status") != "ok"]
    if skipped:
        notes.append(f"{len(skipped)} failed cell(s) not validated")
    no_traces = sum(1 for r in rows if r.get("status") == "ok" and not r.get("trace_part"))
    if no_traces:
        notes.append(f"{no_traces} ok cell(s) without a trace part (RUN/traces) not validated")
    val.notes = notes
    return val


def _with_sampling(rec: RequestTrace, row: dict[str, Any]) -> RequestTrace:
    """The record with meta["sampling"] where its cell sampled (row fields) and the record does not say
    so (the simulator charges a sampled request's overhead from it)."""
    key = sampling_key(row)
    if key[0] != "fixed" or "sampling" in rec.meta:
        return rec
    _, t, top_p, top_k = key
    meta = {**rec.meta, "sampling": {"temperature": t, "top_p": top_p, "top_k": top_k}}
    return dataclasses.replace(rec, meta=meta)


def _predict_sd(
    recs: list[RequestTrace], cm: CostModel, row: dict[str, Any], check: CellCheck
) -> tuple[float, int, list[str]]:
    k = row.get("k")
    if not isinstance(k, int) or k < 1:
        raise SpeclabError(f"cell {row['cell_id']}: no k recorded")
    method = next((str(r.meta["observed"]["method"]) for r in recs if r.meta.get("observed")), None)
    if method is None:
        raise SpeclabError("no engine-observed acceptance in the cell's traces (meta['observed'])")
    sim = []
    missing = 0
    for r in recs:
        mt = observed_trace(r, k)
        if mt is None:
            missing += 1
            mt = MethodTrace(k_max=k, acc_len=np.ones(r.output_len, dtype=np.int32),
                             num_proposed=np.zeros(r.output_len, dtype=np.int32))  # fmt: skip
        sim.append(
            RequestTrace(
                id=r.id,
                workload=r.workload,
                category=r.category,
                prompt_len=r.prompt_len,
                output_len=r.output_len,
                methods={method: mt},
                meta={"sampling": r.meta["sampling"]} if "sampling" in r.meta else {},  # sampled overhead
            )  # fmt: skip
        )
    if missing:
        check.note = f"{missing} request(s) without observed acceptance: simulated without SD"
    return _predict(sim, cm, f"fixed:{method}:{k}", check.batching, check.batch_size)


def format_table(val: Validation) -> list[str]:
    """The comparison as text lines (the CLI prints them)."""

    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    out = [
        f"cost model: {val.cost_model}",
        f"{'cell':<44} {'B':>3} {'meas tok/s':>10} {'pred tok/s':>10} {'meas x':>7} {'pred x':>7} "
        f"{'err x':>7} {'steps meas/pred':>15} {'load':>5}",
    ]
    for c in val.cells:
        name = f"{c.label} {c.workload} {c.batching[:4]}" + (
            "" if c.sampling == "greedy" else f" {c.sampling}"
        )
        err = f(None if c.speedup_err is None else 100 * c.speedup_err, "+.1f")
        out.append(
            f"{name[:44]:<44} {c.batch_size:>3} {f(c.measured_tok_s, '.1f'):>10} {f(c.predicted_tok_s, '.1f'):>10} "
            f"{f(c.measured_speedup, '.2f'):>7} {f(c.predicted_speedup, '.2f'):>7} "
            f"{err + ('%' if err != '-' else ''):>7} {f(c.measured_steps, 'd') + '/' + f(c.predicted_steps, 'd'):>15} "
            f"{f(c.loadavg_1m, '.1f'):>5}" + (f"  ({c.note})" if c.note else "")
        )
    s = val.summary()
    if s["mean_abs_speedup_err"] is not None:
        out.append(
            f"mean absolute error of the predicted speedup: {100 * s['mean_abs_speedup_err']:.1f}% over "
            f"{s['sd_cells']} SD cell(s) (max {100 * s['max_abs_speedup_err']:.1f}%, {s['cells_over_10pct']} "
            f"above 10%); of throughput (all cells): {100 * s['mean_abs_throughput_err']:.1f}%"
        )
        if len(s["by_sampling"]) > 1 or set(s["by_sampling"]) - {"greedy"}:
            out += [
                f"  {lab}: {100 * v['mean_abs_speedup_err']:.1f}% over {v['sd_cells']} SD cell(s)"
                for lab, v in s["by_sampling"].items()
            ]
    else:
        out.append("no SD cell with a measured and a predicted speedup")
    if s["contended_cells"]:
        out.append(
            f"{s['contended_cells']} of {len(val.cells)} cell(s) ran while other processes competed for "
            "the CPUs (CPU pressure, or where not recorded the load average), so their measured times (and these errors) reflect the "
            "machine as much as the simulator; validate on a quiet machine"
        )
    return out
