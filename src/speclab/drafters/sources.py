"""Where a drafter's training and evaluation prompts come from, by source name:

- a built-in workload (`offline-chat`, ...): drawn with the training seed, the bench/demo draws held out by id
  (speclab.drafters.data);
- a standard-library corpus source (`stdlib-explain`, ...: speclab.drafters.corpus), split by content into a
  training side and a held-out side;
- requests the target writes itself (`self-chat`, `self-math`, `self-code`: speclab.drafters.selfgen), split
  by content like the corpus; their pools are sampled before the split (they need the target);
- the user's own traffic, `file:PATH` (a prompts file or request log, as bench reads it): split by content
  (the normalised text of the request), so a request repeated in the log is on one side only; the held-out
  side, about EVAL_FILE_PERMILLE per mille of the distinct requests, is the drafter's evaluation set there.

Training prompts of corpus and file sources are deduplicated against every evaluation set by content
(speclab.drafters.similarity.Deduper): exact normalised text for all, and for the corpus also near
duplicates (most of their word 8-grams found in an evaluation prompt).
"""

from __future__ import annotations

import random
from typing import Any

from speclab.drafters.corpus import SOURCES, corpus_prompts, held_by_content, python_version
from speclab.drafters.corpus import describe_source as _describe_corpus
from speclab.drafters.selfgen import WHAT as SELF_WHAT
from speclab.drafters.selfgen import is_self, pool_side
from speclab.drafters.similarity import Deduper, normalize, prompt_text, similarity_report

FILE_PREFIX = "file:"
EVAL_FILE_PERMILLE = 200
CORPUS_HOLDOUT = 128  # held-out prompts per corpus source that training is deduplicated against
CORPUS_EVAL_SEED = 42


def source_kind(name: str) -> str:
    """ "stdlib", "self", "file" or "workload"."""
    if name in SOURCES:
        return "stdlib"
    if is_self(name):
        return "self"
    if name.startswith(FILE_PREFIX):
        return "file"
    return "workload"


def _side(p: Any) -> bool:
    """Whether a request is on the held-out side (by its normalised text)."""
    return held_by_content(prompt_text(p), EVAL_FILE_PERMILLE)


def file_split(name: str, held: bool, seed: int) -> list[Any]:
    """One side of a file source's split by content, in an order seeded by `seed` (a larger draw starts with
    a smaller one). Requests with equal normalised text are one request."""
    from speclab.workloads.registry import load_workload

    seen: set[str] = set()
    side = []
    for p in load_workload(name, limit=None, seed=0):
        key = normalize(prompt_text(p))
        if key in seen:
            continue
        seen.add(key)
        if _side(p) == held:
            side.append(p)
    random.Random(f"{seed}/{name}").shuffle(side)
    return side


def _pool(name: str, pools: dict[str, list[Any]] | None) -> list[Any]:
    if not pools or name not in pools:
        raise ValueError(f"{name}: its requests must be sampled first (speclab.drafters.selfgen.self_pool)")
    return pools[name]


def source_training(name: str, limit: int, seed: int, pools: dict[str, list[Any]] | None = None) -> list[Any]:
    """Training-side candidates of a corpus, self or file source (at most `limit`)."""
    kind = source_kind(name)
    if kind == "stdlib":
        return corpus_prompts(name, limit, seed, held=False)
    if kind == "self":
        return pool_side(_pool(name, pools), False, limit)
    return file_split(name, held=False, seed=seed)[:limit]


def source_eval(name: str, n: int, seed: int, pools: dict[str, list[Any]] | None = None) -> list[Any]:
    """The held-out evaluation prompts of a corpus, self or file source."""
    kind = source_kind(name)
    if kind == "stdlib":
        return corpus_prompts(name, n, seed, held=True)
    if kind == "self":
        return pool_side(_pool(name, pools), True, n)
    return file_split(name, held=True, seed=seed)[:n]


def evaluation_sets(
    names: list[str], builtin: list[Any], pools: dict[str, list[Any]] | None = None
) -> list[Any]:
    """Every evaluation set a training prompt must not duplicate: `builtin` (the bench/demo draws of every
    built-in offline workload) and the held-out sides of the named corpus, self and file sources."""
    out = list(builtin)
    for w in names:
        kind = source_kind(w)
        if kind == "stdlib":
            out += corpus_prompts(w, CORPUS_HOLDOUT, CORPUS_EVAL_SEED, held=True)
        elif kind == "self":
            pool = _pool(w, pools)
            out += pool_side(pool, True, len(pool))
        elif kind == "file":
            out += file_split(w, held=True, seed=0)
    return out


def describe_source(name: str) -> dict[str, Any]:
    """What a training or evaluation source is, for the manifest."""
    if is_self(name):
        return {"kind": "self", "what": SELF_WHAT[name]}
    return _describe_corpus(name)


def dedup_training(name: str, cands: list[Any], dedup: Deduper, n: int) -> tuple[list[Any], int]:
    """(kept, dropped): the first `n` candidates of one source that duplicate no evaluation prompt, and how
    many were passed over on the way."""
    near = source_kind(name) in ("stdlib", "self")
    kept: list[Any] = []
    dropped = 0
    for p in cands:
        if len(kept) >= n:
            break
        if dedup.duplicate(p, near=near):
            dropped += 1
        else:
            kept.append(p)
    return kept, dropped


def source_identity(recipe: Any) -> dict[str, Any]:
    """What a cache key takes from the recipe's corpus and file sources beyond their names: the Python
    version (its standard library is the corpus) and each file's content digest. Empty for built-in
    workloads alone, so those recipes keep their keys."""
    from speclab.workloads.files import file_fingerprint

    names = sorted(set(recipe.workloads) | set(recipe.eval_workloads))
    out: dict[str, Any] = {}
    if any(source_kind(w) == "stdlib" for w in names):
        out["python"] = python_version()
    if any(source_kind(w) == "self" for w in names):
        from speclab.drafters.selfgen import SAMPLING, SELF_VERSION

        out["self"] = [SELF_VERSION, SAMPLING]
    files = {w: file_fingerprint(w, {}) for w in names if source_kind(w) == "file"}
    if files:
        out["files"] = files
    return out


def source_stats(
    recipe: Any, train_p: list[Any], held_p: list[Any], dropped: dict[str, int]
) -> dict[str, Any]:
    """The training manifest's account of its sources: per training source what it is and how many prompts
    (and how many were dropped as duplicates of evaluation prompts); per evaluation source how many
    prompts and whether it was left out of training; each evaluation prompt's similarity to its nearest
    training prompt (speclab.drafters.similarity), summarised per evaluation source."""
    counts: dict[str, int] = {}
    for p in train_p:
        counts[p.workload] = counts.get(p.workload, 0) + 1
    sources = {
        w: {
            **describe_source(w),
            "train_prompts": counts.get(w, 0),
            "dropped_as_duplicates": dropped.get(w, 0),
        }
        for w in recipe.workloads
    }
    held: dict[str, int] = {}
    for p in held_p:
        held[p.workload] = held.get(p.workload, 0) + 1
    evaluation = {
        w: {**describe_source(w), "prompts": held.get(w, 0), "left_out": w not in recipe.workloads}
        for w in recipe.eval_workloads
    }
    return {
        "sources": sources,
        "evaluation_sources": evaluation,
        "heldout_similarity": similarity_report(held_p, train_p),
    }
