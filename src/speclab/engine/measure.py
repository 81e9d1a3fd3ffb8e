"""What the engine worker measures besides time: weight and KV-cache bytes, vLLM's spec-decode counters,
the machine's load and the process's peak RSS. Light imports (torch only inside flatten_tensors)."""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path
from typing import Any

from speclab.engine.protocol import SpecCounters

SPEC_METRICS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
PER_POS_METRIC = "vllm:spec_decode_num_accepted_tokens_per_pos"


def unique_bytes(tensors: Any, exclude: set[int] | None = None) -> tuple[int, set[int]]:
    """Bytes of distinct tensors (tied weights counted once; `exclude`: data pointers already counted)."""
    seen: set[int] = set()
    total = 0
    for t in tensors:
        try:
            ptr = int(t.data_ptr())
            nbytes = int(t.numel()) * int(t.element_size())
        except Exception:
            continue
        if ptr in seen or (exclude and ptr in exclude):
            continue
        seen.add(ptr)
        total += nbytes
    return total, seen


def checkpoint_num_params(path: str | None) -> int | None:
    """Parameters stored in a local safetensors checkpoint, read from the file headers (no tensors
    loaded). Tied weights are stored once, so they count once."""
    if path is None or not Path(path).is_dir():
        return None
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            numel = 1
            for d in meta["shape"]:
                numel *= int(d)
            total += numel
    return total


def flatten_tensors(obj: Any) -> list[Any]:
    """The tensors in nested lists, tuples and dicts (e.g. the runner's KV caches)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, list | tuple):
        return [t for x in obj for t in flatten_tensors(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in flatten_tensors(x)]
    return []


def spec_metrics(llm: Any) -> SpecCounters:
    """vLLM's spec-decode counters so far (engine totals: a cell's are the difference, counters_delta)."""
    c = SpecCounters()
    per_pos: list[int] = []
    for m in llm.get_metrics():
        if m.name in SPEC_METRICS:
            field = SPEC_METRICS[m.name]
            setattr(c, field, getattr(c, field) + int(m.value))
        elif m.name == PER_POS_METRIC:
            vals = list(m.values)
            per_pos += [0] * (len(vals) - len(per_pos))
            for i, v in enumerate(vals):
                per_pos[i] += int(v)
    c.accepted_per_pos = per_pos
    return c


def counters_delta(after: SpecCounters, before: SpecCounters) -> SpecCounters:
    n = max(len(after.accepted_per_pos), len(before.accepted_per_pos))
    a = after.accepted_per_pos + [0] * (n - len(after.accepted_per_pos))
    b = before.accepted_per_pos + [0] * (n - len(before.accepted_per_pos))
    return SpecCounters(
        num_drafts=after.num_drafts - before.num_drafts,
        num_draft_tokens=after.num_draft_tokens - before.num_draft_tokens,
        num_accepted_tokens=after.num_accepted_tokens - before.num_accepted_tokens,
        accepted_per_pos=[x - y for x, y in zip(a, b, strict=True)],
    )


def loadavg() -> float | None:
    """The 1-minute load average (None where the platform has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB
