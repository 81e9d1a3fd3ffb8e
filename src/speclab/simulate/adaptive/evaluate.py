"""Evaluation of the adaptive policies on every trace set at hand.

    python -m speclab.simulate.adaptive.evaluate --out DIR [--traces NAME=STORE ...] [--synthetic]
        [--cost-model llama3.1-8b-h100-chained] [--batch-sizes 1,2,4,8,16,32,64,128]

Per set and batch size (continuous batching, steady state, speclab's rules): no SD, the best static
(method, k) at that batch size, each single-method oracle, oracle combine, vLLM's batch-size schedule
derived from the same set (schedule:..., the engine's own baseline), and the online policies. Writes
DIR/adaptive_eval.json (rows + per-set summary), DIR/adaptive_eval.csv, DIR/adaptive_eval.md (the
tables) and DIR/adaptive_eval.png (speedup against batch size, one panel per set)."""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path
from typing import Any

from speclab.atomic import atomic_path, atomic_write_text
from speclab.simulate.adaptive.recommend import (
    fixed_config,
    fixed_from_grid,
    schedule_from_grid,
    schedule_spec,
    schedule_support,
    vllm_config,
    zero_k_policy,
)
from speclab.simulate.adaptive.synth import SHAPES, make_set
from speclab.simulate.api import simulate
from speclab.traces import read_store
from speclab.traces.model import RequestTrace

ONLINE = ["adaptive", "adaptive-pooled", "adaptive-gated"]
FIELDS = ["set", "batch_size", "policy", "role", "speedup", "throughput_tok_s"]
KMAX_STATIC = 8


