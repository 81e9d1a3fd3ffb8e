"""The results store of a run directory (CONTRACTS.md section 4) and the conversion of worker output into it.

RUN/results.jsonl holds one JSON line per cell, rewritten atomically on every change (a reader or a killed run
never sees half a line); a cell that failed and later succeeds replaces its row. RUN/traces/ holds one trace
part per ok cell, named after the cell (writing it again replaces it, so re-ingesting a cell never duplicates
its traces).
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from speclab.atomic import atomic_path, atomic_write_text
from speclab.bench.cells import Cell
from speclab.bench.repeats import apply_pairs
from speclab.bench.sampling import is_sampled_row
from speclab.catalog import trace_method_name
from speclab.engine.measure import loadavg
from speclab.engine.protocol import CellResult
from speclab.errors import ConfigError
from speclab.traces.model import RequestTrace
from speclab.traces.store import read_store, records_to_table

RESULTS = "results.jsonl"
TRACES = "traces"


def write_run_files(run_dir: Path, spec: Any, spec_text: str | None, command_line: str | None) -> None:
    """The sweep as given (sweep.toml) and as understood (sweep.json), and the command line appended to
    command.txt: what a resumed or shown run reads back."""
    if spec_text is not None:
        atomic_write_text(run_dir / "sweep.toml", spec_text)
    atomic_write_text(run_dir / "sweep.json", json.dumps(spec.to_dict(), indent=2) + "\n")
    if command_line:
        with open(run_dir / "command.txt", "a") as fh:
            fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  {command_line}\n")


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold a run directory for one sweep at a time (offline or server mode); a second one fails at once."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{run_dir}: another `speclab bench` is running on this directory") from None
        yield


def parse_rows(path: Path) -> dict[str, dict[str, Any]]:
    """cell_id -> row, in file order; the one parser of results.jsonl (the store, `bench show`, analyze, report).

    Strict: the file is only ever rewritten whole (atomically), so a bad line was edited by hand, and a report
    or a resumed sweep that skipped it would silently lose a cell. A bad line is a one-line error naming
    file:line. A cell_id seen twice keeps its last row, as the store does when it replaces a row."""
    rows: dict[str, dict[str, Any]] = {}
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{path}:{i}: not valid JSON ({exc.msg}); edited by hand? fix or delete the line"
            ) from None
        if not isinstance(row, dict) or "cell_id" not in row:
            raise ConfigError(
                f"{path}:{i}: not a results row (a JSON object with a cell_id); fix or delete the line"
            )
        rows[row["cell_id"]] = row
    return rows


class ResultsStore:
    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / RESULTS
        self.rows: dict[str, dict[str, Any]] = {}
        self._load()

    def _load(self) -> None:
        if self.path.exists():
            self.rows = parse_rows(self.path)

    def is_ok(self, cell_id: str) -> bool:
        r = self.rows.get(cell_id)
        return r is not None and r.get("status") == "ok"

    def put(self, row: dict[str, Any]) -> None:
        """Add or replace one row and rewrite the file atomically."""
        self.rows[row["cell_id"]] = row
        self._flush()

    def redo(self, cell_ids: list[str], globs: list[str], what: str = "cell") -> list[str]:
        """Forget the rows of the cells matching any of the globs (`--redo`), so they are measured again;
        returns their ids. No match is an error (`what` names the cells in it)."""
        again = [cid for cid in cell_ids if any(fnmatch.fnmatch(cid, g) for g in globs)]
        if not again:
            raise ConfigError(f"--redo {' '.join(globs)}: matches no {what} of this sweep")
        for cid in again:
            self.rows.pop(cid, None)
        self.flush()
        return again

    def flush(self) -> None:
        self._flush()

    def _flush(self) -> None:
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in self.rows.values())
        atomic_write_text(self.path, text)

    def ordered(self) -> list[dict[str, Any]]:
        return list(self.rows.values())


# --- metrics ----------------------------------------------------------------------------------------------


def acceptance_stats(res: CellResult) -> tuple[float | None, list[float], float | None]:
    """(mean acceptance length, acceptance rate per draft position, mean tokens per decode step).

    Mean acceptance length follows vLLM: 1 + accepted / drafts, over steps where something was drafted.
    Tokens per step also counts steps where the proposer offered nothing (an n-gram miss)."""
    sc = res.spec_counters
    reqs = res.requests
    mean_len: float | None = None
    per_pos: list[float] = []
    if sc is not None and sc.num_drafts > 0:
        mean_len = 1.0 + sc.num_accepted_tokens / sc.num_drafts
        per_pos = [a / sc.num_drafts for a in sc.accepted_per_pos]
    else:
        steps = [a for r in reqs for a in (r.per_step_accepted or [])]
        if steps:
            mean_len = 1.0 + sum(steps) / len(steps)
            width = max((d for r in reqs for d in (r.per_step_drafted or [])), default=0)
            per_pos = [sum(1 for a in steps if a > i) / len(steps) for i in range(width)]
    tps: float | None = None
    if any(r.per_step_accepted is not None for r in reqs):
        tokens = 0
        steps_total = 0
        for r in reqs:
            acc = r.per_step_accepted or []
            produced = max(len(r.output_token_ids) - 1, 0)  # the first token comes from prefill
            sd_tokens = sum(a + 1 for a in acc)
            steps_total += len(acc) + max(produced - sd_tokens, 0)
            tokens += produced
        tps = tokens / steps_total if steps_total else None
    return mean_len, per_pos, tps


def copies_identical(res: CellResult) -> bool | None:
    """Under replicate batching: did every copy of a prompt produce the same tokens?"""
    by_prompt: dict[str, list[int]] = {}
    seen_copies = False
    for r in res.requests:
        if r.copy:
            seen_copies = True
        first = by_prompt.setdefault(r.id, r.output_token_ids)
        if first != r.output_token_ids:
            return False
    return True if seen_copies else None


def lossless_check(res: CellResult, baseline: dict[str, list[int]]) -> tuple[bool | None, str]:
    """Compare every request's output with the no-SD output of the same prompt, token for token."""
    if not baseline:
        return None, "no baseline outputs"
    total = 0
    differ: list[str] = []
    first_detail = ""
    for r in res.requests:
        ref = baseline.get(r.id)
        if ref is None:
            continue
        total += 1
        out = r.output_token_ids
        if out != ref:
            differ.append(r.id)
            if not first_detail:
                pos = next(
                    (i for i, (a, b) in enumerate(zip(out, ref, strict=False)) if a != b),
                    min(len(out), len(ref)),
                )
                first_detail = f"; first: prompt {r.id} copy {r.copy} at output position {pos}"
    if total == 0:
        return None, "no matching prompts in the baseline"
    if differ:
        return False, f"{len(differ)}/{total} outputs differ from no-SD{first_detail}"
    return True, f"{total}/{total} outputs identical to no-SD"


