"""Print a run's results: a per-cell table and a speedup-by-batch-size summary."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from speclab.bench.categories import category_lines
from speclab.bench.distribution_checks import check_failed, check_lines, merge_checks
from speclab.bench.expected_acceptance import merge_expected
from speclab.bench.noise import describe, load_noise
from speclab.bench.repeats import (
    CONTENDED_LOAD_FACTOR,
    CONTENDED_PRESSURE,
    chosen_pairs,
    contended,
    evidence,
    row_pressure,
)
from speclab.bench.rows import fill_speedups, read_rows
from speclab.bench.sampling import has_sampled, is_sampled_row, row_setting, setting_text


def load_rows(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's offline rows with their speedups, the expected acceptance and engine faults of
    RUN/expected_acceptance.json (`trace crosscheck RUN --expected`) and the distribution checks of
    RUN/distribution_checks.json (`bench check-sampling --run RUN`) merged in."""
    rows = read_rows(run_dir)
    fill_speedups(rows)
    return merge_checks(merge_expected(rows, run_dir), run_dir)


def _sort_key(r: dict[str, Any], method_order: dict[str, int]) -> tuple:
    mode, temp, _, _ = row_setting(r)
    return (
        r.get("workload", ""),
        r.get("batching", ""),
        r.get("batch_size", 0),
        (mode == "as-logged", temp or 0.0, setting_text(r)),
        method_order.get(r.get("label", ""), 99),
    )


def _fmt(v: Any, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def _mib(b: Any) -> str:
    return "-" if b is None else f"{b / 2**20:.0f}"


def _range(spread: Any) -> str:
    if not isinstance(spread, dict) or spread.get("min") is None:
        return "-"
    out = f"{spread['min']:.2f}-{spread['max']:.2f}"
    left = spread.get("contended_left_out")
    return f"{out} ({left} contended left out)" if left else out


def format_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no results)"
    repeated = any(r.get("runs") for r in rows)
    method_order: dict[str, int] = {}
    for r in rows:
        method_order.setdefault(
            r.get("label", ""), len(method_order) + (0 if r.get("method") == "none" else 1)
        )
    rows = sorted(rows, key=lambda r: _sort_key(r, method_order))
    header = [
        "workload",
        "batching",
        "B",
        "method",
        "tok/s",
        "speedup",
        "acc.len",
        "acc/pos",
        "propose/verify/other %",
        "peak MiB",
        "+draft MiB",
        "+peak MiB",
        "token-exact",
        "status",
    ]
    table = []
    for r in rows:
        ts = r.get("time_split_s") or {}
        tot = sum(v for v in ts.values() if v) if ts else 0
        split = (
            "/".join(f"{100 * (ts.get(k) or 0) / tot:.0f}" for k in ("propose", "verify", "other"))
            if tot
            else "-"
        )
        mem = r.get("memory") or {}
        acc = r.get("acceptance_rate_per_pos") or []
        exact = r.get("lossless")
        table.append(
            [
                r.get("workload", ""),
                r.get("batching", ""),
                str(r.get("batch_size", "")),
                r.get("label", r.get("method", "")),
                _fmt(r.get("throughput_tok_s"), ".1f"),
                _fmt(r.get("speedup"), ".2f") + ("x" if r.get("speedup") is not None else ""),
                _fmt(r.get("mean_acceptance_length"), ".2f"),
                " ".join(f"{a:.2f}" for a in acc) if acc else "-",
                split,
                _mib(mem.get("peak_rss_bytes")),
                _mib(mem.get("draft_weights_bytes")) if r.get("method") != "none" else "-",
                _mib(mem.get("added_peak_rss_bytes")) if r.get("method") != "none" else "-",
                "-" if exact is None else ("yes" if exact else "NO"),
                (r.get("status", "") if r.get("status") == "ok" else f"FAILED: {str(r.get('error'))[:60]}")
                + (", ENGINE FAULT" if r.get("engine_fault") or check_failed(r) else ""),
            ]
        )
    right = {2, 4, 5, 6, 9, 10, 11}
    if repeated:  # n runs and the matched-pair speedup range, after the speedup (medians)
        header[6:6] = ["n", "range"]
        for row, r in zip(table, rows, strict=True):
            row[6:6] = [str(r.get("repeats") or 1), _range(r.get("speedup_spread"))]
        right = {2, 4, 5, 6, 7, 8, 11, 12, 13}
    if has_sampled(rows):  # the sampling temperature (or "as logged") after the method
        header.insert(4, "T")
        for row, r in zip(table, rows, strict=True):
            row.insert(4, setting_text(r))
        right = {i + 1 if i >= 4 else i for i in right}
    right = _expected_column(header, table, rows, right)
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(header)]
    lines = []

    def fmt_row(cols: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cols, widths, strict=True))
        ).rstrip()

    lines.append(fmt_row(header))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(fmt_row(row) for row in table)
    return "\n".join(lines)


