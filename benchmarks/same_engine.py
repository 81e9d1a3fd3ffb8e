"""Proposers compared on ONE engine start-up: each cell is run once per arm, back to back, in rounds.

    python benchmarks/same_engine.py RUN --out DIR [--rounds 5] [--arms FILE.json] [--batch 1,4,16]
        [--workloads offline-chat,...]
    python benchmarks/same_engine.py --summary DIR

RUN is a `speclab bench` run with a no-SD entry: its cells (prompts, batch sizes, max_tokens) and engine
settings (target, dtype, KV cache, max_model_len, ...) are reused. One in-process vLLM engine is started with
`speclab.methods.vllm_custom.SpeclabSwitchProposer` holding every arm (default: `off`, static n-gram k=5
with vLLM's compiled lookup, static suffix k=8 without the global cache, the shipped `adaptive` proposer);
then, round after round, every cell is run once per arm (the arms' order rotated from cell to cell and
round to round), switching the active arm between cells.

Why: on the 2-core CPU an engine start-up's speed differs by 5-30% from the next one and keeps that offset for
its life (docs/bench.md), more than the proposers differ; a bench sweep runs each entry on its own engines,
so its ratios carry those offsets (restarting every round only averages them). Here all arms share one
start-up, and an arm's ratio to `off` in a round compares two runs of the same cell a minute apart.

What it does not measure: vLLM's native n-gram / suffix proposers and a no-SD engine (the static arms are
speclab's adapters of the same rules, the n-gram one with vLLM's own kernel; `off` runs vLLM's SD step with
nothing to verify). A bench run beside it gives those.

Output: DIR/units.jsonl, one line per (round, cell, arm) as it completes (a rerun with the same DIR resumes:
units already there are skipped; each line records its engine start-up, and ratios are only taken within
one), and a table of each arm's median ratio to `off` [min-max over rounds] per workload and batch size,
the adaptive arm's median ratio to the best static arm of that cell (paired per round), and whether its
outputs were token-exact against `off`'s in every round.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

CHILD_ENV = "SPECLAB_SAME_ENGINE_CHILD"
SWITCH = "speclab.methods.vllm_custom.SpeclabSwitchProposer"
DEFAULT_ARMS: dict[str, dict[str, Any]] = {
    "off": {"proposer": "off"},
    "ngram-k5": {"proposer": "ngram", "k": 5, "options": {"min_n": 3, "max_n": 7, "impl": "vllm"}},
    "suffix-k8": {"proposer": "suffix", "k": 8, "options": {"max_cached_requests": 0}},
    "adaptive": {
        "proposer": "adaptive",
        "k": 8,
        "options": {"cost_model": "smollm2-135m-cpu-live", "suffix": {"max_cached_requests": 0}},
    },
}


def none_job(run: Path) -> Path:
    jobs = sorted(run.glob("engines/none-*/attempt-*/job.json"))
    if not jobs:
        raise SystemExit(f"{run}: no engines/none-*/attempt-*/job.json (a run with a no-SD entry is needed)")
    return jobs[-1]


def digest(ids: list[int]) -> str:
    return hashlib.blake2b(json.dumps(ids).encode(), digest_size=8).hexdigest()


def read_units(path: Path) -> list[dict[str, Any]]:
    """The completed units; a torn last line (a killed run) is skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def order(arms: list[str], r: int, c: int) -> list[str]:
    """The arms rotated by round and cell, so no arm always runs first (or right after another)."""
    s = (r + c) % len(arms)
    return arms[s:] + arms[:s]


