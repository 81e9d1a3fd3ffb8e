"""`speclab profile`: measure the engine's step-time surface, fit a cost model, save it by name."""

from __future__ import annotations

from pathlib import Path

import click


@click.command(name="profile")
@click.option("--target", default="smollm2-135m", show_default=True, help="Target model (preset or path).")
@click.option("--dtype", default="float32", show_default=True)
@click.option(
    "--methods",
    default="",
    help="Comma list of SD methods to profile, METHOD or METHOD:K (e.g. ngram:3,suffix:8).",
)
@click.option(
    "--ks",
    default="3",
    show_default=True,
    help="k for methods given without one (comma list: one engine each).",
)
@click.option(
    "--out", "out", required=True, help="Cost-model NAME (usable as --cost-model NAME) or a .toml path."
)
@click.option(
    "--work",
    default=None,
    type=click.Path(file_okay=False),
    help="Raw data directory (default: beside the model).",
)
@click.option(
    "--max-batched", default=512, show_default=True, help="Largest prefill (batched tokens) in the grid."
)
@click.option("--eager", is_flag=True, help="enforce_eager (only if your bench runs use it too).")
@click.option("--dry-run", is_flag=True, help="Print the engines and cells, run nothing.")
@click.option("--force", is_flag=True, help="Replace an existing --out cost model.")
def command(
    target: str, dtype: str, methods: str, ks: str, out: str, work: str | None, max_batched: int, eager: bool,
    dry_run: bool, force: bool,
) -> None:  # fmt: skip
    """Measure target forwards (batched tokens 1..MAX_BATCHED, KV tokens, batch size) and each method's
    drafting at each k on the real engine, fit the cost-model forms on most cells, report their error on
    the held-out cells, and save the better-fitting model."""
    from speclab.profile import error_lines, plan_profile, profile, resolve_out
    from speclab.profile.plan import parse_methods

    name, path = resolve_out(out)
    if not dry_run:
        from speclab.outputs import output_file

        output_file(path, [work], force=force)  # before the hour of measuring, not after
    engines = plan_profile(
        target, parse_methods(methods, ks), dtype=dtype, enforce_eager=eager, max_batched=max_batched
    )
    wd = Path(work) if work else path.with_suffix(".profile")
    if dry_run:
        for e in engines:
            cells = ", ".join(
                f"b{c.batch_size}xL{c.prompt_len}{' (held out)' if c.holdout else ''}" for c in e.cells
            )
            click.echo(f"{e.label}: {len(e.cells)} cells, {e.cells[0].max_tokens} tokens each: {cells}")
        click.echo(f"would save {path} (raw data in {wd})")
        return
    fit = profile(engines, name, path, wd, echo=click.echo)
    click.echo(
        "error on the held-out cells (mean |relative error| per step, of a cell's summed time, of all):"
    )
    for line in error_lines(fit):
        click.echo(f"  {line}")
    for n in fit.notes:
        click.echo(f"note: {n}", err=True)
    click.echo(
        f"saved cost model {name!r}: {path} (use --cost-model {name if path.parent.name == 'cost_models' else path})"
    )
