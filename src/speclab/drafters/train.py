"""`speclab drafters train eagle`: train an EAGLE-3 head for a local target on CPU, cache it with a manifest.

Stages (each cached under `$SPECLAB_CACHE/drafters/<target>/`, keyed by a hash of everything it depends on):
1. data: the target's greedy outputs on training prompts (offline workloads, bench/demo prompts held out),
   with its hidden states at the aux layers and its argmax at every position (`data-<hash>.pt`);
   the held-out evaluation prompts likewise (`eval-<hash>.pt`);
2. training: TTT over k chained steps, cross-entropy against the target's greedy token mapped into the draft
   vocabulary (optionally partly against its top-k distribution, `soft_weight`); replay metrics on the held-out prompts at intervals (the acceptance curve);
3. output: `eagle3-<hash>/` holding config.json + model.safetensors (vLLM's eagle3 layout) and
   `speclab-manifest.json` (recipe, data and training statistics, curve, file checksums), swapped in atomically.

Deterministic under the seed (single-threaded order of batches, seeded init); `max_minutes` is a safety cap
that, when it triggers, is recorded in the manifest (the result then depends on the machine's speed).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from speclab.atomic import atomic_path
from speclab.drafters.data import (
    DATA_CHUNK,
    DATA_VERSION,
    TOPK,
    Sequence,
    build_sequences,
    collate_topk,
    eos_ids,
    eval_prompts,
    training_prompts,
)
from speclab.drafters.evaluate import collate, left_out_sources, replay_metrics
from speclab.drafters.generate import engine_sequences
from speclab.drafters.loop import (
    cache_entry,
    fit,
    manifest_head,
    publish_drafter,
    start_run,
    target_identity,
)
from speclab.drafters.selfgen import is_self, self_pool
from speclab.drafters.sources import source_identity, source_stats
from speclab.errors import SpeclabError
from speclab.models.dflash import default_aux_layers
from speclab.models.eagle3 import Eagle3Head, head_config
from speclab.models.prepare import MANIFEST, cache_root, file_checksums, resolve_model

RECIPE_VERSION = "1"

DEFAULT_WORKLOADS = {
    "offline-math": 64,
    "offline-chat": 64,
    "offline-code-edit": 16,
    "offline-reasoning": 24,
    "offline-summarization": 8,
}
DEFAULT_EVAL = ["offline-math", "offline-chat"]
# the standard-library corpus (speclab.drafters.corpus): real code and documentation, no built-in workload
# in training, so the offline workloads are evaluation sources left out of training
STDLIB_WORKLOADS = {
    "stdlib-explain": 48,
    "stdlib-complete": 40,
    "stdlib-docqa": 48,
    "stdlib-summarize": 16,
    "stdlib-math": 24,
}
STDLIB_EVAL = ["stdlib-explain", "stdlib-docqa", "stdlib-math", "offline-math", "offline-chat"]
# requests the target writes itself (speclab.drafters.selfgen); the built-in workloads are left out
SELF_WORKLOADS = {"self-chat": 256, "self-math": 128, "self-code": 128}
SELF_EVAL = [
    "self-chat",
    "self-math",
    "self-code",
    "offline-chat",
    "offline-math",
    "offline-code-edit",
    "stdlib-complete",
]
# the trainer's default: the self requests and the offline workloads together (better than "offline" on the
# offline workloads and than "self" on left-out prompts: docs/results/2026-12-06-drafters-left-out.md), sized
# to fit 30 minutes on 2 CPU cores with the vllm data engine, data stage included; the standard library's
# question, word-problem and completion prompts are its left-out evaluation sources
MIX_WORKLOADS = {"self-chat": 384, "self-math": 192, "self-code": 192, **DEFAULT_WORKLOADS}
MIX_EVAL = [*SELF_EVAL, "stdlib-docqa", "stdlib-math"]
# training corpora by name: (training sources -> prompts, evaluation sources); "offline" is the original recipe
CORPORA = {
    "offline": (DEFAULT_WORKLOADS, DEFAULT_EVAL),
    "stdlib": (STDLIB_WORKLOADS, STDLIB_EVAL),
    "self": (SELF_WORKLOADS, SELF_EVAL),
    "self+offline": (MIX_WORKLOADS, MIX_EVAL),
}
CORPUS_EPOCHS = {"self+offline": 6}  # where a corpus's recipe differs from EagleRecipe.epochs


@dataclass
class EagleRecipe:
    """Everything a trained head depends on (its hash names the cache entry)."""

    target: str = "smollm2-135m"
    seed: int = 0
    workloads: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_WORKLOADS))
    max_new_tokens: int = 64
    max_prompt_tokens: int = 512
    aux_layers: list[int] | None = None  # HF hidden_states indices; None: (2, L // 2, L - 1)
    draft_vocab: int = 8192
    k: int = 3  # TTT steps (= drafts per step it is trained for)
    head_layers: int = 1  # decoder layers in the head (vLLM's eagle3 runs any number)
    soft_weight: float = 0.0  # share of the loss on the target's top-k distribution instead of its argmax
    step_weights: float = 0.8  # loss weight of step j: step_weights ** j
    epochs: int = 8  # acceptance curve: docs/results/2026-12-03-drafters-training.md (3 epochs: 0.33 math)
    batch_size: int = 8
    lr: float = 1e-3
    eval_workloads: list[str] = field(default_factory=lambda: list(DEFAULT_EVAL))
    eval_prompts: int = 16
    eval_seed: int = 42  # the demo's seed: its prompts are exactly the held-out ones
    evals: int = 6  # points on the acceptance curve
    data_engine: str = "transformers"  # what decodes the data stage: speclab.drafters.generate

    def key(self, target_files: Any) -> str:
        fields = asdict(self)
        # added later: at their defaults they leave the key as it was, so cached heads keep their names
        for name, default in (("head_layers", 1), ("soft_weight", 0.0), ("data_engine", "transformers")):
            if fields[name] == default:
                del fields[name]
        fields.update(source_identity(self))
        blob = json.dumps([RECIPE_VERSION, fields, target_files], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def drafters_dir(target: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    return (Path(cache_dir).expanduser() if cache_dir else cache_root() / "drafters") / target


def is_trained(d: Path, verify_files: bool = True, version: str = RECIPE_VERSION) -> bool:
    """A complete cache entry of this recipe version (file checksums verified unless verify_files=False)."""
    try:
        m = json.loads((d / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if m.get("recipe_version") != version:
        return False
    if not verify_files:
        return all((d / f).is_file() for f in m.get("files", {}))
    return file_checksums(d) == m.get("files")


def load_target(target: str) -> tuple[Any, Any, Path]:
    """(model, tokenizer, checkpoint dir) of the fp32 target (prepared on first use)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = target_path(target)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(path)), path


