"""`speclab trace`: replay per-position acceptance for each method, and cross-check against engine runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from speclab.catalog import NGRAM_MAX_N, NGRAM_MIN_N
from speclab.cli.options import INT32_MAX, choice_option, limit_option, seed_option
from speclab.cli.trace_sampled import crosscheck_expected, make_scorer, records_target
from speclab.errors import ConfigError
from speclab.replay.generate import GENERATORS

_COUNT = click.IntRange(1, 1 << 24)  # lengths, depths and n-gram sizes: bounded, so nothing overflows

_METHODS_HELP = (
    "Comma list of methods to replay: ngram, suffix, draft_model, eagle3 (a trained EAGLE-3 head), "
    "eagle (EAGLE-1, experimental)."
)


def _method_options(
    ngram_min: int,
    ngram_max: int,
    max_model_len: int | None,
    suffix_opts: dict[str, Any],
    draft_model: str | None,
    threads: int | None,
    eagle_head: str | None = None,
    target: str | None = None,
    eagle3_head: str | None = None,
) -> dict[str, dict[str, Any]]:
    opts: dict[str, dict[str, Any]] = {
        "ngram": {"min_n": ngram_min, "max_n": ngram_max, "max_model_len": max_model_len},
        "suffix": dict(suffix_opts),
        "draft_model": {"max_model_len": max_model_len, "threads": threads},
    }
    if draft_model:
        from speclab.models.prepare import resolve_model

        opts["draft_model"]["model"] = str(resolve_model(draft_model))
    if eagle_head:
        from speclab.models.prepare import resolve_model

        if not target:
            raise ConfigError("eagle replay needs --target (the model whose hidden states feed the head)")
        opts["eagle"] = {"head": eagle_head, "target": str(resolve_model(target))}
    # eagle3: the head is resolved here; the target here or, with --from, from the records (records_target)
    opts["eagle3"] = {"max_model_len": max_model_len, "threads": threads}
    if eagle3_head:
        from speclab.models.prepare import resolve_model

        opts["eagle3"]["head"] = str(resolve_model(eagle3_head))
    if target:
        from speclab.models.prepare import resolve_model

        opts["eagle3"]["target"] = str(resolve_model(target))
    return opts


def _progress(desc: str):
    from tqdm import tqdm

    return lambda it: tqdm(it, desc=desc, unit="req", file=sys.stderr, disable=None)


@click.group(name="trace", invoke_without_command=True)
@click.option("--from", "source", type=click.Path(exists=True), help="Trace store, bench RUN dir or JSONL.")
@click.option(
    "--workload",
    default=None,
    help="Generate outputs on the spot for this workload (a name, or file:PATH; needs --target).",
)
@click.option("--target", default=None, help="Target model (preset name or checkpoint) for --workload.")
@limit_option("Prompts of --workload to generate.", default=20)
@click.option(
    "--max-tokens",
    type=click.IntRange(1, INT32_MAX),
    default=256,
    show_default=True,
    help="Output tokens per request for --workload.",
)
@choice_option(
    "--generator",
    choices=GENERATORS,
    default="engine",
    help="--workload outputs from: engine (all prompts batched on a vLLM engine, as the bench runs them) or "
    "transformers (one request at a time, no vLLM needed; slower). Greedy fp32 either way, same tokens; "
    "sampled outputs (--temperature > 0): engine only.",
)
@click.option(
    "--temperature",
    type=click.FloatRange(0.0, 100.0),
    default=0.0,
    show_default=True,
    help="--workload: sample the outputs at this temperature (0: greedy); sampled records get accept_prob.",
)
@click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=1.0, show_default=True,
              help="--workload sampling: top-p (1: off).")  # fmt: skip
@click.option("--top-k", type=click.IntRange(0, INT32_MAX), default=0, show_default=True,
              help="--workload sampling: top-k (0: off).")  # fmt: skip
@seed_option("--workload sampling: each prompt's seed is derived from this and the prompt's id.", default=0)
@choice_option(
    "--draft-sampling",
    choices=["greedy", "probabilistic"],
    default="greedy",
    help="Sampled traces, model drafters: expected acceptance for argmax drafts (vLLM's default "
    "draft_sample_method, p_T(argmax q)) or for drafts sampled from q (sum-min).",
)
@click.option("--methods", default="ngram,suffix", show_default=True, help=_METHODS_HELP)
@click.option("--k-max", default=20, show_default=True, help="Longest proposal replayed per position.")
@click.option("--out", "out", type=click.Path(), help="Output store (.parquet file, directory, or .jsonl).")
@click.option("--force", is_flag=True, help="Replace an existing --out.")
@click.option(
    "--ngram-min", type=_COUNT, default=NGRAM_MIN_N, show_default=True, help="n-gram prompt_lookup_min."
)
@click.option(
    "--ngram-max", type=_COUNT, default=NGRAM_MAX_N, show_default=True, help="n-gram prompt_lookup_max."
)
@click.option(
    "--suffix-max-tree-depth",
    type=_COUNT,
    default=24,
    show_default=True,
    help="vLLM suffix_decoding_max_tree_depth.",
)
@click.option("--suffix-max-cached-requests", type=click.IntRange(0, INT32_MAX), default=10000, show_default=True,
              help="vLLM suffix_decoding_max_cached_requests (responses kept in the global tree).")  # fmt: skip
@click.option(
    "--suffix-max-spec-factor",
    type=click.FloatRange(0.0, 1e6),
    default=1.0,
    show_default=True,
    help="vLLM suffix_decoding_max_spec_factor.",
)
@click.option(
    "--suffix-min-token-prob",
    type=click.FloatRange(0.0, 1.0),
    default=0.1,
    show_default=True,
    help="vLLM suffix_decoding_min_token_prob.",
)
@click.option("--suffix-no-global", is_flag=True, help="Suffix: no global tree (max_cached_requests 0).")
@click.option("--draft-model", default=None, help="Draft checkpoint (preset name or path) for draft_model.")
@click.option("--eagle3-head", default=None, help="EAGLE-3 head (dir or preset name) for eagle3.")
@click.option("--eagle-head", default=None, help="EAGLE-1 head dir for eagle (experimental; needs --target).")
@click.option(
    "--max-model-len", default=None, type=_COUNT, help="Cap proposals like an engine with this limit."
)
@click.option(
    "--threads",
    default=None,
    type=click.IntRange(1, 4096),
    help="torch threads for draft_model and --generator transformers (default: torch's; 1 for crosscheck --expected).",
)
@click.pass_context
def command(  # over 100 lines: one parameter per option, then the checks and dispatch in order
    ctx: click.Context,
    source: str | None,
    workload: str | None,
    target: str | None,
    limit: int,
    max_tokens: int,
    generator: str,
    temperature: float,
    top_p: float,
    top_k: int,
    seed: int,
    draft_sampling: str,
    methods: str,
    k_max: int,
    out: str | None,
    force: bool,
    ngram_min: int,
    ngram_max: int,
    suffix_max_tree_depth: int,
    suffix_max_cached_requests: int,
    suffix_max_spec_factor: float,
    suffix_min_token_prob: float,
    suffix_no_global: bool,
    draft_model: str | None,
    eagle3_head: str | None,
    eagle_head: str | None,
    max_model_len: int | None,
    threads: int | None,
) -> None:
    """Replay tracing: for every output position and method, the proposal the method would make from
    prompt + output[:p] (up to --k-max tokens), its length and the acceptance length.

    \b
    speclab trace --from RUN_OR_STORE --methods ngram,suffix --out traced.parquet
    speclab trace --workload offline-code-edit --target smollm2-135m --limit 10 --out t.parquet
    speclab trace --from RUN --methods eagle3 --eagle3-head smollm2-135m-eagle3 --out t.parquet
    speclab trace crosscheck RUN            (replay vs what vLLM accepted, per method)
    """
    ctx.ensure_object(dict)
    ctx.obj.update(
        opts=dict(
            ngram_min=ngram_min,
            ngram_max=ngram_max,
            max_model_len=max_model_len,
            suffix_opts=dict(
                max_tree_depth=suffix_max_tree_depth,
                max_cached_requests=0 if suffix_no_global else suffix_max_cached_requests,
                max_spec_factor=suffix_max_spec_factor,
                min_token_prob=suffix_min_token_prob,
            ),
            draft_model=draft_model,
            threads=threads,
            eagle_head=eagle_head,
            target=target,
            eagle3_head=eagle3_head,
        )
    )
    if ctx.invoked_subcommand is not None:
        return
    from speclab.replay.replay import load_records, replay_records

    if bool(source) == bool(workload):
        raise click.UsageError("give exactly one of --from STORE_OR_RUN or --workload NAME (with --target)")
    if not out:
        raise click.UsageError("--out is required")
    _check_out(out, source, force)
    from speclab.traces.model import K_MAX_LIMIT

    if not 1 <= k_max <= K_MAX_LIMIT:
        raise ConfigError(f"--k-max must be in 1..{K_MAX_LIMIT}, got {k_max}")
    mlist, options = _methods(methods, ctx.obj["opts"])
    sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed}
    if source:
        if temperature > 0:
            raise click.UsageError("--temperature applies to --workload (--from records keep their sampling)")
        records = load_records(source)
    else:
        records = _generate(workload, target, limit, max_tokens, threads, generator, sampling)
    if "eagle3" in mlist and "target" not in options["eagle3"]:
        options["eagle3"]["target"] = records_target(records)
    with_ids = [r for r in records if r.prompt_token_ids is not None and r.output_token_ids is not None]
    if not with_ids:
        raise ConfigError(
            f"{source or workload}: no record carries prompt and output token ids; nothing to replay"
        )
    compare: dict[str, list[int]] = {}
    traced = replay_records(
        records, mlist, k_max, options, progress=_progress("replay"), skip_missing_ids=True, compare=compare,
        scorer=lambda: make_scorer(target, records, threads), draft_sampling=draft_sampling,
    )  # fmt: skip
    _write(out, traced, force)
    skipped = len(records) - len(with_ids)
    click.echo(
        f"replayed {len(with_ids)} requests x {', '.join(mlist)} (k_max {k_max}) -> {out}"
        + (f"; {skipped} records without token ids passed through unchanged" if skipped else "")
    )
    _summary(mlist, with_ids, compare)


def _methods(methods: str, opts: dict[str, Any]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """--methods checked, and each method's replay options."""
    from speclab.traces import check_method_name

    mlist = [m.strip() for m in methods.split(",")]
    if not all(mlist):
        raise ConfigError(f"--methods: empty item in {methods!r} (expected comma-separated method names)")
    for m in mlist:
        check_method_name(m)
    options = _method_options(**opts)
    if "eagle3" in mlist and "head" not in options["eagle3"]:
        from speclab.methods.eagle3 import MISSING_HEAD

        raise ConfigError(MISSING_HEAD)
    return mlist, options


