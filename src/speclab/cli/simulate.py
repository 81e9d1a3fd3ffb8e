"""`speclab simulate`: predict SD throughput per batch size from traces and a cost model.

About 415 lines: one command with many options (the study's rules, trace sets, Ray, CSV/JSON/plot output,
--recommend); the simulation itself lives in speclab.simulate.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import click

from speclab.cli import batch_size_list
from speclab.errors import ConfigError
from speclab.outputs import output_files

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
]


def _rows(results: list) -> list[dict]:
    rows = []
    for r in results:
        d = r.to_dict()
        split = d.pop("time_split_s")
        d.pop("notes")
        d.update({f"{k}_s": v for k, v in split.items()})
        rows.append({k: d[k] for k in CSV_FIELDS})
    return rows


def _parse_sizes(s: str) -> list[int]:
    return batch_size_list(s, "--batch-sizes") or []


def _heuristic(v: str | None) -> str | float | None:
    if v is None:
        return None
    try:
        p = float(v)
    except ValueError:
        return v
    if not 0 <= p <= 1:  # NaN fails too
        raise ConfigError(f"--ngram-miss-heuristic {v!r}: a probability must be in 0..1")
    return p


def _unique_stores(stores: tuple[str, ...]) -> list[str]:
    """The stores, each once: the same store given twice would count every request twice."""
    out: dict[Path, str] = {}
    for s in stores:
        key = Path(s).resolve()
        if key in out:
            click.echo(f"note: --traces {s}: same store as {out[key]}; read once", err=True)
            continue
        out[key] = s
    return list(out.values())


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


def _continuous_cols(r, measure: str) -> str:
    other = r.makespan_speedup if measure == "steady" else r.steady_speedup
    tail = "-" if r.tail_share is None else f"{100 * r.tail_share:.1f}%"
    return f" {other:>8.2f}x {tail:>6}"


@click.command(name="simulate")
@click.option("--traces", "stores", multiple=True, type=click.Path(), help="Trace store (repeatable).")
@click.option(
    "--trace-set",
    "trace_set_args",
    multiple=True,
    metavar="NAME=STORE",
    help="A trace set simulated on its own (repeatable; instead of --traces): rows per set.",
)
@click.option(
    "--ray",
    "ray_address",
    is_flag=False,
    flag_value="auto",
    default=None,
    metavar="[ADDRESS]",
    help="Split the sweep (trace sets x policies x batch sizes) into Ray tasks on the cluster at ADDRESS, "
    "or (no ADDRESS) the running cluster, else a local one on 127.0.0.1. Needs the ray extra.",
)
@click.option("--workload", "workloads", multiple=True, help="Only requests of this workload (repeatable).")
@click.option(
    "--cost-model", default="llama3.1-8b-h100", show_default=True, help="Preset name or .toml path."
)
@click.option(
    "--policy", "policies", multiple=True, help="none | fixed:M:K | oracle:M | oracle-combine:M1,M2 | ..."
)
@click.option(
    "--batching",
    type=click.Choice(["replicate", "static", "continuous"]),
    default="continuous",
    show_default=True,
)
@click.option("--batch-sizes", default="1,8,16,32,64,128", show_default=True)
@click.option(
    "--aggregate",
    type=click.Choice(["total", "study"]),
    default="total",
    show_default=True,
    help="total: output tokens / total time. study: the study's 300-request sample and mean-over-batches.",
)
@click.option(
    "--ngram-miss-heuristic",
    default=None,
    help="Study guess of n-gram lookup misses where traces lack proposal counts: "
    "instructcoder|cnn|sharegpt|gsm8k|auto|P (auto = from each request's workload).",
)
@click.option(
    "--combine-draft",
    type=click.Choice(["auto", "chosen", "ngram"]),
    default="auto",
    show_default=True,
    help="oracle-combine drafting charged as the chosen method, or as n-gram (the study; auto under study).",
)
@click.option(
    "--linear-draft-kv",
    type=click.Choice(["batch", "request"]),
    default="batch",
    show_default=True,
    help="kv_tokens in the study's linear drafting form: the batch's, or each request's own (then max).",
)
@click.option(
    "--continuous-measure",
    type=click.Choice(["steady", "makespan"]),
    default="steady",
    show_default=True,
    help="continuous batching: headline figures from the steady state (all B slots busy, requests "
    "re-admitted) or the single pass's makespan (the other is reported beside it).",
)
@click.option(
    "--lengths",
    type=click.Choice(["own", "common"]),
    default="own",
    show_default=True,
    help="own: each policy over its methods' trace lengths (combine: the shorter), against a baseline over "
    "the same; common: every policy over the shortest length of all methods used.",
)
@click.option(
    "--rules",
    type=click.Choice(["auto", "speclab", "study"]),
    default="auto",
    show_default=True,
    help="Step rules: the study's (auto with --batching replicate --aggregate study) or speclab's.",
)
@click.option("--switch-overhead", type=float, default=None, help="Seconds per step with a method switch.")
@click.option("--sample", type=click.IntRange(min=1), default=None, help="Sample N requests (study's rule).")
@click.option("--seed", type=int, default=42, show_default=True)
@click.option("--engine", type=click.Choice(["fast", "reference"]), default="fast", hidden=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON rows instead of a table.")
@click.option(
    "--csv", "csv_path", type=click.Path(dir_okay=False), default=None, help="Also write rows as CSV."
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Speedup plot; the format from the suffix: .png, .svg or .pdf.",
)
@click.option("--force", is_flag=True, help="Replace existing --csv/--plot files.")
@click.option("--list-policies", is_flag=True, help="Print the registered policy names, one per line.")
@click.option(
    "--recommend",
    is_flag=True,
    help="Derive vLLM's batch-size schedule for k (num_speculative_tokens_per_batch_size) from these traces "
    "per method over --batch-sizes (continuous batching) and print the best as a ready-to-paste "
    "speculative config (docs/adaptive.md).",
)
@click.option("--recommend-kmax", type=click.IntRange(min=1), default=8, show_default=True, hidden=True)
def command(  # over 100 lines: one parameter per option, then the checks and dispatch in order
    stores: tuple[str, ...],
    trace_set_args: tuple[str, ...],
    ray_address: str | None,
    workloads: tuple[str, ...],
    cost_model: str,
    policies: tuple[str, ...],
    batching: str,
    batch_sizes: str,
    aggregate: str,
    ngram_miss_heuristic: str | None,
    combine_draft: str,
    linear_draft_kv: str,
    continuous_measure: str,
    lengths: str,
    rules: str,
    switch_overhead: float | None,
    sample: int | None,
    seed: int,
    engine: str,
    as_json: bool,
    csv_path: str | None,
    plot_path: str | None,
    force: bool,
    list_policies: bool,
    recommend: bool,
    recommend_kmax: int,
) -> None:
    """Simulate SD throughput from traces and a cost model.

    Example (the study's setting): speclab simulate --traces STORE --cost-model llama3.1-8b-h100
    --policy oracle-combine:ngram,eagle --batching replicate --aggregate study
    """
    from speclab.simulate import list_policies as _list
    from speclab.simulate import simulate

    if list_policies:
        for p in _list():
            click.echo(p.name)
        return
    if not stores and not trace_set_args:
        raise ConfigError("--traces STORE is required")
    if stores and trace_set_args:
        raise ConfigError("give --traces (one trace set) or --trace-set NAME=STORE (several), not both")
    if ray_address is not None:
        from speclab.raycluster import import_ray

        import_ray()
    if not policies and not recommend:
        raise ConfigError("give at least one --policy (see --list-policies)")
    sizes = _parse_sizes(batch_sizes)
    heuristic = _heuristic(ngram_miss_heuristic)
    if switch_overhead is not None and not (math.isfinite(switch_overhead) and 0 <= switch_overhead <= 1e3):
        raise ConfigError(f"--switch-overhead {switch_overhead}: need a finite number of seconds in 0..1000")
    if plot_path and Path(plot_path).suffix.lower() not in PLOT_FORMATS:
        raise ConfigError(f"--plot {plot_path}: the name must end in {', '.join(PLOT_FORMATS)} (the format)")
    inputs = [*stores, *(a.partition("=")[2] for a in trace_set_args), cost_model]
    output_files({"--csv": csv_path, "--plot": plot_path}, inputs, force=force)
    if trace_set_args:
        sets = _trace_sets(trace_set_args, workloads)
        if len(sets) > 1 and (recommend or plot_path):
            raise ConfigError("--recommend and --plot take one trace set (give --traces or one --trace-set)")
        traces = next(iter(sets.values()))
    else:
        stores = tuple(_unique_stores(stores))
        traces = _read_traces(stores, workloads)
        sets = {"traces": traces}
    if recommend:
        _recommend(traces, cost_model, _parse_sizes(batch_sizes), recommend_kmax, as_json)
        if not policies:
            return
    opts = dict(
        ngram_miss_heuristic=heuristic,
        combine_draft=combine_draft,
        switch_overhead=switch_overhead,
        linear_draft_kv=linear_draft_kv,
        continuous_measure=continuous_measure,
        lengths=lengths,
        rules=rules,
        sample=sample,
        engine=engine,
    )
    if ray_address is None and len(sets) == 1:
        results = simulate(
            traces, cost_model, list(policies), batching, sizes, aggregate=aggregate, seed=seed, **opts
        )
        set_of = [next(iter(sets))] * len(results)
    else:
        from speclab.simulate.distributed import simulate_sweep

        pairs = simulate_sweep(
            sets,
            cost_model,
            list(policies),
            batching,
            sizes,
            aggregate=aggregate,
            seed=seed,
            ray_address=ray_address,
            echo=lambda m: click.echo(m, err=True),
            **opts,
        )
        set_of, results = [p[0] for p in pairs], [p[1] for p in pairs]
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
        )


def _read_traces(stores: tuple[str, ...], workloads: tuple[str, ...]) -> list:
    from speclab.traces import read_store

    traces = [r for s in stores for r in read_store(s)]
    if workloads:
        traces = [r for r in traces if r.workload in workloads]
        if not traces:
            raise ConfigError(f"no requests of workload(s) {', '.join(workloads)} in {', '.join(stores)}")
    return traces


def _trace_sets(args: tuple[str, ...], workloads: tuple[str, ...]) -> dict[str, list]:
    """--trace-set NAME=STORE[,STORE...] -> {name: traces}, in the order given."""
    sets: dict[str, list] = {}
    for a in args:
        name, sep, paths = a.partition("=")
        name = name.strip()
        stores = tuple(p for p in paths.split(",") if p.strip())
        if not sep or not name or not stores:
            raise ConfigError(f"--trace-set {a!r}: expected NAME=STORE (e.g. ic=traces/ic)")
        if name in sets:
            raise ConfigError(f"--trace-set {name}: given twice")
        sets[name] = _read_traces(tuple(_unique_stores(stores)), workloads)
    return sets


def _recommend(traces: list, cost_model: str, sizes: list[int], kmax: int, as_json: bool) -> None:
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
