"""Proposers compared on ONE engine start-up: each cell is run once per arm, back to back, in rounds.

    python benchmarks/same_engine.py RUN --out DIR [--rounds 5] [--arms FILE.json] [--batch 1,4,16]
        [--workloads offline-chat,...] [--chunk 4]
    python benchmarks/same_engine.py --summary DIR [DIR ...]

RUN is a `speclab bench` run with a no-SD entry: its cells (prompts, batch sizes, max_tokens) and engine
settings (target, dtype, KV cache, max_model_len, ...) are reused. One in-process vLLM engine is started with
`speclab.methods.vllm_custom.SpeclabSwitchProposer` holding every arm (default: `off`, static n-gram k=5
with vLLM's compiled lookup, static suffix k=8 without the global cache, the adaptive proposer as shipped);
then, round after round, every cell is run once per arm (the arms' order rotated from cell to cell and
round to round), switching the active arm between cells.
`--chunk N` runs each batch-1 cell in parts of N prompts with the arms rotated
per part (a batch-1 cell takes 10-25 s per arm on the 2-core CPU, long enough for the machine's speed to
move between two arms); the parts are summed per round before the arms are compared. Resume with the same
options.

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
outputs were token-exact against `off`'s in every round. Below it, each adaptive arm's 95% interval for its
median paired ratio (to the best static arm, and to `off`): the sign test's, distribution-free and exact
(`speclab.bench.repeats.median_interval`; at least 6 rounds), read as ahead / behind / level.

A/A control: an arm named `off-...` with proposer `off` does the same work as `off`; its interval against
`off` is what these rounds can resolve on this machine (benchmarks/arms/resolution.json). It is never taken
as the best static arm.
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

sys.path.insert(0, str(Path(__file__).parent))
from bench_adaptive_driver import none_job  # noqa: E402

from speclab.bench.repeats import interval_verdict, median_interval  # noqa: E402

CHILD_ENV = "SPECLAB_SAME_ENGINE_CHILD"
SWITCH = "speclab.methods.vllm_custom.SpeclabSwitchProposer"
DEFAULT_ARMS: dict[str, dict[str, Any]] = {
    "off": {"proposer": "off"},
    "ngram-k5": {"proposer": "ngram", "k": 5, "options": {"min_n": 3, "max_n": 7, "impl": "vllm"}},
    "suffix-k8": {"proposer": "suffix", "k": 8, "options": {"max_cached_requests": 0}},
    "adaptive": {
        "proposer": "adaptive",
        "k": 8,
        "options": {"cost_model": "smollm2-135m-cpu-live"},  # the engine default: n-gram probe, pooled
    },
}


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


def is_adaptive(arm: str) -> bool:
    """Arms compared against the best static one: those named adaptive* (the default arms file's naming)."""
    return arm.startswith("adaptive")


def is_control(arm: str, off: str = "off") -> bool:
    """A second arm that drafts nothing (named off*, e.g. `off-again`, proposer off): an A/A control whose
    ratio to `off` is the machine's noise on the same work, never a candidate for the best static arm."""
    return arm != off and arm.startswith(off)


def merge_parts(units: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Units of one cell run in parts (--chunk: `part` = i of n) summed into one per (start-up, round, cell,
    arm): tokens over seconds; its outputs are the parts' digests in part order (compared with off's). A
    cell with a part missing (a run that died within a round) is left out."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for u in units:
        groups[(u["start"], u["round"], u["cell_id"], u["arm"])].append(u)
    out = []
    for us in groups.values():
        parts = us[0].get("parts", 1)
        if len({u.get("part", 0) for u in us}) < parts:
            continue
        us = sorted({u.get("part", 0): u for u in us}.values(), key=lambda u: u.get("part", 0))
        tokens = sum(u["output_tokens"] for u in us)
        elapsed = sum(u["elapsed_s"] for u in us)
        out.append(
            dict(
                us[0],
                tok_s=tokens / elapsed,
                output_tokens=tokens,
                elapsed_s=elapsed,
                steps=sum(u["steps"] for u in us),
                propose_s=sum(u["propose_s"] for u in us),
                outputs="/".join(u["outputs"] for u in us),
            )
        )
    return out


def split_cell(cell: Any, chunk: int | None) -> list[tuple[Any, int, int]]:
    """(sub-cell, part, parts): a batch-1 cell split into runs of `chunk` prompts (the same requests one
    after another, so the arms can alternate every few seconds instead of every cell); other cells whole
    (splitting a B > 1 cell would change its batch)."""
    if not chunk or cell.batch_size != 1 or len(cell.prompts) <= chunk:
        return [(cell, 0, 1)]
    from dataclasses import replace

    pieces = [cell.prompts[i : i + chunk] for i in range(0, len(cell.prompts), chunk)]
    return [(replace(cell, prompts=p), i, len(pieces)) for i, p in enumerate(pieces)]


def summarize(units: list[dict[str, Any]], off: str = "off") -> list[dict]:
    """Per (workload, batch): each arm's ratios to `off` per round (same start-up, same round), median /
    min / max / count; each adaptive arm's ratio to the best static arm (the highest median ratio among the
    arms that are neither off nor adaptive), paired per round, and the rounds it was at least as fast;
    exactness of every arm's outputs against off's in the same round; the proposer's median ms per step."""
    by: dict[tuple[str, int], dict[tuple[str, int], dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
    for u in merge_parts(units):
        by[(u["workload"], u["batch_size"])][(u["start"], u["round"])][u["arm"]] = u
    rows = []
    for (w, b), rounds in sorted(by.items()):
        ratios: dict[str, list[float]] = defaultdict(list)
        exact: dict[str, bool] = {}
        paired = [arms for arms in rounds.values() if off in arms]
        for arms in paired:
            base = arms[off]
            for name, u in arms.items():
                ratios[name].append(u["tok_s"] / base["tok_s"])
                exact[name] = exact.get(name, True) and u["outputs"] == base["outputs"]
        if not ratios:
            continue
        med = {a: statistics.median(v) for a, v in ratios.items()}
        statics = [a for a in med if a != off and not is_adaptive(a) and not is_control(a, off)]
        best = max(statics, key=lambda a: med[a]) if statics else None
        vs_best: dict[str, tuple[float, float, float, int, int]] = {}
        interval: dict[str, dict[str, Any]] = {}
        for a in (x for x in med if is_adaptive(x) or is_control(x, off)):
            # a control (A/A) arm is only read against off: its interval is the resolution of these rounds
            r = [
                arms[a]["tok_s"] / arms[best]["tok_s"]
                for arms in paired
                if best and is_adaptive(a) and a in arms and best in arms
            ]
            if r:
                vs_best[a] = (statistics.median(r), min(r), max(r), len(r), sum(x >= 1.0 for x in r))
            for what, xs in (("vs_best", r), ("vs_off", ratios[a])):
                if xs:
                    iv = median_interval(xs)
                    interval.setdefault(a, {})[what] = (iv, interval_verdict(iv, len(xs)))
        per_step = defaultdict(list)
        for arms in paired:
            for a, u in arms.items():
                per_step[a].append(1e3 * u["propose_s"] / max(u["steps"], 1))
        rows.append(
            {
                "workload": w,
                "batch_size": b,
                "ratio_to_off": {a: (med[a], min(v), max(v), len(v)) for a, v in sorted(ratios.items())},
                "exact": exact,
                "best_static": best,
                "vs_best": vs_best,
                "interval": interval,
                "propose_ms": {a: statistics.median(v) for a, v in sorted(per_step.items())},
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    """Markdown: ratios to off, then each adaptive arm against the best static arm, exactness, proposer time."""
    arms = sorted({a for r in rows for a in r["ratio_to_off"]}, key=lambda a: (a != "off", is_adaptive(a), a))
    adaptive = [a for a in arms if is_adaptive(a)]
    head = ["workload", "B", *(f"{a} / off" for a in arms[1:]), "best static"]
    head += [f"{a} / best static (rounds >=)" for a in adaptive] + ["exact"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["workload"], str(r["batch_size"])]
        for a in arms[1:]:
            x = r["ratio_to_off"].get(a)
            cells.append("-" if x is None else f"{x[0]:.3f} [{x[1]:.2f}-{x[2]:.2f}]")
        cells.append(r["best_static"] or "-")
        for a in adaptive:
            v = r["vs_best"].get(a)
            cells.append("-" if v is None else f"{v[0]:.3f} [{v[1]:.2f}-{v[2]:.2f}] ({v[4]}/{v[3]})")
        bad = [a for a, e in r["exact"].items() if not e]
        cells.append("yes" if not bad else "NO: " + ",".join(bad))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "95% distribution-free interval of the median paired ratio (sign test; exact coverage in"
        " parentheses) and what it says:"
    )
    for r in rows:
        for a, got in r.get("interval", {}).items():
            parts = []
            for what, label in (("vs_best", f"/ {r['best_static']}"), ("vs_off", "/ off")):
                if what not in got:
                    continue
                iv, verdict = got[what]
                span = "-" if iv is None else f"[{iv[0]:.3f}-{iv[1]:.3f}] ({iv[2]:.3f})"
                parts.append(f"{label} {span} {verdict}")
            lines.append(f"- {r['workload']} B = {r['batch_size']}, {a}: " + "; ".join(parts))
    lines.append("")
    lines.append("proposer ms per engine step, median over rounds:")
    for r in rows:
        ms = ", ".join(f"{a} {v:.2f}" for a, v in r["propose_ms"].items() if a != "off")
        lines.append(f"- {r['workload']} B = {r['batch_size']}: {ms}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from speclab.engine.protocol import EngineSpec, read_job
    from speclab.engine.worker import Engine
    from speclab.methods.vllm_custom import set_arm, switch_arms

    job = read_job(none_job(args.run))
    arms_cfg = json.loads(Path(args.arms).read_text()) if args.arms else DEFAULT_ARMS
    if not isinstance(arms_cfg, dict):
        raise SystemExit("--arms: expected a JSON object {NAME: {proposer, k, options}}")
    ks = [a["k"] for a in arms_cfg.values() if isinstance(a, dict) and isinstance(a.get("k"), int)]
    if not ks:
        raise SystemExit(
            "--arms: give at least one arm a k (the engine's num_speculative_tokens is the largest)"
        )
    k = max(ks)  # an arm without k drafts up to it
    try:
        switch_arms({"arms": arms_cfg}, k)  # bad arms fail here, before an engine starts
    except ValueError as exc:
        raise SystemExit(f"--arms: {exc}") from None
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
    done = {(u["round"], u["cell_id"], u.get("part", 0), u["arm"]) for u in read_units(units_path)}
    units_todo = [piece for c in cells for piece in split_cell(c, args.chunk)]
    todo = [
        (r, ui, piece, a)
        for r in range(1, args.rounds + 1)
        for ui, piece in enumerate(units_todo)
        for a in order(arm_names, r, ui)
        if (r, piece[0].cell_id, piece[1], a) not in done
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
    for i, (r, _, (c, part, parts), a) in enumerate(todo, 1):
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
            "part": part,
            "parts": parts,
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
            f"[{i}/{len(todo)}] round {r} {unit['workload']} B{c.batch_size}"
            + (f" part {part + 1}/{parts}" if parts > 1 else "")
            + f" {a}: {unit['tok_s']:.1f} tok/s "
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
    ap.add_argument(
        "--chunk",
        type=int,
        default=None,
        metavar="N",
        help="run batch-1 cells in parts of N prompts, the arms rotated per part (finer interleaving)",
    )
    ap.add_argument(
        "--summary",
        type=Path,
        nargs="+",
        default=None,
        metavar="DIR",
        help="print the table of DIRs' units and exit",
    )
    args = ap.parse_args(argv)
    if args.summary is not None:
        print(table(summarize([u for d in args.summary for u in read_units(d / "units.jsonl")])))
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