def _generate(
    workload: str, target: str | None, limit: int, max_tokens: int, threads: int | None, generator: str,
    sampling: dict[str, Any],
) -> list:  # fmt: skip
    """--workload: the target's outputs (greedy, or sampled), generated here (speclab.replay.generate)."""
    if not target:
        raise click.UsageError("--workload needs --target (the model whose greedy outputs are replayed)")
    from speclab.replay.generate import generate_records

    return generate_records(
        workload,
        target,
        limit=limit,
        max_tokens=max_tokens,
        threads=threads,
        generator=generator,
        echo=lambda s: click.echo(s, err=True),
        sampling=sampling,
    )


def _summary(mlist: list[str], with_ids: list, compare: dict[str, list[int]]) -> None:
    """Per method: mean acceptance length and proposal rate over the replayed positions."""
    for m in mlist:
        accs = [r.methods[m].acc_len[1:] for r in with_ids if m in r.methods and r.output_len > 1]
        if accs:
            import numpy as np

            a = np.concatenate(accs)
            hit = np.concatenate([r.methods[m].num_proposed[1:] > 0 for r in with_ids if r.output_len > 1])
            exp = [r.methods[m].expected_acc_len() for r in with_ids if m in r.methods and r.output_len > 1]
            exp = [e[1:] for e in exp if e is not None]
            click.echo(
                f"  {m:12s} mean acc_len {a.mean():.3f}  proposal rate {hit.mean():.3f}  positions {len(a)}"
                + (f"  expected acc_len (sampled) {np.concatenate(exp).mean():.3f}" if exp else "")
            )
    for m, (eq, tot) in compare.items():
        click.echo(
            f"  {m}: replaced existing entries; equal to the replay at {eq}/{tot} positions ({100 * eq / tot:.1f}%)"
        )


