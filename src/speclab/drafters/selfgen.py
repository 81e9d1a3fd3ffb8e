"""Training requests the target writes itself: sources `self-chat`, `self-math` and `self-code`.

An instruction-tuned model, given its chat template up to the start of a user turn and nothing else, writes
a user's request: the kind of request it was tuned to answer (the idea of Magpie, Xu et al. 2024). Sampled
(temperature 1, top-p 0.95, top-k 50) from a fixed system message per source, this gives diverse requests in
the words users of such a model use, from nothing but the target: no network, no dataset, no template over
a topic list. The target then answers them greedily like any other training prompt (speclab.drafters.data).

- `self-chat`: the target's own system message (whatever its template puts there by default);
- `self-math`: a system message saying users ask math word problems and arithmetic questions;
- `self-code`: a system message saying users ask to write, fix or change code.

Requests are generated in chunks of CHUNK, each sampled under its own seed (seed, source, chunk index), so a
larger draw starts with a smaller one and each chunk is cached on its own (`requests-<hash>.json`, keyed by
the chunk, the sampling settings and the target's checksums). A request is kept when it ends by itself
(end of turn within MAX_REQUEST_TOKENS), has at least MIN_WORDS words and its normalised text is new to the
pool. Each request is on one side of a split by the hash of its normalised text: HELD_PERMILLE per mille are
the source's evaluation side, never trained on.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from speclab.atomic import atomic_write_text
from speclab.drafters.corpus import held_by_content
from speclab.drafters.similarity import normalize
from speclab.errors import SpeclabError
from speclab.workloads.base import Prompt, content_id, user

SYSTEM: dict[str, str | None] = {
    "self-chat": None,  # the template's own default system message
    "self-math": "You are a helpful math tutor. Users ask you math word problems and arithmetic questions.",
    "self-code": "You are an expert Python programmer. Users ask you to write, fix or change code.",
}
CATEGORY = {"self-chat": "chat", "self-math": "math", "self-code": "code"}
WHAT = {
    "self-chat": "requests the target writes itself under its own system message, answered by it",
    "self-math": "math requests the target writes itself (a math tutor's system message), answered by it",
    "self-code": "coding requests the target writes itself (a programmer's system message), answered by it",
}
SELF_VERSION = "1"
CHUNK = 32
MAX_REQUEST_TOKENS = 80
MIN_WORDS = 4
HELD_PERMILLE = 150
SAMPLING = {"temperature": 1.0, "top_p": 0.95, "top_k": 50}
MAX_CHUNKS = 400  # a source that keeps nothing (a model that never ends a request) fails instead of looping


def is_self(name: str) -> bool:
    return name in SYSTEM


def is_held(text: str) -> bool:
    return held_by_content(text, HELD_PERMILLE)


def request_prefix(tok: Any, source: str) -> list[int]:
    """The target's chat template up to where a user's words begin (its system message per SYSTEM)."""
    marker = "\x00SPECLAB\x00"
    msgs = [{"role": "user", "content": marker}]
    if SYSTEM[source] is not None:
        msgs.insert(0, {"role": "system", "content": SYSTEM[source]})
    text = tok.apply_chat_template(msgs, tokenize=False)
    return list(tok(text[: text.index(marker)], add_special_tokens=False)["input_ids"])


def _chunk_seed(seed: int, source: str, chunk: int) -> int:
    return int(hashlib.sha256(f"{seed}/{source}/{chunk}".encode()).hexdigest()[:8], 16)


@torch.inference_mode()
def sample_requests(
    model: Any, tok: Any, source: str, seed: int, chunk: int, stop_ids: set[int]
) -> list[str]:
    """One chunk of CHUNK sampled requests (texts; those that did not end by themselves, at one of
    `stop_ids`, are dropped)."""
    prefix = torch.tensor([request_prefix(tok, source)] * CHUNK)
    stop = sorted(stop_ids)
    with torch.random.fork_rng():
        torch.manual_seed(_chunk_seed(seed, source, chunk))
        out = model.generate(
            prefix,
            attention_mask=torch.ones_like(prefix),
            do_sample=True,
            max_new_tokens=MAX_REQUEST_TOKENS,
            eos_token_id=stop,
            pad_token_id=stop[0],
            **SAMPLING,
        )
    texts = []
    for row in out[:, prefix.shape[1] :].tolist():
        ended = next((i for i, t in enumerate(row) if t in stop), None)
        if ended is None:
            continue
        text = tok.decode(row[:ended], skip_special_tokens=True).strip()
        if len(text.split()) >= MIN_WORDS:
            texts.append(text)
    return texts


def _chunk_path(root: Path, source: str, seed: int, chunk: int, target_files: Any) -> Path:
    blob = [
        SELF_VERSION,
        source,
        SYSTEM[source],
        seed,
        chunk,
        CHUNK,
        MAX_REQUEST_TOKENS,
        SAMPLING,
        target_files,
    ]
    key = hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:12]
    return root / f"requests-{key}.json"


def self_pool(
    model: Any,
    tok: Any,
    source: str,
    need_train: int,
    need_held: int,
    seed: int,
    root: Path,
    target_files: Any,
    stop_ids: set[int],
    say: Any = None,
) -> list[Prompt]:
    """Requests of one self source, in generation order, enough for `need_train` on the training side and
    `need_held` on the held-out side. Chunks already cached are read, the others sampled (ending at one of
    `stop_ids`) and cached."""
    log = say or (lambda msg: None)
    pool: list[Prompt] = []
    seen: set[str] = set()
    sides = [0, 0]  # [training, held]
    chunk = 0
    while sides[0] < need_train or sides[1] < need_held:
        if chunk >= MAX_CHUNKS:
            raise SpeclabError(
                f"drafters: {source}: {chunk} chunks of sampled requests gave only {sides[0]} training and "
                f"{sides[1]} held-out requests (needed {need_train} and {need_held})"
            )
        path = _chunk_path(root, source, seed, chunk, target_files)
        if path.is_file():
            texts = json.loads(path.read_text())["requests"]
        else:
            texts = sample_requests(model, tok, source, seed, chunk, stop_ids)
            atomic_write_text(path, json.dumps({"source": source, "chunk": chunk, "requests": texts}))
            log(f"data: {source}: sampled request chunk {chunk + 1} ({len(texts)} kept of {CHUNK})")
        for text in texts:
            key = normalize(text)
            if key in seen:
                continue
            seen.add(key)
            msgs = [user(text)]
            meta = {"source": source, "held": is_held(text)}
            pool.append(Prompt(content_id(source, msgs), source, CATEGORY[source], msgs, meta=meta))
            sides[1 if meta["held"] else 0] += 1
        chunk += 1
    return pool


def pool_side(pool: list[Prompt], held: bool, limit: int) -> list[Prompt]:
    """The first `limit` requests of one side of the split, in generation order."""
    return [p for p in pool if p.meta.get("held") == held][:limit]
