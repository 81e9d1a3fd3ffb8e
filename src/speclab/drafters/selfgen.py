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
    """One chunk of CHUNK sampled requests with transformers (texts; those that did not end by themselves,
    at one of `stop_ids`, are dropped)."""
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
    return _texts(tok, out[:, prefix.shape[1] :].tolist(), stop_ids)


def _texts(tok: Any, rows: list[list[int]], stop_ids: set[int]) -> list[str]:
    """The requests among sampled rows: each row up to its first stop id, if it has one and enough words."""
    texts = []
    for row in rows:
        ended = next((i for i, t in enumerate(row) if t in stop_ids), None)
        if ended is None:
            continue
        text = tok.decode(row[:ended], skip_special_tokens=True).strip()
        if len(text.split()) >= MIN_WORDS:
            texts.append(text)
    return texts


def sample_chunks_engine(
    tok: Any, source: str, seed: int, chunks: list[int], stop_ids: set[int], target_dir: Path, say: Any = None
) -> dict[int, list[str]]:
    """Chunks of sampled requests on a vLLM engine, all in one run: row r of chunk c is drawn under its own
    seed (the chunk's seed + r), so a chunk's requests do not depend on what was sampled beside it."""
    from speclab.replay.generate import engine_generate

    prefix = request_prefix(tok, source)
    seeds = [_chunk_seed(seed, source, c) + r for c in chunks for r in range(CHUNK)]
    per = [{**SAMPLING, "seed": s, "max_tokens": MAX_REQUEST_TOKENS} for s in seeds]
    rows = engine_generate([prefix] * len(seeds), target_dir, MAX_REQUEST_TOKENS, echo=say, sampling=per)
    return {c: _texts(tok, rows[j * CHUNK : (j + 1) * CHUNK], stop_ids) for j, c in enumerate(chunks)}


def _chunk_path(root: Path, source: str, seed: int, chunk: int, target_files: Any, engine: str) -> Path:
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
    if engine != "transformers":  # added later: transformers-sampled chunks keep their names
        blob.append(engine)
    key = hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:12]
    return root / f"requests-{key}.json"


def chunks_ahead(sides: list[int], need_train: int, need_held: int, chunk: int, kept: int) -> int:
    """How many chunks (from `chunk` on) should give the requests still needed, at the share of requests per
    chunk kept so far (0.85 before any) and the split's shares, with a tenth more for luck."""
    per_chunk = kept / chunk if chunk and kept else 0.85 * CHUNK
    held_share = HELD_PERMILLE / 1000
    want = max((need_train - sides[0]) / (1 - held_share), (need_held - sides[1]) / held_share, 1.0)
    return max(1, min(MAX_CHUNKS - chunk, int(1.1 * want / max(per_chunk, 1.0)) + 1))


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
    engine: str = "transformers",
    target_dir: Path | None = None,
) -> list[Prompt]:
    """Requests of one self source, in generation order, enough for `need_train` on the training side and
    `need_held` on the held-out side. Chunks already cached are read, the others sampled (ending at one of
    `stop_ids`) and cached: one at a time with transformers, with the vllm engine as many at once as should
    be needed (target_dir: the target's checkpoint)."""
    log = say or (lambda msg: None)
    pool: list[Prompt] = []
    seen: set[str] = set()
    sides = [0, 0]  # [training, held]
    chunk = kept = 0
    while sides[0] < need_train or sides[1] < need_held:
        if chunk >= MAX_CHUNKS:
            raise SpeclabError(
                f"drafters: {source}: {chunk} chunks of sampled requests gave only {sides[0]} training and "
                f"{sides[1]} held-out requests (needed {need_train} and {need_held})"
            )
        path = _chunk_path(root, source, seed, chunk, target_files, engine)
        if path.is_file():
            texts = json.loads(path.read_text())["requests"]
        elif engine == "transformers":
            texts = sample_requests(model, tok, source, seed, chunk, stop_ids)
            atomic_write_text(path, json.dumps({"source": source, "chunk": chunk, "requests": texts}))
            log(f"data: {source}: sampled request chunk {chunk + 1} ({len(texts)} kept of {CHUNK})")
        else:
            if target_dir is None:
                raise SpeclabError(
                    "drafters: sampling requests on the vllm engine needs the target's directory"
                )
            span = range(chunk, chunk + chunks_ahead(sides, need_train, need_held, chunk, kept))
            todo = [c for c in span if not _chunk_path(root, source, seed, c, target_files, engine).is_file()]
            got = sample_chunks_engine(tok, source, seed, todo, stop_ids, target_dir, say)
            for c, t in got.items():
                cpath = _chunk_path(root, source, seed, c, target_files, engine)
                atomic_write_text(cpath, json.dumps({"source": source, "chunk": c, "requests": t}))
            n = sum(len(t) for t in got.values())
            log(
                f"data: {source}: sampled request chunks {span.start + 1}-{span.stop} ({n} kept of {len(todo) * CHUNK})"
            )
            texts = got[chunk]
        kept += len(texts)
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
