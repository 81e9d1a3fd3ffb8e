"""`speclab drafters train draft`: a small draft model distilled from the target's logits, on CPU.

The student is a normal causal-LM checkpoint of the target's family (same config, fewer decoder layers) with
the target's tokenizer files, so vLLM runs it as `method = "draft_model"` and speclab's draft-model replay
(`speclab.methods.draft_model`) reads it like any other checkpoint.

- Init: the target's embedding (tied with lm_head in SmolLM2), final norm and the decoder layers listed in
  `layers` (default: the first `depth`), renumbered 0..n-1. The embedding/lm_head stays frozen by default: it
  is the target's calibrated output layer, ~1/5 of its weights, and not training it saves its weight gradient.
- Data: the shared self-distillation set (`speclab.drafters.data`: the target's greedy outputs on the offline
  workloads, bench/demo prompts held out) with the target's top-k logits at every position (prompt positions
  included), cached by `train.load_data`, i.e. the same files the EAGLE-3 trainer uses.
- Loss: KL(target || student) on the target's next-token distribution restricted to its top-k tokens
  (renormalised; the student's log-probabilities are over the full vocabulary), mean over positions. AdamW,
  warmup + cosine, batches of length-bucketed sequences up to `tokens_per_batch` tokens, in a seeded order.
- Evaluation: `speclab.methods.draft_model`'s replay (teacher-forced greedy chains) on the held-out prompts,
  stepped as vLLM steps: first-position acceptance, tokens per step and per-position acceptance at k.
- Cache: `$SPECLAB_CACHE/drafters/<target>/draft-<hash>/` (checkpoint + tokenizer + speclab-manifest.json with
  recipe, data and training statistics, the acceptance curve, cost relative to the target, time, peak RSS).
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from speclab.drafters.data import Sequence, collate_topk
from speclab.drafters.evaluate import add_steps, left_out_sources, summarize_steps
from speclab.drafters.loop import cache_entry, fit, manifest_head, publish_drafter, start_run, target_identity
from speclab.drafters.train import (
    DEFAULT_EVAL,
    DEFAULT_WORKLOADS,
    data_stats,
    drafters_dir,
    is_trained,
    load_data,
    load_target,
    target_path,
)
from speclab.errors import ConfigError
from speclab.methods.draft_model import DraftModelProposer
from speclab.models.dflash import default_aux_layers
from speclab.replay.crosscheck import expected_engine_steps

RECIPE_VERSION = "draft-1"
# copied from the target so the student is a complete checkpoint with the target's tokenizer
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
)


@dataclass
class DraftRecipe:
    """Everything a distilled draft depends on (its hash names the cache entry). The data fields (seed,
    workloads, max_new_tokens, max_prompt_tokens, aux_layers, eval_*) match EagleRecipe's defaults, so both
    trainers share one data file."""

    target: str = "smollm2-135m"
    seed: int = 0
    workloads: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_WORKLOADS))
    max_new_tokens: int = 64
    max_prompt_tokens: int = 512
    aux_layers: list[int] | None = None  # the shared data file's features (unused by the student)
    depth: int = 4  # student decoder layers (cost/acceptance trade-off: docs/drafters.md)
    layers: list[int] | None = None  # target layers the student starts from; None: the first `depth`
    train_embedding: bool = False
    k: int = 3  # drafts per step the evaluation replays
    epochs: int = 4
    tokens_per_batch: int = 1024
    lr: float = 1e-3
    eval_workloads: list[str] = field(default_factory=lambda: list(DEFAULT_EVAL))
    eval_prompts: int = 16
    eval_seed: int = 42  # the demo's seed: its prompts are exactly the held-out ones
    evals: int = 5  # points on the acceptance curve after the start

    def key(self, target_files: Any) -> str:
        from speclab.drafters.sources import source_identity

        fields = {**asdict(self), **source_identity(self)}  # nothing added for built-in workloads alone
        blob = json.dumps([RECIPE_VERSION, fields, target_files], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def draft_key(recipe: DraftRecipe, prepare: bool = True) -> tuple[Path, str]:
    """(target dir, cache key) of a recipe without loading the target; fills aux_layers and layers."""
    target_dir = target_path(recipe.target, prepare)
    tcfg = json.loads((target_dir / "config.json").read_text())
    recipe.aux_layers = default_aux_layers(tcfg, recipe.aux_layers)
    n_layers = int(tcfg["num_hidden_layers"])
    layers = list(recipe.layers) if recipe.layers is not None else list(range(recipe.depth))
    if not layers or len(set(layers)) != len(layers) or any(i < 0 or i >= n_layers for i in layers):
        raise ConfigError(f"draft layers must be distinct indices in 0..{n_layers - 1} (got {layers})")
    recipe.layers, recipe.depth = layers, len(layers)
    return target_dir, recipe.key(target_identity(target_dir))


# --- the student ----------------------------------------------------------------------------------------


def build_student(target: Any, layers: list[int], train_embedding: bool = False) -> Any:
    """A copy of the target's config with `len(layers)` decoder layers, initialised from those target layers
    plus the target's embedding, final norm and lm_head."""
    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = len(layers)
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[i] for i in layers]
    student = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        student.model.embed_tokens.load_state_dict(target.model.embed_tokens.state_dict())
        student.model.norm.load_state_dict(target.model.norm.state_dict())
        for new, old in enumerate(layers):
            student.model.layers[new].load_state_dict(target.model.layers[old].state_dict())
        if not getattr(cfg, "tie_word_embeddings", False):
            student.lm_head.load_state_dict(target.lm_head.state_dict())
    student.tie_weights()
    if not train_embedding:
        student.model.embed_tokens.weight.requires_grad_(False)
        student.lm_head.weight.requires_grad_(False)
    return student


def save_student(student: Any, target_dir: Path, out: Path) -> None:
    """The student as a plain checkpoint (config.json, model.safetensors) plus the target's tokenizer files."""
    student.save_pretrained(str(out), safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (target_dir / name).is_file():
            shutil.copy2(target_dir / name, out / name)


def unique_params(model: Any) -> int:
    """Parameters counted once (tied embedding/lm_head share one tensor): the weights a forward reads."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen[id(p)] = p.numel()
    return sum(seen.values())


# --- loss -----------------------------------------------------------------------------------------------


def kl_loss(student: Any, seqs: list[Sequence]) -> torch.Tensor:
    """Mean over positions of KL(p_target || p_student), p_target = softmax of the target's top-k logits."""
    tokens, valid, ids, vals = collate_topk(seqs)
    inside = torch.zeros_like(valid)
    for i, s in enumerate(seqs):
        inside[i, : len(s.tokens)] = True
    hidden = student.model(input_ids=tokens, attention_mask=inside.long()).last_hidden_state
    h = hidden[valid]  # only positions with a target distribution reach the (large) vocabulary projection
    logp = torch.log_softmax(student.lm_head(h).float(), -1)
    pt = torch.softmax(vals[valid], -1)
    return (pt * (pt.clamp_min(1e-30).log() - logp.gather(-1, ids[valid]))).sum(-1).mean()


def token_batches(seqs: list[Sequence], tokens_per_batch: int) -> list[list[int]]:
    """Length-bucketed batches whose padded size (count x longest) stays within tokens_per_batch."""
    order = sorted(range(len(seqs)), key=lambda i: (len(seqs[i].tokens), i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * len(seqs[i].tokens) > tokens_per_batch:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


# --- evaluation -----------------------------------------------------------------------------------------


def replay_draft(
    student: Any, seqs: list[Sequence], k: int, left_out: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Held-out acceptance of a draft model with speclab.methods.draft_model's replay, walked through each
    output as vLLM steps (the walk `trace crosscheck` compares with vLLM), per workload and over all."""
    prop = DraftModelProposer(student)
    by: dict[str, list[int]] = defaultdict(list)
    for s in seqs:
        toks = s.tokens.numpy()
        acc, proposed = prop.replay(toks[: s.out_start], toks[s.out_start :], k)
        steps = [a for _, a, _ in expected_engine_steps(acc, proposed, k)]  # walked as the engine walks
        add_steps(by, s.workload, steps, left_out)
    return summarize_steps(by, k)


# --- training -------------------------------------------------------------------------------------------


def train_student(
    student: Any,
    train: list[Sequence],
    heldout: list[Sequence],
    recipe: DraftRecipe,
    log: Any,
    max_minutes: float | None = None,
) -> dict[str, Any]:
    """KL distillation over token-budgeted batches, in the shared loop (drafters.loop); returns training
    statistics and the held-out acceptance curve (with the mean training KL at each point)."""

    def loss(seqs: list[Sequence]) -> torch.Tensor:
        return kl_loss(student, seqs)

    def metrics() -> dict[str, Any]:
        return replay_draft(student, heldout, recipe.k, left_out_sources(recipe)) if heldout else {}

    batches = token_batches(train, recipe.tokens_per_batch)
    return fit(student, train, batches, loss, metrics, recipe, log, max_minutes, ("train_kl", "train KL"))


def train_draft(
    recipe: DraftRecipe,
    cache_dir: str | None = None,
    force: bool = False,
    log: Any = None,
    max_minutes: float | None = None,
    threads: int | None = None,
) -> Path:
    """Train (or find cached) the distilled draft model for recipe.target; returns its checkpoint directory."""
    say = log or (lambda msg: None)
    t_start = start_run(recipe.seed, threads)
    target_dir, key = draft_key(recipe)
    root = drafters_dir(recipe.target, cache_dir)
    with cache_entry(root, f"draft-{key}") as out:
        if not force and is_trained(out, version=RECIPE_VERSION):
            say(f"distilled draft for {recipe.target}: up to date at {out}")
            return out
        model, tok, _ = load_target(recipe.target)
        aux = list(recipe.aux_layers or [])
        train, heldout, data_info = load_data(recipe, aux, model, tok, target_dir, root, say)
        layers = list(recipe.layers or [])
        student = build_student(model, layers, recipe.train_embedding)
        cost = {
            "student_params": unique_params(student),
            "target_params": unique_params(model),
            "layers_from_target": layers,
        }
        cost["params_ratio"] = round(cost["student_params"] / cost["target_params"], 4)
        del model  # only the student is needed from here on
        say(
            f"training: {sum(len(s.tokens) for s in train)} tokens, student of {len(layers)} layers "
            f"(target layers {layers}), {cost['params_ratio']:.1%} of the target's weights"
        )
        stats = train_student(student, train, heldout, recipe, say, max_minutes)
        head_info = manifest_head(
            "draft_model", RECIPE_VERSION, recipe, target_dir, data_stats(train, heldout, data_info)
        )
        head_info["cost"] = cost
        publish_drafter(
            root, out, "draft", lambda d: save_student(student, target_dir, d), head_info, stats, t_start
        )
    say(f"distilled draft for {recipe.target}: saved at {out}")
    return out