def _check_out(out: str, source: str | None, force: bool) -> None:
    """Before the replay: the output is not the input and replaces an existing one only with --force."""
    if out.endswith(".jsonl"):
        from speclab.outputs import output_file

        output_file(out, [source], force=force)
    else:
        from speclab.traces.store import check_store_output

        check_store_output(out, [source], force)


def _write(out: str, records: list, force: bool) -> None:
    from speclab.traces import export_jsonl, write_store

    if out.endswith(".jsonl"):
        export_jsonl(records, out)
    else:
        write_store(out, records, replace=force)


@command.command(name="crosscheck")
@click.argument("run", type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--out", "out", type=click.Path(dir_okay=False), help="Write summary + mismatches as JSON here."
)
@click.option("--force", is_flag=True, help="Replace an existing output file.")
@click.option("--show", default=5, show_default=True, help="Mismatches to print.")
@click.option("--by-workload", is_flag=True, help="Break the agreement down per workload.")
@click.option(
    "--expected",
    is_flag=True,
    help="Sampled runs: the engine's mean acceptance length beside the one expected from the replayed "
    "acceptance probabilities, per method and temperature, with engine faults flagged.",
)
@click.option("--draft-sampling", type=click.Choice(["greedy", "probabilistic"]), default=None,
              help="--expected, model drafters: argmax drafts or drafts sampled from q (sum-min); default: "
              "the run's draft_sample_method, else vLLM's default (greedy).")  # fmt: skip
