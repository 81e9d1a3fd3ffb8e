"""Importers from other trace formats into speclab's RequestTrace.

specdecode-bench: the study's JSON Lines (arXiv 2601.11580), one request per line:
  {"id": str, "prompt_token_ids": [int], "generated_token_ids": [int],
   "acc_ngram": {"acc_len": [int]}, "acc_eagle": {"acc_len": [int]}, optional "acc_eagle_three": {...}}
acc_len[p] = tokens one step starting at output position p would produce when proposing up to k_max=20
drafts (accepted drafts + bonus, 1..21). The study's traces carry no proposal counts, so num_proposed is
recorded as unknown (None), never invented.

Lengths: each method's trace comes from that method's own run. generated_token_ids and acc_ngram come from
the n-gram run (same length: the record's output); every other acc_* array (acc_eagle, ...) comes from its
own run and keeps its own length (MethodTrace.output_len), with its output tokens unknown. Nothing is
truncated or padded unless --lenient-lengths asks for the old one-length layout.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from speclab.errors import TraceError
from speclab.inputs import open_binary
from speclab.traces.model import CATEGORIES, KNOWN_METHODS, MethodTrace, RequestTrace, json_lines

FORMATS = ("specdecode-bench", "speclab-jsonl")
STUDY_K_MAX = 20
# study key -> speclab method name
STUDY_METHOD_KEYS = {
    "acc_ngram": "ngram",
    "acc_eagle": "eagle",
    "acc_eagle_three": "eagle3",
    "acc_eagle3": "eagle3",
}

# workload name fragment -> study category
_CATEGORY_GUESS = {
    "instructcoder": "code-editing",
    "code": "code-editing",
    "cnn": "summarization",
    "summar": "summarization",
    "gsm8k": "math",
    "math": "math",
    "sharegpt": "chat",
    "chat": "chat",
    "aime": "reasoning",
    "gpqa": "reasoning",
    "reason": "reasoning",
}


def guess_category(workload: str) -> str:
    w = workload.lower().replace("_", "").replace("-", "")
    for frag, cat in _CATEGORY_GUESS.items():
        if frag in w:
            return cat
    return "other"


def _method_for_key(key: str) -> str:
    if key in STUDY_METHOD_KEYS:
        return STUDY_METHOD_KEYS[key]
    name = key[len("acc_") :]
    return name if name in KNOWN_METHODS else f"custom:{name}"


def _int_list(v: Any, where: str) -> np.ndarray:
    if not isinstance(v, list):
        raise TraceError(f"{where}: expected a list of integers, got {type(v).__name__}")
    if any(isinstance(x, bool) or not isinstance(x, int) for x in v):
        bad = next(x for x in v if isinstance(x, bool) or not isinstance(x, int))
        raise TraceError(f"{where}: expected integers, found {bad!r}")
    # stored in 32 bits: refuse what would wrap (and ints numpy cannot hold at all) here
    bad_i = next((i for i, x in enumerate(v) if not -(2**31) <= x < 2**31), None)
    if bad_i is not None:
        raise TraceError(f"{where}: value {v[bad_i]} at position {bad_i} out of range (must fit in 32 bits)")
    return np.asarray(v, dtype=np.int64)


def _method_traces(
    d: dict[str, Any], where: str, gen: np.ndarray, k_max: int, lenient_lengths: bool
) -> tuple[dict[str, MethodTrace], list[str], list[str]]:
    """One study record's acc_* fields as method traces: (methods, the length fixes made, the acc_* keys whose
    trace keeps its own length)."""
    methods: dict[str, MethodTrace] = {}
    fixed_here: list[str] = []
    own: list[str] = []
    for key in sorted(k for k in d if k.startswith("acc_")):
        v = d[key]
        if not isinstance(v, dict) or "acc_len" not in v:
            raise TraceError(f"{where}: field {key}: expected an object with acc_len")
        acc = _int_list(v["acc_len"], f"{where}: field {key}.acc_len")
        if len(acc) != len(gen) and (lenient_lengths or key == "acc_ngram"):
            if not lenient_lengths:
                raise TraceError(
                    f"{where}: field {key}.acc_len: has {len(acc)} entries but generated_token_ids "
                    f"has {len(gen)} (both come from the n-gram run: one entry per generated "
                    "token expected; --lenient-lengths to truncate/pad)"
                )
            acc = np.concatenate([acc[: len(gen)], np.ones(max(0, len(gen) - len(acc)), np.int64)])
            fixed_here.append(f"{key}.acc_len {len(v['acc_len'])}->{len(gen)}")
        if len(acc) and (acc.min() < 1 or acc.max() > k_max + 1):
            p = int(np.flatnonzero((acc < 1) | (acc > k_max + 1))[0])
            raise TraceError(
                f"{where}: field {key}.acc_len: value {int(acc[p])} at position {p} out of range "
                f"1..{k_max + 1} (k_max={k_max})"
            )
        if len(acc) != len(gen):
            own.append(key)
        methods[_method_for_key(key)] = MethodTrace(k_max=k_max, acc_len=acc, num_proposed=None)
    return methods, fixed_here, own


def import_specdecode_bench(
    paths: list[str | os.PathLike[str]],
    workload: str | None = None,
    category: str | None = None,
    k_max: int = STUDY_K_MAX,
    lenient_lengths: bool = False,
) -> tuple[list[RequestTrace], list[str]]:
    """Read study JSONL files. Returns (records, notes). Bad input raises TraceError naming file, line, field.

    Each acc_* array keeps its own length, except acc_ngram, which comes from the same run as
    generated_token_ids and must match it. lenient_lengths: force every acc_len array to the length of
    generated_token_ids (truncate, or pad with 1 = no acceptance) instead; every such fix is counted in meta
    and in the notes. Not needed for the study's files."""
    if category is not None and category not in CATEGORIES:
        raise TraceError(f"--category {category!r} not one of {', '.join(CATEGORIES)}")
    records: list[RequestTrace] = []
    notes: list[str] = []
    seen: dict[str, str] = {}
    for path in paths:
        path = Path(path)
        wl = workload or path.name.split(".")[0]
        cat = category or guess_category(wl)
        adjusted = 0
        own_len: dict[str, int] = {}  # method -> records whose trace has its own length
        try:  # opened once: a pipe or FIFO works, a FIFO without a writer times out
            fh = io.TextIOWrapper(open_binary(path, TraceError), encoding="utf-8-sig")
        except OSError as exc:
            raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
        with fh:
            for lineno, where, d in json_lines(fh, path):
                if not isinstance(d, dict):
                    raise TraceError(f"{where}: expected a JSON object per line, got {type(d).__name__}")
                if "id" not in d:
                    raise TraceError(f"{where}: field id: missing")
                rid = d["id"]
                if isinstance(rid, bool) or not isinstance(rid, str | int) or rid == "":
                    raise TraceError(f"{where}: field id: expected a non-empty string, got {rid!r}")
                rid = str(rid)
                where = f"{where} (id={rid!r})"
                if rid in seen:
                    raise TraceError(f"{where}: field id: duplicate (first at {seen[rid]})")
                seen[rid] = f"{path}: line {lineno}"
                for key in ("prompt_token_ids", "generated_token_ids"):
                    if key not in d:
                        raise TraceError(f"{where}: field {key}: missing")
                prompt = _int_list(d["prompt_token_ids"], f"{where}: field prompt_token_ids")
                gen = _int_list(d["generated_token_ids"], f"{where}: field generated_token_ids")
                methods, fixed_here, own = _method_traces(d, where, gen, k_max, lenient_lengths)
                adjusted += len(fixed_here)
                for key in own:
                    own_len[key] = own_len.get(key, 0) + 1
                if not methods:
                    raise TraceError(f"{where}: field acc_ngram/acc_eagle: no acc_* field found")
                meta: dict[str, Any] = {"source": "specdecode-bench", "file": path.name, "line": lineno}
                if fixed_here:
                    meta["lenient_length_fixes"] = fixed_here
                rec = RequestTrace(
                    id=rid,
                    workload=wl,
                    category=cat,
                    prompt_len=len(prompt),
                    output_len=len(gen),
                    methods=methods,
                    prompt_token_ids=prompt,
                    output_token_ids=gen,
                    meta=meta,
                )
                rec.validate(where)
                records.append(rec)
        for key, cnt in sorted(own_len.items()):
            notes.append(
                f"{path}: {key}: {cnt} record(s) with their own length (from that method's own run; kept as is)"
            )
        if adjusted:
            notes.append(f"{path}: {adjusted} acc_len array(s) truncated/padded to generated length")
    if not records:
        raise TraceError(f"{', '.join(map(str, paths))}: no records found")
    return records, notes
