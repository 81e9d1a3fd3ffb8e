"""A server cell's results row: `vllm bench serve`'s result JSON + the /metrics counter deltas.

Row fields beyond the cell's settings (ServerCell.describe): status, error, category, completed,
failed_requests, output_tokens, elapsed_s (the load generator's benchmark duration), throughput_tok_s (output
tokens/s), request_throughput, request_goodput (requests/s meeting every SLO bound; null without an SLO),
goodput_share (good / completed), latency_ms {ttft, tpot, itl, e2el: {mean, p50, p90, p99}}, spec_counters
(from /metrics: num_drafts, num_draft_tokens, num_accepted_tokens, accepted_per_pos; null without SD),
mean_acceptance_length and acceptance_rate_per_pos (vLLM's definitions, from those counters),
bench_serve_spec (vllm bench serve's own reading of the same counters), server_counters (generation tokens,
requests finished), lossless (generated texts identical to the no-SD cell at the same load), result_file,
server {startup_s, log, config}, engine_id, finished_at, host.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from speclab.bench.sampling import is_sampled_row
from speclab.engine.measure import loadavg
from speclab.errors import SpeclabError
from speclab.server.metrics import ServerCounters

METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = ("50", "90", "99")


def latency_table(result: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """{metric: {mean, p50, p90, p99}} in milliseconds from a bench-serve result (missing ones are None)."""
    out: dict[str, dict[str, float | None]] = {}
    for m in METRICS:
        d: dict[str, float | None] = {"mean": _num(result.get(f"mean_{m}_ms"))}
        for p in PERCENTILES:
            d[f"p{p}"] = _num(result.get(f"p{p}_{m}_ms"))
        out[m] = d
    return out


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def read_result(path: Path) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpeclabError(f"{path}: cannot read the bench-serve result: {exc}") from None
    if not isinstance(d, dict) or "completed" not in d:
        raise SpeclabError(f"{path}: not a vllm bench serve result (no 'completed')")
    return d


def acceptance(counters: ServerCounters | None) -> tuple[float | None, list[float]]:
    """vLLM's mean acceptance length (1 + accepted / drafts) and acceptance rate per draft position."""
    sc = counters.spec_counters() if counters is not None else None
    if sc is None or sc.num_drafts <= 0:
        return None, []
    return 1.0 + sc.num_accepted_tokens / sc.num_drafts, [a / sc.num_drafts for a in sc.accepted_per_pos]


def build_server_row(
    settings: dict[str, Any],
    result: dict[str, Any] | None,
    counters: ServerCounters | None,
    *,
    category: str,
    engine_id: str,
    result_file: str | None,
    server: dict[str, Any],
    error: str | None = None,
    cpu_pressure: float | None = None,
) -> dict[str, Any]:
    """The row of one server cell; `result` None (or an error) makes a failed row."""
    row = dict(settings)
    failed = error is not None or result is None
    completed = int(result.get("completed", 0)) if result else 0
    n_failed = int(result.get("failed", 0) or 0) if result else 0
    if not failed and (n_failed or completed < int(settings.get("num_prompts") or 0)):
        errors = [e for e in (result or {}).get("errors") or [] if e]
        error = f"{n_failed} of {settings.get('num_prompts')} requests failed" + (
            f": {str(errors[0]).strip().splitlines()[-1][:200]}" if errors else ""
        )
        failed = True
    mean_len, per_pos = acceptance(counters)
    sc = counters.spec_counters() if counters is not None else None
    goodput = _num((result or {}).get("request_goodput"))
    req_tput = _num((result or {}).get("request_throughput"))
    row.update(
        {
            "status": "failed" if failed else "ok",
            "error": error,
            "category": category,
            "completed": completed,
            "failed_requests": n_failed,
            "output_tokens": int((result or {}).get("total_output_tokens") or 0),
            "elapsed_s": _num((result or {}).get("duration")),
            "throughput_tok_s": _num((result or {}).get("output_throughput")),
            "request_throughput": req_tput,
            "request_goodput": goodput,
            "goodput_share": goodput / req_tput if goodput is not None and req_tput else None,
            "latency_ms": latency_table(result or {}),
            "spec_counters": None
            if sc is None
            else {
                "num_drafts": sc.num_drafts,
                "num_draft_tokens": sc.num_draft_tokens,
                "num_accepted_tokens": sc.num_accepted_tokens,
                "accepted_per_pos": sc.accepted_per_pos,
            },
            "mean_acceptance_length": mean_len,
            "acceptance_rate_per_pos": per_pos,
            "bench_serve_spec": {
                k: (result or {}).get(f"spec_decode_{k}")
                for k in ("num_drafts", "draft_tokens", "accepted_tokens", "acceptance_length")
            }
            if result and "spec_decode_num_drafts" in result
            else None,
            "server_counters": None
            if counters is None
            else {
                "generation_tokens": counters.generation_tokens,
                "prompt_tokens": counters.prompt_tokens,
                "requests_finished": counters.requests_finished,
            },
            "speedup": None,  # a server cell is compared on latency at equal load, not on a throughput ratio
            "lossless": None,
            "lossless_detail": None,
            "baseline_cell_id": None,
            "result_file": result_file,
            "server": server,
            "engine_id": engine_id,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": {"loadavg_1m": loadavg(), "cpus": os.cpu_count(), "cpu_pressure": cpu_pressure},
        }
    )
    return row


def generated_texts(result: dict[str, Any] | None) -> list[str] | None:
    """The generated texts in request order (a result saved with --save-detailed), else None."""
    texts = (result or {}).get("generated_texts")
    return [str(t) for t in texts] if isinstance(texts, list) else None


def apply_server_baseline(
    row: dict[str, Any], mine: list[str] | None, base_row: dict[str, Any] | None, base: list[str] | None
) -> None:
    """Token-exactness at the server, as far as the API shows it: every generated text equal to the no-SD
    cell's at the same load (greedy, so expected in float32)."""
    if row.get("method") == "none" or not base_row or base_row.get("status") != "ok":
        return
    row["baseline_cell_id"] = base_row["cell_id"]
    if is_sampled_row(row):  # token-exactness does not apply to sampled decoding
        row["lossless"] = None
        row["lossless_detail"] = "sampled decoding: token-exactness against no SD does not apply"
        return
    if mine is None or base is None or len(mine) != len(base):
        row["lossless"], row["lossless_detail"] = None, "generated texts not available on both sides"
        return
    differ = [i for i, (a, b) in enumerate(zip(mine, base, strict=True)) if a != b]
    if differ:
        row["lossless"] = False
        row["lossless_detail"] = (
            f"{len(differ)}/{len(mine)} generated texts differ from no-SD (first: request {differ[0]})"
        )
        if row.get("dtype") != "float32":
            row["lossless_detail"] += f" (expected in {row.get('dtype')}: compare in float32)"
    else:
        row["lossless"], row["lossless_detail"] = (
            True,
            f"{len(mine)}/{len(mine)} generated texts identical to no-SD",
        )
