"""What `speclab simulate` prints and writes: the table (or JSON rows), the CSV file, the plot, and the
`--recommend` report with its ready-to-paste speculative config."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import click

PLOT_FORMATS = (".png", ".svg", ".pdf")


CSV_FIELDS = [
    "batch_size",
    "policy",
    "speedup",
    "throughput_tok_s",
    "baseline_throughput_tok_s",
    "mean_accepted_len",
    "verify_s",
    "propose_s",
    "overhead_s",
    "total_time_s",
    "tokens_rejected",
    "steps",
    "output_tokens",
    "num_requests",
    "batching",
    "aggregate",
    "makespan_speedup",
    "makespan_throughput_tok_s",
    "tail_share",
    "steady_speedup",
    "steady_throughput_tok_s",
    "draws",  # sampled traces: realisations averaged, and the speedup's range over them
    "speedup_min",
    "speedup_max",
]


def _rows(results: list) -> list[dict]:
    rows = []
    for r in results:
        d = r.to_dict()
        split = d.pop("time_split_s")
        d.pop("notes")
        d.update({f"{k}_s": v for k, v in split.items()})
        sp = d.pop("speedup_spread") or {}
        d.update(speedup_min=sp.get("min"), speedup_max=sp.get("max"))
        rows.append({k: d[k] for k in CSV_FIELDS})
    return rows


def _plot(results: list, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from speclab.atomic import atomic_path

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for pol in dict.fromkeys(r.policy for r in results):
        pts = [(r.batch_size, r.speedup) for r in results if r.policy == pol]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=pol)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    sizes = sorted({r.batch_size for r in results})
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.minorticks_off()
    ax.set_xlabel("batch size")
    ax.set_ylabel("speedup over no SD")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=Path(path).suffix.lower()[1:], dpi=120)
    plt.close(fig)


def _spread(r) -> str:
    sp = r.speedup_spread
    return f"  [{sp['min']:.2f}-{sp['max']:.2f}x over {sp['n']} draws]"


def _continuous_cols(r, measure: str) -> str:
    other = r.makespan_speedup if measure == "steady" else r.steady_speedup
    tail = "-" if r.tail_share is None else f"{100 * r.tail_share:.1f}%"
    return f" {other:>8.2f}x {tail:>6}"


def emit(
    results: list,
    set_of: list[str],
    sets: dict[str, list],
    cost_model: str,
    batching: str,
    aggregate: str,
    continuous_measure: str,
    csv_path: str | None,
    plot_path: str | None,
    as_json: bool,
) -> None:
    """Notes, then the CSV and plot files where asked, then the JSON or the table on stdout."""
    many = len(sets) > 1
    for n in dict.fromkeys(n for r in results for n in r.notes):
        click.echo(f"note: {n}", err=True)
    if csv_path:
        from speclab.atomic import atomic_write_text

        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=(["trace_set"] if many else []) + CSV_FIELDS)
        w.writeheader()
        w.writerows(
            [dict(row, trace_set=name) for name, row in zip(set_of, _rows(results), strict=True)]
            if many
            else _rows(results)
        )
        atomic_write_text(csv_path, buf.getvalue())
    if plot_path:
        _plot(
            results,
            plot_path,
            f"{cost_model} | {batching} | aggregate {aggregate} | {results[0].num_requests} req",
        )
    if as_json:
        click.echo(
            json.dumps(
                [
                    dict(r.to_dict(), trace_set=n) if many else r.to_dict()
                    for n, r in zip(set_of, results, strict=True)
                ],
                indent=2,
            )
        )
        return
    cont = batching == "continuous"
    head = f"{'batch':>5}  {'policy':<30} {'speedup':>8} {'tok/s':>10} {'acc_len':>7} {'verify%':>7} {'propose%':>8} {'ovh%':>5} {'rejected':>10}"
    if cont:  # the other measure beside the headline one, and the single pass's tail
        head += f" {'makespan' if continuous_measure == 'steady' else 'steady':>9} {'tail%':>6}"
    width = max(len(n) for n in sets)
    click.echo((f"{'set':<{width}}  " if many else "") + head)
    for name, r in zip(set_of, results, strict=True):
        tot = sum(r.time_split_s.values()) or 1.0
        acc = "-" if r.mean_accepted_len is None else f"{r.mean_accepted_len:.2f}"
        click.echo(
            (f"{name:<{width}}  " if many else "")
            + f"{r.batch_size:>5}  {r.policy:<30} {r.speedup:>7.2f}x {r.throughput_tok_s:>10.1f} {acc:>7} "
            f"{100 * r.time_split_s['verify'] / tot:>6.1f}% {100 * r.time_split_s['propose'] / tot:>7.1f}% "
            f"{100 * r.time_split_s['overhead'] / tot:>4.1f}% {r.tokens_rejected:>10}"
            + (_continuous_cols(r, continuous_measure) if cont else "")
            + (_spread(r) if r.speedup_spread else "")
        )


def recommend_and_print(traces: list, cost_model: str, sizes: list[int], kmax: int, as_json: bool) -> None:
    from speclab.simulate.adaptive import recommend

    rec = recommend(traces, cost_model, sizes, kmax)
    if as_json:
        click.echo(json.dumps(rec, indent=2))
        return
    what = "vLLM's batch-size schedule" if rec["kind"] == "schedule" else "one fixed k"
    click.echo(f"recommended: {rec['method']} with {what} ({rec['policy']})")
    click.echo("simulated speedup (continuous batching, steady state): " + ", ".join(
        f"B={b} {v:.2f}x" for b, v in rec["speedup"].items()))  # fmt: skip
    if rec["note"]:
        click.echo(f"  note: {rec['note']}")
    for m, o in rec["others"].items():
        if m != rec["method"]:
            click.echo(f"  other: {o['policy']} (mean speedup {o['mean_speedup']:.2f}x)")
            if o["note"]:
                click.echo(f"    note: {o['note']}")
    if rec["not_costed"]:
        click.echo(
            f"  skipped (the cost model has no drafting cost for them): {', '.join(rec['not_costed'])}"
        )
    installed = rec["vllm"] or "not installed here"
    click.echo(
        f"only what vLLM {rec['vllm_checked']} can run is offered (schedules for ngram, eagle, eagle3, mtp, "
        f"draft_model; one fixed k for suffix and custom_class); installed vLLM: {installed}"
    )
    if rec["vllm"] and not rec["vllm"].startswith(rec["vllm_checked"] + "."):
        click.echo(f"  warning: which proposers follow a schedule was checked in vLLM {rec['vllm_checked']}'s "
                   f"source only; check yours ({rec['vllm']})")  # fmt: skip
    click.echo("speculative config (k = 0 switches SD off at that batch size):")
    click.echo(json.dumps(rec["speculative_config"]))
    if rec["method"].startswith("custom:"):
        click.echo('(add "model": the proposer\'s class path, package.module.ClassName)')
    elif rec["method"] not in ("ngram", "suffix"):
        click.echo(f'(add the drafter: "model": the {rec["method"]} model path, as in your current config)')