def _seqs_to_obj(seqs: list[Sequence]) -> list[dict[str, Any]]:
    return [s.__dict__ for s in seqs]


def cached_sequences(path: Path, build: Any, log: Any) -> list[Sequence]:
    """Load `path` (torch.save of sequence dicts) or build and save it atomically."""
    if path.is_file():
        log(f"data: cached at {path}")
        return [Sequence(**d) for d in torch.load(path, weights_only=False)]
    seqs = build()
    with atomic_path(path) as tmp:
        torch.save(_seqs_to_obj(seqs), tmp)
    return seqs


def pick_draft_vocab(seqs: list[Sequence], size: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `size` target ids the target emits most often (greedy labels, then input tokens; ties by id),
    sorted ascending; returns (d2t offsets, t2d mask) as vLLM reads them."""
    counts = torch.zeros(vocab, dtype=torch.float64)
    for s in seqs:
        lab = s.labels[s.labels >= 0]
        counts += torch.bincount(lab, minlength=vocab).double()
        counts += 1e-3 * torch.bincount(s.tokens, minlength=vocab).double()  # break ties toward seen tokens
    size = min(size, vocab)
    # stable: among equal counts the lower id wins
    order = sorted(range(vocab), key=lambda i: (-float(counts[i]), i))[:size]
    ids = torch.tensor(sorted(order), dtype=torch.long)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(size), t2d


def ttt_loss(
    head: Eagle3Head, seqs: list[Sequence], k: int, decay: float, soft_weight: float = 0.0
) -> torch.Tensor:
    """Sum over the k chained steps (weight decay**j) of the head's loss against the target at the position
    it drafts: cross-entropy with the target's greedy token (mapped into the draft vocabulary), and with
    `soft_weight` > 0 that share of it replaced by cross-entropy with the target's distribution (softmax of
    its stored top-k logits, restricted to the draft vocabulary and renormalised), EAGLE's own objective."""
    tokens, feats, labels, valid = collate(seqs)
    soft = None
    if soft_weight > 0:
        _, _, top_ids, top_vals = collate_topk(seqs)
        # draft ids of the target's top-k (-1 outside the draft vocabulary, which gets no probability)
        top_draft = head.t2d_index[top_ids]
        soft = (top_draft, top_vals.masked_fill(top_draft < 0, float("-inf")))
    n = tokens.shape[1]
    total = torch.zeros(())
    for j, lg in enumerate(head.forward_ttt(tokens, feats, valid, k)):
        lab = torch.roll(labels, -(1 + j), 1)
        lab[:, n - 1 - j :] = -1
        tgt = torch.where(lab >= 0, head.t2d_index[lab.clamp(min=0)], torch.full_like(lab, -1))
        if not (tgt >= 0).any():
            continue
        # one log-softmax for both losses (cross_entropy is log_softmax + nll_loss)
        logp_all = torch.log_softmax(lg.reshape(-1, lg.shape[-1]), -1)
        step = torch.nn.functional.nll_loss(logp_all, tgt.reshape(-1), ignore_index=-1)
        if soft is not None:
            ids = torch.roll(soft[0], -(1 + j), 1).reshape(-1, soft[0].shape[-1])
            vals = torch.roll(soft[1], -(1 + j), 1).reshape(-1, soft[1].shape[-1])
            use = tgt.reshape(-1) >= 0  # same positions as the hard loss (their top-1 is in the vocabulary)
            q = torch.softmax(vals[use], -1)
            logp = logp_all[use].gather(1, ids[use].clamp(min=0))
            soft_ce = -(q * logp).nan_to_num(0.0).sum(-1).mean()
            step = (1 - soft_weight) * step + soft_weight * soft_ce
        total = total + decay**j * step
    return total