@click.pass_context
def crosscheck(  # fmt: skip
    ctx: click.Context,
    run: str,
    as_json: bool,
    out: str | None,
    force: bool,
    show: int,
    by_workload: bool,
    expected: bool,
    draft_sampling: str,
) -> None:
    """Replay vs engine: walk the replayed trace the way vLLM steps (skipping accepted positions) and
    compare with each request's observed per-step accepted/drafted counts; agreement per method.
    --expected (sampled runs): measured vs expected mean acceptance length instead."""
    from speclab.atomic import atomic_write_text
    from speclab.replay.crosscheck import crosscheck_records
    from speclab.replay.replay import load_records
    from speclab.replay.runs import make_run_replay_fn

    opts = ctx.obj["opts"]
    if out:
        from speclab.outputs import output_file

        output_file(out, [run], force=force)
    records = load_records(run)
    if expected:
        payload = crosscheck_expected(run, records, {**opts, "draft_sampling": draft_sampling}, as_json)
        if out:
            atomic_write_text(out, json.dumps(payload, indent=2) + "\n")
        return
    replay_fn, skipped = make_run_replay_fn(Path(run), opts)
    res = crosscheck_records(records, replay_fn, max_model_len=opts["max_model_len"])
    mismatches = res.mismatches()
    payload = {
        "run": str(run),
        "summary": res.summary(),
        "by_workload": res.summary(by_workload=True),
        "skipped_methods": skipped,
        "mismatches": [vars(m) for m in mismatches],
        "explained": [vars(m) for m in res.per_request if m.status in ("output_end", "max_model_len")],
    }
    summary = payload["by_workload" if by_workload else "summary"]
    if out:
        atomic_write_text(out, json.dumps(payload, indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(payload, indent=2))
        return
    if not summary:
        click.echo(f"{run}: no records with meta['observed'] for a replayable method")
    for m, s in summary.items():
        click.echo(
            f"{m:28s} requests {s['requests']:4d}  agree {s['agree']:4d}  output_end {s['output_end']:3d}  "
            f"max_model_len {s['max_model_len']:3d}  mismatch {s['mismatch']:3d}  "
            f"agreement {100 * s['agreement_rate']:.1f}%  steps {s['steps_matched']}/{s['steps_observed']}"
        )
    for name, why in skipped.items():
        click.echo(f"{name:28s} skipped: {why}")
    for m in mismatches[:show]:
        click.echo(f"  mismatch {m.id} ({m.method}, k={m.k}): {m.first_diff}")