def evaluate_set(
    name: str, traces: list[RequestTrace], cm: str, sizes: list[int]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """All rows for one set, and its summary (the best online policy's share of oracle combine at the
    smallest batch size, and its worst speedup over no SD)."""
    methods = sorted(set.intersection(*(set(t.methods) for t in traces)))
    fixed = [f"fixed:{m}:{k}" for m in methods for k in range(1, KMAX_STATIC + 1)]
    oracles = [f"oracle:{m}" for m in methods] + (
        [f"oracle-combine:{','.join(methods)}"] if len(methods) > 1 else []
    )
    # a schedule's k = 0 for a model-based drafter (it still runs one forward per step): priced, not 1.0x
    zero = {m: z for m in methods if (z := zero_k_policy(m, cm))}
    res_all = simulate(traces, cm, ["none", *fixed, *oracles, *zero.values()], "continuous", sizes)
    res = [r for r in res_all if r.policy not in zero.values()]
    rows: list[dict[str, Any]] = []
    best_static: dict[int, tuple[str, float]] = {}
    for r in res:
        role = "baseline" if r.policy == "none" else "static" if r.policy.startswith("fixed:") else "other"
        role = "oracle" if r.policy.startswith("oracle") else role
        if role == "static" and r.speedup > best_static.get(r.batch_size, ("", 0.0))[1]:
            best_static[r.batch_size] = (r.policy, r.speedup)
        if role != "static":
            rows.append(_row(name, r, role))
    for b, (pol, sp) in best_static.items():
        rows.append({"set": name, "batch_size": b, "policy": pol, "role": "best static", "speedup": sp,
                     "throughput_tok_s": None})  # fmt: skip
    # vLLM's schedule for each method, from the static grid (k = 0 where none beats no SD); one fixed k
    # (the best mean) for a method whose vLLM 0.32 proposer cannot follow a schedule (schedule_support)
    sched = {}
    for m in methods:
        grid: dict[int, dict[int, float]] = {b: {} for b in sizes}
        for r in res_all:
            if r.policy.startswith(f"fixed:{m}:"):
                grid[r.batch_size][int(r.policy.rsplit(":", 1)[1])] = r.speedup
            elif r.policy == zero.get(m):
                grid[r.batch_size][0] = r.speedup
        if schedule_support(m)[0]:
            sched[m] = schedule_spec(m, schedule_from_grid(grid)[0])
        else:
            sched[m] = f"fixed:{m}:{fixed_from_grid(grid)[0]}"
    res2 = simulate(traces, cm, list(sched.values()) + ONLINE, "continuous", sizes)
    for r in res2:
        rows.append(_row(name, r, "online" if r.policy.split(":")[0] in ONLINE else "vllm schedule"))
    b0 = min(sizes)
    comb = [x["speedup"] for x in rows if x["batch_size"] == b0 and x["policy"].startswith("oracle-combine")]
    summary: dict[str, Any] = {"set": name, "requests": len(traces), "methods": methods}
    for pol in ONLINE:
        sp = {x["batch_size"]: x["speedup"] for x in rows if x["policy"] == pol}
        summary[pol] = {
            "share_of_combine_b1": sp[b0] / comb[0] if comb else None,
            "min_speedup": min(sp.values()),
            "min_vs_best_static": min(sp[b] / best_static[b][1] for b in sp if b in best_static),
        }
    best_sched = max(sched.values(), key=lambda s: sum(x["speedup"] for x in rows if x["policy"] == s))
    summary["vllm_schedule"] = best_sched
    if best_sched.startswith("fixed:"):
        m, k = best_sched.removeprefix("fixed:").rsplit(":", 1)
        summary["vllm_config"] = fixed_config(m, int(k))
    else:
        m, rest = best_sched.removeprefix("schedule:").rsplit(":", 1)
        pts = [tuple(int(v) for v in e.split("=")) for e in rest.split(",")]
        summary["vllm_config"] = vllm_config(m, pts, max(sizes))  # type: ignore[arg-type]
    return rows, summary


def _row(name: str, r: Any, role: str) -> dict[str, Any]:
    return {"set": name, "batch_size": r.batch_size, "policy": r.policy, "role": role,
            "speedup": r.speedup, "throughput_tok_s": r.throughput_tok_s}  # fmt: skip


def markdown(rows: list[dict[str, Any]], summaries: list[dict[str, Any]]) -> str:
    """One table per set: a column per batch size, a row per policy (best static names its (method, k))."""
    out = []
    for s in summaries:
        name = s["set"]
        rs = [r for r in rows if r["set"] == name]
        sizes = sorted({r["batch_size"] for r in rs})
        out.append(f"### {name} ({s['requests']} requests; methods {', '.join(s['methods'])})\n")
        out.append("| policy | " + " | ".join(f"B={b}" for b in sizes) + " |")
        out.append("|---|" + "---|" * len(sizes))
        order = ["baseline", "best static", "oracle", "vllm schedule", "other", "online"]
        seen: list[str] = []
        for role in order:
            for pol in dict.fromkeys(r["policy"] for r in rs if r["role"] == role):
                if role == "best static":
                    if "best static" in seen:
                        continue
                    seen.append("best static")
                    cells = []
                    for b in sizes:
                        x = next(r for r in rs if r["role"] == "best static" and r["batch_size"] == b)
                        cells.append(f"{x['speedup']:.2f}x ({x['policy'].removeprefix('fixed:')})")
                    out.append("| best static (method:k) | " + " | ".join(cells) + " |")
                    continue
                sp = {r["batch_size"]: r["speedup"] for r in rs if r["policy"] == pol}
                label = "no SD" if role == "baseline" else pol
                out.append(f"| {label} | " + " | ".join(f"{sp[b]:.2f}x" for b in sizes) + " |")
        for pol in ONLINE:
            v = s[pol]
            share = "-" if v["share_of_combine_b1"] is None else f"{100 * v['share_of_combine_b1']:.0f}%"
            out.append(
                f"\n{pol}: {share} of oracle combine at B={sizes[0]}; worst speedup {v['min_speedup']:.2f}x; "
                f"worst ratio to the best static {v['min_vs_best_static']:.2f}"
            )
        out.append(f"\nvLLM schedule: `{s['vllm_schedule']}`; config `{json.dumps(s['vllm_config'])}`\n")
    return "\n".join(out) + "\n"


def plot(rows: list[dict[str, Any]], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(dict.fromkeys(r["set"] for r in rows))
    ncol = min(3, len(sets))
    nrow = (len(sets) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(5 * ncol, 3.6 * nrow), squeeze=False)
    for ax, name in zip(axes.flat, sets, strict=False):
        rs = [r for r in rows if r["set"] == name]
        for role, style in (("best static", "--"), ("oracle", ":"), ("vllm schedule", "-."), ("online", "-")):
            pols = ["best static"] if role == "best static" else list(
                dict.fromkeys(r["policy"] for r in rs if r["role"] == role))  # fmt: skip
            for pol in pols:
                pts = sorted((r["batch_size"], r["speedup"]) for r in rs
                             if r["role"] == role and (role == "best static" or r["policy"] == pol))  # fmt: skip
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3, label=pol)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("batch size")
        ax.set_ylabel("speedup over no SD (simulated)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(sets) :]:
        ax.axis("off")
    fig.tight_layout()
    with atomic_path(str(path)) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def run(sets: dict[str, list[RequestTrace]], cm: str, sizes: list[int], out: Path) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    summaries = []
    for name, traces in sets.items():
        r, s = evaluate_set(name, traces, cm, sizes)
        rows += r
        summaries.append(s)
    out.mkdir(parents=True, exist_ok=True)
    result = {"cost_model": cm, "batching": "continuous (steady state)", "rows": rows, "summary": summaries}
    atomic_write_text(out / "adaptive_eval.json", json.dumps(result, indent=1) + "\n")
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS)
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(out / "adaptive_eval.csv", buf.getvalue())
    atomic_write_text(out / "adaptive_eval.md", markdown(rows, summaries))
    plot(rows, out / "adaptive_eval.png")
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m speclab.simulate.adaptive.evaluate")
    ap.add_argument("--out", required=True)
    ap.add_argument("--traces", action="append", default=[], help="NAME=STORE (repeatable)")
    ap.add_argument("--synthetic", action="store_true", help="add speclab's synthetic shapes")
    ap.add_argument("--cost-model", default="llama3.1-8b-h100-chained")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32,64,128")
    a = ap.parse_args(argv)
    sets: dict[str, list[RequestTrace]] = {}
    for spec in a.traces:
        name, _, path = spec.partition("=")
        sets[name] = read_store(path)
    if a.synthetic:
        for s in SHAPES:
            sets[s] = make_set(s)
    res = run(sets, a.cost_model, [int(x) for x in a.batch_sizes.split(",")], Path(a.out))
    print(markdown(res["rows"], res["summary"]))


if __name__ == "__main__":
    main()
