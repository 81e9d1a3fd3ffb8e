"""`speclab drafters`: train drafters for a local target on CPU (cache: $SPECLAB_CACHE/drafters):
`train eagle` (an EAGLE-3 head), `train draft` (a distilled draft model), `show` (a manifest's figures)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

# options both trainers take (the data stage is shared)
_WORKLOAD_PROMPTS = click.option(
    "--workload-prompts",
    "workload_prompts",
    multiple=True,
    metavar="SOURCE=N",
    help="Training prompts of one source, e.g. offline-chat=256 or stdlib-docqa=64 (after --prompts-scale; "
    "repeatable; N = 0 drops it). Scales one source alone: the others' cached data is reused. "
    "file:PATH=N trains on your own traffic (a prompts file or request log): split by content, about a "
    "fifth of the distinct requests held out and measured separately.",
)


def _corpus(default: str) -> Callable[[Any], Any]:
    return click.option(
        "--corpus",
        type=click.Choice(["offline", "stdlib", "self", "self+offline"]),
        default=default,
        show_default=True,
        help="Training corpus: offline (the built-in offline workloads), stdlib (prompts made from Python's "
        "standard-library code and documentation), self (requests the target writes itself) or self+offline "
        "(both); with stdlib and self the offline workloads are evaluated as left out of training.",
    )


_EVAL_SOURCES = click.option(
    "--eval-sources",
    default=None,
    metavar="A,B,...",
    help="Evaluation sources instead of the corpus's (built-in workloads, stdlib-*, self-*, file:PATH).",
)


def _prompts_scale(what: str) -> Callable[[Any], Any]:
    return click.option(
        "--prompts-scale",
        type=float,
        default=1.0,
        show_default=True,
        help=f"Multiply the number of training prompts per workload (a longer budget for a better {what}).",
    )


@click.group(name="drafters")
def command() -> None:
    """Train speculative-decoding drafters for a local target (self-distilled, cached with a manifest)."""


@command.group(name="train")
def train_group() -> None:
    """Train a drafter."""


@train_group.command(name="eagle")
@click.option(
    "--target", default="smollm2-135m", show_default=True, help="Target model preset or checkpoint."
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--epochs", type=int, default=None, help="Training epochs (default: the recipe's).")
@click.option("--draft-vocab", type=int, default=None, help="Draft vocabulary size (default 8192).")
@click.option("--k", "k", type=int, default=None, help="Chained draft steps trained for (default 3).")
@click.option(
    "--head-layers",
    type=int,
    default=None,
    help="Decoder layers in the head (default 1; each costs one layer per draft forward).",
)
@click.option(
    "--soft-weight",
    type=click.FloatRange(0.0, 1.0),
    default=None,
    help="Share of the loss on the target's top-k distribution instead of its argmax (default 0).",
)
@_prompts_scale("head")
@_corpus("self+offline")
@_WORKLOAD_PROMPTS
@click.option(
    "--max-new-tokens", type=int, default=None, help="Greedy tokens per training prompt (default 64)."
)
@_EVAL_SOURCES
@click.option("--max-minutes", type=float, default=None, help="Stop training after this long (recorded).")
@click.option(
    "--budget-minutes",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Hold the whole run, data stage included, to this long: the learning-rate decay follows the time "
    "left and training stops at the budget (recorded).",
)
@click.option(
    "--data-engine",
    type=click.Choice(["vllm", "transformers"]),
    default=None,
    help="What decodes the data stage: a vLLM engine (default where vLLM is installed; about three times "
    "the tokens per second on CPU) or transformers in this process.",
)
@click.option("--threads", type=int, default=None, help="torch threads (1 is faster on a contended machine).")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None, help="Drafters cache directory.")
@click.option("--force", is_flag=True, help="Retrain even if a head for this recipe is cached.")
def train_eagle_cmd(
    target: str,
    seed: int,
    epochs: int | None,
    draft_vocab: int | None,
    k: int | None,
    head_layers: int | None,
    soft_weight: float | None,
    prompts_scale: float,
    corpus: str,
    workload_prompts: tuple[str, ...],
    max_new_tokens: int | None,
    eval_sources: str | None,
    max_minutes: float | None,
    budget_minutes: float | None,
    data_engine: str | None,
    threads: int | None,
    cache_dir: str | None,
    force: bool,
) -> None:
    """Train an EAGLE-3 head (reduced draft vocabulary) by self-distillation on the offline workloads.

    Prints the head's directory (pass it to vLLM with method eagle3) and its held-out replay metrics.
    """
    from speclab.drafters.generate import check_engine, default_engine
    from speclab.drafters.train import EagleRecipe, train_eagle
    from speclab.errors import ConfigError

    recipe = EagleRecipe(target=target, seed=seed, data_engine=check_engine(data_engine or default_engine()))
    apply_corpus(recipe, corpus, prompts_scale, workload_prompts, eval_sources)
    for name, value in (
        ("epochs", epochs),
        ("draft_vocab", draft_vocab),
        ("k", k),
        ("head_layers", head_layers),
        ("max_new_tokens", max_new_tokens),
    ):
        if value is not None:
            if value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
            setattr(recipe, name, value)
    if soft_weight is not None:
        recipe.soft_weight = soft_weight
    path = train_eagle(
        recipe,
        cache_dir,
        force=force,
        log=lambda m: click.echo(m, err=True),
        max_minutes=max_minutes,
        threads=threads,
        budget_minutes=budget_minutes,
    )
    click.echo(str(path))
    _summary(path)


@train_group.command(name="draft")
@click.option(
    "--target", default="smollm2-135m", show_default=True, help="Target model preset or checkpoint."
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--depth", type=int, default=None, help="Student decoder layers (default 4: the target's first)."
)
@click.option(
    "--layers",
    default=None,
    help="Target layers the student starts from, comma-separated (instead of the first --depth).",
)
@click.option("--epochs", type=int, default=None, help="Training epochs (default: the recipe's).")
@_prompts_scale("draft")
@_corpus("offline")
@_WORKLOAD_PROMPTS
@click.option(
    "--max-new-tokens", type=int, default=None, help="Greedy tokens per training prompt (default 64)."
)
@click.option("--max-minutes", type=float, default=None, help="Stop training after this long (recorded).")
@click.option("--threads", type=int, default=None, help="torch threads (1 is faster on a contended machine).")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None, help="Drafters cache directory.")
@click.option("--force", is_flag=True, help="Retrain even if a draft for this recipe is cached.")
def train_draft_cmd(
    target: str,
    seed: int,
    depth: int | None,
    layers: str | None,
    epochs: int | None,
    prompts_scale: float,
    corpus: str,
    workload_prompts: tuple[str, ...],
    max_new_tokens: int | None,
    max_minutes: float | None,
    threads: int | None,
    cache_dir: str | None,
    force: bool,
) -> None:
    """Distil a small draft model (the target's first layers, its tokenizer) from the target's logits.

    Prints the checkpoint directory (vLLM runs it with method draft_model; a sweep can also name the preset
    smollm2-135m-distilled) and its held-out replay metrics.
    """
    from speclab.drafters.distill import DraftRecipe, train_draft
    from speclab.errors import ConfigError

    recipe = DraftRecipe(target=target, seed=seed)
    apply_corpus(recipe, corpus, prompts_scale, workload_prompts)
    for name, value in (("depth", depth), ("epochs", epochs), ("max_new_tokens", max_new_tokens)):
        if value is not None:
            if value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
            setattr(recipe, name, value)
    if layers is not None:
        try:
            recipe.layers = [int(x) for x in layers.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"--layers {layers!r}: expected comma-separated layer indices") from None
    path = train_draft(
        recipe,
        cache_dir,
        force=force,
        log=lambda m: click.echo(m, err=True),
        max_minutes=max_minutes,
        threads=threads,
    )
    click.echo(str(path))
    _summary(path)


def apply_corpus(
    recipe: Any, corpus: str, scale: float, overrides: tuple[str, ...], eval_sources: str | None = None
) -> None:
    """Set a recipe's training and evaluation sources: the named corpus's, scaled, with the overrides; a
    file source is also evaluated (on the held-out side of its split). `eval_sources` (comma-separated)
    replaces the corpus's evaluation sources."""
    from speclab.drafters.train import CORPORA, CORPUS_EPOCHS

    base, evals = CORPORA[corpus]
    if corpus in CORPUS_EPOCHS and hasattr(recipe, "head_layers"):  # an EAGLE-3 recipe
        recipe.epochs = CORPUS_EPOCHS[corpus]
    recipe.workloads = scaled_workloads(base, scale, overrides)
    if eval_sources is not None:
        evals = [
            _source_name(w.strip(), w.strip(), "--eval-sources") for w in eval_sources.split(",") if w.strip()
        ]
    recipe.eval_workloads = list(
        dict.fromkeys([*evals, *(w for w in recipe.workloads if w.startswith("file:"))])
    )


def _source_name(name: str, item: str, option: str = "--workload-prompts") -> str:
    from speclab.drafters.corpus import SOURCES
    from speclab.drafters.data import OFFLINE_WORKLOADS
    from speclab.drafters.selfgen import SYSTEM
    from speclab.errors import ConfigError

    if name.startswith("file:"):
        path = Path(name[5:].strip()).expanduser()
        if not path.is_file():
            raise ConfigError(f"{option} {item!r}: no such file {path}")
        return f"file:{path.resolve()}"
    if name not in OFFLINE_WORKLOADS and name not in SOURCES and name not in SYSTEM:
        known = ", ".join(OFFLINE_WORKLOADS + tuple(SOURCES) + tuple(SYSTEM))
        raise ConfigError(f"{option} {item!r}: unknown workload {name} (one of {known}, file:PATH)")
    return name


def scaled_workloads(base: dict[str, int], scale: float, overrides: tuple[str, ...]) -> dict[str, int]:
    """Training prompts per source: `base` times --prompts-scale, then the --workload-prompts SOURCE=N
    overrides (comma-separated or repeated; N = 0 drops the source; file:PATH=N adds the user's file)."""
    from speclab.errors import ConfigError

    if scale <= 0:
        raise ConfigError("--prompts-scale must be > 0")
    out = {w: max(1, round(n * scale)) for w, n in base.items()}
    for item in (x.strip() for o in overrides for x in o.split(",") if x.strip()):
        name, eq, num = item.rpartition("=")
        name = name.strip()
        try:
            n = int(num)
        except ValueError:
            n = -1
        if not eq or not name or n < 0:
            raise ConfigError(f"--workload-prompts {item!r}: expected WORKLOAD=N with N >= 0")
        out[_source_name(name, item)] = n
    out = {w: n for w, n in out.items() if n > 0}
    if not out:
        raise ConfigError("--workload-prompts: no training prompts left")
    return out


def figure_kind(manifest: dict[str, Any], group: str) -> str:
    """What a held-out figure of a manifest measures: prompts of a training source held out, a source
    left out of training entirely, or one of the pooled groups."""
    from speclab.drafters.evaluate import LEFT_OUT, TRAINING_SOURCES

    if group == TRAINING_SOURCES:
        return "pooled: held out of the training sources"
    if group == LEFT_OUT:
        return "pooled: sources left out of training"
    if group == "all":
        return "pooled: every evaluation prompt"
    src = manifest.get("evaluation", {}).get("sources", {}).get(group)
    if src is None:
        return "held out"
    return "left out of training" if src.get("left_out") else "held out of a training source"


def _summary(path: Path) -> None:
    m = json.loads((path / "speclab-manifest.json").read_text())
    final = m.get("final") or {}
    sims = m.get("data", {}).get("heldout_similarity", {})
    for w, r in final.items():
        if isinstance(r, dict):
            pos = " ".join(f"{x:.2f}" for x in r.get("per_position", []))
            sim = f", nearest training prompt: median similarity {sims[w]['median']:.2f}" if w in sims else ""
            click.echo(
                f"  {w}: first-position acceptance {r['first_acceptance']:.3f}, "
                f"tokens/step {r['tokens_per_step']:.3f}, per position {pos} "
                f"(k={m['recipe']['k']}, {r['steps']} steps, {figure_kind(m, w)}{sim})"
            )
    cost = m.get("cost")
    if cost:
        click.echo(
            f"  cost: {cost['student_params'] / 1e6:.1f}M of the target's {cost['target_params'] / 1e6:.1f}M "
            f"weights ({cost['params_ratio']:.1%} per draft forward), target layers {cost['layers_from_target']}"
        )
    tr = m["training"]
    capped = ", stopped by its time limit" if tr.get("time_capped") else ""
    click.echo(
        f"  trained in {m['total_seconds']:.0f} s ({tr['steps']}/{tr['planned_steps']} steps, "
        f"{m['recipe']['epochs']} epochs planned{capped}), peak RSS {m['peak_rss_mib']:.0f} MiB"
    )


@command.command(name="show")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
def show_cmd(path: str) -> None:
    """Summarise a trained drafter's manifest (held-out metrics, budget, acceptance curve)."""
    from speclab.errors import SpeclabError

    p = Path(path)
    if not (p / "speclab-manifest.json").is_file():
        raise SpeclabError(f"{p}: no speclab-manifest.json (not a speclab-trained drafter)")
    _summary(p)
    m = json.loads((p / "speclab-manifest.json").read_text())
    curve = m["training"]["curve"]
    groups = [k for k, v in (curve[-1] if curve else {}).items() if isinstance(v, dict)]
    run = bool(curve) and "run_seconds" in curve[0]
    click.echo(
        "  curve (held out; per group: first-position acceptance / tokens per step; seconds of training"
        + ("; minutes since the run started, data stage included):" if run else "):")
    )
    head = f"{'step':>5} {'tokens':>9} {'seconds':>8}" + (f" {'run min':>7}" if run else "")
    click.echo("    " + head + "".join(f" {g:>22}" for g in groups))
    for pt in curve:
        cells = "".join(
            f" {pt[g]['first_acceptance']:>14.3f} / {pt[g]['tokens_per_step']:.3f}"
            if g in pt
            else f" {'-':>22}"
            for g in groups
        )
        mins = f" {pt.get('run_seconds', 0) / 60:>7.1f}" if run else ""
        click.echo(f"    {pt.get('step', '-'):>5} {pt['train_tokens']:>9} {pt['seconds']:>8}{mins}" + cells)


@command.command(name="evaluate")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--sources",
    required=True,
    metavar="A,B,...",
    help="Evaluation sources (built-in workloads, stdlib-*, self-*, file:PATH).",
)
@click.option(
    "--prompts", type=click.IntRange(min=1), default=16, show_default=True, help="Prompts per source."
)
@click.option("--seed", type=int, default=42, show_default=True, help="Seed of the evaluation draw.")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None, help="Drafters cache directory.")
@click.option(
    "--data-engine",
    type=click.Choice(["transformers", "vllm"]),
    default="transformers",
    show_default=True,
    help="What decodes the evaluation prompts (and samples self-* requests): the same for every head, so "
    "heads are compared on the same token sequences.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def evaluate_cmd(
    path: str, sources: str, prompts: int, seed: int, cache_dir: str | None, data_engine: str, as_json: bool
) -> None:
    """Replay a trained EAGLE-3 head on the evaluation prompts of SOURCES (the same prompts for any head),
    each source marked left out of its training or held out of a training source."""
    from speclab.drafters.assess import evaluate_head

    names = [_source_name(w.strip(), w.strip(), "--sources") for w in sources.split(",") if w.strip()]
    res = evaluate_head(
        Path(path),
        names,
        prompts,
        seed,
        cache_dir,
        log=lambda m: click.echo(m, err=True),
        data_engine=data_engine,
    )
    if as_json:
        click.echo(json.dumps(res, indent=1))
        return
    for w, r in res.items():
        if not isinstance(r, dict) or not r.get("steps"):
            continue
        kind = {True: "left out of training", False: "held out of a training source"}.get(
            r.get("left_out"), "pooled"
        )
        pos = " ".join(f"{x:.2f}" for x in r.get("per_position", []))
        click.echo(
            f"  {w}: first-position acceptance {r['first_acceptance']:.3f}, tokens/step "
            f"{r['tokens_per_step']:.3f}, per position {pos} ({r['steps']} steps, {kind})"
        )
