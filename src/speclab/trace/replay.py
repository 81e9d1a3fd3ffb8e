"""Replay driver: records with prompt/output token ids -> records with `methods` filled.

Every method is replayed by the proposer class that also runs live (speclab.methods), so a replayed trace
says what an engine using that proposer would have proposed and accepted at each position.

Record order matters for suffix speculation: its global trie holds the outputs of the requests replayed
before, per workload, in store order. A record whose (workload, prompt, output) was already replayed
(bench stores repeat the same request across cells and copies) reuses the earlier result and is not added
to the global trie again, so copies of one request never inflate its acceptance.
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
    out: list[RequestTrace] = []
    # one proposer per method; suffix gets one per workload (its global trie is per workload)
    proposers: dict[tuple[str, str], Any] = {}
    cache: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    it = progress(records) if progress else records
    for rec in it:
        if rec.prompt_token_ids is None or rec.output_token_ids is None:
            if skip_missing_ids:
                out.append(rec)
                continue
            raise TraceError(f"record {rec.id!r}: no prompt/output token ids; cannot replay")
        key = _key(rec)
        for m in methods:
            ck = (m, key)
            if ck not in cache:
                pk = (m, rec.workload if m == "suffix" else "")
                if pk not in proposers:
                    proposers[pk] = make_proposer(m, **options.get(m, {}))
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
        rec.meta.setdefault("replay", {})
        rec.meta["replay"] = {
            **rec.meta["replay"],
            **{m: {"k_max": k_max, "options": _jsonable(options.get(m, {}))} for m in methods},
        }
        out.append(rec)
    return out


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(d, default=str))
