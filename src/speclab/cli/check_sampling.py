"""`speclab bench check-sampling`: does sampled speculative decoding keep the target's output distribution?

Draws `--samples` outputs per prompt from an engine without SD and then from one with SD (one engine at a
time, speclab.bench.sampling_check), compares the joint distribution of the first `--positions` output
tokens per prompt (speclab.analyze.distcheck) and prints a table; `--out` writes the whole result as JSON.
Exit status 1 when the verdict is "fail". docs/sampling.md explains the test, its power and its limits.

`--run RUN` checks every sampled SD cell of a bench run instead (speclab.bench.run_sampling_check): the run's
engines, settings, workloads and prompts, results in RUN/distribution_checks.json, which `bench show` and
`report` merge into the run's rows.
"""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any

import click

from speclab.catalog import ENGINE_METHODS
from speclab.cli.options import choice_option, limit_option, seed_option
from speclab.errors import ConfigError

SCHEMA = "speclab.sampling-check/1"


@click.command("check-sampling")
@click.option("--workload", default="offline-chat", show_default=True, help="Workload whose prompts to use.")
@limit_option("How many of the workload's prompts.", default=4)
@click.option(
    "--samples",
    type=click.IntRange(2, 100_000),
    default=300,
    show_default=True,
    help="Draws per prompt and engine.",
)
@click.option("--temperature", type=click.FloatRange(0, min_open=True), default=1.0, show_default=True)
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--top-k", type=click.IntRange(0), default=0, show_default=True, help="0: off.")
@choice_option(
    "--method",
    choices=[m for m in ENGINE_METHODS if m != "none"],
    default="ngram",
    help="The speculative method checked against no SD.",
)
@click.option("--k", type=click.IntRange(1, 64), default=3, show_default=True, help="Draft tokens per step.")
@click.option("--draft", help="Drafter for draft_model / eagle / eagle3 (a preset name, path or hub id).")
@click.option(
    "--positions",
    type=click.IntRange(1, 16),
    default=3,
    show_default=True,
    help="Compare the joint distribution of the first N output tokens (the first alone is never speculative).",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(1, 4096),
    default=None,
    help="Tokens generated per draw (default: --positions + 1).",
)
@click.option("--target", default="smollm2-135m", show_default=True, help="Target model.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32")
@click.option(
    "--batch", type=click.IntRange(1, 1024), default=64, show_default=True, help="Draws run at once."
)
@click.option(
    "--enforce-eager/--no-enforce-eager", default=True, show_default=True, help="Skip torch.compile."
)
@click.option("--max-prompt-tokens", type=click.IntRange(16), default=512, show_default=True)
@seed_option("First sampling seed (the SD engine's draws use the seeds after the baseline's).", default=0)
@click.option("--out", help="Write the result as JSON here.")
@click.option(
    "--run",
    "run_dir",
    type=click.Path(file_okay=False),
    help="Check every sampled SD cell of this bench run (its engines, settings and workloads; the first "
    "--limit prompts of each) and write RUN/distribution_checks.json.",
)
@click.option(
    "--force", is_flag=True, help="Replace an existing --out file; with --run: draw every check again."
)
@click.pass_context
def command(ctx: click.Context, **kw: Any) -> None:
    """Check that sampled SD keeps the target's output distribution (a two-sample test with stated power).

    With --run RUN: every SD entry of the run at each of its temperatures > 0 on each of its workloads.
    Set SPECLAB_CPU_SAMPLING_FIX=off to see vLLM's own behaviour without speclab's CPU sampling fix."""
    from speclab.analyze.distcheck import distribution_check
    from speclab.bench.sampling_check import CheckSettings, draw_samples
    from speclab.engine import cpu_sampling
    from speclab.outputs import output_file

    max_tokens = kw["max_tokens"] or kw["positions"] + 1
    if max_tokens < kw["positions"]:
        raise ConfigError(f"--max-tokens {max_tokens}: below --positions {kw['positions']}")
    if kw["run_dir"]:
        _check_run(ctx, kw, max_tokens)
        return
    if kw["out"]:
        output_file(kw["out"], force=kw["force"])
    options: dict[str, Any] = {}
    if kw["draft"]:
        options["model"] = kw["draft"]
    settings = CheckSettings(
        target=kw["target"],
        dtype=kw["dtype"],
        method=kw["method"],
        k=kw["k"],
        options=options,
        temperature=kw["temperature"],
        top_p=kw["top_p"],
        top_k=kw["top_k"],
        samples=kw["samples"],
        max_tokens=max_tokens,
        seed=kw["seed"],
        chunk=kw["batch"],
        enforce_eager=kw["enforce_eager"],
    )
    settings.validate()
    prompts = workload_prompts(kw["workload"], kw["limit"], kw["seed"], kw["target"], kw["max_prompt_tokens"])
    fix = "on" if cpu_sampling.fix_enabled() else "off"
    drawn = draw_samples(settings, prompts, echo=lambda s: click.echo(s, err=True))
    check = distribution_check(drawn["sd"], drawn["base"], positions=kw["positions"])
    result = {
        "schema": SCHEMA,
        "command": shlex.join(["speclab", *sys.argv[1:]]),
        "workload": kw["workload"],
        "settings": settings.to_dict(),
        "cpu_sampling_fix": fix,
        "engine_info": drawn["engine_info"],
        "acceptance": drawn["acceptance"],
        "distribution_check": check,
        "outputs": {"sd": drawn["sd"], "base": drawn["base"]},
    }
    click.echo(format_check(result))
    if kw["out"]:
        from speclab.atomic import atomic_write_text

        atomic_write_text(kw["out"], json.dumps(result, indent=1))
        click.echo(f"result: {kw['out']}")
    if check["verdict"] == "fail":
        sys.exit(1)


