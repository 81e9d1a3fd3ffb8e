"""Self-distillation data for drafters: the target's own greedy outputs on offline-workload prompts, with the
target's hidden states at chosen layers, its greedy label (argmax) and its top-k logits at every position
(one data set serves both trainers: EAGLE-3 heads read the features, distilled draft models the logits).

Held-out prompts: the prompts that bench and the demo draw (`load_workload(w, limit=N, seed=S)` for the seeds
of the shipped sweep presets and the default seed) are excluded from training by id; training prompts are
drawn with a different seed and filtered against that set.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch

OFFLINE_WORKLOADS = (
    "offline-math",
    "offline-chat",
    "offline-code-edit",
    "offline-reasoning",
    "offline-summarization",
)
TRAIN_SEED_OFFSET = 7_919  # training prompts come from seed + this, never from a bench/demo seed
DATA_VERSION = "2"  # 2: top-k logits kept beside features and labels
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


def heldout_ids(workloads: tuple[str, ...] = OFFLINE_WORKLOADS) -> set[str]:
    """Ids of the prompts a bench or demo run with a shipped seed draws from these workloads: the first
    HOLDOUT_LIMIT per seed, plus each shipped sweep's exact draw."""
    from speclab.workloads.registry import load_workload

    seeds, draws = _sweep_draws()
    ids: set[str] = set()
    for w in workloads:
        for seed in seeds:
            ids.update(p.id for p in load_workload(w, limit=HOLDOUT_LIMIT, seed=seed))
        for dw, n, seed in draws:
            if dw == w and n > HOLDOUT_LIMIT:
                ids.update(p.id for p in load_workload(w, limit=n, seed=seed))
    return ids


def training_prompts(workloads: dict[str, int], seed: int) -> list[Any]:
    """`workloads`: name -> number of prompts. Drawn with seed + TRAIN_SEED_OFFSET, held-out ids removed."""
    from speclab.workloads.registry import load_workload

    held = heldout_ids(tuple(workloads))
    out = []
    for w, n in workloads.items():
        cands = load_workload(w, limit=n * 2 + 50, seed=seed + TRAIN_SEED_OFFSET)
        out += [p for p in cands if p.id not in held][:n]
    return out