def train_head(
    head: Eagle3Head,
    train: list[Sequence],
    heldout: list[Sequence],
    recipe: EagleRecipe,
    log: Any,
    max_minutes: float | None = None,
    clock: tuple[float, float | None] | None = None,
) -> dict[str, Any]:
    """TTT over length-bucketed batches of recipe.batch_size sequences, in the shared loop (drafters.loop;
    `clock`: the run's start and deadline); returns training statistics and the held-out acceptance curve."""
    order = sorted(range(len(train)), key=lambda i: (len(train[i].tokens), i))  # less padding
    batches = [order[i : i + recipe.batch_size] for i in range(0, len(order), recipe.batch_size)]

    def loss(seqs: list[Sequence]) -> torch.Tensor:
        return ttt_loss(head, seqs, recipe.k, recipe.step_weights, recipe.soft_weight)

    def metrics() -> dict[str, Any]:
        return replay_metrics(head, heldout, recipe.k, left_out_sources(recipe)) if heldout else {}

    return fit(head, train, batches, loss, metrics, recipe, log, max_minutes, clock=clock)


def target_path(target: str, prepare: bool = True) -> Path:
    """The fp32 target checkpoint directory (prepared on first use unless prepare=False); loads no model."""
    return resolve_model(target, "float32", prepare=prepare)


def eagle_key(recipe: EagleRecipe, prepare: bool = True) -> tuple[Path, dict[str, Any], str]:
    """(target dir, target config, cache key) of a recipe, without loading the target; fills aux_layers."""
    target_dir = target_path(recipe.target, prepare)
    tcfg = json.loads((target_dir / "config.json").read_text())
    recipe.aux_layers = default_aux_layers(tcfg, recipe.aux_layers)
    return target_dir, tcfg, recipe.key(target_identity(target_dir))


def train_eagle(
    recipe: EagleRecipe,
    cache_dir: str | None = None,
    force: bool = False,
    log: Any = None,
    max_minutes: float | None = None,
    threads: int | None = None,
    budget_minutes: float | None = None,
) -> Path:
    """Train (or find cached) the EAGLE-3 head for recipe.target; returns its directory. `budget_minutes`
    holds the whole run (data stage included) to that long (speclab.drafters.loop.fit)."""
    say = log or (lambda msg: None)
    t_start = start_run(recipe.seed, threads)
    deadline = t_start + budget_minutes * 60 if budget_minutes else None
    target_dir, tcfg, key = eagle_key(recipe)
    aux = list(recipe.aux_layers or [])
    root = drafters_dir(recipe.target, cache_dir)
    with cache_entry(root, f"eagle3-{key}") as out:
        if not force and is_trained(out):
            say(f"eagle3 head for {recipe.target}: up to date at {out}")
            return out
        model, tok, _ = load_target(recipe.target)
        clock = (t_start, deadline)
        return _train_locked(recipe, model, tok, target_dir, tcfg, aux, root, out, say, max_minutes, clock)


