"""The live adaptive proposer over an EAGLE-3 head against the static configurations it chooses among, as arms
of ONE engine start-up, in rotated rounds (docs/adaptive.md, "Arms of one engine").

One start-up of a CPU engine runs the same forward 5-30% faster or slower than another for its whole life,
more than the configurations differ, so comparing engines started apart mixes that in. Here one engine runs
the sweep entry's model drafter with the adaptive adapter (speclab.live.vllm_eagle), and each arm is one of
the adapter's modes, set between cells: `adaptive`, `ngram:K` (vLLM's lookup alone, the head's forward
skipped), `eagle3:K` (the head alone), `off`. Two arms with the same mode are an A/A control: what one
start-up resolves. Each round runs every batch size's cell under every arm, the arms' order rotated per round.

    speclab bench --preset adaptive-mixed-cpu --methods none --repeats 1 --out runs/mixed-none
    .venv/bin/python -m benchmarks.live_arms --preset adaptive-mixed-cpu --entry adaptive-eagle3 \\
        --reference runs/mixed-none --rounds 8 --out runs/mixed-arms

Every SD output is compared token for token with the reference run's no-SD cell of the same prompts and batch
size. Records go to OUT/arms.jsonl as each cell finishes (a rerun resumes); the summary (per batch size: each
arm's throughput, adaptive / best static and the A/A ratio as medians of per-round ratios with their 95%
sign-test interval, tokens per step per category) to OUT/summary.{json,md}. `--summarise` only reads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

DEFAULT_ARMS = "adaptive=adaptive,ngram=ngram:3,eagle3=eagle3:3,eagle3-again=eagle3:3"
DEFAULT_AA = "eagle3,eagle3-again"
CHILD_ENV = "SPECLAB_LIVE_ARMS_CHILD"


def parse_arms(text: str) -> dict[str, str]:
    """LABEL=MODE,... -> {label: mode}, in order; a bare MODE is its own label."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        label, _, mode = part.partition("=")
        label, mode = (label, mode) if mode else (label, label)
        if label in out:
            raise SystemExit(f"live_arms: arm {label!r} given twice")
        out[label] = mode
    if len(out) < 2 or "adaptive" not in out.values():
        raise SystemExit("live_arms: --arms needs an adaptive arm and at least one static arm")
    return out


def rotation(arms: list[str], rnd: int) -> list[str]:
    """The arms' order in round `rnd` (0-based): rotated by one per round, so each arm runs first, second...
    in turn and drift over the run hits them alike."""
    j = rnd % len(arms)
    return arms[j:] + arms[:j]


# --- setup (no engine) --------------------------------------------------------------------------------------


def load_setup(args: argparse.Namespace) -> dict[str, Any]:
    """The sweep's entry, its cells (CellSpecs) by batch size, the no-SD reference outputs, prompt categories."""
    from speclab.bench.api import default_prompt_provider, load_sweep_source
    from speclab.bench.attempts import finished_results
    from speclab.bench.categories import prompt_categories
    from speclab.bench.cells import engine_spec, expand_cells
    from speclab.bench.sampling import cell_prompts
    from speclab.engine.protocol import CellSpec

    overrides = {
        "num_prompts": args.num_prompts,
        "max_tokens": args.max_tokens,
        "batch_sizes": [int(b) for b in args.batch_sizes.split(",")] if args.batch_sizes else None,
        "engine.enforce_eager": True if args.enforce_eager else None,
    }
    spec, _ = load_sweep_source(args.sweep, args.preset, overrides)
    entry = next((m for m in spec.methods if m.label == args.entry), None)
    if entry is None or not (entry.options or {}).get("proposer_options"):
        raise SystemExit(f"live_arms: the sweep has no adaptive model-drafter entry labelled {args.entry!r}")
    cells = [c for c in expand_cells(spec) if c.method.label == args.entry and not c.sampled]
    base = {c.baseline_key: c.cell_id for c in expand_cells(spec) if c.is_baseline}
    provider = default_prompt_provider(spec)
    sets = {w: provider(w) for w in {c.workload for c in cells}}
    ref: dict[str, dict[str, list[int]]] = {}
    for _, res, _, _ in finished_results(Path(args.reference)):
        ref[res.cell_id] = {r.id: list(r.output_token_ids) for r in res.requests if not r.copy}
    by_b: dict[int, dict[str, Any]] = {}
    for c in cells:
        want = base.get(c.baseline_key)
        if want not in ref:
            raise SystemExit(
                f"live_arms: {args.reference} has no no-SD cell {want} (B = {c.batch_size}); run "
                f"speclab bench --preset/SWEEP --methods none --repeats 1 --out {args.reference} first"
            )
        prompts = cell_prompts(c.setting, c.seed, sets[c.workload], spec.max_model_len)[0]
        by_b.setdefault(c.batch_size, {})
        by_b[c.batch_size] = {
            "cell": CellSpec(c.cell_id, c.batching, c.batch_size, c.max_tokens, prompts),
            "reference": ref[want],
            "categories": prompt_categories(spec, c.workload)
            or {p.id: sets[c.workload].category for p in prompts},
        }
    eng = engine_spec(spec, entry)
    eng.max_num_seqs = max(by_b)
    return {"engine": eng, "by_b": dict(sorted(by_b.items())), "workloads": sorted(sets)}


