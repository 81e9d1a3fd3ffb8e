"""Self-distillation data for drafters: the target's own greedy outputs on offline-workload prompts, with the
target's hidden states at chosen layers, its greedy label (argmax) and its top-k logits at every position
(one data set serves both trainers: EAGLE-3 heads read the features, distilled draft models the logits).

Held-out prompts: the prompts that bench and the demo draw (`load_workload(w, limit=N, seed=S)` for the seeds
of the shipped sweep presets and the default seed) are excluded from training by id; training prompts are
drawn with a different seed and filtered against that set. Corpus and file sources (speclab.drafters.sources)
are split by content and deduplicated against every evaluation set.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch

from speclab.errors import SpeclabError

OFFLINE_WORKLOADS = (
    "offline-math",
    "offline-chat",
    "offline-code-edit",
    "offline-reasoning",
    "offline-summarization",
)
TRAIN_SEED_OFFSET = 7_919  # training prompts come from seed + this, never from a bench/demo seed
# 2: top-k logits kept beside features and labels; 3: features/logits from one teacher-forced forward after
# decoding (equal up to float rounding), decoded in chunks of DATA_CHUNK prompts, one cache file per chunk
DATA_VERSION = "3"
DATA_CHUNK = 32  # prompts decoded as one batch and cached as one file (a larger draw reuses its first chunks)
TOPK = 32  # the target's top-k logits kept per position (the distilled draft's KL target)
HOLDOUT_LIMIT = 128  # offline builders draw lazily, so a smaller draw with the same seed is a prefix of this


def _sweep_draws() -> tuple[set[int], set[tuple[str, int, int]]]:
    """Seeds of the shipped sweep presets (plus 0, load_workload's default, and 42, bench's), and their
    exact (workload, num_prompts, seed) draws."""
    seeds, draws = {0, 42}, set()
    for f in resources.files("speclab.presets.sweeps").iterdir():
        if f.name.endswith(".toml"):
            d = tomllib.loads(f.read_text())
            seed = int(d.get("seed", 42))
            seeds.add(seed)
            for w in d.get("workloads", []):
                draws.add((w, int(d.get("num_prompts", 0)), seed))
    return seeds, draws


def heldout_prompts(workloads: tuple[str, ...] = OFFLINE_WORKLOADS) -> list[Any]:
    """The prompts a bench or demo run with a shipped seed draws from these workloads: the first
    HOLDOUT_LIMIT per seed, plus each shipped sweep's exact draw (repeats once)."""
    from speclab.workloads.registry import load_workload

    seeds, draws = _sweep_draws()
    out: dict[str, Any] = {}
    for w in workloads:
        for seed in sorted(seeds):
            out.update((p.id, p) for p in load_workload(w, limit=HOLDOUT_LIMIT, seed=seed))
        for dw, n, seed in sorted(draws):
            if dw == w and n > HOLDOUT_LIMIT:
                out.update((p.id, p) for p in load_workload(w, limit=n, seed=seed))
    return list(out.values())


def heldout_ids(workloads: tuple[str, ...] = OFFLINE_WORKLOADS) -> set[str]:
    """Ids of `heldout_prompts(workloads)`."""
    return {p.id for p in heldout_prompts(workloads)}


def training_prompts(
    workloads: dict[str, int],
    seed: int,
    report: dict[str, Any] | None = None,
    pools: dict[str, list[Any]] | None = None,
    eval_sources: tuple[str, ...] = (),
) -> list[Any]:
    """`workloads`: source name -> number of prompts (speclab.drafters.sources). Built-in workloads are drawn
    with seed + TRAIN_SEED_OFFSET, held-out ids removed; corpus, self and file sources are deduplicated
    against every evaluation set by content, `eval_sources`' included (`report`, when given, receives the
    number dropped per source). `pools`: the sampled requests of self sources (speclab.drafters.selfgen)."""
    from speclab.drafters.similarity import Deduper
    from speclab.drafters.sources import dedup_training, evaluation_sets, source_kind, source_training
    from speclab.errors import ConfigError
    from speclab.workloads.registry import load_workload

    held = heldout_ids(tuple(w for w in workloads if source_kind(w) == "workload"))
    others = [w for w in workloads if source_kind(w) != "workload"]
    against = list(dict.fromkeys(others + [w for w in eval_sources if source_kind(w) != "workload"]))
    dedup = Deduper(evaluation_sets(against, heldout_prompts(OFFLINE_WORKLOADS), pools)) if others else None
    out = []
    for w, n in workloads.items():
        # draws are lazy (a larger draw starts with a smaller one), so n prompts are a prefix of 2n prompts
        if dedup is not None and source_kind(w) != "workload":
            cands = source_training(w, n * 2 + 50, seed + TRAIN_SEED_OFFSET, pools)
            kept, dropped = dedup_training(w, cands, dedup, n)
            if report is not None:
                report[w] = dropped
            where = "after removing duplicates of evaluation prompts"
        else:
            cands = load_workload(w, limit=n * 2 + 50, seed=seed + TRAIN_SEED_OFFSET)
            kept = [p for p in cands if p.id not in held][:n]
            where = "outside the held-out set"
        if len(kept) < n:
            raise ConfigError(
                f"drafters: {w} has only {len(kept)} distinct training prompts {where} (asked for {n})"
            )
        out += kept
    return out