def data_chunks(prompts: list[Any], size: int = DATA_CHUNK) -> list[list[Any]]:
    """Per workload (in order of first appearance), consecutive runs of `size` prompts in draw order: since a
    larger draw starts with a smaller one, its first chunks are the smaller draw's and are reused."""
    by: dict[str, list[Any]] = {}
    for p in prompts:
        by.setdefault(p.workload, []).append(p)
    return [ps[i : i + size] for ps in by.values() for i in range(0, len(ps), size)]


def chunk_key(chunk: list[Any], recipe: Any, aux: list[int], target_files: Any) -> str:
    """Cache key of one data chunk: its prompt ids and everything its sequences depend on."""
    blob = [
        DATA_VERSION,
        TOPK,
        DATA_CHUNK,
        [p.id for p in chunk],
        recipe.max_new_tokens,
        recipe.max_prompt_tokens,
        aux,
        target_files,
    ]
    engine = data_engine(recipe)
    if engine != "transformers":  # added later: transformers-made chunks keep their names
        blob.append(engine)
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:12]


def data_engine(recipe: Any) -> str:
    return getattr(recipe, "data_engine", "transformers")


def cached_chunks(
    prompts: list[Any],
    kind: str,
    recipe: Any,
    aux: list[int],
    model: Any,
    tok: Any,
    ident: Any,
    root: Path,
    say: Any,
    info: dict[str, Any] | None = None,
) -> list[Sequence]:
    """The sequences of `prompts`, per chunk of DATA_CHUNK prompts of one workload: read from the cache
    (`{kind}-<hash>.pt`) or generated and cached. `info` counts generated and cached prompts. With the vllm
    data engine every chunk not cached is decoded first, in one engine run."""
    chunks = data_chunks(prompts)
    paths = [root / f"{kind}-{chunk_key(chunk, recipe, aux, ident)}.pt" for chunk in chunks]
    decoded = None
    missing = [p for chunk, path in zip(chunks, paths, strict=True) if not path.is_file() for p in chunk]
    if missing and data_engine(recipe) != "transformers":
        decoded = decode_prompts(missing, recipe, model, tok, say)
    seqs: list[Sequence] = []
    for i, (chunk, path) in enumerate(zip(chunks, paths, strict=True)):
        t = time.perf_counter()

        def build(chunk: list[Any] = chunk) -> list[Sequence]:
            extra = {} if decoded is None else {"decoded": decoded}  # decoded elsewhere: features only
            return build_sequences(
                model, tok, chunk, aux, recipe.max_new_tokens, recipe.max_prompt_tokens, DATA_CHUNK, **extra
            )

        fresh = not path.is_file()
        seqs += cached_sequences(path, build, lambda m: None)
        if info is not None:
            info["generated_prompts" if fresh else "cached_prompts"] += len(chunk)
        state = (
            f"{'features' if decoded else 'generated'} in {time.perf_counter() - t:.0f} s"
            if fresh
            else "cached"
        )
        say(f"data: {kind} chunk {i + 1}/{len(chunks)} ({chunk[0].workload}, {len(chunk)} prompts) {state}")
    return seqs


def decode_prompts(prompts: list[Any], recipe: Any, model: Any, tok: Any, say: Any) -> dict[str, list[int]]:
    """Prompt id -> the rendered prompt followed by the target's greedy output, decoded on a vLLM engine in
    one run (the vllm data engine)."""
    from speclab.workloads.render import render_prompt

    ids = [render_prompt(p, tok, recipe.max_prompt_tokens)[0] for p in prompts]
    t = time.perf_counter()
    full = engine_sequences(ids, recipe.max_new_tokens, eos_ids(model, tok), target_path(recipe.target), say)
    say(f"data: decoded {len(prompts)} prompts on vllm in {time.perf_counter() - t:.0f} s")
    return {p.id: f for p, f in zip(prompts, full, strict=True)}