# --- the engine's rounds ------------------------------------------------------------------------------------


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short when a run died: that cell reruns
            continue
    return out


def run_rounds(args: argparse.Namespace, setup: dict[str, Any], arms: dict[str, str], out: Path) -> None:
    from speclab.engine.worker import Engine
    from speclab.live.vllm_eagle import RPC_MODE

    rec_path = out / "arms.jsonl"
    done = {(r["round"], r["arm"], r["batch_size"]) for r in read_records(rec_path)}
    todo = [
        (rnd, b, arm)
        for rnd in range(args.rounds)
        for b in setup["by_b"]
        for arm in rotation(list(arms), rnd)
        if (rnd, arm, b) not in done
    ]
    if not todo:
        return
    engine = Engine(setup["engine"])
    print(f"engine up in {engine.startup_s:.0f} s; {len(todo)} cells to run", flush=True)
    first = next(iter(setup["by_b"].values()))["cell"]
    for mode in dict.fromkeys(arms.values()):  # compile what each mode runs before anything is timed
        engine.llm.collective_rpc(RPC_MODE, args=(mode,))
        engine.warmup(first)
    for i, (rnd, b, arm) in enumerate(todo, 1):
        item = setup["by_b"][b]
        engine.llm.collective_rpc(RPC_MODE, args=(arms[arm],))
        res = engine.run_cell(item["cell"])
        ref = item["reference"]
        exact = all(r.output_token_ids == ref.get(r.id) for r in res.requests)
        info = res.engine_info
        rec = {
            "round": rnd, "arm": arm, "mode": arms[arm], "batch_size": b, "cell_id": res.cell_id,
            "elapsed_s": res.elapsed_s, "output_tokens": res.output_tokens, "steps": res.steps,
            "tok_s": res.output_tokens / res.elapsed_s, "token_exact": exact,
            "loadavg_start": info.get("loadavg_start"), "loadavg_end": info.get("loadavg_end"),
            "cpu_pressure": info.get("cpu_pressure"), "counts": info.get("adaptive_counts"),
            "requests": [
                {"id": r.id, "tokens": len(r.output_token_ids), "accepted": r.per_step_accepted,
                 "drafted": r.per_step_drafted}
                for r in res.requests
            ],
        }  # fmt: skip
        with rec_path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        print(
            f"[{i}/{len(todo)}] round {rnd + 1} B={b} {arm}: {rec['tok_s']:.1f} tok/s "
            f"({res.elapsed_s:.1f} s){'' if exact else '  NOT TOKEN-EXACT'}",
            flush=True,
        )


# --- the summary (records only) -----------------------------------------------------------------------------


