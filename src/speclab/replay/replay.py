"""Replay driver: records with prompt/output token ids -> records with `methods` filled.

Every method is replayed by the proposer class that also runs live (speclab.methods), so a replayed trace
says what an engine using that proposer would have proposed and accepted at each position.

Record order matters for suffix decoding: like vLLM's built-in `suffix` method (the same arctic-inference
cache, speclab.methods.suffix), its global tree holds the responses of the requests run before, per
workload, in store order (of each prompt's first appearance), as an engine running the workload at batch
1 would; a request also sees its own response so far, as in the engine. Records sharing a prompt (bench
stores repeat a request across cells) are replayed against the same global tree, and only the first one's
response stays in it, so copies of one request never inflate each other's acceptance. A record whose
(workload, prompt, output) was already replayed reuses the earlier result. To reproduce what an engine
proposed in a given run (batching, earlier cells, warmup) see speclab.replay.engine_sim.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from speclab.errors import TraceError
from speclab.methods import make_proposer
from speclab.traces import MethodTrace, RequestTrace, read_jsonl, read_store


def load_records(source: str | Path) -> list[RequestTrace]:
    """Read a trace store (Parquet file or directory), a bench RUN directory (its traces/ store) or a
    speclab JSONL export."""
    p = Path(source)
    if not p.exists():
        raise TraceError(f"{p}: not found")
    if p.is_dir() and (p / "traces").is_dir():
        p = p / "traces"
    if p.suffix == ".jsonl":
        return read_jsonl(p)
    return read_store(p)


def _key(rec: RequestTrace) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(rec.workload.encode())
    h.update(np.asarray(rec.prompt_token_ids, dtype=np.int32).tobytes())
    h.update(b"|")
    h.update(np.asarray(rec.output_token_ids, dtype=np.int32).tobytes())
    return h.hexdigest()


def _prompt_key(rec: RequestTrace) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(np.asarray(rec.prompt_token_ids, dtype=np.int32).tobytes())
    return h.hexdigest()


def replay_records(
    records: Iterable[RequestTrace],
    methods: list[str],
    k_max: int = 20,
    options: dict[str, dict[str, Any]] | None = None,
    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
    skip_missing_ids: bool = False,
    compare: dict[str, list[int]] | None = None,
) -> list[RequestTrace]:
    """Fill rec.methods[m] for each method (replacing an existing entry of that name). Records without
    token ids raise TraceError unless skip_missing_ids, in which case they pass through unchanged.
    If `compare` is given, positions where a replaced (e.g. imported) acc_len equals the replayed one,
    both capped at the smaller k_max, are counted there: compare[m] = [equal, total]."""
    options = options or {}
    records = list(records)
    # one proposer per method; suffix gets one per workload (its global trie is per workload)
    proposers: dict[tuple[str, str], Any] = {}
    cache: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    # Records sharing a prompt (the same request in several cells, or outputs that differ between cells,
    # e.g. in bf16) are replayed together, and only the first one's output enters suffix's global trie
    # afterwards, so no variant ever sees another variant's answer.
    groups: dict[tuple[str, str], list[int]] = {}
    for i, rec in enumerate(records):
        if rec.prompt_token_ids is None or rec.output_token_ids is None:
            if not skip_missing_ids:
                raise TraceError(f"record {rec.id!r}: no prompt/output token ids; cannot replay")
            continue
        groups.setdefault((rec.workload, _prompt_key(rec)), []).append(i)
    order = [i for g in groups.values() for i in g]
    it = progress(order) if progress else order
    for i in it:
        rec = records[i]
        key = _key(rec)
        for m in methods:
            ck = (m, key)
            pk = (m, rec.workload if m == "suffix" else "")
            if pk not in proposers:
                proposers[pk] = make_proposer(m, **options.get(m, {}))
            if m == "suffix" and i == groups[(rec.workload, _prompt_key(rec))][0]:
                _suffix_group(proposers[pk], records, groups[(rec.workload, _prompt_key(rec))], k_max, cache)
            if ck not in cache:
                acc, nprop = proposers[pk].replay(rec.prompt_token_ids, rec.output_token_ids, k_max)
                cache[ck] = (np.asarray(acc, np.int32), np.asarray(nprop, np.int32))
            acc, nprop = cache[ck]
            old = rec.methods.get(m)
            if compare is not None and old is not None and len(old.acc_len) == len(acc):
                cap = min(old.k_max, k_max) + 1
                eq = np.minimum(old.acc_len, cap) == np.minimum(acc, cap)
                c = compare.setdefault(m, [0, 0])
                c[0] += int(eq.sum())
                c[1] += len(eq)
            rec.methods[m] = MethodTrace(k_max=k_max, acc_len=acc.copy(), num_proposed=nprop.copy())
        rec.meta = dict(rec.meta)
        rec.meta["replay"] = {
            **rec.meta.get("replay", {}),
            **{m: {"k_max": k_max, "options": _jsonable(options.get(m, {}))} for m in methods},
        }
    return records


def _suffix_group(
    spec: Any, records: list[RequestTrace], group: list[int], k_max: int,
    cache: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]],
) -> None:  # fmt: skip
    """Replay the records of one prompt against the same global tree: the variants first, each forgotten
    after, then the first record, whose response stays."""
    first = records[group[0]]
    for i in group[1:]:
        ck = ("suffix", _key(records[i]))
        if ck not in cache:
            rec = records[i]
            cache[ck] = spec.replay(rec.prompt_token_ids, rec.output_token_ids, k_max, keep=False)
    ck = ("suffix", _key(first))
    if ck in cache:
        spec.remember(first.prompt_token_ids, first.output_token_ids)
    else:
        cache[ck] = spec.replay(first.prompt_token_ids, first.output_token_ids, k_max, keep=True)


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(d, default=str))