def load_data(
    recipe: Any, aux: list[int], model: Any, tok: Any, target_dir: Path, root: Path, say: Any
) -> tuple[list[Sequence], list[Sequence], dict[str, Any]]:
    """The self-distillation data (training and held-out sequences) every trainer shares. Cached per chunk of
    DATA_CHUNK prompts of one workload (`data-<hash>.pt`, held out: `eval-<hash>.pt`), keyed by the chunk's
    prompt ids, max_new_tokens, max_prompt_tokens, the aux layers, the data version and the target's
    checksums: scaling one workload up generates only its new chunks. Refuses overlap of the two sets.
    Returns (training, held-out, {seconds, prompts generated now, prompts read from the cache})."""
    ident = target_identity(target_dir)
    info: dict[str, Any] = {"data_seconds": 0.0, "generated_prompts": 0, "cached_prompts": 0}
    t0 = time.perf_counter()
    dropped: dict[str, int] = {}
    pools = self_pools(recipe, model, tok, root, ident, say)
    train_p = training_prompts(recipe.workloads, recipe.seed, dropped, pools, tuple(recipe.eval_workloads))
    say(f"data: {len(train_p)} training prompts (evaluation prompts held out)")
    held_p = eval_prompts(recipe.eval_workloads, recipe.eval_prompts, recipe.eval_seed, pools)
    overlap = {p.id for p in held_p} & {p.id for p in train_p}
    if overlap:
        raise SpeclabError(f"drafters: {len(overlap)} evaluation prompts are in the training data")
    info.update(source_stats(recipe, train_p, held_p, dropped))
    for w, r in info["heldout_similarity"].items():
        say(f"data: {w}: held-out prompts' similarity to the nearest training prompt: median {r['median']}")
    train = cached_chunks(train_p, "data", recipe, aux, model, tok, ident, root, say, info)
    heldout = cached_chunks(held_p, "eval", recipe, aux, model, tok, ident, root, say, info)
    info["data_seconds"] = round(time.perf_counter() - t0, 1)
    return train, heldout, info


def self_pools(recipe: Any, model: Any, tok: Any, root: Path, ident: Any, say: Any) -> dict[str, list[Any]]:
    """The sampled requests of every self source the recipe trains or evaluates on (speclab.drafters.selfgen),
    enough for its training prompts (with room for duplicates of evaluation prompts) and its evaluation."""
    pools = {}
    names = [w for w in dict.fromkeys([*recipe.workloads, *recipe.eval_workloads]) if is_self(w)]
    stop = eos_ids(model, tok) if names else set()
    for w in names:
        n = int(recipe.workloads.get(w, 0))
        need_held = recipe.eval_prompts if w in recipe.eval_workloads else 0
        engine = data_engine(recipe)
        where = target_path(recipe.target) if engine != "transformers" else None
        pools[w] = self_pool(
            model, tok, w, n + max(8, n // 10), need_held, recipe.seed, root, ident, stop, say, engine, where
        )
    return pools


def data_stats(train: list[Sequence], heldout: list[Sequence], info: dict[str, Any]) -> dict[str, Any]:
    """Data statistics for a manifest. data_seconds is this run's data stage: generating the chunks it did
    not find cached plus loading the rest (generated_prompts / cached_prompts say how many of each)."""
    by: dict[str, int] = {}
    for s in train:
        by[s.workload] = by.get(s.workload, 0) + 1
    return {
        "train_prompts": len(train),
        "train_prompts_by_workload": by,
        "train_tokens": sum(len(s.tokens) for s in train),
        "generated_tokens": sum(len(s.tokens) - s.out_start for s in train),
        "heldout_prompts": len(heldout),
        **info,
    }


def _train_locked(
    recipe: EagleRecipe,
    model: Any,
    tok: Any,
    target_dir: Path,
    tcfg: dict[str, Any],
    aux: list[int],
    root: Path,
    out: Path,
    say: Any,
    max_minutes: float | None,
    clock: tuple[float, float | None],
) -> Path:
    train, heldout, data_info = load_data(recipe, aux, model, tok, target_dir, root, say)

    d2t, t2d = pick_draft_vocab(train, recipe.draft_vocab, int(tcfg["vocab_size"]))
    cfg = head_config(tcfg, aux, len(d2t), recipe.head_layers)
    embed = model.get_input_embeddings().weight.detach()
    head = Eagle3Head(cfg, embed, d2t, t2d)
    head.init_from_target(model.model.norm.weight.detach(), model.get_output_embeddings().weight, recipe.seed)
    labels = torch.cat([s.labels[s.labels >= 0] for s in heldout])
    coverage = float(t2d[labels].float().mean()) if len(labels) else 0.0
    say(
        f"training: {sum(len(s.tokens) for s in train)} tokens, draft vocab {len(d2t)} "
        f"(covers {coverage:.1%} of held-out greedy tokens)"
    )
    stats = train_head(head, train, heldout, recipe, say, max_minutes, clock)

    data = {**data_stats(train, heldout, data_info), "draft_vocab_coverage_heldout": round(coverage, 4)}
    head_info = manifest_head("eagle3", RECIPE_VERSION, recipe, target_dir, data)
    publish_drafter(root, out, "eagle3", head.save, head_info, stats, clock[0])
    say(f"eagle3 head for {recipe.target}: saved at {out}")
    return out
