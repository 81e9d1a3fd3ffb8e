"""`speclab simulate`: predict SD throughput per batch size from traces and a cost model.

One command with many options (the study's rules, trace sets, Ray, --recommend); its output (table, JSON,
CSV, plot, the recommendation) is written by speclab.cli.simulate_output; the simulation itself lives in
speclab.simulate.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import click

from speclab.cli import batch_size_list
from speclab.cli.options import choice_option
from speclab.cli.simulate_output import PLOT_FORMATS, emit, recommend_and_print
from speclab.errors import ConfigError
from speclab.outputs import output_files


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
@choice_option(
    "--batching",
    choices=["replicate", "static", "continuous"],
    default="continuous",
)
@click.option("--batch-sizes", default="1,8,16,32,64,128", show_default=True)
@choice_option(
    "--aggregate",
    choices=["total", "study"],
    default="total",
    help="total: output tokens / total time. study: the study's 300-request sample and mean-over-batches.",
)
@click.option(
    "--ngram-miss-heuristic",
    default=None,
    help="Study guess of n-gram lookup misses where traces lack proposal counts: "
    "instructcoder|cnn|sharegpt|gsm8k|auto|P (auto = from each request's workload).",
)
@choice_option(
    "--combine-draft",
    choices=["auto", "chosen", "ngram"],
    default="auto",
    help="oracle-combine drafting charged as the chosen method, or as n-gram (the study; auto under study).",
)
@choice_option(
    "--linear-draft-kv",
    choices=["batch", "request"],
    default="batch",
    help="kv_tokens in the study's linear drafting form: the batch's, or each request's own (then max).",
)
@choice_option(
    "--continuous-measure",
    choices=["steady", "makespan"],
    default="steady",
    help="continuous batching: headline figures from the steady state (all B slots busy, requests "
    "re-admitted) or the single pass's makespan (the other is reported beside it).",
)
@choice_option(
    "--lengths",
    choices=["own", "common"],
    default="own",
    help="own: each policy over its methods' trace lengths (combine: the shorter), against a baseline over "
    "the same; common: every policy over the shortest length of all methods used.",
)
@choice_option(
    "--rules",
    choices=["auto", "speclab", "study"],
    default="auto",
    help="Step rules: the study's (auto with --batching replicate --aggregate study) or speclab's.",
)
@click.option("--switch-overhead", type=float, default=None, help="Seconds per step with a method switch.")
@click.option("--sample", type=click.IntRange(min=1), default=None, help="Sample N requests (study's rule).")
@click.option("--seed", type=int, default=42, show_default=True)
@click.option(
    "--draws",
    type=click.IntRange(0, 10_000),
    default=8,
    show_default=True,
    help="Sampled traces (accept_prob): realisations of each step's accepted count, drawn from --seed; "
    "figures are their mean, with the speedup's range. Greedy traces: no draws.",
)
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
    draws: int,
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
        recommend_and_print(traces, cost_model, _parse_sizes(batch_sizes), recommend_kmax, as_json)
        if not policies:
            return
    opts = {
        "ngram_miss_heuristic": heuristic,
        "combine_draft": combine_draft,
        "switch_overhead": switch_overhead,
        "linear_draft_kv": linear_draft_kv,
        "continuous_measure": continuous_measure,
        "lengths": lengths,
        "rules": rules,
        "sample": sample,
        "engine": engine,
        "draws": draws,
    }
    set_of, results = _run(sets, cost_model, policies, batching, sizes, aggregate, seed, ray_address, opts)
    emit(
        results,
        set_of,
        sets,
        cost_model,
        batching,
        aggregate,
        continuous_measure,
        csv_path,
        plot_path,
        as_json,
    )


def _run(
    sets: dict[str, list],
    cost_model: str,
    policies: tuple[str, ...],
    batching: str,
    sizes: list[int],
    aggregate: str,
    seed: int,
    ray_address: str | None,
    opts: dict,
) -> tuple[list[str], list]:
    """Simulate every trace set: in this process (one set) or as a sweep (several, or --ray); returns each
    result's trace-set name and the results."""
    from speclab.simulate import simulate

    args = (cost_model, list(policies), batching, sizes)
    kw = dict(aggregate=aggregate, seed=seed, **opts)
    if ray_address is None and len(sets) == 1:
        results = simulate(next(iter(sets.values())), *args, **kw)
        set_of = [next(iter(sets))] * len(results)
    else:
        from speclab.simulate.distributed import simulate_sweep

        echo = functools.partial(click.echo, err=True)
        pairs = simulate_sweep(sets, *args, ray_address=ray_address, echo=echo, **kw)
        set_of, results = [p[0] for p in pairs], [p[1] for p in pairs]
    return set_of, results


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
