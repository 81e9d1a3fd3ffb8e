"""Reading a run's results rows (RUN/results.jsonl, parsed by bench.results.parse_rows) for display: `bench
show`, `speclab analyze` and `speclab report` all go through here.

- `read_rows`: the rows in file order (strict, like the store: a bad line is an error naming file:line).
- `fill_speedups`: speedups a row lacks because its baseline finished after it, filled for display by the
  runner's own `apply_baseline`.
- `entry_labels`: the name of each row's sweep entry. Tables, plots and recommendations key rows by it, so
  two entries with the same method and k but other options stay apart.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from speclab.bench.results import RESULTS, apply_baseline, parse_rows
from speclab.bench.sampling import row_setting
from speclab.errors import ConfigError


def read_rows(run: str | Path, mode: str = "offline") -> list[dict[str, Any]]:
    """The rows of a run's results.jsonl in file order; `run` is the run directory or the file itself.

    mode: "offline" (the default: the engine-batch cells every table, plot and verdict is about), "server"
    (the server-mode cells, `"mode": "server"`, speclab.server) or "all"."""
    run = Path(run)
    path = run / RESULTS if run.is_dir() else run
    if not path.exists():
        if not run.exists():
            raise ConfigError(f"{run}: run directory not found")
        raise ConfigError(f"{run}: no {RESULTS} here (not a bench run directory, or nothing finished yet)")
    rows = list(parse_rows(path).values())
    if mode == "all":
        return rows
    return [r for r in rows if (r.get("mode") == "server") == (mode == "server")]


def baseline_match(r: dict[str, Any]) -> tuple[Any, ...]:
    """The settings a row shares with its no-SD row, from the row's own fields. (The runner matches cells by
    Cell.baseline_key, which also covers engine settings; rows do not record those.)"""
    return (
        r.get("target"),
        r.get("dtype"),
        r.get("workload"),
        r.get("batching"),
        r.get("batch_size"),
        r.get("num_prompts"),
        r.get("max_tokens"),
        r.get("seed"),
        row_setting(r),  # the sampling setting (rows without one: greedy)
    )


def fill_speedups(rows: list[dict[str, Any]]) -> None:
    """Fill, in place, the speedup of ok rows that lack one (their baseline finished later and the run
    stopped before the runner refreshed them), with the same `apply_baseline` the runner uses."""
    base: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        if r.get("method") == "none" and r.get("status") == "ok" and r.get("throughput_tok_s"):
            base[baseline_match(r)] = r
    for r in rows:
        if r.get("speedup") is None and r.get("status") == "ok" and r.get("throughput_tok_s"):
            b = base.get(baseline_match(r))
            if b is not None:
                apply_baseline(r, None, b, None)


def _options_text(options: dict[str, Any]) -> str:
    return ",".join(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in sorted(options.items()))


def entry_labels(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The sweep-entry label of each row, in order.

    Bench rows carry the entry's `label` (unique within a sweep: bench.spec rejects duplicates). A row
    without one (made outside the bench, e.g. analyze.synthetic) is named METHOD@kK ("none" for no SD);
    where such rows share METHOD and K but differ in method_options, each name gets its options appended,
    "ngram@k3(prompt_lookup_max=5,prompt_lookup_min=2)", so they stay apart. Pass all rows of a run (not a
    filtered subset) so that every caller names a row the same way."""
    base = []
    for r in rows:
        label = r.get("label")
        if isinstance(label, str) and label:
            base.append(None)
            continue
        m, k = str(r.get("method")), r.get("k")
        base.append(m if m == "none" or k is None else f"{m}@k{k}")
    variants: dict[str, set[str]] = defaultdict(set)
    for r, b in zip(rows, base, strict=True):
        if b is not None:
            variants[b].add(json.dumps(r.get("method_options") or {}, sort_keys=True))
    out = []
    for r, b in zip(rows, base, strict=True):
        if b is None:
            out.append(str(r["label"]))
        elif len(variants[b]) > 1:
            out.append(f"{b}({_options_text(r.get('method_options') or {})})")
        else:
            out.append(b)
    return out
