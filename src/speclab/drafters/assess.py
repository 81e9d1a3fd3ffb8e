"""`speclab drafters evaluate`: replay a trained EAGLE-3 head on evaluation prompts of any sources, so that
heads trained on different data are compared on the same prompts. Each source is marked left out of the
head's training or held out of one of its training sources (by the head's own recipe); the prompts and the
target's outputs on them are cached like training's held-out data (`eval-<hash>.pt`), so a second head is
evaluated on exactly the same sequences without decoding them again.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from speclab.drafters.data import eval_prompts
from speclab.drafters.evaluate import replay_metrics
from speclab.drafters.loop import target_identity
from speclab.drafters.train import (
    EagleRecipe,
    cached_chunks,
    drafters_dir,
    load_target,
    self_pools,
    target_path,
)
from speclab.errors import ConfigError
from speclab.models.eagle3 import Eagle3Head
from speclab.models.prepare import MANIFEST


def head_recipe(head_dir: Path) -> EagleRecipe:
    """The recipe a speclab-trained EAGLE-3 head was trained with (from its manifest)."""
    try:
        m = json.loads((head_dir / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{head_dir}: not a speclab-trained drafter ({exc})") from None
    if m.get("kind") != "eagle3":
        raise ConfigError(f"{head_dir}: a {m.get('kind')!r} drafter; evaluate takes an EAGLE-3 head")
    known = {f.name for f in fields(EagleRecipe)}
    return EagleRecipe(**{k: v for k, v in m["recipe"].items() if k in known})


def evaluate_head(
    head_dir: Path,
    sources: list[str],
    prompts: int = 16,
    seed: int = 42,
    cache_dir: str | None = None,
    log: Any = None,
    data_engine: str = "transformers",
) -> dict[str, Any]:
    """Replay metrics of the head at `head_dir` (its own k) on the first `prompts` evaluation prompts of each
    source (drawn as training draws its evaluation prompts, under `seed`), with the pooled groups; each
    source's entry carries `left_out` (not a training source of the head). The prompts are decoded by
    `data_engine` whatever the head was trained with, so any two heads see the same sequences."""
    say = log or (lambda msg: None)
    trained = head_recipe(head_dir)
    # the evaluation data as training makes it: same output length, prompt limit and aux layers
    r = EagleRecipe(
        **{
            **vars(trained),
            "eval_workloads": list(sources),
            "eval_prompts": prompts,
            "eval_seed": seed,
            "data_engine": data_engine,
        }
    )
    target_dir = target_path(r.target)
    ident = target_identity(target_dir)
    model, tok, _ = load_target(r.target)
    root = drafters_dir(r.target, cache_dir)
    # self sources: their pools are sampled under the head's seed; only the evaluation side is needed here
    pools = self_pools(EagleRecipe(**{**vars(r), "workloads": {}}), model, tok, root, ident, say)
    held = eval_prompts(r.eval_workloads, prompts, seed, pools)
    seqs = cached_chunks(held, "eval", r, list(r.aux_layers or []), model, tok, ident, root, say)
    head = Eagle3Head.load(head_dir, model.get_input_embeddings().weight.detach())
    head.eval()
    left_out = frozenset(w for w in sources if w not in trained.workloads)
    metrics = replay_metrics(head, seqs, trained.k, left_out)
    for w in sources:
        if isinstance(metrics.get(w), dict):
            metrics[w] = {"left_out": w in left_out, **metrics[w]}
    return metrics
