"""`speclab bench SWEEP --endpoint [LABEL=]URL [--endpoint [LABEL=]URL]`: the sweep's [server] loads sent to
OpenAI-compatible servers that already run (speclab.server.endpoint; docs/server.md, "Existing endpoint")."""

from __future__ import annotations

import dataclasses
import shlex
import sys
from collections.abc import Callable
from typing import Any

import click

from speclab.bench.spec import SweepSpec


def run_endpoint(
    spec: SweepSpec,
    text: str,
    run_dir: str,
    redo: tuple[str, ...],
    dry_run: bool,
    endpoint_args: tuple[str, ...],
    api_key_env: str | None,
    model: str | None,
    request_timeout: float,
    *,
    check_run_dir: Callable[..., Any],
) -> None:
    """Run (or resume) the endpoint cells; a remote failure is one line and exit 2 (EndpointFault)."""
    from speclab.bench.preflight import preflight, render_workload
    from speclab.errors import ConfigError
    from speclab.server.endpoint import expand_endpoint_cells, parse_endpoints, run_endpoint_bench
    from speclab.server.faults import EndpointFault
    from speclab.server.show import format_server_run

    if not (request_timeout > 0):
        raise ConfigError(f"--request-timeout {request_timeout}: need a number of seconds > 0")
    endpoints = parse_endpoints(list(endpoint_args))
    cells = expand_endpoint_cells(spec, endpoints)
    check_run_dir(run_dir, text, [c.cell_id for c in cells], redo)
    if dry_run:
        click.echo(f"sweep {spec.name} ({spec.source}), endpoint mode: {len(cells)} cells")
        for ep in endpoints:
            role = "baseline" if ep.baseline else "compared with the baseline"
            click.echo(f"  endpoint {ep.label}: {ep.url} ({role})")
            for c in cells:
                if c.endpoint is ep:
                    click.echo(f"    {c.cell_id}  ({c.load_text}, {c.num_prompts} requests)")
        return
    # the prompts are rendered here with the sweep's target tokenizer (it must be the served model's); the
    # sweep's methods do not apply (the servers run what they run), so no drafter is looked for
    local = dataclasses.replace(spec, methods=[m for m in spec.methods if m.name == "none"])
    pf = preflight(local, check_models=True)
    tokenizer = pf.target_path or spec.target

    def provider(workload: str):  # type: ignore[no-untyped-def]
        return render_workload(spec, workload, tokenizer, pf.categories[workload])

    click.echo(f"sweep {spec.name}, endpoint mode: {len(cells)} cells -> {run_dir}", err=True)
    outcome, fault = run_endpoint_bench(
        spec,
        run_dir,
        provider,
        endpoints,
        tokenizer=tokenizer,
        api_key_env=api_key_env,
        model=model,
        request_timeout_s=request_timeout,
        echo=lambda s: click.echo(s, err=True),
        spec_text=text,
        command_line=shlex.join(["speclab", *sys.argv[1:]]),
        redo=list(redo),
    )
    click.echo("")
    click.echo(format_server_run(run_dir))
    click.echo("")
    click.echo(
        f"{outcome.ok} endpoint cell(s) run, {outcome.skipped} already done, {outcome.failed} failed; "
        f"results: {run_dir}/results.jsonl, bench-serve results: {run_dir}/server/cells/"
    )
    if fault is not None:
        raise EndpointFault(fault)
    if outcome.failed:
        sys.exit(1)