def _tokens_per_step(reqs: list[dict[str, Any]]) -> float | None:
    """Output tokens per engine step of these requests: a step yields 1 + its accepted drafts, so the steps
    are the tokens less every accepted draft."""
    tokens = sum(r["tokens"] for r in reqs)
    acc = sum(sum(r["accepted"] or []) for r in reqs)
    return tokens / (tokens - acc) if tokens > acc else None


def _ratio_stats(ratios: list[float]) -> dict[str, Any]:
    from speclab.bench.repeats import median_interval

    iv = median_interval(ratios)
    return {
        "median": statistics.median(ratios) if ratios else None,
        "interval": [iv[0], iv[1]] if iv else None,
        "coverage": iv[2] if iv else None,
        "rounds": len(ratios),
    }


def summarise(
    records: list[dict[str, Any]], arms: dict[str, str], aa: tuple[str, str] | None,
    categories: dict[int, dict[str, str]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Per batch size: each arm's median tok/s [min-max]; the best static arm (highest median); adaptive /
    best static and the A/A pair's ratio, per round, as median and 95% sign-test interval; tokens per step
    per category and arm; token-exactness and the largest load seen."""
    adaptive = next(a for a, m in arms.items() if m == "adaptive")
    static = [a for a, m in arms.items() if m != "adaptive" and (aa is None or a != aa[1])]
    out: dict[str, Any] = {}
    for b in sorted({r["batch_size"] for r in records}):
        rows = [r for r in records if r["batch_size"] == b]
        by_round: dict[int, dict[str, float]] = {}
        for r in rows:
            by_round.setdefault(r["round"], {})[r["arm"]] = r["tok_s"]
        full = {k: v for k, v in by_round.items() if set(arms) <= set(v)}
        tput = {a: [v[a] for v in full.values()] for a in arms}
        best = max(static, key=lambda a: statistics.median(tput[a])) if full else None
        cats: dict[str, dict[str, float | None]] = {}
        for a in arms:
            groups: dict[str, list[dict[str, Any]]] = {}
            for r in rows:
                if r["arm"] == a:
                    for q in r["requests"]:
                        groups.setdefault((categories or {}).get(b, {}).get(q["id"], "all"), []).append(q)
            for c, reqs in groups.items():
                cats.setdefault(c, {})[a] = _tokens_per_step(reqs)
        out[str(b)] = {
            "rounds": len(full),
            "tok_s": {
                a: {"median": statistics.median(x), "min": min(x), "max": max(x)} for a, x in tput.items() if x
            },
            "best_static": best,
            "adaptive_over_best": _ratio_stats([v[adaptive] / v[best] for v in full.values()]) if best else None,
            "adaptive_over": {
                a: _ratio_stats([v[adaptive] / v[a] for v in full.values()]) for a in static
            },
            "aa": _ratio_stats([v[aa[1]] / v[aa[0]] for v in full.values()]) if aa and full else None,
            "pairs": {
                f"{x}/{y}": _ratio_stats([v[x] / v[y] for v in full.values()])
                for i, x in enumerate([adaptive, *static]) for y in [adaptive, *static][i + 1 :]
            },
            "tokens_per_step": cats,
            "token_exact": all(r["token_exact"] for r in rows),
            "max_load": max((r["loadavg_end"] or 0.0) for r in rows),
            "max_pressure": max((r["cpu_pressure"] or 0.0) for r in rows),
        }  # fmt: skip
    return out


def _iv(s: dict[str, Any] | None) -> str:
    if not s or s["median"] is None:
        return "-"
    iv = s["interval"]
    return f"{s['median']:.3f}" + (f" [{iv[0]:.3f}-{iv[1]:.3f}]" if iv else " [too few rounds]")


def format_summary(summary: dict[str, Any], arms: dict[str, str]) -> str:
    lines = [
        "| B | rounds | "
        + " | ".join(f"{a} tok/s" for a in arms)
        + " | best static | adaptive / best static "
        "| A/A | token-exact |",
        "|" + "---|" * (len(arms) + 6),
    ]
    for b, s in summary.items():
        t = s["tok_s"]
        cells = [
            f"{t[a]['median']:.1f} [{t[a]['min']:.1f}-{t[a]['max']:.1f}]" if a in t else "-" for a in arms
        ]
        lines.append(
            f"| {b} | {s['rounds']} | " + " | ".join(cells) + f" | {s['best_static']} | "
            f"{_iv(s['adaptive_over_best'])} | {_iv(s['aa'])} | {'yes' if s['token_exact'] else 'NO'} |"
        )
    lines += ["", "Tokens per step by category (all rounds):", ""]
    lines.append("| B | category | " + " | ".join(arms) + " |")
    lines.append("|" + "---|" * (len(arms) + 2))
    for b, s in summary.items():
        for c, per in sorted(s["tokens_per_step"].items()):
            vals = [f"{per[a]:.2f}" if per.get(a) is not None else "-" for a in arms]
            lines.append(f"| {b} | {c} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


# --- the same cells simulated from their own traces ---------------------------------------------------------


def arm_policy(mode: str, options: dict[str, Any], kmax: int) -> str:
    """The simulator policy an arm's mode runs: `fixed:M:K`, `none` for off, the entry's adaptive policy."""
    if mode == "adaptive":
        methods = options.get("methods", ["ngram", "eagle3"])
        return f"{options.get('policy', 'adaptive')}:{','.join(methods)}:{kmax}"
    return "none" if mode == "off" else f"fixed:{mode}"


def simulate_arms(
    store: str, arms: dict[str, str], entry_options: dict[str, Any], engine_method: str, kmax: int,
    batch_sizes: list[int], cost_model: str | None = None,
) -> dict[str, dict[str, float]]:  # fmt: skip
    """Per batch size, each arm's simulated tok/s over the whole cell (continuous batching, makespan: the
    cell's requests in one pass, tail included, as measured). The adaptive arm is priced as it runs live, the
    head paid at every step (speclab.live.vllm_eagle.sunk_drafter_cost); the static arms by the plain model.
    Each request once (a run holds it once per batch size)."""
    from speclab.costmodel import get_cost_model
    from speclab.live.vllm_eagle import sunk_drafter_cost
    from speclab.simulate import simulate
    from speclab.traces.store import read_store

    seen: dict[str, Any] = {}
    for t in read_store(store):
        seen.setdefault(t.id, t)
    traces = list(seen.values())
    cm = get_cost_model(cost_model or entry_options.get("proposer_options", {}).get("cost_model"))
    sunk = sunk_drafter_cost(cm, engine_method, kmax)
    opts = entry_options.get("proposer_options", {})
    out: dict[str, dict[str, float]] = {str(b): {} for b in batch_sizes}
    for arm, mode in arms.items():
        pol = arm_policy(mode, opts, kmax)
        rows = simulate(
            traces, sunk if mode == "adaptive" else cm, [pol], "continuous", batch_sizes,
            continuous_measure="makespan",
        )  # fmt: skip
        for r in rows:
            out[str(r.batch_size)][arm] = r.makespan_throughput_tok_s
    return out


def ranking(values: dict[str, float], arms: list[str]) -> list[str]:
    """Arms fastest first."""
    return sorted(arms, key=lambda a: -values[a])


def resolved_order(pairs: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """(faster, slower) for every measured pair whose per-round ratio interval excludes 1; a pair whose
    interval holds 1 is level: the rounds cannot order it."""
    out = []
    for key, st in pairs.items():
        x, y = key.split("/")
        iv = st.get("interval")
        if iv and iv[0] > 1.0:
            out.append((x, y))
        elif iv and iv[1] < 1.0:
            out.append((y, x))
    return out


def measured_ranking(medians: dict[str, float], order: list[tuple[str, str]]) -> str:
    """The arms by median, fastest first, with '>' between neighbours the rounds order and '=' between
    neighbours they cannot."""
    arms = ranking(medians, list(medians))
    text = arms[0]
    for a, b in zip(arms, arms[1:], strict=False):
        text += f" {'>' if (a, b) in order else '='} {b}"
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset")
    src.add_argument("--sweep", help="a sweep file")
    ap.add_argument(
        "--entry", required=True, help="the [[methods]] label of the adaptive model-drafter entry"
    )
    ap.add_argument("--reference", required=True, help="a bench run holding the entry's no-SD cells")
    ap.add_argument("--arms", default=DEFAULT_ARMS, help=f"LABEL=MODE,... (default {DEFAULT_ARMS})")
    ap.add_argument("--aa", default=DEFAULT_AA, help="two arms with the same mode: the A/A control ('' none)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--num-prompts", type=int, help="as speclab bench's override (the reference run's too)")
    ap.add_argument("--max-tokens", type=int, help="as speclab bench's override")
    ap.add_argument("--batch-sizes", help="as speclab bench's override, e.g. 1,4")
    ap.add_argument("--enforce-eager", action="store_true", help="as speclab bench's --enforce-eager")
    ap.add_argument("--out", required=True)
    ap.add_argument("--summarise", action="store_true", help="only summarise OUT/arms.jsonl")
    ap.add_argument("--simulate", metavar="STORE", help="also simulate the arms from this trace store")
    ap.add_argument("--cost-model", help="with --simulate: the cost model (default: the entry's)")
    args = ap.parse_args(argv)
    arms = parse_arms(args.arms)
    aa = tuple(a.strip() for a in args.aa.split(",")) if args.aa else None
    if aa is not None and (len(aa) != 2 or not set(aa) <= set(arms) or arms[aa[0]] != arms[aa[1]]):
        raise SystemExit("live_arms: --aa names two arms of --arms with the same mode")
    if args.rounds < 1:
        raise SystemExit("live_arms: --rounds must be >= 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    setup = load_setup(args)
    if not args.summarise:
        if os.environ.get(CHILD_ENV) != "1":  # the engine needs the worker's environment from process start
            from speclab.engine.launch import worker_env

            env = dict(worker_env(setup["engine"].kv_cache_gib), **{CHILD_ENV: "1"})
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.live_arms",
                *(argv if argv is not None else sys.argv[1:]),
            ]
            os.execve(sys.executable, cmd, env)
        run_rounds(args, setup, arms, out)
    records = read_records(out / "arms.jsonl")
    cats = {b: item["categories"] for b, item in setup["by_b"].items()}
    summary = summarise(records, arms, aa, cats)  # type: ignore[arg-type]
    (out / "summary.json").write_text(
        json.dumps({"arms": arms, "aa": aa, "by_batch_size": summary}, indent=1)
    )
    text = format_summary(summary, arms)
    if args.simulate:
        static = [a for a in arms if aa is None or a != aa[1]]
        eng = setup["engine"]
        sim = simulate_arms(
            args.simulate, {a: arms[a] for a in static}, eng.options, eng.method, int(eng.k),
            [int(b) for b in summary], args.cost_model,
        )  # fmt: skip
        lines = ["", "Simulated from the traces (tok/s, the whole cell) against measured (median tok/s):", "",
                 "| B | " + " | ".join(static) + " | simulated ranking | measured ranking ('=': level) | agree |",
                 "|" + "---|" * (len(static) + 4)]  # fmt: skip
        for b, s in summary.items():
            meas = {a: s["tok_s"][a]["median"] for a in static if a in s["tok_s"]}
            if len(meas) < len(static):
                continue
            rs, order = ranking(sim[b], static), resolved_order(s["pairs"])
            agree = all(sim[b][x] > sim[b][y] for x, y in order)
            rm = measured_ranking(meas, order)
            s.update(simulated_tok_s=sim[b], simulated_ranking=rs, measured_ranking=rm, rankings_agree=agree)
            lines.append(f"| {b} | " + " | ".join(f"{sim[b][a]:.1f}" for a in static)
                         + f" | {' > '.join(rs)} | {rm} | {'yes' if agree else 'no'} |")  # fmt: skip
        text += "\n".join(lines)
        (out / "summary.json").write_text(
            json.dumps({"arms": arms, "aa": aa, "by_batch_size": summary}, indent=1)
        )
    (out / "summary.md").write_text(text + "\n")
    print(text)
    return 0 if all(s["token_exact"] for s in summary.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
