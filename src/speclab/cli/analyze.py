"""`speclab analyze`: acceptance statistics per workload and method, and the oracle gap."""

from __future__ import annotations

import json
import shlex
import sys

import click

from speclab.atomic import atomic_write_text
from speclab.cli import batch_size_list


@click.command(name="analyze")
@click.option("--traces", "traces", type=click.Path(exists=True), help="Trace store (default: RUN/traces).")
@click.option("--run", "run", type=click.Path(exists=True, file_okay=False), help="Bench run directory.")
@click.option("--cost-model", default=None, help="Named cost model (default: fitted from RUN/timings.csv).")
@click.option("--batch-sizes", default=None, help="Comma list for the simulated oracle (default: the run's).")
@click.option(
    "--max-requests",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="Requests sampled per workload to simulate.",
)
@click.option(
    "--bins",
    type=click.IntRange(min=1, max=10_000),
    default=10,
    show_default=True,
    help="Normalised position bins.",
)
@click.option("--no-oracle", is_flag=True, help="Skip the simulated oracle gap.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON instead of tables.")
@click.option(
    "--out", "out", type=click.Path(dir_okay=False), help="Write the JSON here (e.g. analysis.json)."
)
@click.option("--force", is_flag=True, help="Replace an existing output file.")
def command(
    traces: str | None,
    run: str | None,
    cost_model: str | None,
    batch_sizes: str | None,
    max_requests: int,
    bins: int,
    no_oracle: bool,
    as_json: bool,
    out: str | None,
    force: bool,
) -> None:
    """Acceptance analysis from a trace store, with oracle gaps against a bench run.

    Per workload and method: mean/std/p5/p50/p95 of acceptance length, acceptance along the output in
    normalised position bins, per-request spread, heavy-tail statistics, prompt-output overlap vs the
    n-gram advantage over model drafters, and measured vs simulated oracle speedup per batch size.
    """
    from speclab.analyze import analyze, format_tables
    from speclab.costmodel.registry import resolve_cost_model
    from speclab.outputs import output_file

    sizes = batch_size_list(batch_sizes) if batch_sizes else None
    if cost_model is not None:
        resolve_cost_model(cost_model)  # the one resolver: an unknown name fails as in `simulate`
    if out:
        output_file(out, [traces, run, cost_model], force=force)
    result = analyze(
        traces,
        run=run,
        cost_model=cost_model,
        batch_sizes=sizes,
        max_requests=max_requests,
        n_bins=bins,
        oracle=not no_oracle,
        command=shlex.join(["speclab", *sys.argv[1:]]),
    )
    text = json.dumps(result, indent=1, default=str)
    if out:
        atomic_write_text(out, text + "\n")
    if as_json:
        click.echo(text)
    else:
        click.echo(format_tables(result), nl=False)
        if out:
            click.echo(f"analysis written to {out}")
