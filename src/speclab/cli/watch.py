"""`speclab watch URL`: a running vLLM's spec-decode counters and occupancy over a window (no request sent),
and with --cost-model what other k (or SD off) would give at that occupancy (docs/server.md)."""

from __future__ import annotations

import json
import math

import click

from speclab.errors import ConfigError


def _positive(value: float, flag: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{flag} {value}: need a number of seconds > 0")
    return value


@click.command(name="watch")
@click.argument("url")
@click.option("--window", "window_s", type=float, default=10.0, show_default=True, help="Seconds to watch.")
@click.option(
    "--interval",
    "interval_s",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds between scrapes (occupancy is sampled at each).",
)
@click.option(
    "--cost-model",
    default=None,
    help="A cost model (name or TOML file): price k = 0 (SD off) .. the server's k at the observed occupancy.",
)
@click.option(
    "--method", default="ngram", show_default=True, help="The drafting cost the what-if charges (cost model)."
)
@click.option(
    "--context-tokens",
    type=click.IntRange(min=0),
    default=None,
    help="Context (KV) tokens per running request for the what-if; default: the window's finished requests' "
    "prompt + half their output, else 1024.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def command(
    url: str,
    window_s: float,
    interval_s: float,
    cost_model: str | None,
    method: str,
    context_tokens: int | None,
    as_json: bool,
) -> None:
    """Read URL's /metrics for --window seconds: acceptance per draft position, mean acceptance length,
    draft and accepted token rates, running requests; sends no request."""
    from speclab.server.watch import context_estimate, format_watch, watch

    _positive(window_s, "--window")
    _positive(interval_s, "--interval")
    r = watch(url, window_s, interval_s)
    if cost_model is not None:
        r["what_if"] = _what_if(r, cost_model, method, context_tokens, context_estimate(r))
    click.echo(json.dumps(r, indent=2) if as_json else format_watch(r))


def _what_if(r: dict, name: str, method: str, ctx: int | None, estimate: float | None) -> dict:
    from speclab.costmodel import get_cost_model
    from speclab.server.whatif import ASSUMES, what_if

    if not r["acceptance_rate_per_pos"]:
        raise ConfigError("--cost-model: no drafts in the window (SD off or idle): nothing to price")
    if not r.get("running") or not r["running"]["busy_mean"]:
        raise ConfigError("--cost-model: no request was running in the window")
    cm = get_cost_model(name)
    context = float(ctx if ctx is not None else estimate if estimate is not None else 1024)
    share = r["draft_share"] if r["draft_share"] is not None else 1.0
    rows = what_if(
        cm, method, r["acceptance_rate_per_pos"], r["running"]["busy_mean"], share, context, r["k"]
    )
    return {
        "cost_model": cm.name,
        "method": method,
        "running": r["running"]["busy_mean"],
        "context_tokens": context,
        "draft_share": share,
        "observed_k": r["k"],
        "rows": rows,
        "assumes": ASSUMES,
    }
