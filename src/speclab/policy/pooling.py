"""Statistics of a lookup proposer pooled from hindsight: its first-draft match rate over a request's
window, and the counts pooled over every request an engine served (adaptive-pooled's priors, adaptive-gated's
record). Hindsight at a past position q is the lookup's draft at q checked against the output known now,
`min(acc_len[q] - 1, pos - q)` (StepView.hindsight)."""

from __future__ import annotations

import numpy as np

HINDSIGHT = 16  # positions a model-free probe looks back over for a copy in progress
RATE_WINDOW = 64  # ... and for its rate of matches
FIRST_WEIGHT = 4.0  # pseudo-tries of the pooled first-draft rate in a request's own rate outside a copy
POOL_LAG = HINDSIGHT  # a past position joins the pooled counts this far back (its match censored at >= 16)


def match_rate(hind: np.ndarray, offers: np.ndarray | None, prior: float = 1.0 / 16.0) -> np.ndarray:
    """A lookup's first-draft acceptance over the hindsight window (among positions where it offered drafts,
    when offers are recorded), shrunk to `prior` with FIRST_WEIGHT pseudo-tries (1/16: Laplace's 0.25 in 4)."""
    hit = (hind >= 1).sum(axis=1)
    tried = (hind >= 0).sum(axis=1) if offers is None else (offers > 0).sum(axis=1)
    return (hit + FIRST_WEIGHT * prior) / (tried + FIRST_WEIGHT)


def pool_counts(
    hind: np.ndarray,
    offers: np.ndarray | None,
    pos: np.ndarray,
    folded: np.ndarray,
    req: np.ndarray,
    lag: int = POOL_LAG,
) -> np.ndarray:
    """Counts of a lookup's past positions not yet pooled (those at least `lag` back and after each
    request's `folded`, which is advanced in place): [first-draft hits, tries] outside a copy (offered
    positions, when offers are recorded) and [tokens continued, tokens at risk] inside one (a copy: the
    lookup at q - 1 matched q). A position's match is censored at the tokens known since it (its distance
    d >= lag: a match still running at d is d tokens continued and no stop) and at its offer (where offers are
    not recorded, at `lag`); hindsight reaches back RATE_WINDOW positions (older ones are not counted). The
    per-token continuation these give is the geometric rate's estimate under that censoring, so a short lag
    is not biased: it only pools each position with fewer of its tokens, sooner."""
    width = hind.shape[1]
    if width <= lag:
        return np.zeros(4)
    d = np.arange(lag, width)  # distance of q from now; column d - 1 holds q, column d holds q - 1
    x = hind[:, d - 1]
    prev = hind[:, d]
    q = pos[:, None] - d[None, :]
    new = (q > folded[req][:, None]) & (x >= 0)
    folded[req] = np.maximum(folded[req], pos - lag)
    inrun = new & (prev >= 1)
    out = new & (prev < 1)
    if offers is not None:
        off = offers[:, d - 1]
        out &= off > 0
        cap = np.where(off > 0, off, lag)
    else:
        cap = np.full(x.shape, lag)
    got = np.minimum(x, cap)
    stopped = (x < cap) & (x < d[None, :])  # not censored by time: the copy ended after `got` tokens
    return np.array(
        [
            float((out & (x >= 1)).sum()),
            float(out.sum()),
            float(got[inrun].sum()),
            float((got + stopped)[inrun].sum()),
        ]
    )