def eval_prompts(workloads: list[str], n: int, seed: int = 42) -> list[Any]:
    """The held-out evaluation prompts: exactly what the demo/bench draws (seed 42 by default)."""
    from speclab.workloads.registry import load_workload

    return [p for w in workloads for p in load_workload(w, limit=n, seed=seed)]


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
def greedy_with_features(
    model: Any,
    prompts: list[list[int]],
    aux_layers: list[int],
    max_new_tokens: int,
    stop: set[int],
    batch_size: int = 8,
    topk: int = TOPK,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor]]:
    """Greedy decoding (stops at a stop id, as bench does with ignore_eos off) that keeps, for every
    position, the target's hidden states at `aux_layers` (HF hidden_states indices), its argmax and its
    `topk` largest logits (free: the logits are computed anyway).

    Batched with left padding and explicit position ids; each row is fed its own next token. Returns per
    prompt (tokens, feats, labels, out_start, topk_ids, topk_logits)."""
    from transformers import DynamicCache

    results: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor]] = []
    kk = min(topk, model.config.vocab_size)
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        b, lens = len(chunk), [len(p) for p in chunk]
        width = max(lens)
        toks: list[list[int]] = [list(p) for p in chunk]
        feats: list[list[torch.Tensor]] = [[] for _ in chunk]
        labels: list[list[int]] = [[] for _ in chunk]
        tk_ids: list[list[torch.Tensor]] = [[] for _ in chunk]
        tk_val: list[list[torch.Tensor]] = [[] for _ in chunk]
        # Left padding, hidden by the attention mask; position ids count real tokens only.
        ids = torch.zeros(b, width, dtype=torch.long)
        mask = torch.zeros(b, width, dtype=torch.long)
        for r, p in enumerate(chunk):
            ids[r, width - len(p) :] = torch.tensor(p)
            mask[r, width - len(p) :] = 1
        cache = DynamicCache()
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=cache,
            output_hidden_states=True,
            use_cache=True,
        )
        hs = torch.cat([out.hidden_states[a] for a in aux_layers], -1)
        am = out.logits.argmax(-1)
        top = out.logits.topk(kk, -1)
        for r, n in enumerate(lens):
            feats[r].append(hs[r, width - n :].half())
            labels[r] += am[r, width - n :].tolist()
            tk_ids[r].append(top.indices[r, width - n :].int())
            tk_val[r].append(top.values[r, width - n :].half())
        done = [False] * b
        nxt = am[:, -1]
        for step in range(max_new_tokens):
            for r in range(b):
                if not done[r]:
                    toks[r].append(int(nxt[r]))
                    done[r] = int(nxt[r]) in stop
            if all(done) or step == max_new_tokens - 1:
                break  # the last token appended is never fed: its features and label stay unknown
            mask = torch.cat([mask, torch.ones(b, 1, dtype=torch.long)], 1)
            pos = mask.sum(1, keepdim=True) - 1
            out = model(
                input_ids=nxt[:, None],
                attention_mask=mask,
                position_ids=pos,
                past_key_values=cache,
                output_hidden_states=True,
                use_cache=True,
            )
            hs = torch.cat([out.hidden_states[a] for a in aux_layers], -1)[:, 0]
            nxt = out.logits[:, -1].argmax(-1)
            top = out.logits[:, -1].topk(kk, -1)
            for r in range(b):
                if not done[r]:
                    feats[r].append(hs[r : r + 1].half())
                    labels[r].append(int(nxt[r]))
                    tk_ids[r].append(top.indices[r : r + 1].int())
                    tk_val[r].append(top.values[r : r + 1].half())
        for r, n in enumerate(lens):
            t = torch.tensor(toks[r])
            f = torch.cat(feats[r])[: len(t)]
            lab = torch.tensor((labels[r] + [-1])[: len(t)])
            ti, tv = torch.cat(tk_ids[r])[: len(t)], torch.cat(tk_val[r])[: len(t)]
            if len(f) < len(t):  # the last token was never fed: zero features and logits, label unknown
                pad = len(t) - len(f)
                f = torch.cat([f, torch.zeros(pad, f.shape[1], dtype=f.dtype)])
                ti = torch.cat([ti, torch.zeros(pad, kk, dtype=ti.dtype)])
                tv = torch.cat([tv, torch.zeros(pad, kk, dtype=tv.dtype)])
            results.append((t, f, lab, n, ti, tv))
    return results


def build_sequences(
    model: Any,
    tokenizer: Any,
    prompts: list[Any],
    aux_layers: list[int],
    max_new_tokens: int,
    max_prompt_tokens: int = 1024,
    batch_size: int = 8,
    log: Any = None,
) -> list[Sequence]:
    """Render prompts with the target's chat template and decode them greedily, keeping features/labels.
    Prompts are processed in order of length (less padding); the result follows the input order."""
    from speclab.workloads.render import render_prompt

    say = log or (lambda msg: None)
    ids = [render_prompt(p, tokenizer, max_prompt_tokens)[0] for p in prompts]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    stop = eos_ids(model, tokenizer)
    out: dict[int, Sequence] = {}
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        res = greedy_with_features(model, [ids[i] for i in idx], aux_layers, max_new_tokens, stop, batch_size)
        for i, (t, f, lab, n, ti, tv) in zip(idx, res, strict=True):
            out[i] = Sequence(prompts[i].id, prompts[i].workload, t, f, lab, n, ti, tv)
        say(f"  generated {min(start + batch_size, len(order))}/{len(order)} prompts")
    return [out[i] for i in range(len(prompts))]
