"""`speclab workloads list|show|export|inspect`: see exactly which prompts a run uses."""

from __future__ import annotations

import json

import click

from speclab.cli.options import choice_option, limit_option, seed_option
from speclab.validation import MAX_PROMPTS


def _load(name: str, limit: int | None, seed: int, source: str | None) -> list:
    from speclab.workloads import get_workload, load_workload

    info = get_workload(name)
    try:
        prompts = load_workload(name, limit=limit, seed=seed, source=source)
    except UnicodeDecodeError as exc:  # a binary --source: one line that names it
        from speclab.errors import ConfigError

        raise ConfigError(f"--source {source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if limit is not None and len(prompts) < limit:
        click.echo(
            f"note: {name} yielded {len(prompts)} prompts, fewer than --limit {limit}"
            + (f" ({info.notes})" if info.notes else ""),
            err=True,
        )
    return prompts


_common = [
    click.option(
        "--limit", type=click.IntRange(0, MAX_PROMPTS), default=None, help="At most this many prompts."
    ),
    seed_option("Sampling / generation seed.", default=0),
    click.option(
        "--source",
        type=click.Path(exists=True),
        default=None,
        help="Local file or directory in the dataset's schema (jsonl/json/parquet/csv, a datasets "
        "save_to_disk dir, or a hub snapshot dir); for offline-code-edit/-summarization local material.",
    ),
]


def _with_common(f):  # type: ignore[no-untyped-def]
    for opt in reversed(_common):
        f = opt(f)
    return f


@click.group(name="workloads")
def command() -> None:
    """List, show and export workloads (study datasets, offline stand-ins, your own files as file:PATH)."""


@command.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_cmd(as_json: bool) -> None:
    """List the registered workloads."""
    from speclab.workloads import list_workloads

    infos = list_workloads()
    if as_json:
        click.echo(json.dumps([i.to_dict() for i in infos], indent=2))
        return
    w = max(len(i.name) for i in infos)
    for i in infos:
        src = f" [{i.hf_id}{' ' + i.hf_config if i.hf_config else ''}]" if i.hf_id else ""
        click.echo(f"{i.name:<{w}}  {i.kind:<7}  {i.category:<13}  {i.description}{src}")
        if i.notes:
            click.echo(f"{'':<{w}}  {'':<7}  {'':<13}  note: {i.notes}")


@command.command(name="show")
@click.argument("name")
@_with_common
@click.option("--json", "as_json", is_flag=True, help="Print each prompt as one JSON line.")
def show_cmd(name: str, limit: int | None, seed: int, source: str | None, as_json: bool) -> None:
    """Print the prompts of workload NAME (default: the first 5)."""
    prompts = _load(name, 5 if limit is None else limit, seed, source)
    for p in prompts:
        if as_json:
            click.echo(json.dumps(p.to_dict(), ensure_ascii=False))
            continue
        meta = {k: v for k, v in p.meta.items() if k != "truncate"}
        click.echo(f"=== {p.id}  ({p.category})  {json.dumps(meta, ensure_ascii=False)}")
        for m in p.messages:
            click.echo(f"--- {m['role']}:\n{m['content']}")
        if p.reference is not None:
            ref = p.reference if len(p.reference) <= 400 else p.reference[:400] + " [...]"
            click.echo(f"--- reference:\n{ref}")
        click.echo()


@command.command(name="export")
@click.argument("name")
@click.option("--out", "out", type=click.Path(dir_okay=False), required=True, help="Output .jsonl file.")
@_with_common
@click.option(
    "--tokenizer",
    default=None,
    help="Target model (checkpoint dir, .gguf file or speclab model name): also write prompt_token_ids "
    "from its chat template.",
)
@click.option(
    "--max-prompt-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Truncate longer prompts' bodies to fit (needs --tokenizer); recorded per prompt.",
)
@click.option("--force", is_flag=True, help="Replace an existing output file.")
def export_cmd(
    name: str,
    out: str,
    limit: int | None,
    seed: int,
    source: str | None,
    tokenizer: str | None,
    max_prompt_tokens: int | None,
    force: bool,
) -> None:
    """Write the prompts of workload NAME as JSON lines (one Prompt per line)."""
    from speclab.atomic import atomic_path
    from speclab.errors import SpeclabError
    from speclab.outputs import output_file

    if max_prompt_tokens is not None and tokenizer is None:
        raise SpeclabError("--max-prompt-tokens needs --tokenizer (truncation is counted in target tokens)")
    file_input = name[len("file:") :].strip() if name.startswith("file:") else None
    output_file(out, [file_input, source], force=force)
    prompts = _load(name, limit, seed, source)
    tok = None
    if tokenizer is not None:
        from speclab.workloads.render import load_tokenizer, render_prompt

        tok = load_tokenizer(tokenizer)
    n_trunc = 0
    with atomic_path(out) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for p in prompts:
            row = p.to_dict()
            if tok is not None:
                ids, truncated = render_prompt(p, tok, max_prompt_tokens)
                row["prompt_token_ids"] = ids
                row["prompt_len"] = len(ids)
                row["truncated"] = truncated
                # an untruncated prompt is the full rendering: tokenise again only when it was cut
                row["untruncated_prompt_len"] = len(render_prompt(p, tok)[0]) if truncated else len(ids)
                row["prompt_text"] = tok.decode(ids)  # exactly what the model reads, template included
                n_trunc += truncated
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    msg = f"wrote {len(prompts)} prompts of {name} to {out}"
    if tok is not None:
        msg += f" ({n_trunc} truncated to {max_prompt_tokens} tokens)" if max_prompt_tokens else ""
    click.echo(msg, err=True)


@command.command(name="inspect")
@click.argument("path")
@choice_option(
    "--format",
    "fmt",
    choices=["auto", "prompts", "chat", "request-log"],
    default="auto",
    help="The file's format (auto: detected from its first line).",
)
@click.option(
    "--tokenizer",
    default=None,
    help="Target model (checkpoint dir, .gguf file or speclab model name): prompt lengths in its tokens, "
    "chat template applied. Without it lengths are words and punctuation marks (approximate).",
)
@click.option(
    "--max-prompt-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Also count the prompts longer than this (needs --tokenizer).",
)
@limit_option("Inspect the sample a sweep would draw.")
@seed_option("Sampling seed for --limit (the sweeps' 42).", default=42)
@click.option("--skip-invalid", is_flag=True, help="Leave malformed lines out (counted) instead of refusing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def inspect_cmd(
    path: str,
    fmt: str,
    tokenizer: str | None,
    max_prompt_tokens: int | None,
    limit: int | None,
    seed: int,
    skip_invalid: bool,
    as_json: bool,
) -> None:
    """Summarise a prompts file or request log before a run: count, prompt lengths, what the requests asked
    for, and the n-gram overlap potential (does n-gram or suffix drafting have a chance?)."""
    from speclab.errors import SpeclabError
    from speclab.workloads.summary import format_summary, summarize_file

    if max_prompt_tokens is not None and tokenizer is None:
        raise SpeclabError(
            "--max-prompt-tokens needs --tokenizer (prompt lengths are counted in target tokens)"
        )
    tok = None
    if tokenizer is not None:
        from speclab.workloads.render import load_tokenizer

        tok = load_tokenizer(tokenizer)
    path = path.removeprefix("file:")  # the workload name form works too
    s = summarize_file(path, fmt, tok, max_prompt_tokens, limit, seed, skip_invalid)
    if as_json:
        click.echo(json.dumps(s, indent=2))
    else:
        click.echo(format_summary(s, tokenizer, max_prompt_tokens))
