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
from speclab.replay.expected import fill_accept_prob, pad_drafts, record_sampling
from speclab.traces import MethodTrace, RequestTrace, read_jsonl, read_store

MODEL_METHODS = ("draft_model", "eagle3")  # stateless proposers that load a model


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
    scorer: Callable[[], Any] | None = None,
    draft_sampling: str = "greedy",
    models: dict[str, Any] | None = None,
) -> list[RequestTrace]:
    """Fill rec.methods[m] for each method (replacing an existing entry of that name). Records without
    token ids raise TraceError unless skip_missing_ids, in which case they pass through unchanged.
    If `compare` is given, positions where a replaced (e.g. imported) acc_len equals the replayed one,
    both capped at the smaller k_max, are counted there: compare[m] = [equal, total].
    Sampled records (meta["sampling"], temperature > 0) also get accept_prob (speclab.replay.expected):
    `scorer()` gives the target's TargetScorer (called once, when the first sampled record comes);
    draft_sampling: "probabilistic" (sum-min) or "greedy" (p_T(argmax q)) for model drafters.
    `models`: a dict shared between calls, where the model proposers (draft model, EAGLE-3), stateless, are
    kept by method and options, so several calls load each model once."""
    options = options or {}
    records = list(records)
    # one proposer per method; suffix gets one per workload (its global trie is per workload)
    proposers: dict[tuple[str, str], Any] = {}
    cache: dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}
    expected = _Expected(scorer, draft_sampling)
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
                proposers[pk] = _proposer(m, options.get(m, {}), models)
            if m == "suffix" and i == groups[(rec.workload, _prompt_key(rec))][0]:
                _suffix_group(proposers[pk], records, groups[(rec.workload, _prompt_key(rec))], k_max, cache)
            if ck not in cache:
                acc, nprop = proposers[pk].replay(rec.prompt_token_ids, rec.output_token_ids, k_max)
                cache[ck] = (np.asarray(acc, np.int32), np.asarray(nprop, np.int32), None)
            acc, nprop, drafts = cache[ck]
            old = rec.methods.get(m)
            if compare is not None and old is not None and len(old.acc_len) == len(acc):
                cap = min(old.k_max, k_max) + 1
                eq = np.minimum(old.acc_len, cap) == np.minimum(acc, cap)
                c = compare.setdefault(m, [0, 0])
                c[0] += int(eq.sum())
                c[1] += len(eq)
            rec.methods[m] = MethodTrace(k_max=k_max, acc_len=acc.copy(), num_proposed=nprop.copy())
            expected.fill(rec, m, proposers[pk], drafts)
        rec.meta = dict(rec.meta)
        rec.meta["replay"] = {
            **rec.meta.get("replay", {}),
            **{m: {"k_max": k_max, "options": _jsonable(options.get(m, {}))} for m in methods},
        }
    return records


def _proposer(method: str, opts: dict[str, Any], models: dict[str, Any] | None) -> Any:
    if models is None or method not in MODEL_METHODS:
        return make_proposer(method, **opts)
    key = json.dumps([method, opts], sort_keys=True, default=lambda v: f"{type(v).__name__}@{id(v)}")
    if key not in models:
        models[key] = make_proposer(method, **opts)
    return models[key]


def _suffix_group(
    spec: Any, records: list[RequestTrace], group: list[int], k_max: int,
    cache: dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray | None]],
) -> None:  # fmt: skip
    """Replay the records of one prompt against the same global tree: the variants first, each forgotten
    after, then the first record, whose response stays. Each position's draft is kept too (accept_prob)."""
    first = records[group[0]]
    for i in [*group[1:], group[0]]:
        rec = records[i]
        ck = ("suffix", _key(rec))
        if ck in cache:
            if i == group[0]:
                spec.remember(first.prompt_token_ids, first.output_token_ids)
            continue
        got: dict[int, list[int]] = {}
        acc, nprop = spec.replay(
            rec.prompt_token_ids, rec.output_token_ids, k_max, keep=i == group[0], drafts=got
        )
        cache[ck] = (acc, nprop, pad_drafts([got.get(p, []) for p in range(len(acc))], k_max))


class _Expected:
    """accept_prob for the sampled records of one replay: the target's distributions once per record,
    each method's result cached by (method, record key, sampling)."""

    def __init__(self, scorer: Callable[[], Any] | None, how: str) -> None:
        self.make, self.how = scorer, how
        self.scorer: Any = None
        self.cache: dict[tuple[str, str], tuple[np.ndarray, str]] = {}
        self.probs: tuple[int, Any] | None = None

    def fill(self, rec: RequestTrace, method: str, proposer: Any, drafts: np.ndarray | None) -> None:
        sampling = record_sampling(rec)
        if sampling is None:
            return
        mt = rec.methods[method]
        ck = (method, _key(rec) + json.dumps(sampling, sort_keys=True))
        if ck not in self.cache:
            if self.probs is None or self.probs[0] != id(rec):
                if self.scorer is None:
                    if self.make is None:
                        raise TraceError(
                            f"record {rec.id!r} is sampled: its expected acceptance needs the target"
                        )
                    self.scorer = self.make()
                self.probs = (
                    id(rec),
                    self.scorer.probs(rec.prompt_token_ids, rec.output_token_ids, sampling),
                )
            fill_accept_prob(mt, method, proposer, rec, self.probs[1], sampling, drafts, self.how)
            self.cache[ck] = (mt.accept_prob, mt.accept_source)
        ap, src = self.cache[ck]
        if ap is not None:
            mt.accept_prob, mt.accept_source = ap.copy(), src


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(d, default=str))
