"""Synthetic trace sets of different shapes for evaluating the adaptive policies (made up, labelled so).

Acceptance comes in runs, as in real traces: a model-free lookup either copies a span (every position of
the span accepts the rest of it) or misses/mostly fails; a model drafter accepts geometrically, with its
own occasional easy spans. With `offers`, the lookup records what it could offer per position
(num_proposed: the span's rest inside a copy, sometimes a false match outside), as replays do."""

from __future__ import annotations

import numpy as np

from speclab.traces import MethodTrace, RequestTrace

K_MAX = 20
# name: (category, n-gram span start prob, mean span, n-gram short p, eagle span p, eagle mean, eagle p,
#        eagle drift along the output, false-match rate, mean output length)
SHAPES: dict[str, tuple] = {
    "synth-code-copy": ("code-editing", 0.10, 18, 0.15, 0.03, 4, 0.60, 0.0, 0.25, 120),
    "synth-chat": ("chat", 0.004, 6, 0.08, 0.02, 3, 0.50, 0.0, 0.15, 150),
    "synth-reasoning": ("reasoning", 0.01, 8, 0.12, 0.02, 4, 0.45, 0.35, 0.2, 300),
    "synth-summary": ("summarization", 0.03, 10, 0.10, 0.02, 3, 0.55, 0.0, 0.3, 90),
}


def _runs(rng: np.random.Generator, n: int, p_long: float, mean: float, short_p, kmax: int) -> np.ndarray:
    out = np.ones(n, dtype=np.int64)
    i = 0
    while i < n:
        if rng.random() < p_long:
            span = max(1, int(rng.exponential(mean)))
            for j in range(min(span, n - i)):
                out[i + j] = min(kmax + 1, span - j + 1)
            i += span
        else:
            p = short_p if np.isscalar(short_p) else short_p[i]
            out[i] = min(kmax + 1, 1 + int(rng.geometric(1 - p)) - 1)
            i += 1
    return out


def make_set(name: str, n: int = 150, seed: int = 0, offers: bool = True) -> list[RequestTrace]:
    cat, ng_p, ng_mean, ng_short, eg_p, eg_mean, eg_short, drift, false_m, mean_len = SHAPES[name]
    rng = np.random.default_rng([seed, sorted(SHAPES).index(name)])
    out = []
    for i in range(n):
        L = max(2, int(rng.lognormal(0, 0.6) * mean_len))
        ng = _runs(rng, L, ng_p, ng_mean, ng_short, K_MAX)
        ramp = np.clip(eg_short + drift * (np.arange(L) / L - 0.5), 0.05, 0.95)
        eg = _runs(rng, L, eg_p, eg_mean, ramp, K_MAX)
        nprop = None
        if offers:  # a match offers up to K_MAX drafts; a miss offers none
            matched = (ng > 1) | (rng.random(L) < false_m)
            nprop = np.where(matched, np.maximum(ng - 1, rng.integers(1, K_MAX + 1, L)), 0)
        out.append(
            RequestTrace(
                id=f"{name}-{i}", workload=name, category=cat, prompt_len=int(rng.integers(50, 800)),
                output_len=L,
                methods={"ngram": MethodTrace(k_max=K_MAX, acc_len=ng, num_proposed=nprop),
                         "eagle": MethodTrace(k_max=K_MAX, acc_len=eg)},
                meta={"synthetic": True},
            )
        )  # fmt: skip
    return out
