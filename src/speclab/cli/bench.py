"""`speclab bench`: run a sweep on a real vLLM engine, or show a run's results.

speclab bench SWEEP.toml --out RUN        run (or resume) a sweep file
speclab bench --preset demo-cpu --out RUN run a shipped sweep preset
speclab bench SWEEP.toml --server --out RUN  its [server] cells: vllm serve + vllm bench serve
speclab bench SWEEP.toml --endpoint URL [--endpoint URL] --out RUN  its [server] loads at running servers
speclab bench show RUN [--json]           the results table
speclab bench compare RUN_A RUN_B         same cells, token-exact outputs, throughput ratios
speclab bench presets                     list sweep presets
speclab bench check-sampling              does sampled SD keep the target's distribution? (docs/sampling.md)
speclab bench check-sampling --run RUN    the same for every sampled SD cell of a run
"""

from __future__ import annotations

import fnmatch
import math
import shlex
import sys
from pathlib import Path

import click

from speclab.bench.spec import SweepSpec
from speclab.cli import batch_size_list
from speclab.errors import ConfigError
from speclab.outputs import check_no_loop, check_writable

_SUBCOMMANDS = ("run", "show", "presets", "compare", "check-sampling")


class _BenchGroup(click.Group):
    """`speclab bench SWEEP.toml ...` means `speclab bench run SWEEP.toml ...`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in _SUBCOMMANDS and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_BenchGroup, context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """Benchmark speculative decoding on a real vLLM engine.

    \b
    speclab bench SWEEP.toml --out RUN         run (or resume) a sweep
    speclab bench --preset demo-cpu --out RUN  run a shipped preset (see `speclab bench presets`)
    speclab bench show RUN                     print the results table
    speclab bench compare RUN_A RUN_B          same cells and outputs? throughput ratios
    speclab bench check-sampling               does sampled SD keep the target's distribution?
    speclab bench check-sampling --run RUN     ... for every sampled SD cell of a run
    """


def _str_list(value: str | None, what: str = "") -> list[str] | None:
    """A comma-separated option value (None stays None); an empty item (`,`, `a,,b`) is refused, never
    read as "no restriction"."""
    if value is None:
        return None
    items = [x.strip() for x in value.split(",")]
    if not all(items):
        raise ConfigError(f"{what}: empty item in {value!r} (expected comma-separated names)")
    return items


def _temperature_list(text: str | None) -> list[float] | None:
    """--temperatures 0,0.7,1 as numbers (the sweep's own check bounds them)."""
    if text is None:
        return None
    try:
        return [float(t) for t in text.split(",")]
    except ValueError:
        raise ConfigError(
            f"--temperatures {text!r}: need numbers separated by commas, e.g. 0,0.7,1"
        ) from None


@command.command("run")
@click.argument("sweep", required=False, type=click.Path(dir_okay=False))
@click.option("--preset", help="A shipped sweep preset instead of a file (see `speclab bench presets`).")
@click.option(
    "--out", "out", type=click.Path(file_okay=False), help="Run directory (default: runs/<sweep name>)."
)
@click.option("--num-prompts", type=int, help="Override the sweep's prompt count per cell.")
@click.option("--max-tokens", type=int, help="Override the sweep's max output tokens.")
@click.option("--batch-sizes", help="Override the batch sizes, e.g. 1,16.")
@click.option("--temperatures", help="Override the sampling temperatures, e.g. 0,0.7,1 (each its own cell).")
@click.option(
    "--repeats", type=int, help="Measure each cell N times, interleaved with its no-SD baseline (default 1)."
)
@click.option("--workloads", help="Override the workloads, e.g. offline-math,offline-code-edit.")
@click.option("--methods", help="Keep only these method entries (labels or names; none is always kept).")
@click.option("--batching", type=click.Choice(["replicate", "continuous", "both"]), help="Override batching.")
@click.option(
    "--enforce-eager/--no-enforce-eager", default=None, help="Skip torch.compile (fast start, slow steps)."
)
@click.option(
    "--cell-timeout",
    type=float,
    help="Stop an engine that finishes no cell for this many seconds (start-up included); the cell fails.",
)
@click.option(
    "--redo",
    multiple=True,
    help="Measure cells again even if done: a cell id glob, e.g. 'none.*.b1.*' (repeatable).",
)
@click.option(
    "--server",
    "server_mode",
    is_flag=True,
    help="Server mode: each engine behind `vllm serve` on loopback, driven by `vllm bench serve` at the "
    "sweep's [server] request rates / concurrency levels (docs/server.md).",
)
@click.option(
    "--endpoint",
    "endpoints",
    multiple=True,
    metavar="[LABEL=]URL",
    help="Bench an OpenAI-compatible server that already runs, at the sweep's [server] loads; twice for an "
    "A/B comparison (label `none` = the no-SD baseline). docs/server.md, 'Existing endpoint'.",
)
@click.option(
    "--api-key-env", metavar="NAME", help="With --endpoint: the environment variable holding the API key."
)
@click.option(
    "--model", "served_model", help="With --endpoint: the served model name (default: the first listed)."
)
@click.option(
    "--request-timeout",
    type=float,
    default=300.0,
    help="With --endpoint: fail a request after this many seconds.",
)
@click.option(
    "--ray",
    "ray_address",
    is_flag=False,
    flag_value="auto",
    default=None,
    metavar="[ADDRESS]",
    help="Run each engine as a Ray task: on the cluster at ADDRESS, or (no ADDRESS) the running cluster, "
    "else a local one on 127.0.0.1. Needs the ray extra. Put it after SWEEP.",
)
@click.option("--dry-run", is_flag=True, help="Check the sweep and list its engines and cells; run nothing.")
@click.option(
    "--arrivals",
    default=None,
    metavar="logged[:SPEED]",
    help="Server or endpoint loads: replay the request log's own arrival times (divided by SPEED), each request with "
    "its own max_tokens, in place of the [server] rates / concurrency levels (docs/server.md).",
)
@click.option(
    "--no-progress", is_flag=True, help="No progress bar (one line per finished cell still printed)."
)
def run_cmd(
    sweep: str | None,
    preset: str | None,
    out: str | None,
    num_prompts: int | None,
    max_tokens: int | None,
    batch_sizes: str | None,
    temperatures: str | None,
    repeats: int | None,
    workloads: str | None,
    methods: str | None,
    batching: str | None,
    enforce_eager: bool | None,
    cell_timeout: float | None,
    redo: tuple[str, ...],
    server_mode: bool,
    endpoints: tuple[str, ...],
    api_key_env: str | None,
    served_model: str | None,
    request_timeout: float,
    ray_address: str | None,
    dry_run: bool,
    arrivals: str | None,
    no_progress: bool,
) -> None:
    """Run (or resume) a sweep. Completed cells in RUN are skipped."""
    from speclab.bench.api import default_prompt_provider, load_sweep_source, run_bench
    from speclab.bench.cells import expand_cells, group_engines
    from speclab.bench.show import format_run

    if sweep is None and preset is None:
        raise ConfigError("give a sweep file (speclab bench SWEEP.toml) or --preset NAME")
    if sweep is not None and preset is not None:
        raise ConfigError("give either a sweep file or --preset, not both")
    if cell_timeout is not None and not (math.isfinite(cell_timeout) and cell_timeout > 0):
        raise ConfigError(f"--cell-timeout {cell_timeout}: need a number of seconds > 0")
    overrides = {
        "num_prompts": num_prompts,
        "max_tokens": max_tokens,
        "batch_sizes": batch_size_list(batch_sizes, "--batch-sizes"),
        "temperatures": _temperature_list(temperatures),
        "workloads": _str_list(workloads, "--workloads"),
        "batching": ["replicate", "continuous"] if batching == "both" else batching,
        "engine.enforce_eager": enforce_eager,
        "repeats": repeats,
    }
    if ray_address is not None and server_mode:
        raise click.UsageError("--server and --ray cannot be combined: server cells run on this machine")
    if ray_address is not None:
        from speclab.raycluster import import_ray

        import_ray()  # one line now if the extra is missing, not after the checks
    spec, text = load_sweep_source(sweep, preset, overrides, _str_list(methods, "--methods"))
    if arrivals is not None:  # the server (or endpoint) loads become the log's own arrival times
        from speclab.server.arrivals import apply_arrivals

        if not (server_mode or click.get_current_context().params.get("endpoints")):
            raise click.UsageError("--arrivals sets server loads: give --server (or --endpoint) too")
        apply_arrivals(spec, arrivals)
    run_dir = out or f"runs/{spec.name}"
    if endpoints:
        if server_mode or ray_address is not None:
            raise click.UsageError("--endpoint cannot be combined with --server or --ray")
        from speclab.cli.bench_endpoint import run_endpoint

        opts = (endpoints, api_key_env, served_model, request_timeout)
        run_endpoint(spec, text, run_dir, redo, dry_run, *opts, check_run_dir=_check_run_dir)
        return
    if server_mode:
        _run_server(spec, text, run_dir, redo, dry_run)
        return
    cells = expand_cells(spec)
    _check_run_dir(run_dir, text, [c.cell_id for c in cells], redo)
    check_no_loop(run_dir, "--out ")
    check_writable(Path(run_dir) / "x", f"--out {run_dir}")
    # the machine checks (workloads, models, drafter tokenizers, and the memory of the engines kept resident
    # on this machine; under Ray they run elsewhere): one line on failure, before any model loads
    say = (lambda s: click.echo(s, err=True)) if ray_address is None else None
    provider = default_prompt_provider(spec, echo=say)
    if dry_run:
        groups = group_engines(spec, cells)
        reps = f", each measured {spec.repeats} times" if spec.repeats > 1 else ""
        click.echo(f"sweep {spec.name} ({spec.source}): {len(cells)} cells on {len(groups)} engines{reps}")
        for g in groups:
            e = g.engine
            click.echo(
                f"  engine {g.engine_id}: {e.method} k={e.k} {e.dtype} max_num_seqs={e.max_num_seqs} "
                f"options={e.options or {}}"
            )
            for c in g.cells:
                click.echo(f"    {c.cell_id}")
        return
    click.echo(f"sweep {spec.name}: {len(cells)} cells -> {run_dir}", err=True)
    outcome = run_bench(
        spec,
        run_dir,
        spec_text=text,
        prompt_provider=provider,
        cell_timeout_s=cell_timeout,
        redo=list(redo),
        ray_address=ray_address,
        progress=not no_progress and sys.stderr.isatty(),
        echo=lambda s: click.echo(s, err=True),
        command_line=shlex.join(["speclab", *sys.argv[1:]]),
    )
    click.echo("")
    click.echo(format_run(run_dir))
    click.echo("")
    click.echo(
        f"{outcome.ok} cell(s) run, {outcome.skipped + outcome.recovered} already done, {outcome.failed} failed; "
        f"results: {run_dir}/results.jsonl, traces: {run_dir}/traces/, timings: {run_dir}/timings.csv"
    )
    if outcome.failed:
        sys.exit(1)


def _run_server(spec: SweepSpec, text: str, run_dir: str, redo: tuple[str, ...], dry_run: bool) -> None:
    """`speclab bench SWEEP --server`: the sweep's [server] cells (speclab.server.runner)."""
    from speclab.bench.api import default_prompt_provider
    from speclab.server.cells import expand_server_cells, group_server_engines
    from speclab.server.runner import run_server_bench
    from speclab.server.show import format_server_run

    cells = expand_server_cells(spec)
    _check_run_dir(run_dir, text, [c.cell_id for c in cells], redo)
    provider = default_prompt_provider(spec)
    if dry_run:
        groups = group_server_engines(spec, cells)
        click.echo(
            f"sweep {spec.name} ({spec.source}), server mode: {len(cells)} cells on {len(groups)} servers"
        )
        for g in groups:
            e = g.engine
            click.echo(
                f"  server {g.engine_id}: {e.method} k={e.k} {e.dtype} max_num_seqs={e.max_num_seqs} "
                f"options={e.options or {}}"
            )
            for c in g.cells:
                click.echo(f"    {c.cell_id}  ({c.load_text}, {c.num_prompts} requests)")
        return
    click.echo(f"sweep {spec.name}, server mode: {len(cells)} cells -> {run_dir}", err=True)
    outcome = run_server_bench(
        spec,
        run_dir,
        provider,
        echo=lambda s: click.echo(s, err=True),
        spec_text=text,
        command_line=shlex.join(["speclab", *sys.argv[1:]]),
        redo=list(redo),
    )
    click.echo("")
    click.echo(format_server_run(run_dir))
    click.echo("")
    click.echo(
        f"{outcome.ok} server cell(s) run, {outcome.skipped} already done, {outcome.failed} failed; "
        f"results: {run_dir}/results.jsonl, bench-serve results: {run_dir}/server/cells/"
    )
    if outcome.failed:
        sys.exit(1)


def _check_run_dir(run_dir: str, text: str | None, cell_ids: list[str], redo: tuple[str, ...]) -> None:
    """Checks that need nothing but the sweep, done before the run directory is created or touched."""
    for g in redo:
        if not any(fnmatch.fnmatch(c, g) for c in cell_ids):
            raise ConfigError(f"--redo {g!r}: matches no cell of this sweep (see --dry-run for the cell ids)")
    old = Path(run_dir) / "sweep.toml"
    if text is not None and old.is_file() and old.read_text(encoding="utf-8", errors="replace") != text:
        raise ConfigError(
            f"{run_dir}: holds a run of a different sweep ({old} differs); give a new --out "
            "(resuming needs the same sweep file)"
        )


@command.command("show")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the result rows as JSON.")
def show_cmd(run_dir: str, as_json: bool) -> None:
    """Print the results table of a run directory."""
    import json

    from speclab.bench.rows import read_rows
    from speclab.bench.show import format_run, load_rows
    from speclab.server.show import format_server_run

    server = read_rows(run_dir, mode="server")
    if as_json:
        click.echo(json.dumps(load_rows(run_dir) + server, indent=2))
        return
    offline = load_rows(run_dir)
    if offline or not server:
        click.echo(format_run(run_dir, offline))
    if server:
        if offline:
            click.echo("")
        click.echo(format_server_run(run_dir))


@command.command("compare")
@click.argument("run_a", type=click.Path(file_okay=False))
@click.argument("run_b", type=click.Path(file_okay=False))
def compare_cmd(run_a: str, run_b: str) -> None:
    """Two runs of one sweep (e.g. serial and --ray): the same cells, token-exact outputs, and the throughput
    and speedup of B over A per cell. Exit 1 when cells or outputs differ."""
    from speclab.bench.compare import compare_runs, format_comparison

    c = compare_runs(run_a, run_b)
    click.echo(format_comparison(c, run_a, run_b))
    if not c.same:
        sys.exit(1)


@command.command("presets")
def presets_cmd() -> None:
    """List the shipped sweep presets."""
    from speclab.bench.spec import list_presets

    for name, desc in list_presets():
        click.echo(f"{name:<24} {desc}")


def _register_check_sampling() -> None:
    from speclab.cli.check_sampling import command as check_sampling

    command.add_command(check_sampling, "check-sampling")


_register_check_sampling()
