"""`speclab models`: list presets and prepare local checkpoints."""

from __future__ import annotations

import click


@click.group(name="models")
def command() -> None:
    """Model presets and local checkpoints (cache: $SPECLAB_CACHE/models, default ~/.cache/speclab/models)."""


@command.command(name="list")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None, help="Models cache directory.")
def list_cmd(cache_dir: str | None) -> None:
    """Show model presets, their drafters and where they are prepared."""
    from speclab.models import list_models

    for row in list_models(cache_dir):
        p = row["preset"]
        src = p.hub_id if p.source == "hub" else f"built locally ({p.source})"
        click.echo(f"{p.name}  [{p.role}, {p.hardware}]  {p.description}")
        click.echo(f"    source: {src}")
        for method, drafter in p.drafters.items():
            click.echo(f"    drafter for {method}: {drafter}")
        for dt, where in row["prepared"].items():
            click.echo(f"    {dt}: {where or 'not prepared'}")


@command.command(name="prepare")
@click.argument("names", nargs=-1, required=True)
@click.option(
    "--dtype",
    "dtypes",
    multiple=True,
    help="float32 and/or bfloat16 (repeatable; default: every dtype the preset offers).",
)
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None, help="Models cache directory.")
@click.option("--force", is_flag=True, help="Rebuild even if an up-to-date checkpoint exists.")
@click.option("--with-drafters/--no-drafters", default=True, help="Also prepare the preset's local drafters.")
def prepare_cmd(
    names: tuple[str, ...], dtypes: tuple[str, ...], cache_dir: str | None, force: bool, with_drafters: bool
) -> None:
    """Build local HF checkpoints for presets (idempotent, checksummed, atomic)."""
    from speclab.models import get_preset, prepare_model, presets

    todo: list[str] = []
    for name in names:
        p = get_preset(name)
        todo.append(name)
        if with_drafters:
            todo += [d for d in p.drafters.values() if d in presets() and presets()[d].buildable]
    for name in dict.fromkeys(todo):
        p = get_preset(name)
        for dt in dtypes or p.dtypes:
            path = prepare_model(name, dt, cache_dir, force=force, log=lambda m: click.echo(m, err=True))
            click.echo(f"{name}\t{dt}\t{path}")