def eval_prompts(
    workloads: list[str], n: int, seed: int = 42, pools: dict[str, list[Any]] | None = None
) -> list[Any]:
    """The held-out evaluation prompts: exactly what the demo/bench draws (seed 42 by default) for built-in
    workloads, the held-out side of the split for corpus and file sources."""
    from speclab.drafters.sources import source_eval, source_kind
    from speclab.workloads.registry import load_workload

    out = []
    for w in workloads:
        if source_kind(w) == "workload":
            out += load_workload(w, limit=n, seed=seed)
        else:
            out += source_eval(w, n, seed, pools)
    return out


@dataclass
class Sequence:
    """One prompt + greedy output. feats[t]: target aux features at position t; labels[t]: the target's
    argmax after x[..t] (-1 where unknown: the last position); topk_ids/topk_logits[t]: the target's k
    largest next-token logits after x[..t] (rows where labels is -1 are zero)."""

    prompt_id: str
    workload: str
    tokens: torch.Tensor  # [n] long
    feats: torch.Tensor  # [n, A*H] (stored as float16 to halve memory)
    labels: torch.Tensor  # [n] long
    out_start: int  # index of the first generated token
    topk_ids: torch.Tensor | None = None  # [n, K] int32
    topk_logits: torch.Tensor | None = None  # [n, K] float16


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for v in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(v, int):
            ids.add(v)
        elif v:
            ids.update(int(x) for x in v)
    return ids


@torch.inference_mode()
def greedy_tokens(
    model: Any, prompts: list[list[int]], max_new_tokens: int, stop: set[int]
) -> list[list[int]]:
    """Greedy decoding of all `prompts` as one batch (stops at a stop id, as bench does with ignore_eos off):
    left padding hidden by the attention mask, position ids counting real tokens only, a KV cache, and only
    the last position's logits computed. Returns each prompt followed by its greedy output."""
    from transformers import DynamicCache

    b, lens = len(prompts), [len(p) for p in prompts]
    width = max(lens)
    toks: list[list[int]] = [list(p) for p in prompts]
    ids = torch.zeros(b, width, dtype=torch.long)
    mask = torch.zeros(b, width, dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, width - len(p) :] = torch.tensor(p)
        mask[r, width - len(p) :] = 1
    cache = DynamicCache()
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    nxt = _next_greedy(model, ids, mask, pos, cache)
    done = [False] * b
    for step in range(max_new_tokens):
        for r in range(b):
            if not done[r]:
                toks[r].append(int(nxt[r]))
                done[r] = int(nxt[r]) in stop
        if all(done) or step == max_new_tokens - 1:
            break  # the last token appended is never fed
        mask = torch.cat([mask, torch.ones(b, 1, dtype=torch.long)], 1)
        pos = mask.sum(1, keepdim=True) - 1
        nxt = _next_greedy(model, nxt[:, None], mask, pos, cache)
    return toks


def _next_greedy(model: Any, ids: Any, mask: Any, pos: Any, cache: Any) -> Any:
    """One forward over ids (extending the KV cache), computing only the last position's logits; its argmax."""
    cached = {"past_key_values": cache, "use_cache": True}
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1, **cached)
    return out.logits[:, -1].argmax(-1)