def summarize(units: list[dict[str, Any]], adaptive: str = "adaptive", off: str = "off") -> list[dict]:
    """Per (workload, batch): each arm's ratios to `off` per round (same start-up), median / min / max;
    the adaptive arm's ratio to the best static arm (highest median ratio among the others), paired per
    round; exactness of every arm's outputs against off's in the same round."""
    by: dict[tuple[str, int], dict[tuple[str, int], dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
    for u in units:
        by[(u["workload"], u["batch_size"])][(u["start"], u["round"])][u["arm"]] = u
    rows = []
    for (w, b), rounds in sorted(by.items()):
        ratios: dict[str, list[float]] = defaultdict(list)
        exact: dict[str, bool] = {}
        for arms in rounds.values():
            if off not in arms:
                continue
            base = arms[off]
            for name, u in arms.items():
                ratios[name].append(u["tok_s"] / base["tok_s"])
                exact[name] = exact.get(name, True) and u["outputs"] == base["outputs"]
        if not ratios:
            continue
        med = {a: statistics.median(v) for a, v in ratios.items()}
        statics = [a for a in med if a not in (off, adaptive)]
        best = max(statics, key=lambda a: med[a]) if statics else None
        vs_best: list[float] = []
        if best is not None and adaptive in med:
            for arms in rounds.values():
                if adaptive in arms and best in arms:
                    vs_best.append(arms[adaptive]["tok_s"] / arms[best]["tok_s"])
        rows.append(
            {
                "workload": w,
                "batch_size": b,
                "ratio_to_off": {a: (med[a], min(v), max(v), len(v)) for a, v in sorted(ratios.items())},
                "exact": exact,
                "best_static": best,
                "adaptive_vs_best": (
                    (statistics.median(vs_best), min(vs_best), max(vs_best), len(vs_best))
                    if vs_best
                    else None
                ),
                "adaptive_wins": sum(x >= 1.0 for x in vs_best),
                "propose_ms": {
                    a: statistics.median(
                        [
                            1e3 * u["propose_s"] / max(u["steps"], 1)
                            for arms in rounds.values()
                            for n, u in arms.items()
                            if n == a
                        ]
                    )
                    for a in ratios
                },
            }
        )
    return rows


def table(rows: list[dict], adaptive: str = "adaptive") -> str:
    arms = sorted({a for r in rows for a in r["ratio_to_off"]})
    head = (
        "| workload | B | "
        + " | ".join(f"{a} / off" for a in arms)
        + " | adaptive / best static | rounds won | exact |"
    )
    lines = [head, "|" + "---|" * (len(arms) + 5)]
    for r in rows:
        cells = []
        for a in arms:
            x = r["ratio_to_off"].get(a)
            cells.append("-" if x is None else f"{x[0]:.3f} [{x[1]:.2f}-{x[2]:.2f}]")
        vb = r["adaptive_vs_best"]
        vs = "-" if vb is None else f"{vb[0]:.3f} [{vb[1]:.2f}-{vb[2]:.2f}] vs {r['best_static']}"
        won = "-" if vb is None else f"{r['adaptive_wins']}/{vb[3]}"
        ok = (
            "yes"
            if all(r["exact"].values())
            else "NO: " + ",".join(a for a, e in r["exact"].items() if not e)
        )
        lines.append(
            f"| {r['workload']} | {r['batch_size']} | " + " | ".join(cells) + f" | {vs} | {won} | {ok} |"
        )
    lines.append("")
    lines.append(
        "proposer ms per step (median over rounds): "
        + "; ".join(
            f"{r['workload']} B{r['batch_size']}: "
            + ", ".join(f"{a} {v:.2f}" for a, v in sorted(r["propose_ms"].items()))
            for r in rows
        )
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from speclab.engine.protocol import EngineSpec, read_job
    from speclab.engine.worker import Engine
    from speclab.methods.vllm_custom import set_arm, switch_arms

    job = read_job(none_job(args.run))
    arms_cfg = json.loads(Path(args.arms).read_text()) if args.arms else DEFAULT_ARMS
    k = max((a.get("k") or 1) for a in arms_cfg.values())
    switch_arms({"arms": arms_cfg}, k)  # bad arms fail here, before an engine starts
    arm_names = list(arms_cfg)
    if "off" not in arm_names:
        raise SystemExit("--arms: an arm named 'off' (proposer off) is the baseline and is required")
    batches = {int(x) for x in args.batch.split(",")} if args.batch else None
    workloads = set(args.workloads.split(",")) if args.workloads else None
    cells = [
        c
        for c in job.cells
        if (batches is None or c.batch_size in batches)
        and (workloads is None or c.cell_id.split(".")[1] in workloads)
    ]
    if not cells:
        raise SystemExit("no cell of the run matches --batch / --workloads")
    cells.sort(key=lambda c: (c.cell_id.split(".")[1], c.batch_size))
    e = job.engine
    spec = EngineSpec(
        target=e.target, dtype=e.dtype, method="custom_class", k=k,
        options={"model": SWITCH, "proposer_options": {"arms": arms_cfg}},
        max_model_len=e.max_model_len, max_num_seqs=max(c.batch_size for c in cells),
        enforce_eager=e.enforce_eager, kv_cache_gib=e.kv_cache_gib, seed=e.seed, llm_kwargs=dict(e.llm_kwargs),
    )  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    units_path = args.out / "units.jsonl"
    done = {(u["round"], u["cell_id"], u["arm"]) for u in read_units(units_path)}
    todo = [
        (r, ci, c, a)
        for r in range(1, args.rounds + 1)
        for ci, c in enumerate(cells)
        for a in order(arm_names, r, ci)
        if (r, c.cell_id, a) not in done
    ]
    if not todo:
        print(f"{args.out}: all {args.rounds} rounds done")
        return 0
    (args.out / "arms.json").write_text(json.dumps({"run": str(args.run), "arms": arms_cfg}, indent=1))
    start = f"{os.getpid()}-{int(time.time())}"
    print(
        f"# starting one engine for {len(arm_names)} arms; {len(todo)} units to run; load {os.getloadavg()}",
        flush=True,
    )
    engine = Engine(spec)
    for a in arm_names:  # each arm's first call (numba compiles, suffix cache) outside any timed cell
        set_arm(a)
        engine.warmup(cells[0])
    t_start = time.time()
    for i, (r, _, c, a) in enumerate(todo, 1):
        set_arm(a)
        res = engine.run_cell(c)
        if res.status != "ok":
            print(f"round {r} {c.cell_id} {a}: {res.status} {res.error}", flush=True)
            continue
        info = res.engine_info or {}
        unit = {
            "start": start,
            "round": r,
            "cell_id": c.cell_id,
            "workload": c.cell_id.split(".")[1],
            "batch_size": c.batch_size,
            "arm": a,
            "tok_s": res.output_tokens / res.elapsed_s,
            "elapsed_s": res.elapsed_s,
            "output_tokens": res.output_tokens,
            "steps": res.steps,
            "propose_s": res.time_split_s.propose if res.time_split_s else 0.0,
            "outputs": digest([t for q in res.requests for t in q.output_token_ids]),
            "loadavg": [info.get("loadavg_start"), info.get("loadavg_end")],
            "cpu_pressure": info.get("cpu_pressure"),
            "time": time.time(),
        }
        with units_path.open("a") as f:
            f.write(json.dumps(unit) + "\n")
        eta = (time.time() - t_start) / i * (len(todo) - i)
        print(
            f"[{i}/{len(todo)}] round {r} {unit['workload']} B{c.batch_size} {a}: {unit['tok_s']:.1f} tok/s "
            f"load {info.get('loadavg_end')} eta {eta / 60:.1f} min",
            flush=True,
        )
    set_arm(None)
    print(table(summarize(read_units(units_path))))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, nargs="?", help="a speclab bench run with a no-SD entry")
    ap.add_argument("--out", type=Path, help="where units.jsonl goes (a rerun resumes)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--arms", default=None, help="JSON file: {NAME: {proposer, k, options}}, one named 'off'")
    ap.add_argument("--batch", default=None, help="batch sizes to run (default: the run's)")
    ap.add_argument("--workloads", default=None, help="workloads to run (default: the run's)")
    ap.add_argument("--summary", type=Path, default=None, metavar="DIR", help="print DIR's table and exit")
    args = ap.parse_args(argv)
    if args.summary is not None:
        print(table(summarize(read_units(args.summary / "units.jsonl"))))
        return 0
    if args.run is None or args.out is None:
        ap.error("RUN and --out are needed (or --summary DIR)")
    if os.environ.get(CHILD_ENV) != "1":
        # the worker's environment (in-process engine, Intel OpenMP preloaded, compile cache) must be set
        # before the process starts: run this script again under it
        from speclab.engine.launch import worker_env
        from speclab.engine.protocol import read_job

        env = worker_env(read_job(none_job(args.run)).engine.kv_cache_gib)
        env[CHILD_ENV] = "1"
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