def baseline_outputs(run_dir: Path, row: dict[str, Any]) -> dict[str, list[int]]:
    """prompt id -> output token ids of a baseline cell, read back from its trace part."""
    part = row.get("trace_part")
    if not part:
        return {}
    path = run_dir / part
    if not path.exists():
        return {}
    out: dict[str, list[int]] = {}
    for rec in read_store(path, validate=False):
        pid = rec.meta.get("prompt_id", rec.id)
        if rec.output_token_ids is not None:
            out[pid] = [int(t) for t in rec.output_token_ids]
    return out


# --- rows and traces --------------------------------------------------------------------------------------


def effective_options(method: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options the method ran with (custom_class: speclab's adapters read proposer_options)."""
    if method == "custom_class":
        from speclab.live.vllm_custom import adapter_options

        return adapter_options(options)
    return dict(options)


def trace_records(
    cell: Cell,
    res: CellResult,
    prompts: dict[str, list[int]],
    category: str,
    max_model_len: int | None = None,
    sampling: dict[str, dict[str, Any]] | None = None,
    categories: dict[str, str] | None = None,
) -> list[RequestTrace]:
    """One trace record per request (under replicate: the first copy of each prompt). meta["observed"]
    also records the method's effective options and the engine's max_model_len, for the cross-check;
    meta["sampling"] the request's sampling ({temperature, top_p, top_k, seed}; `sampling`: prompt id -> its
    PromptSpec.sampling), absent for greedy requests. `categories`: prompt id -> its own category (mixed and
    file workloads, bench/categories.py); other requests get `category`."""
    records = []
    observed_name = trace_method_name(cell.method.name, cell.method.options)
    options = effective_options(cell.method.name, cell.method.options)
    for r in res.requests:
        if r.copy:
            continue
        pids = prompts.get(r.id)
        meta: dict[str, Any] = {
            "prompt_id": r.id,
            "cell_id": cell.cell_id,
            "target": cell.target,
            "dtype": cell.dtype,
            "batching": cell.batching,
            "batch_size": cell.batch_size,
            "finish_reason": r.finish_reason,
            "source": "bench",
        }
        own = (sampling or {}).get(r.id)
        if own:
            meta["sampling"] = {k: own.get(k) for k in ("temperature", "top_p", "top_k", "seed")}
        if cell.method.name != "none" and r.per_step_accepted is not None:
            meta["observed"] = {
                "method": observed_name,
                "k": cell.method.k,
                "per_step_accepted": list(r.per_step_accepted),
                "per_step_drafted": list(r.per_step_drafted or []),
                "options": options,
            }
            if max_model_len is not None:
                meta["observed"]["max_model_len"] = max_model_len
        records.append(
            RequestTrace(
                id=f"{cell.cell_id}:{r.id}",
                workload=cell.workload,
                category=(categories or {}).get(r.id, category),
                prompt_len=len(pids) if pids is not None else r.prompt_len,
                output_len=len(r.output_token_ids),
                methods={},
                prompt_token_ids=pids,
                output_token_ids=r.output_token_ids,
                meta=meta,
            )
        )
    return records


def write_trace_part(run_dir: Path, cell_id: str, records: list[RequestTrace]) -> str:
    """Write (or replace) the cell's trace part; returns its path relative to the run directory."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in cell_id)
    rel = f"{TRACES}/part-{safe}.parquet"
    target = run_dir / rel
    table = records_to_table(records)
    with atomic_path(target) as tmp:
        pq.write_table(table, tmp)
    return rel


def build_row(
    cell: Cell,
    res: CellResult,
    *,
    category: str,
    engine_id: str,
    trace_part: str | None,
    baseline_row: dict[str, Any] | None,
    baseline_out: dict[str, list[int]] | None,
) -> dict[str, Any]:
    row = cell.describe()
    row.update(
        {
            "status": res.status,
            "error": res.error,
            "category": category,
            "output_tokens": res.output_tokens,
            "elapsed_s": res.elapsed_s,
            "throughput_tok_s": res.output_tokens / res.elapsed_s if res.elapsed_s > 0 else None,
            "speedup": None,
            "baseline_cell_id": None,
            "mean_acceptance_length": None,
            "acceptance_rate_per_pos": [],
            "mean_tokens_per_step": None,
            "time_split_s": {
                "propose": res.time_split_s.propose,
                "verify": res.time_split_s.verify,
                "other": res.time_split_s.other,
            },
            "memory": {
                "peak_rss_bytes": res.memory.peak_rss_bytes,
                "weights_bytes": res.memory.weights_bytes,
                "kv_cache_bytes": res.memory.kv_cache_bytes,
                "draft_weights_bytes": res.memory.draft_weights_bytes,
            },
            "lossless": None,
            "lossless_detail": None,
            # sampled copies draw with their own seeds: they are meant to differ
            "copies_identical": copies_identical(res)
            if cell.batching == "replicate" and not cell.sampled
            else None,
            "steps": res.steps,
            # vLLM's spec-decode counters over the cell (the server-mode cross-check compares them with /metrics)
            "spec_counters": None if res.spec_counters is None else asdict(res.spec_counters),
            "num_requests": len(res.requests),
            "trace_part": trace_part,
            "engine_id": engine_id,
            "engine_info": res.engine_info,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            # other processes competing for the CPUs make throughputs noisy: keep the evidence
            "host": {"loadavg_1m": loadavg(), "cpus": os.cpu_count()},
        }
    )
    if res.status == "ok" and not cell.is_baseline:
        mean_len, per_pos, tps = acceptance_stats(res)
        row["mean_acceptance_length"] = mean_len
        row["acceptance_rate_per_pos"] = per_pos
        row["mean_tokens_per_step"] = tps
    if res.status == "ok":
        apply_baseline(row, res, baseline_row, baseline_out)
    return row


def apply_baseline(
    row: dict[str, Any],
    res: CellResult | None,
    baseline_row: dict[str, Any] | None,
    baseline_out: dict[str, list[int]] | None,
) -> None:
    """Fill speedup and token-exactness of an ok row from its no-SD cell (if that is done and ok)."""
    if row["method"] == "none":
        row["speedup"] = 1.0
        return
    if not baseline_row or baseline_row.get("status") != "ok":
        return
    row["baseline_cell_id"] = baseline_row["cell_id"]
    # memory the method adds over no-SD, as the process sees it (draft weights, its KV cache, buffers)
    peak = (row.get("memory") or {}).get("peak_rss_bytes")
    base_peak = (baseline_row.get("memory") or {}).get("peak_rss_bytes")
    if peak is not None and base_peak is not None:
        row["memory"]["added_peak_rss_bytes"] = peak - base_peak
    b = baseline_row.get("throughput_tok_s")
    t = row.get("throughput_tok_s")
    if b and t:
        row["speedup"] = t / b
    if row.get("runs"):  # repeats: the median of matched pairs instead of the ratio of medians
        apply_pairs(row, baseline_row)
    if is_sampled_row(row):  # token-exactness does not apply to sampled decoding (docs/bench.md)
        row["lossless"] = None
        row["lossless_detail"] = "sampled decoding: token-exactness against no SD does not apply"
        return
    if res is not None and baseline_out is not None:
        ok, detail = lossless_check(res, baseline_out)
        if row["dtype"] != "float32" and ok is False:
            detail += f" (expected in {row['dtype']}: batch shape changes rounding; compare in float32)"
        row["lossless"], row["lossless_detail"] = ok, detail
