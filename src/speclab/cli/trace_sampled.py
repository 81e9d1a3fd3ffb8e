"""`speclab trace` on sampled outputs: the target that scores them, and `trace crosscheck --expected`."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click

from speclab.errors import ConfigError

EXPECTED_THREADS = 1  # crosscheck --expected without --threads


def records_target(records: list) -> str:
    """The one target the records were generated with (bench records carry meta["target"])."""
    from speclab.models.prepare import resolve_model

    names = {r.meta.get("target") for r in records if r.output_token_ids is not None}
    if len(names) != 1 or None in names:
        raise ConfigError(
            "eagle3 replay and sampled records need --target (the records name "
            + (f"several targets: {', '.join(sorted(map(str, names)))})" if len(names) > 1 else "no target)")
        )
    return str(resolve_model(str(names.pop()), prepare=False))


def make_scorer(target: str | None, records: list, threads: int | None) -> Any:
    """The target's distributions for sampled records: --target, else the records' target."""
    from speclab.models.prepare import resolve_model
    from speclab.replay.expected import TargetScorer

    return TargetScorer(resolve_model(target) if target else records_target(records), threads=threads)


def progress_line(every_s: float = 10.0) -> Any:
    """report(label, done, total) for a long replay: one stderr line per group at most every `every_s`
    seconds, and at each group's end."""
    import time

    last = [time.monotonic()]

    def report(label: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] >= every_s:
            last[0] = now
            click.echo(f"expected acceptance {label}: {done}/{total} records", err=True)

    return report


def crosscheck_expected(run: str, records: list, opts: dict[str, Any], as_json: bool) -> dict[str, Any]:
    """`crosscheck --expected`: per method and temperature, the engine's mean acceptance length beside the
    expectation from accept_prob (speclab.replay.crosscheck.expected_check); the payload it printed."""
    from speclab.replay.crosscheck import expected_check, expected_summary
    from speclab.replay.runs import expected_traces

    # one torch thread unless --threads says otherwise: the forwards are small, and torch's default (one
    # thread per core) runs several times slower when other jobs keep the cores busy
    opts = {**opts, "threads": opts.get("threads") or EXPECTED_THREADS}
    scorer: list[Any] = []

    class _Lazy:  # the target is loaded only if a sampled record needs it
        def probs(self, *a: Any) -> Any:
            if not scorer:
                scorer.append(make_scorer(opts.get("target"), records, opts.get("threads")))
            return scorer[0].probs(*a)

    traces, skipped = expected_traces(Path(run), records, opts, _Lazy(), progress=progress_line())
    checks = [
        expected_check(r, traces[r.id][0], str(r.meta["observed"]["method"]), int(r.meta["observed"]["k"]),
                       r.meta["observed"], traces[r.id][1]["temperature"])
        for r in records if r.id in traces
    ]  # fmt: skip
    by_method, by_cell = expected_summary(checks), expected_summary(checks, by="cell")
    payload = {"run": str(run), "expected": by_method, "by_cell": by_cell, "skipped_methods": skipped}
    try:
        saved = save_cells(run, by_cell, opts, skipped)
    except OSError as exc:  # a run directory this user cannot write: the printed result still stands
        click.echo(f"warning: cannot save the expected acceptance in {run}: {exc}", err=True)
    else:
        if saved is not None:
            click.echo(f"expected acceptance per cell -> {saved}", err=True)
    if as_json:
        click.echo(json.dumps(payload, indent=2, default=lambda v: None if math.isnan(v) else v))
        return payload
    if not by_method:
        click.echo(f"{run}: no sampled records with observed acceptance for a replayable method")
    for key, s in by_method.items():
        click.echo(
            f"{key:28s} requests {s['requests']:4d}  steps {s['steps']:6d}  acc.len measured "
            f"{s['measured_mean_acceptance_length']:.3f}  expected {s['expected_mean_acceptance_length']:.3f}  "
            f"({100 * s['rel_error']:+.1f}%, chance sd {100 * s['chance_sd_rel']:.1f}%)  MAE cells "
            f"{100 * s['cell_mae_rel']:.1f}%  requests {100 * s['mae_rel']:.1f}%"
            + ("  ENGINE FAULT" if "engine_fault" in s else "")
        )
    for cell, s in by_cell.items():
        if "engine_fault" in s:
            click.echo(f"  engine fault in {cell}: {s['engine_fault']}")
    for name, why in skipped.items():
        click.echo(f"{name:28s} skipped: {why}")
    return payload


def cell_entry(s: dict[str, Any]) -> dict[str, Any]:
    """One cell of RUN/expected_acceptance.json from its `expected_summary(by="cell")` entry."""
    exp, meas = s["expected_mean_acceptance_length"], s["measured_mean_acceptance_length"]
    return {
        "expected_mean_acc": exp,
        "measured_mean_acc": meas,
        "rel_error": (meas - exp) / exp,  # signed: below 0 where the engine accepted less than expected
        "engine_fault": s.get("engine_fault"),
        "method": s.get("method"),
        "k": s.get("k"),
        "temperature": s.get("temperature"),
        "steps": s["steps"],
        "requests": s["requests"],
        "mae_rel": s["mae_rel"],
        "chance_sd_rel": s["chance_sd_rel"],
    }


def save_cells(
    run: str, by_cell: dict[str, dict[str, Any]], opts: dict[str, Any], skipped: dict[str, str]
) -> Path | None:
    """On a bench run directory: rewrite RUN/expected_acceptance.json (speclab.bench.expected_acceptance)
    with every cell checked; its path. Anything else (a trace store, a JSONL export): nothing, None."""
    from speclab.bench.expected_acceptance import write_expected
    from speclab.bench.results import RESULTS

    if not (Path(run).is_dir() and (Path(run) / RESULTS).is_file()):
        return None
    cells = {cid: cell_entry(s) for cid, s in by_cell.items() if cid}
    settings = {"command": "speclab trace crosscheck RUN --expected", **opts}
    return write_expected(run, cells, settings, skipped)
