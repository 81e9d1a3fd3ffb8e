"""`speclab validate RUN`: predicted beside measured throughput and speedup for every cell of a bench run."""

from __future__ import annotations

import json
from pathlib import Path

import click

from speclab.cli.options import choice_option


@click.command(name="validate")
@click.argument("run", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--cost-model", default=None, help="Cost model name or .toml path (default: fitted from RUN/timings.csv)."
)
@choice_option("--fit", choices=["linear", "best"], default="best",
                help="Without --cost-model: the profile's best forms on held-out steps, or linear (as "
                     "`cost-models fit`).")  # fmt: skip
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False),
              help="Where to write the JSON (default: RUN/validation.json; '-' for stdout).")  # fmt: skip
@click.option(
    "--force", is_flag=True, help="Replace an existing --json file (RUN/validation.json always is)."
)
def command(run: str, cost_model: str | None, fit: str, json_out: str | None, force: bool) -> None:
    """Simulate every cell of RUN from its own traces (its requests, batching and batch size, and the
    acceptance the engine observed) and print predicted beside measured throughput and speedup per cell,
    with the mean absolute error of the predicted speedup. The report (`speclab report --run RUN`) shows
    RUN/validation.json."""
    from speclab.atomic import atomic_write_text
    from speclab.outputs import output_file
    from speclab.validate import VALIDATION_JSON, format_table, validate_run

    if json_out not in (None, "-"):
        output_file(json_out, [run, cost_model], force=force, what="--json")
    val = validate_run(run, cost_model, fit=fit)
    text = json.dumps(val.to_dict(), indent=1) + "\n"
    if json_out == "-":
        click.echo(text, nl=False)
        return
    for line in format_table(val):
        click.echo(line)
    for n in val.notes:
        click.echo(f"note: {n}", err=True)
    path = Path(json_out) if json_out else Path(run) / VALIDATION_JSON
    atomic_write_text(path, text)
    click.echo(f"wrote {path}")
