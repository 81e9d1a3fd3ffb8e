"""The report's per-category section: cells whose prompts span several categories (a mixed workload, or a
file whose lines name their own), broken down per category, and the hand-configurable baselines simulated
on the run's traces where RUN/adaptive/baselines.json holds them (python -m
speclab.simulate.adaptive.baselines STORE --out RUN/adaptive)."""

from __future__ import annotations

import json
from typing import Any

from speclab.bench.rows import entry_labels
from speclab.report.data import ReportData
from speclab.report.html import esc, table

HEADERS = ["workload", "batching", "B", "entry", "speedup (cell)", "category", "requests", "output tokens",
           "acc len", "tokens/step"]  # fmt: skip


def _num(v: Any, spec: str = ".2f") -> Any:
    return "-" if v is None else format(v, spec)


def breakdown_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    labels = entry_labels(rows)
    out = []
    for r, label in zip(rows, labels, strict=True):
        if r.get("status") != "ok" or not r.get("per_category"):
            continue
        for cat, v in r["per_category"].items():
            out.append([
                r.get("workload"), r.get("batching"), r.get("batch_size"), label, _num(r.get("speedup")), cat,
                v.get("num_requests"), v.get("output_tokens"), _num(v.get("mean_acceptance_length")),
                _num(v.get("mean_tokens_per_step")),
            ])  # fmt: skip
    return out


def baselines_rows(res: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """The hand baselines (simulate.adaptive.baselines) as a table: a row per baseline, a column per B."""
    sizes = sorted(res["static"], key=int)
    heads = ["baseline", *(f"B={b}" for b in sizes)]

    def cell(pair: list[Any]) -> str:
        return f"{pair[1]:.2f}x ({str(pair[0]).removeprefix('fixed:')})"

    body = [["best static", *(cell(res["best_static"][b]) for b in sizes)]]
    for c, v in res["per_category"].items():
        body.append([f"{c} alone ({v['requests']} req)", *(cell(v["best"][b]) for b in sizes)])
    body.append(["per-category static routing", *(f"{res['routed'][b]['speedup']:.2f}x" for b in sizes)])
    s = res.get("schedule")
    if s:
        sp = {str(k): v for k, v in s["speedup"].items()}
        body.append([f"vLLM {s['kind']} {s['policy']}", *(f"{sp[str(b)]:.2f}x" for b in sizes)])
    return heads, body


def section(d: ReportData) -> list[str]:
    body = breakdown_rows(d.rows or [])
    path = d.run_path / "adaptive" / "baselines.json" if d.run_path else None
    res = None
    if path is not None and path.is_file():
        try:
            res = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            res = None
    if not body and res is None:
        return []
    h = ['<h2 id="categories">Per category</h2>']
    if body:
        h.append(
            "<p>Cells whose prompts span several categories, per category. Speedup is the cell's: its "
            "categories share one engine batch, so throughput cannot be split between them; acceptance "
            "length (steps with a proposal), tokens per step and output tokens can.</p>"
        )
        h.append(table(HEADERS, body, left=6))
    if res is not None:
        heads, rows = baselines_rows(res)
        h.append(
            f"<p>Baselines a user could configure by hand, simulated on the run's traces "
            f"(cost model {esc(res.get('cost_model', '?'))}, continuous batching, steady state): the best "
            "static configuration for all requests, each category's own best, every request on its "
            "category's best in one mixed batch (routing by request type), and vLLM's batch-size "
            "schedule.</p>"
        )
        h.append(table(heads, rows))
    return h
