"""`speclab traces import|export|validate|info|replay|crosscheck`: get traces into a store, see what is in it,
replay each method's acceptance over them and cross-check the replay against engine runs.

`replay` and `crosscheck` are the commands of speclab.cli.trace (`speclab trace` and `speclab trace
crosscheck` stay as their aliases), loaded only when used.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from speclab.errors import TraceError
from speclab.traces.model import K_MAX_LIMIT

# replay tracing's subcommands, from speclab.cli.trace (imported when one of them runs)
REPLAY_COMMANDS = ("replay", "crosscheck")


class _TracesGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *REPLAY_COMMANDS]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "replay":
            from speclab.cli import trace

            return trace.command
        if cmd_name == "crosscheck":
            return _crosscheck
        return super().get_command(ctx, cmd_name)


@click.group(name="traces", cls=_TracesGroup)
def command() -> None:
    """Import, export, validate and inspect trace stores; replay methods over them and cross-check the
    replay against engine runs."""


@click.command(
    name="crosscheck",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def _crosscheck(args: tuple[str, ...]) -> None:
    """Replay vs engine, per method; takes the replay options (--ngram-min, --suffix-*, ...) too."""
    from speclab.cli import trace

    # the replay options (--ngram-min, --suffix-*, --draft-model, ...) belong to the replay group; the rest
    # (RUN, --json, --out, --show, --by-workload, --help) to its crosscheck
    group_opts = {o: p for p in trace.command.params if isinstance(p, click.Option) for o in p.opts}
    own = {o for p in trace.crosscheck.params for o in p.opts} | {"--help", "-h"}
    before: list[str] = []
    after: list[str] = []
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        name = arg.split("=", 1)[0]
        opt = group_opts.get(name)
        if opt is None or name in own:
            after.append(arg)
            continue
        before.append(arg)
        if not opt.is_flag and "=" not in arg and rest:
            before.append(rest.pop(0))
    trace.command.main([*before, "crosscheck", *after], prog_name="speclab traces", standalone_mode=False)


@command.command(name="import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["specdecode-bench", "speclab-jsonl"]),
    required=True,
    help="specdecode-bench: the study's JSON Lines; speclab-jsonl: speclab's own export.",
)
@click.option("--out", "out", required=True, type=click.Path(), help="Store: a directory or a .parquet file.")
@click.option(
    "--workload", default=None, help="Workload name (default: each file's name up to the first dot)."
)
@click.option("--category", default=None, help="Study category (default: guessed from the workload name).")
@click.option(
    "--k-max",
    type=click.IntRange(min=1, max=K_MAX_LIMIT),
    default=20,
    show_default=True,
    help="Study traces' k.",
)
@click.option("--lenient-lengths", is_flag=True, help="Truncate/pad acc_len arrays whose length differs.")
@click.option("--append", is_flag=True, help="Add a part to an existing directory store.")
@click.option("--force", is_flag=True, help="Replace an existing store.")
def import_cmd(
    files: tuple[str, ...],
    fmt: str,
    out: str,
    workload: str | None,
    category: str | None,
    k_max: int,
    lenient_lengths: bool,
    append: bool,
    force: bool,
) -> None:
    """Import trace FILE(s) into the store --out."""
    from speclab.traces import append_to_store, read_jsonl, write_store
    from speclab.traces.importers import import_specdecode_bench
    from speclab.traces.store import check_store_output

    outp = Path(out)
    if append and force:
        raise TraceError("give --append or --force, not both")
    # a first look, for an early answer; the authoritative check runs under the store's lock
    check_store_output(outp, files, force, append)
    if append and outp.suffix == ".parquet":
        raise TraceError(f"{out}: cannot append to a single-file store; use a directory")
    if fmt == "specdecode-bench":
        recs, notes = import_specdecode_bench(
            list(files), workload=workload, category=category, k_max=k_max, lenient_lengths=lenient_lengths
        )
    else:
        recs, notes = [], []
        seen: dict[str, str] = {}
        for f in files:
            for i, r in enumerate(read_jsonl(f)):
                if r.id in seen:
                    raise TraceError(
                        f"{f}: record {i} (id={r.id!r}): field id: duplicate (first in {seen[r.id]})"
                    )
                seen[r.id] = str(f)
                recs.append(r)
        if not recs:
            raise TraceError(f"{', '.join(files)}: no records found")
    if append:
        # the id check and the new part happen under the store's writer lock
        append_to_store(outp, recs, tag=Path(files[0]).stem, refuse_existing_ids=True)
    else:
        write_store(outp, recs, replace=force)
    for n in notes:
        click.echo(f"note: {n}", err=True)
    methods = sorted({m for r in recs for m in r.methods})
    click.echo(
        f"imported {len(recs)} request(s), {sum(r.output_len for r in recs)} output positions, "
        f"methods {', '.join(methods)} -> {out}"
        + ("; proposal counts: unknown (not in the source format)" if fmt == "specdecode-bench" else "")
    )


@command.command(name="export")
@click.argument("store", type=click.Path())
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="JSON Lines file.")
@click.option("--force", is_flag=True, help="Replace an existing --out file.")
def export_cmd(store: str, out: str, force: bool) -> None:
    """Export a store to speclab's lossless JSON Lines."""
    from speclab.outputs import output_file
    from speclab.traces import export_jsonl, read_store

    output_file(out, [store], force=force)
    recs = read_store(store)
    export_jsonl(recs, out)
    click.echo(f"exported {len(recs)} record(s) -> {out}")