@torch.inference_mode()
def teacher_forced(
    model: Any, seqs: list[list[int]], aux_layers: list[int], topk: int, tokens_per_forward: int = 1024
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """One forward over each finished sequence: per position the hidden states at `aux_layers` (float16), the
    argmax and the `topk` largest logits. Sequences are right-padded in length-sorted groups of at most
    `tokens_per_forward` padded tokens (bounds the [tokens, vocab] logits); no mask is needed, since under the
    causal mask a real position never sees the padding after it."""
    kk = min(topk, model.config.vocab_size)
    res: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    groups: list[list[int]] = []
    for i in order:  # ascending lengths: a group's padded size is its count x its last length
        if groups and (len(groups[-1]) + 1) * len(seqs[i]) <= tokens_per_forward:
            groups[-1].append(i)
        else:
            groups.append([i])
    for g in groups:
        width = max(len(seqs[i]) for i in g)
        ids = torch.zeros(len(g), width, dtype=torch.long)
        for r, i in enumerate(g):
            ids[r, : len(seqs[i])] = torch.tensor(seqs[i])
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        hs = torch.cat([out.hidden_states[a] for a in aux_layers], -1)
        top = out.logits.topk(kk, -1)
        am = out.logits.argmax(-1)
        for r, i in enumerate(g):
            n = len(seqs[i])
            res[i] = (hs[r, :n].half(), am[r, :n], top.indices[r, :n].int(), top.values[r, :n].half())
    return [res[i] for i in range(len(seqs))]


@torch.inference_mode()
def features_of(
    model: Any, prompts: list[list[int]], full: list[list[int]], aux_layers: list[int], topk: int = TOPK
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor]]:
    """Training rows of finished sequences (`full[i]`: prompt i followed by its greedy output): one
    teacher-forced forward over each (`teacher_forced`) for the target's hidden states at `aux_layers` (HF
    hidden_states indices), its argmax and its `topk` largest logits at every position: the same values as
    keeping them during decoding, up to float rounding (tests/test_drafters.py checks it against step-by-step
    decoding), at a fraction of the cost.

    Returns per prompt (tokens, feats, labels, out_start, topk_ids, topk_logits). labels[t] is the target's
    greedy token after x[..t]: the next token at output positions (exactly what decoding chose), the argmax
    at prompt positions, -1 at the last position, whose features and logits are zero (it was never fed)."""
    results: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor]] = []
    for p, seq, (f, am, ti, tv) in zip(
        prompts, full, teacher_forced(model, full, aux_layers, topk), strict=True
    ):
        n0, t = len(p), torch.tensor(seq)
        lab = am.clone()
        lab[n0 - 1 : -1] = t[n0:]  # the tokens decoding chose (equal to the argmax up to float ties)
        lab[-1] = -1
        f[-1], ti[-1], tv[-1] = 0, 0, 0
        results.append((t, f, lab, n0, ti, tv))
    return results


def greedy_with_features(
    model: Any,
    prompts: list[list[int]],
    aux_layers: list[int],
    max_new_tokens: int,
    stop: set[int],
    batch_size: int = 32,
    topk: int = TOPK,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor]]:
    """Greedy decoding in batches of `batch_size` prompts (`greedy_tokens`, no features kept while decoding),
    then the training rows of each finished sequence (`features_of`)."""
    results: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor]] = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        results += features_of(
            model, chunk, greedy_tokens(model, chunk, max_new_tokens, stop), aux_layers, topk
        )
    return results


def build_sequences(
    model: Any,
    tokenizer: Any,
    prompts: list[Any],
    aux_layers: list[int],
    max_new_tokens: int,
    max_prompt_tokens: int = 1024,
    batch_size: int = DATA_CHUNK,
    log: Any = None,
    decoded: dict[str, list[int]] | None = None,
) -> list[Sequence]:
    """Render prompts with the target's chat template and decode them greedily, keeping features/labels.
    Prompts are processed in order of length (less padding); the result follows the input order. With
    `decoded` (prompt id -> the prompt's token ids followed by its greedy output, decoded elsewhere:
    speclab.drafters.generate) only the features are computed here."""
    from speclab.workloads.render import render_prompt

    say = log or (lambda msg: None)
    ids = [render_prompt(p, tokenizer, max_prompt_tokens)[0] for p in prompts]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    stop = eos_ids(model, tokenizer)
    out: dict[int, Sequence] = {}
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        chunk = [ids[i] for i in idx]
        if decoded is None:
            res = greedy_with_features(model, chunk, aux_layers, max_new_tokens, stop, batch_size)
        else:
            full = [decoded[prompts[i].id] for i in idx]
            if any(f[: len(c)] != c for f, c in zip(full, chunk, strict=True)):
                raise SpeclabError("drafters: a decoded sequence does not start with its prompt")
            res = features_of(model, chunk, full, aux_layers)
        for i, (t, f, lab, n, ti, tv) in zip(idx, res, strict=True):
            out[i] = Sequence(prompts[i].id, prompts[i].workload, t, f, lab, n, ti, tv)
        say(f"  generated {min(start + batch_size, len(order))}/{len(order)} prompts")
    return [out[i] for i in range(len(prompts))]


def collate_topk(seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (tokens, valid, topk_ids, topk_logits); valid marks positions with a target distribution
    (inside the sequence, label known)."""
    if any(s.topk_ids is None or s.topk_logits is None for s in seqs):
        raise SpeclabError(
            "drafters: data without top-k logits (made by an older speclab); retrain with --force"
        )
    n = max(len(s.tokens) for s in seqs)
    kk = seqs[0].topk_ids.shape[1]  # type: ignore[union-attr]
    tokens = torch.zeros(len(seqs), n, dtype=torch.long)
    valid = torch.zeros(len(seqs), n, dtype=torch.bool)
    ids = torch.zeros(len(seqs), n, kk, dtype=torch.long)
    vals = torch.zeros(len(seqs), n, kk)
    for i, s in enumerate(seqs):
        m = len(s.tokens)
        tokens[i, :m], valid[i, :m] = s.tokens, s.labels >= 0
        ids[i, :m], vals[i, :m] = s.topk_ids.long(), s.topk_logits.float()  # type: ignore[union-attr]
    return tokens, valid, ids, vals
