"""How close training prompts are to evaluation prompts, and removing the ones that are too close.

Two measures:
- similarity: difflib's ratio between two prompts' texts (the measure of benchmarks/heldout_similarity.py);
  `nearest` gives, for each evaluation prompt, the ratio to its most similar training prompt (exact: difflib's
  quick_ratio is an upper bound of ratio, so candidates are tried in decreasing quick_ratio until none can
  beat the best found);
- overlap, for deduplication at corpus scale: the share of a training prompt's word 8-grams found in any
  evaluation prompt, template frames aside (`Deduper`), besides exact equality of the normalised text.
"""

from __future__ import annotations

import difflib
import hashlib
import statistics
from collections import Counter
from typing import Any

SHINGLE = 8  # words per shingle
OVERLAP_LIMIT = 0.5  # a training prompt with this share of its shingles in evaluation prompts is dropped
BOILERPLATE_DF = 3  # a shingle in this many evaluation prompts is a template's frame, not content
MEASURE_CHARS = 2000  # texts are compared on their first this many characters (bounds difflib's cost)
TWIN = 0.9  # a similarity at or above this counts as a near twin


def prompt_text(p: Any) -> str:
    msgs = getattr(p, "messages", None)
    if msgs:
        return " | ".join(str(m["content"]) for m in msgs)
    return str(getattr(p, "prompt", p))


def normalize(text: str) -> str:
    return " ".join(text.lower().split())


def _shingles(text: str) -> set[int]:
    words = normalize(text).split()
    if len(words) < SHINGLE:
        return {_h(" ".join(words))} if words else set()
    return {_h(" ".join(words[i : i + SHINGLE])) for i in range(len(words) - SHINGLE + 1)}


def _h(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest(), "big")


class Deduper:
    """Decides whether a training prompt duplicates any evaluation prompt: equal normalised text, or (when
    `near` is set) at least OVERLAP_LIMIT of its word 8-grams found in evaluation prompts. Word 8-grams that
    occur in BOILERPLATE_DF or more evaluation prompts are the frame of a template (an instruction every
    prompt of a kind repeats), not content, and are not counted on either side."""

    def __init__(self, eval_prompts: list[Any]) -> None:
        texts = [prompt_text(p) for p in eval_prompts]
        self.exact = {normalize(t) for t in texts}
        df: Counter[int] = Counter()
        for t in texts:
            df.update(_shingles(t))
        self.boilerplate = {h for h, c in df.items() if c >= BOILERPLATE_DF}
        self.shingles = set(df) - self.boilerplate

    def overlap(self, p: Any) -> float:
        sh = _shingles(prompt_text(p)) - self.boilerplate
        return len(sh & self.shingles) / len(sh) if sh else 0.0

    def duplicate(self, p: Any, near: bool = True) -> bool:
        if normalize(prompt_text(p)) in self.exact:
            return True
        return near and self.overlap(p) >= OVERLAP_LIMIT


def nearest(heldout: list[str], train: list[str]) -> list[float]:
    """For each held-out text, difflib's ratio to its most similar training text (0 with no training)."""
    train = [t[:MEASURE_CHARS] for t in train]
    out = []
    for h in heldout:
        sm = difflib.SequenceMatcher(None, autojunk=True)
        sm.set_seq2(h[:MEASURE_CHARS])
        bounds = []
        for t in train:
            sm.set_seq1(t)
            bounds.append((sm.real_quick_ratio(), t))
        best = 0.0
        cands = sorted(((b, t) for b, t in bounds if b > best), key=lambda x: -x[0])
        for ub, t in cands:
            if ub <= best:
                break
            sm.set_seq1(t)
            if sm.quick_ratio() <= best:
                continue
            best = max(best, sm.ratio())
        out.append(round(best, 4))
    return out


def similarity_report(heldout: list[Any], train: list[Any]) -> dict[str, Any]:
    """Per evaluation source (the prompts' workload): how many prompts, the median and largest similarity
    to the nearest training prompt, and how many have a near twin (>= TWIN) in training."""
    train_t = [prompt_text(p) for p in train]
    by: dict[str, list[float]] = {}
    for p, s in zip(heldout, nearest([prompt_text(p) for p in heldout], train_t), strict=True):
        by.setdefault(p.workload, []).append(s)
    return {
        w: {
            "prompts": len(v),
            "median": round(statistics.median(v), 4),
            "max": max(v),
            "twins": sum(x >= TWIN for x in v),
            "nearest": v,
        }
        for w, v in by.items()
    }
