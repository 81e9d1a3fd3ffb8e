"""RUN/distribution_checks.json: the distribution check of a run's sampled SD cells, beside its rows.

`speclab bench check-sampling --run RUN` (bench/run_sampling_check.py) draws many outputs per prompt from a
no-SD engine and from each SD [[methods]] entry of the run, at each sampled setting of the run and on each of
its workloads, and tests whether the first tokens' distribution is the same (analyze/distcheck.py). Each
check is stored under its key (`check_key`): the entry's label, the workload and the setting (temperature,
top_p, top_k), so every SD row of that entry, workload and setting (any batching, any batch size) finds it.
`speclab bench show` and `speclab report` merge it into those rows as `distribution_check` (`merge_checks`);
results.jsonl itself is never changed.

File layout: {"schema", "written_at", "settings": the last command's settings, "checks": {key: {label,
method, k, workload, sampling, temperature, top_p, top_k, settings, check: {verdict, p_value,
tv_detectable_80, samples, positions, prompts, alpha, per_prompt, ...}, acceptance, engine_info}},
"skipped": {what: why}}. A missing file changes nothing; an unreadable one is one warning line, and the rows
stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from speclab.bench.run_files import read_run_json, run_file, write_run_json
from speclab.bench.sampling import is_sampled_row, row_setting, setting_text

CHECKS_FILE = "distribution_checks.json"
SCHEMA = "speclab.distribution-checks/1"
# what a row's `distribution_check` gets of a stored check
ROW_FIELDS = ("verdict", "p_value", "tv_detectable_80", "samples", "positions", "prompts", "alpha")


def checks_path(run: str | Path) -> Path:
    """The file of a run directory (or of the run whose results.jsonl `run` is)."""
    return run_file(run, CHECKS_FILE)


def check_key(label: str, workload: str, temperature: float, top_p: float = 1.0, top_k: int = 0) -> str:
    """The key of one check: a method entry's label, a workload and a fixed sampling setting."""
    return f"{label}|{workload}|T={float(temperature):g}|top_p={float(top_p):g}|top_k={int(top_k)}"


def row_key(r: dict[str, Any]) -> str | None:
    """The key of a sampled SD row's check; None for no-SD, greedy and as-logged rows."""
    if r.get("method") in (None, "none") or not is_sampled_row(r):
        return None
    mode, temp, top_p, top_k = row_setting(r)
    if mode != "fixed":
        return None
    return check_key(str(r.get("label") or r.get("method")), str(r.get("workload")), temp, top_p, top_k)


def write_checks(
    run: str | Path,
    checks: dict[str, dict[str, Any]],
    settings: dict[str, Any],
    skipped: dict[str, str] | None = None,
) -> Path:
    """Replace the run's file (atomically) with these checks; returns its path."""
    fields = {"schema": SCHEMA, "settings": settings, "checks": checks, "skipped": dict(skipped or {})}
    return write_run_json(checks_path(run), fields, indent=1)


def read_checks(
    run: str | Path, warn: Callable[[str], None] | None = None
) -> dict[str, dict[str, Any]] | None:
    """{key: check entry} from the run's file; None where there is none, or (after one warning line through
    `warn`, default stderr) where it cannot be read or is not such a file."""
    return read_run_json(
        checks_path(run),
        "checks",
        lambda e: isinstance(e, dict) and isinstance(e.get("check"), dict),
        "a distribution-checks",
        "shown without the distribution checks (`speclab bench check-sampling --run RUN --force` rewrites it)",
        warn,
    )


def merge_checks(
    rows: list[dict[str, Any]], run: str | Path, warn: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """The rows (changed in place, and returned) with `distribution_check` on every sampled SD row whose
    entry, workload and setting the run's file has a check for; other rows, or all of them where there is no
    readable file, stay as they are."""
    checks = read_checks(run, warn)
    if not checks:
        return rows
    for r in rows:
        key = row_key(r)
        e = checks.get(key) if key is not None else None
        if e is None or e["check"].get("verdict") not in ("pass", "fail", "underpowered"):
            continue
        r["distribution_check"] = {k: e["check"].get(k) for k in ROW_FIELDS} | {"key": key}
    return rows


def check_failed(r: dict[str, Any]) -> bool:
    """Whether a row's distribution check failed (its output distribution differs from no SD's)."""
    dc = r.get("distribution_check")
    return isinstance(dc, dict) and dc.get("verdict") == "fail"


def check_lines(rows: list[dict[str, Any]]) -> list[str]:
    """For `bench show`: one line per checked entry, workload and setting (its batch sizes named), with the
    verdict, p value and the total variation detectable at 80% power; a failed check is an ENGINE FAULT.
    Empty where no row has a check."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        dc = r.get("distribution_check")
        if isinstance(dc, dict) and dc.get("key"):
            by_key.setdefault(dc["key"], []).append(r)
    if not by_key:
        return []
    out = [
        f"distribution check (`speclab bench check-sampling --run RUN`): {len(by_key)} sampled SD "
        "entry/workload/setting(s), each against no SD at the same setting:"
    ]
    for rs in by_key.values():
        r, dc = rs[0], rs[0]["distribution_check"]
        sizes = ",".join(str(b) for b in sorted({x.get("batch_size") for x in rs if x.get("batch_size")}))
        p, tv = dc.get("p_value"), dc.get("tv_detectable_80")
        line = (
            f"  {r.get('label', r.get('method'))} {r.get('workload')} T={setting_text(r)} (B={sizes}): "
            f"{str(dc.get('verdict')).upper()}  p = {'-' if p is None else format(p, '.2g')}, detects TV >= "
            f"{'-' if tv is None else format(tv, '.2f')} at 80% power, {dc.get('samples')} samples"
        )
        if dc.get("verdict") == "fail":
            line += "  ENGINE FAULT: output distribution differs from the target's"
        out.append(line)
    return out
