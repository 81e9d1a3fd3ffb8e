"""Prompt/output overlap: how much of the output could be copied from the prompt (what n-gram SD exploits).

The study reports it as BLEU-4 of the output against the prompt; n-gram lookup wins once it exceeds ~0.6.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

_WORD_RE = re.compile(r"\w+|[^\w\s]")


def _units(x: str | Sequence[int]) -> list:
    """Text -> words and punctuation marks; token ids -> themselves."""
    if isinstance(x, str):
        return _WORD_RE.findall(x)
    return [int(t) for t in x]


def _ngrams(seq: list, n: int) -> Counter:
    return Counter(tuple(seq[i : i + n]) for i in range(len(seq) - n + 1))


def ngram_precisions(prompt: str | Sequence[int], output: str | Sequence[int], n: int = 4) -> list[float]:
    """Clipped (BLEU "modified") precision of the output's 1..n-grams against the prompt.

    p_k = sum over output k-grams of min(count in output, count in prompt) / number of output k-grams.
    An order the output is too short to have counts as 0.0.
    """
    if isinstance(prompt, str) != isinstance(output, str):
        raise TypeError("ngram_overlap: give both prompt and output as text, or both as token ids")
    if n < 1:
        raise ValueError("ngram_overlap: n must be >= 1")
    p_units, o_units = _units(prompt), _units(output)
    out = []
    for k in range(1, n + 1):
        o_grams = _ngrams(o_units, k)
        total = sum(o_grams.values())
        if total == 0:
            out.append(0.0)
            continue
        p_grams = _ngrams(p_units, k)
        hit = sum(min(c, p_grams.get(g, 0)) for g, c in o_grams.items())
        out.append(hit / total)
    return out


def ngram_overlap(
    prompt: str | Sequence[int],
    output: str | Sequence[int],
    n: int = 4,
    brevity_penalty: bool = False,
) -> float:
    """BLEU-n style overlap of the output (hypothesis) against the prompt (reference), in [0, 1].

    Geometric mean of the clipped 1..n-gram precisions (0.0 if any is 0). Text is split into words and
    punctuation; token id lists are used as they are (pass ids of the same tokenizer for both).
    brevity_penalty=False by default: an output shorter than its prompt (a summary) is not "less copied".
    With True it is BLEU's exp(1 - len(prompt)/len(output)) when the output is shorter.
    """
    precisions = ngram_precisions(prompt, output, n)
    if not precisions or min(precisions) <= 0.0:
        return 0.0
    score = math.exp(sum(math.log(p) for p in precisions) / len(precisions))
    if brevity_penalty:
        lp, lo = len(_units(prompt)), len(_units(output))
        if 0 < lo < lp:
            score *= math.exp(1.0 - lp / lo)
    return score


def mean_overlap(pairs: Sequence[tuple[str | Sequence[int], str | Sequence[int]]], n: int = 4) -> float:
    """Mean ngram_overlap over (prompt, output) pairs; 0.0 for no pairs."""
    if not pairs:
        return 0.0
    return sum(ngram_overlap(p, o, n) for p, o in pairs) / len(pairs)
