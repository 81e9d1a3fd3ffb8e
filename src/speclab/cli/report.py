"""`speclab report`: the self-contained HTML report (embedded PNGs) plus the PNGs."""

from __future__ import annotations

import click


@click.command(name="report")
@click.option("--run", "run", type=click.Path(exists=True, file_okay=False), help="Bench run directory.")
@click.option("--traces", "traces", type=click.Path(exists=True), help="Trace store (default: RUN/traces).")
@click.option(
    "--analysis",
    "analysis",
    type=click.Path(exists=True, dir_okay=False),
    help="analysis.json from `speclab analyze` (default: computed here from the traces).",
)
@click.option(
    "--cost-model", default=None, help="Named cost model for the oracle bounds (default: RUN/timings.csv)."
)
@click.option("--title", default=None, help="Report title.")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--force", is_flag=True, help="Replace an earlier report in --out.")
def command(
    run: str | None,
    traces: str | None,
    analysis: str | None,
    cost_model: str | None,
    title: str | None,
    out: str,
    force: bool,
) -> None:
    """Write OUT/report.html (one self-contained file, figures embedded) and OUT/*.png.

    Sections: summary (does SD help, best method per workload and batch size), speedup vs batch with the
    oracle bounds next to the results table, recommendations (incl. where SD should be off), time split,
    memory, acceptance histograms and position curves, overlap vs n-gram advantage, oracle gap, and the
    commands and configuration behind the data. Missing inputs get a labelled section.
    """
    from speclab.costmodel.registry import resolve_cost_model
    from speclab.errors import ConfigError
    from speclab.outputs import output_dir
    from speclab.report import build_report

    if cost_model is not None:
        resolve_cost_model(cost_model)  # the one resolver: an unknown name fails as in `simulate`
    # what the report writes: report.html, its figures and atomic writes' temporaries
    output_dir(
        out, [run, traces, analysis, cost_model], force=force, owned=["report.html", "*.png", ".*.tmp"]
    )

    if analysis:
        try:  # a binary or non-UTF-8 file: one line naming it, not a decode error deep in the report
            with open(analysis, encoding="utf-8") as fh:
                fh.read()
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"--analysis {analysis}: not UTF-8 text ({exc.reason} at byte {exc.start})"
            ) from None
    path = build_report(out, run=run, traces=traces, analysis=analysis, title=title, cost_model=cost_model)
    click.echo(f"report written to {path}")