@command.command(name="validate")
@click.argument("store", type=click.Path())
def validate_cmd(store: str) -> None:
    """Check every record of a store (exit 2 with the first problem)."""
    from speclab.traces import read_store

    recs = read_store(store, validate=True)
    ids: dict[str, int] = {}
    for i, r in enumerate(recs):
        if r.id in ids:
            raise TraceError(f"{store}: record {i} (id={r.id!r}): field id: duplicate of record {ids[r.id]}")
        ids[r.id] = i
    click.echo(f"ok: {len(recs)} record(s) valid")


@command.command(name="info")
@click.argument("store", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def info_cmd(store: str, as_json: bool) -> None:
    """Summarise a store: requests and positions per workload; per method acceptance and output lengths
    (a method's trace may have its own length, from its own run)."""
    from speclab.traces import read_store

    recs = read_store(store)
    info: dict = {"store": store, "requests": len(recs), "workloads": {}}
    for wl in sorted({r.workload for r in recs}):
        rs = [r for r in recs if r.workload == wl]
        w: dict = {
            "category": sorted({r.category for r in rs}),
            "requests": len(rs),
            "output_positions": int(sum(r.output_len for r in rs)),
            "mean_prompt_len": float(sum(r.prompt_len for r in rs) / len(rs)),
            "mean_output_len": float(sum(r.output_len for r in rs) / len(rs)),
            "methods": {},
        }
        for m in sorted({m for r in rs for m in r.methods}):
            mts = [r.methods[m] for r in rs if m in r.methods]
            pos = int(sum(len(t.acc_len) for t in mts))
            tot = float(sum(int(t.acc_len.sum()) for t in mts))
            known = sum(t.num_proposed is not None for t in mts)
            lens = [len(t.acc_len) for t in mts]
            # each method's trace has its own length (its own run); how far it is from the record's output
            own = [len(r.methods[m].acc_len) - r.output_len for r in rs if m in r.methods]
            w["methods"][m] = {
                "requests": len(mts),
                "output_positions": pos,
                "mean_output_len": pos / len(mts),
                "min_output_len": min(lens),
                "max_output_len": max(lens),
                "own_length_requests": sum(d != 0 for d in own),
                "mean_abs_length_diff": sum(abs(d) for d in own) / len(own),
                "k_max": sorted({int(t.k_max) for t in mts}),
                "mean_acc_len_per_position": tot / pos if pos else None,
                "proposal_counts": "recorded"
                if known == len(mts)
                else ("unknown" if known == 0 else "partial"),
            }
        info["workloads"][wl] = w
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"{store}: {len(recs)} request(s)")
    for wl, w in info["workloads"].items():
        click.echo(
            f"  {wl} ({', '.join(w['category'])}): {w['requests']} requests, {w['output_positions']} output "
            f"positions, mean prompt {w['mean_prompt_len']:.1f}, mean output {w['mean_output_len']:.1f}"
        )
        for m, d in w["methods"].items():
            acc = "n/a" if d["mean_acc_len_per_position"] is None else f"{d['mean_acc_len_per_position']:.2f}"
            click.echo(
                f"    {m:<12} k_max {','.join(map(str, d['k_max']))}  mean acc_len/position {acc}  "
                f"proposal counts {d['proposal_counts']}"
            )
            own = (
                f"{d['own_length_requests']} of {d['requests']} with their own length "
                f"(mean |difference| {d['mean_abs_length_diff']:.1f})"
                if d["own_length_requests"]
                else "all as the records' output"
            )
            click.echo(
                f"    {'':<12} length mean {d['mean_output_len']:.1f}, min {d['min_output_len']}, "
                f"max {d['max_output_len']}; {own}"
            )
