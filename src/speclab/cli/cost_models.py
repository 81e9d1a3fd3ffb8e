"""`speclab cost-models list|show|fit|check`."""

from __future__ import annotations

import click

from speclab.cli.options import choice_option


@click.group(name="cost-models")
def command() -> None:
    """List, show, fit and check cost models."""


@command.command(name="list")
def list_cmd() -> None:
    """List preset cost models (one per line: name, description)."""
    from speclab.costmodel import get_cost_model, list_cost_models

    for name in list_cost_models():
        click.echo(f"{name}\t{get_cost_model(name).description}")


@command.command(name="show")
@click.argument("name")
def show_cmd(name: str) -> None:
    """Print a cost model (preset NAME or a .toml path) as TOML."""
    from pathlib import Path

    from speclab.costmodel import get_cost_model

    m = get_cost_model(name)
    click.echo(Path(m.path).read_text() if m.path else m.to_toml(), nl=False)


@command.command(name="fit")
@click.argument("timings", nargs=-1, required=True, type=click.Path(exists=True))
@click.option(
    "--out", "out", required=True, type=click.Path(dir_okay=False), help="Cost model TOML to write."
)
@click.option("--name", default=None, help="Model name (default: the CSV's file name).")
@choice_option(
    "--draft-form",
    choices=["linear", "chained", "forwards"],
    default="linear",
    help="Form for model proposers (lookup proposers are always a fraction of verify time).",
)
@choice_option(
    "--overhead-form",
    choices=["mean", "linear"],
    default="mean",
    help="Overhead per step: the mean, or linear in scheduled requests and verified draft tokens.",
)
@choice_option(
    "--target-form",
    choices=["linear", "piecewise", "table"],
    default="linear",
    help="Target forward: the study's linear form (every row); piecewise with one knee "
    "(weights-bound below, compute-bound above; fitted on decode/verify rows); or table: piecewise plus "
    "the measured time of each batched-token count seen in >= 20 rows (CPU kernels are not monotone).",
)
@click.option(
    "--table-bins",
    is_flag=True,
    help="With --target-form table: also tabulate the counts seen in fewer than 20 rows, in runs of 20 rows "
    "sorted by count (one entry per run), and interpolate between entries (wide verifies at large batch).",
)
@click.option(
    "--engine-offsets/--no-engine-offsets",
    default=True,
    show_default=True,
    help="With rows from several engine processes (a run directory, or several files): estimate each "
    "engine's persistent speed offset on the forwards they share and divide it out before fitting.",
)
@click.option("--force", is_flag=True, help="Replace an existing output file.")
def fit_cmd(
    timings: tuple[str, ...],
    out: str,
    name: str | None,
    draft_form: str,
    overhead_form: str,
    target_form: str,
    table_bins: bool,
    engine_offsets: bool,
    force: bool,
) -> None:
    """Fit the study's cost-model form by least squares to TIMINGS: timings CSVs or bench run directories
    (a run directory gives each engine's own timings, so per-engine offsets can be divided out)."""
    from speclab.atomic import atomic_write_text
    from speclab.costmodel.fit import fit_cost_model_report
    from speclab.outputs import output_file

    if table_bins and target_form != "table":
        raise click.UsageError("--table-bins needs --target-form table")
    output_file(out, timings, force=force)

    model, rep = fit_cost_model_report(
        list(timings),
        name=name,
        draft_form=draft_form,
        overhead_form=overhead_form,
        target_form=target_form,
        engine_offsets=engine_offsets,
        table_bins=table_bins,
    )
    header = (
        "# fitted by `speclab cost-models fit`; rows and R^2 per kind:\n"
        + "".join(
            f"#   {k}: {rep.rows.get(k, 0)} rows" + (f", R^2 {rep.r2[k]:.4f}" if k in rep.r2 else "") + "\n"
            for k in sorted(rep.rows)
        )
        + "".join(f"#   engine factor {v:.4f}: {f}\n" for f, v in rep.engine_factors.items())
    )
    atomic_write_text(out, model.to_toml(header))
    for n in rep.notes:
        click.echo(f"note: {n}", err=True)
    click.echo(f"wrote {out}: " + ", ".join(f"{k} R^2 {v:.4f}" for k, v in sorted(rep.r2.items())))


@command.command(name="check")
@click.argument("timings", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--cost-model", "cost_model", required=True, help="Preset name or .toml path.")
@click.option(
    "--engine-offsets/--no-engine-offsets",
    default=True,
    show_default=True,
    help="Divide each engine's start-up speed factor out first (several engine files), as fit does.",
)
def check_cmd(timings: tuple[str, ...], cost_model: str, engine_offsets: bool) -> None:
    """Measured decode/verify forwards in TIMINGS (timings CSVs or bench run directories) against a cost
    model, per band of running requests: measured / predicted time, and the price of one more verified
    draft token as a share of the step, measured and modelled. That share is what an adaptive policy's
    drafts turn on; where it differs by more than 25% the model does not fit this engine (exit 0, a note)."""
    from speclab.costmodel import get_cost_model
    from speclab.costmodel.check import check_cost_model, fmt_share, mismatch_note, mismatches

    cm = get_cost_model(cost_model)
    bands = check_cost_model(list(timings), cm, engine_offsets=engine_offsets)
    if not bands:
        raise click.ClickException("no band of running requests has enough decode/verify forwards to check")

    click.echo(f"cost model {cm.name} against {len(timings)} timings source(s); decode/verify forwards only")
    click.echo(f"{'requests':>10} {'rows':>6} {'measured':>10} {'model':>10} {'ratio':>6} {'token/step':>11} "
               f"{'model':>7} {'model 1st':>9}")  # fmt: skip
    for b in bands:
        lo, hi = b.requests
        req = str(lo) if lo == hi else (f"{lo}-{hi}" if hi < 1 << 20 else f">={lo}")
        click.echo(
            f"{req:>10} {b.rows:>6} {b.measured_s * 1e3:>8.1f}ms {b.predicted_s * 1e3:>8.1f}ms {b.ratio:>6.2f} "
            f"{fmt_share(b.token_share):>11} {fmt_share(b.model_token_share):>7} {fmt_share(b.model_first_share):>9}"
        )
    bad = mismatches(bands)
    if bad:
        click.echo(f"note: {mismatch_note(cm.name, bad)}")