# what the run decides under --run (giving one of them is an error)
_RUN_DECIDES = ("workload", "temperature", "top_p", "top_k", "method", "k", "draft", "target", "dtype",
                "max_prompt_tokens", "out")  # fmt: skip


def _check_run(ctx: click.Context, kw: dict[str, Any], max_tokens: int) -> None:
    """`--run RUN`: the distribution check of every sampled SD cell of a bench run (bench/run_sampling_check.py)."""
    from click.core import ParameterSource

    from speclab.analyze.distcheck import distribution_check
    from speclab.bench.api import default_prompt_provider
    from speclab.bench.rows import read_rows
    from speclab.bench.run_sampling_check import DrawSettings, check_run, load_run_sweep, plan_checks
    from speclab.engine import cpu_sampling

    given = [n for n in _RUN_DECIDES if ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE]
    if given:
        names = ", ".join("--" + n.replace("_", "-") for n in given)
        raise ConfigError(f"--run: the run decides {names} (its sweep's); leave them out")
    spec = load_run_sweep(kw["run_dir"])
    plan = plan_checks(spec, read_rows(kw["run_dir"]))
    if not plan.entries and not plan.skipped:
        raise ConfigError(f"--run {kw['run_dir']}: no SD entry of the run has a sampled cell to check")
    ds = DrawSettings(
        samples=kw["samples"], positions=kw["positions"], limit=kw["limit"], max_tokens=max_tokens,
        seed=kw["seed"], chunk=kw["batch"], enforce_eager=kw["enforce_eager"],
    )  # fmt: skip
    fix = "on" if cpu_sampling.fix_enabled() else "off"
    done = check_run(
        kw["run_dir"],
        plan,
        default_prompt_provider(spec),
        ds,
        lambda sd, base: distribution_check(sd, base, positions=kw["positions"]),
        force=kw["force"],
        echo=lambda s: click.echo(s, err=True),
        extra={"cpu_sampling_fix": fix, "command": shlex.join(["speclab", *sys.argv[1:]])},
    )
    from speclab.bench.distribution_checks import checks_path

    fails = [k for k, e in done.items() if e["check"].get("verdict") == "fail"]
    for key, e in done.items():
        c = e["check"]
        click.echo(
            f"{key}: {str(c.get('verdict')).upper()} (p = {_num(c.get('p_value'))}, detects TV >= "
            f"{_num(c.get('tv_detectable_80'), '.3f')} at 80% power, {c.get('samples')} samples)"
        )
    click.echo(
        f"checks: {checks_path(kw['run_dir'])} (CPU sampling fix: {fix}); shown by `speclab bench show`"
    )
    if fails:
        sys.exit(1)


def workload_prompts(workload: str, limit: int, seed: int, target: str, max_prompt_tokens: int) -> list[Any]:
    """The workload's first `limit` prompts (its seeded sample), rendered with the target's chat template."""
    from speclab.engine.protocol import PromptSpec
    from speclab.errors import SpeclabError
    from speclab.workloads import load_workload, render_prompt
    from speclab.workloads.render import load_tokenizer

    try:
        raw = load_workload(workload, limit=limit, seed=seed)
    except SpeclabError as exc:
        raise ConfigError(f"--workload {workload}: {exc}") from None
    if not raw:
        raise ConfigError(f"--workload {workload}: no prompts")
    tok = load_tokenizer(target)
    return [PromptSpec(p.id, render_prompt(p, tok, max_prompt_tokens)[0]) for p in raw]


def _num(x: float | None, fmt: str = ".3g") -> str:
    return "-" if x is None else format(x, fmt)


def format_check(result: dict[str, Any]) -> str:
    """The per-prompt table, the pooled verdict with its power, and the SD engine's acceptance."""
    dc = result["distribution_check"]
    s = result["settings"]
    lines = [
        f"sampling check: {s['method']} k={s['k']} vs no SD, T={s['temperature']:g} top_p={s['top_p']:g} "
        f"top_k={s['top_k']}, first {dc['positions']} output tokens, {s['samples']} draws per prompt and engine",
        f"{'prompt':<28} {'draws sd/base':>13} {'bins':>5} {'p_value':>9} {'tv_obs':>7} {'tv_80%':>7}",
    ]
    for pid, r in dc["per_prompt"].items():
        lines.append(
            f"{pid[:28]:<28} {r['samples_sd']:>6}/{r['samples_base']:<6} {r['bins']:>5} "
            f"{_num(r['p_value']):>9} {r['tv_observed']:>7.3f} {r['tv_detectable_80']:>7.3f}"
        )
    lines.append(
        f"verdict: {dc['verdict'].upper()}  (pooled p = {_num(dc['p_value'])}, Bonferroni over "
        f"{dc['prompts']} prompt(s), alpha {dc['alpha']:g})"
    )
    lines.append(
        f"power: a difference of total variation >= {dc['tv_detectable_80']:.3f} in the first "
        f"{dc['positions']} tokens of any one prompt is detected with >= 80% probability"
    )
    acc = result["acceptance"]
    per_pos = ", ".join(f"{a:.2f}" for a in acc.get("acceptance_rate_per_pos") or [])
    lines.append(
        f"acceptance (vLLM's counters, SD engine): {_num(acc.get('acceptance_rate'), '.3f')} of "
        f"{acc.get('draft_tokens', 0)} drafted tokens; per position: {per_pos or '-'}"
    )
    lines.append(f"CPU sampling fix: {result['cpu_sampling_fix']}")
    return "\n".join(lines)