def _expected_column(
    header: list[str], table: list[list[str]], rows: list[dict[str, Any]], right: set[int]
) -> set[int]:
    """Where a row has an expected mean acceptance length (RUN/expected_acceptance.json): an "exp.acc"
    column after "acc.len" (changed in place); the right-aligned columns after it."""
    if not any(r.get("expected_mean_acceptance_length") is not None for r in rows):
        return right
    at = header.index("acc.len") + 1
    header.insert(at, "exp.acc")
    for row, r in zip(table, rows, strict=True):
        row.insert(at, _fmt(r.get("expected_mean_acceptance_length"), ".2f"))
    return {i + 1 if i >= at else i for i in right} | {at}


def expected_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Sampled SD cells with an expected acceptance: measured vs expected mean acceptance length, and each
    engine fault with its text. Empty where no row has one."""
    known = [r for r in rows if r.get("expected_mean_acceptance_length") is not None or r.get("engine_fault")]
    if not known:
        return []
    out = [
        f"expected acceptance (`speclab trace crosscheck RUN --expected`): {len(known)} sampled SD cell(s); "
        "acc.len measured by the engine vs expected from the replay:"
    ]
    for r in known:
        st = setting_text(r)
        out.append(
            f"  {r.get('label', r.get('method'))} {r.get('workload')} {r.get('batching')} B={r.get('batch_size')} "
            f"{st if st == 'as logged' else 'T=' + st}: measured {_fmt(r.get('mean_acceptance_length'), '.2f')} "
            f"expected {_fmt(r.get('expected_mean_acceptance_length'), '.2f')}"
            + (f"  ENGINE FAULT: {r['engine_fault']}" if r.get("engine_fault") else "")
        )
    return out


def format_speedup_summary(rows: list[dict[str, Any]], noise: dict[str, Any] | None = None) -> str:
    """Speedup over no-SD by batch size: one line per (workload, batching, method). A figure the noise cannot
    back as faster or slower than no SD (`bench.repeats.evidence`, with the run's A/A noise) ends in "?"."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("method") != "none"]
    if not ok:
        return ""
    by_id = {str(r.get("cell_id")): r for r in rows}
    sizes = sorted({r["batch_size"] for r in ok})
    keys: list[tuple[str, str, str]] = []
    cell: dict[tuple[str, str, str, int], str] = {}
    sampled = has_sampled(rows)
    for r in ok:
        label = str(r.get("label", r["method"]))
        k = (r["workload"], r["batching"], f"{label} T={setting_text(r)}" if sampled else label)
        if k not in keys:
            keys.append(k)
        unsure = evidence(r, by_id.get(str(r.get("baseline_cell_id"))), noise)[0] == "unsure"
        sp = r.get("speedup")
        cell[(*k, r["batch_size"])] = _fmt(sp, ".2f") + ("?" if unsure and sp is not None else "")
    keys.sort()
    head = ["workload", "batching", "method"] + [f"B={b}" for b in sizes]
    body = [[w, bt, m] + [cell.get((w, bt, m, b), "-") for b in sizes] for w, bt, m in keys]
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(head)]
    out = ["speedup over no-SD (output tokens/s), by batch size:"]
    out.append(
        "  ".join(
            h.ljust(w) if i < 3 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths, strict=True))
        )
    )
    for row in body:
        out.append(
            "  ".join(
                c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    if any(c.endswith("?") for c in cell.values()):
        out.append(
            "?: the noise cannot tell faster from slower (fewer than 3 quiet matched pairs all on one side of "
            "1.00x, and no interval from the machine's A/A noise clear of it); `speclab report` says what "
            "would decide"
        )
    return "\n".join(out)


def format_run(run_dir: str | Path, rows: list[dict[str, Any]] | None = None) -> str:
    """The run's text summary; `rows`: its rows as `load_rows` gives them (read here when not given)."""
    rd = Path(run_dir)
    rows = load_rows(rd) if rows is None else rows
    parts = []
    cmd = rd / "command.txt"
    if cmd.exists():
        last = [ln for ln in cmd.read_text().splitlines() if ln.strip()]
        if last:
            parts.append(f"command: {last[-1].split('  ', 1)[-1]}")
    first = rows[0] if rows else {}
    parts.append(
        f"target: {first.get('target')}  dtype: {first.get('dtype')}  prompts/cell: {first.get('num_prompts')}  "
        f"max_tokens: {first.get('max_tokens')}  seed: {first.get('seed')}"
    )
    n_ok = sum(1 for r in rows if r.get("status") == "ok")
    parts.append(f"cells: {len(rows)} ({n_ok} ok, {len(rows) - n_ok} failed)")
    reps = sorted({int(r.get("repeats") or 1) for r in rows if r.get("status") == "ok"})
    if reps and reps != [1]:
        parts.append(
            f"repeats: {'/'.join(map(str, reps))} per cell, interleaved with the baseline; tok/s and speedup "
            "are medians (speedup: of matched pairs), range: the pairs' min-max"
        )
    parts.append("")
    parts.append(format_table(rows))
    noise = load_noise(rd)
    summary = format_speedup_summary(rows, noise)
    if summary:
        parts += ["", summary]
        parts.append(
            f"machine noise: {describe(noise)}"
            if noise
            else "machine noise: not measured for this run (python benchmarks/host_noise.py --save RUN)"
        )
    note = contention_note(rows)
    if note:
        parts += ["", f"note: {note}"]
    exact = [r for r in rows if r.get("lossless") is not None]
    if exact:
        n = sum(1 for r in exact if r["lossless"])
        parts += ["", f"token-exact vs no-SD: {n}/{len(exact)} SD cells"]
    n_sampled = sum(1 for r in rows if r.get("method") != "none" and is_sampled_row(r))
    if n_sampled:
        parts += [
            "",
            f"sampled decoding: {n_sampled} SD cell(s) at T > 0 or as logged; token-exactness does not apply "
            "to them (docs/bench.md, Sampled decoding)",
        ]
    expected = expected_lines(rows)
    if expected:
        parts += ["", *expected]
    per_cat = category_lines(rows)
    if per_cat:
        parts += ["", *per_cat]
    checked = check_lines(rows)
    if checked:
        parts += ["", *checked]
    spread = startup_note(rd)
    if spread:
        parts += ["", f"engine start-ups: {spread}"]
    parts += [f"\nnote: {n}" for n in cost_model_notes(rd)]
    return "\n".join(parts)


def cost_model_notes(run_dir: Path) -> list[str]:
    """For each cost model that prices an adaptive entry of the run (proposer_options.cost_model, or the
    proposer's default), a note where it does not fit the run's own engines: a verified draft token's share
    of the step differs by more than PRICE_MISMATCH between the model and the run's decode/verify forwards
    (speclab.costmodel.check; docs/cost-models.md). Such a policy drafts too little or too much on this
    machine. Empty where nothing is priced or the timings cannot say."""
    import json

    try:
        from speclab.costmodel import get_cost_model
        from speclab.costmodel.check import check_rows, decode_rows, mismatch_note, mismatches
        from speclab.live.driver import DEFAULT_COST_MODEL

        sweep = json.loads((run_dir / "sweep.json").read_text())
        names: dict[str, list[str]] = {}
        for m in sweep.get("methods", []):
            opts = (m.get("options") or {}).get("proposer_options")
            if opts is None:
                continue
            names.setdefault(str(opts.get("cost_model", DEFAULT_COST_MODEL)), []).append(
                str(m.get("label") or m.get("name"))
            )
        notes = []
        rows = decode_rows([run_dir]) if names else None  # read once for every model
        for name, labels in names.items():
            bad = mismatches(check_rows(rows, get_cost_model(name)))
            if bad:
                notes.append(f"(pricing {', '.join(labels)}) {mismatch_note(name, bad, str(run_dir))}")
        return notes
    except Exception:  # noqa: BLE001 - missing or foreign sweep/timings files: say nothing rather than fail
        return []


def startup_note(run_dir: Path) -> str | None:
    """How fast each engine start-up of the run ran the same forwards, relative to the median start-up
    (speclab.costmodel.fit.engine_factors on the profiled decode/verify steps, compared at like tokens,
    requests and KV): the noise floor of the run's speedups where engines were started more than once, or
    the offset each entry carries where they were not. None with fewer than two engine processes."""
    from speclab.costmodel.fit import files_engine_factors, read_timing_groups

    try:
        data, groups, names = read_timing_groups([run_dir])
    except Exception:  # noqa: BLE001 - no, torn or foreign timings files: say nothing rather than fail `show`
        return None
    fac = files_engine_factors(data, groups, len(names)) if len(names) > 1 else None
    if fac is None:
        return None
    by_entry: dict[str, list[float]] = {}
    for name, f in zip(names, fac, strict=True):
        entry = Path(name).parent.parent.name.rsplit("-", 1)[0]
        by_entry.setdefault(entry, []).append(float(f))
    widest = max(by_entry.items(), key=lambda kv: max(kv[1]) - min(kv[1]))
    text = (
        f"{len(names)}; each ran the same forwards at {fac.min():.2f}-{fac.max():.2f}x the median start-up's "
        "time (an entry whose engine started once carries its start-up's factor in every repeat)"
    )
    if len(widest[1]) > 1:
        text += f"; widest within one entry: {widest[0]} {' / '.join(f'{x:.2f}' for x in widest[1])}"
    return text


def startup_factors(run_dir: Path) -> dict[tuple[str, int | None], float]:
    """(engine id, repeat) -> that engine start-up's speed factor (startup_note's figures: >1 is slower
    than the median start-up on the same forwards). The repeat is read from the attempt's cells.jsonl
    ("#r<n>" cell ids); an attempt holding several repeats (engines started once) maps each of them, and
    one without repeat tags maps None. Empty where the run's timings cannot give factors."""
    import json

    from speclab.costmodel.fit import files_engine_factors, read_timing_groups

    try:
        data, groups, names = read_timing_groups([run_dir])
    except Exception:  # noqa: BLE001 - no, torn or foreign timings files: no factors
        return {}
    fac = files_engine_factors(data, groups, len(names)) if len(names) > 1 else None
    if fac is None:
        return {}
    out: dict[tuple[str, int | None], float] = {}
    for name, f in zip(names, fac, strict=True):
        attempt = Path(name).parent
        repeats: set[int | None] = set()
        try:
            lines = (attempt / "cells.jsonl").read_text().splitlines()
        except OSError:
            lines = []
        for line in lines:
            try:
                cid = str(json.loads(line).get("cell_id", ""))
            except (json.JSONDecodeError, AttributeError):
                continue
            tag = cid.rpartition("#r")[2] if "#r" in cid else ""
            repeats.add(int(tag) if tag.isdigit() else None)
        for r in repeats:
            out[(attempt.parent.name, r)] = float(f)
    return out


def startup_adjusted_speedup(
    row: dict[str, Any], baseline_row: dict[str, Any], factors: dict[tuple[str, int | None], float]
) -> dict[str, float] | None:
    """The row's matched-pair speedups with each side's engine start-up factor divided out (pair ratio x
    f(SD engine) / f(no-SD engine), for the same pairs the bench's median used: its quiet ones where any
    are quiet). A model-based figure, printed beside the measured one, never instead of it: the factors
    come from target forwards at like shapes, and proposer time on the CPU may not scale with them.
    None where a pair's start-up has no factor."""
    use = chosen_pairs(row.get("speedup_runs") or [])
    if not use:
        return None

    def factor(engine: str, repeat: int | None) -> float | None:
        return factors.get((engine, repeat), factors.get((engine, None)))

    ratios = []
    for p in use:
        fs = factor(row.get("engine_id", ""), p.get("repeat"))
        fb = factor(baseline_row.get("engine_id", ""), p.get("repeat"))
        if fs is None or fb is None:
            return None
        ratios.append(p["speedup"] * fs / fb)
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "n": len(ratios)}


def contention_note(rows: list[dict[str, Any]]) -> str | None:
    """One sentence on the cells measured while other processes competed for the CPUs (None if none)."""
    busy = [r for r in rows if contended(r)]
    if not busy:
        return None
    loads = [r["host"]["loadavg_1m"] for r in busy if (r.get("host") or {}).get("loadavg_1m") is not None]
    pressures = [p for r in busy if (p := row_pressure(r)) is not None]
    seen = []
    if loads:
        seen.append(f"load average up to {max(loads):.1f} on {busy[0]['host'].get('cpus')} CPUs")
    if pressures:
        seen.append(f"some task waiting for a CPU up to {100 * max(pressures):.0f}% of the time")
    return (
        f"{len(busy)} of {len(rows)} cell(s) ran while other processes competed for the CPUs "
        f"({'; '.join(seen)}; contended: CPU pressure above {100 * CONTENDED_PRESSURE:.0f}%, or where "
        f"that is not recorded, load above {CONTENDED_LOAD_FACTOR:g}x the CPU count): their throughputs are noisy and their speedups may be biased; "
        "rerun them on a quiet machine"
    )
