"""`adaptive-survival`: the rule's goodput choice (goodput.batch_choice) with non-parametric, position-aware
acceptance estimates and a one-step lookahead.

- Model-free proposer (a probe): its survival S(j) = P(at least j drafts accepted) is estimated from this
  request's own hindsight (StepView.hindsight: at each of the last WINDOW positions q the lookup's match
  length, censored at the tokens known since q) by Kaplan-Meier, *conditioned on the state the lookup was
  in* at q: whether the lookups at q - 1 and q - 2 had matched through q (no copy in progress / a run of 1 /
  a run of 2 or more, read from the same hindsight) and, where the traces record offers, whether it offered
  drafts at q. The estimate keeps the shape the data has: outside a copy a lookup that mostly misses but
  sometimes starts a long copy gets a heavy tail (the rule's geometric law gives it a thin one); inside a
  copy, the remaining length of the copies seen. Each depth's hazard is shrunk to the prior's.
- Model-based drafter (runs only when chosen): per-depth acceptance of the request's own steps (a draft at
  depth j is at risk if the j - 1 before it were accepted), discounted per step, shrunk to the prior's
  depth profile scaled to the request's overall rate: S(j) = prod_{i <= j} p_i. A drafter whose acceptance
  falls (or rises) with depth is priced so; a geometric one comes out geometric.
- Lookahead (batch_choice(lookahead=True)): a copy the probes see is not lost when the step goes to another
  method: the next position's hindsight shows it and a later step takes the rest. Each choice is credited
  with the copy it leaves in progress, valued as that later step. Without this, the heavy tail above made
  the lookup win myopically at positions where a copy only rarely starts (measured: worse than the rule).

Priors: hazards per state (lookup) or per depth (drafter), fitted the same way on OTHER traces: by default
speclab's synthetic shapes (synth.SHAPES, made up); the evaluation fits them on every set but the one
evaluated (`prior_trained_on`, leave one set out). Nothing at or after the current position is read: the
same tests as the other adaptive policies (tests/test_simulate_adaptive.py), plus
tests/test_adaptive_survival.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from speclab.methods.catalog import MODEL_FREE
from speclab.simulate.adaptive.base import MB_DECAY, MB_PRIOR, AdaptiveBase
from speclab.simulate.adaptive.goodput import batch_choice
from speclab.simulate.fast import prepare
from speclab.simulate.policies import PolicyContext, StepOutcome, StepView
from speclab.traces.model import RequestTrace

WINDOW = 64  # past positions of the request the model-free estimate reads
PRIOR_WEIGHT = 8.0  # model-free: pseudo-positions at risk of the prior's hazard, per state and depth
PRIOR_DEPTH = 64  # depths the prior holds (beyond: its last hazard)
NSTATES = 6  # run state 0/1/2, times offered (3..5) where offers are recorded
MIN_PRIOR_RISK = 20  # an offered state with fewer training positions borrows its run state's data
RATE_WEIGHT = 4.0  # model-based: pseudo-trials of the prior's overall rate in the request's rate
DEPTH_WEIGHT = 4.0  # model-based: pseudo-trials of the (rescaled) prior hazard at each depth

_DEFAULT: dict[str, np.ndarray] | None = None
_OVERRIDE: dict[str, np.ndarray] | None = None


def _full(col: np.ndarray, d: int) -> np.ndarray:
    return col >= d


def states(hind: np.ndarray, offers: np.ndarray | None, width: int) -> tuple[np.ndarray, np.ndarray]:
    """From a hindsight row of width + 2 columns (and past offers): the state at the current position (n,)
    and at each of the last `width` positions (n, width). Run state at q: 0 if the lookup at q - 1 missed
    its first draft, 1 if it matched one but the one at q - 2 did not match two, else 2; + 3 where offers
    are recorded and the lookup offered drafts at q (the current position's offer is added by the caller)."""
    # the lookup at q - d' matched through q iff its censored match length there is >= d'; column c is
    # distance c + 1 from the current position, so for q = pos - (c + 1) the column c + d' holds q - d'
    r1 = _full(hind[:, 1 : width + 1], 1)
    r2 = _full(hind[:, 2 : width + 2], 2)
    past = np.where(r1, np.where(r2, 2, 1), 0)
    if offers is not None:
        past = past + 3 * (offers[:, :width] > 0)
    now = np.where(hind[:, 0] >= 1, np.where(hind[:, 1] >= 2, 2, 1), 0)
    return now, past


def km_counts(x: np.ndarray, depth_ok: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """x: (..., w) censored accepted-draft counts (-1 = no position), depth_ok: (..., w) how deep each is
    observed. Returns (at risk, survived) per depth 1..depth, shape (..., w, depth) booleans."""
    j = np.arange(1, depth + 1)
    seen = j <= depth_ok[..., None]
    return seen & (x[..., None] >= j - 1), seen & (x[..., None] >= j)


def hazards_to_survival(h: np.ndarray) -> np.ndarray:
    return np.cumprod(np.clip(h, 1e-6, 0.999), axis=-1)


def _smooth(risk: np.ndarray, surv: np.ndarray) -> np.ndarray:
    """Hazards (surv + 0.5) / (risk + 1) (never exactly 0 or 1), carried past the last depth with data."""
    h = (surv + 0.5) / (risk + 1.0)
    for row, rk in zip(h.reshape(-1, h.shape[-1]), risk.reshape(-1, risk.shape[-1]), strict=True):
        seen = np.flatnonzero(rk >= 1)
        if not len(seen):
            row[:] = MB_PRIOR
        elif seen[-1] + 1 < len(row):
            row[seen[-1] + 1 :] = row[seen[-1]]
    return h


def train_prior(traces: list[RequestTrace]) -> dict[str, np.ndarray]:
    """Per method any of `traces` holds (over the traces that hold it), hazards fitted by Kaplan-Meier over every position (uncensored but for
    the traces' k_max): a lookup method (model-free) per state, (NSTATES, PRIOR_DEPTH), the state read
    exactly as a policy reads it; a model-based one per depth, (PRIOR_DEPTH,). Traces with and without
    recorded offers are counted apart (the offered states come from the former only) and added up."""
    out: dict[str, np.ndarray] = {}
    for method in sorted(set().union(*(set(t.methods) for t in traces))):
        shape = (NSTATES, PRIOR_DEPTH) if method in MODEL_FREE else (PRIOR_DEPTH,)
        risk, surv = np.zeros(shape), np.zeros(shape)
        held = [t for t in traces if method in t.methods]
        for offered in (True, False):
            part = [t for t in held if (t.methods[method].num_proposed is not None) == offered]
            if part:
                r, v = _prior_counts(part, method)
                risk, surv = risk + r, surv + v
        if method in MODEL_FREE:
            for st in range(3, NSTATES):  # too few offered positions in a run state: add the run state's data
                if risk[st, 0] < MIN_PRIOR_RISK:
                    risk[st], surv[st] = risk[st] + risk[st - 3], surv[st] + surv[st - 3]
        out[method] = _smooth(risk, surv)
    return out


def _prior_counts(traces: list[RequestTrace], method: str) -> tuple[np.ndarray, np.ndarray]:
    ta = prepare(traces, {method})
    kmax = ta.k_max[method]
    depth = min(PRIOR_DEPTH, kmax)
    req = np.repeat(np.arange(ta.n), ta.out_len)
    pos = np.arange(ta.total_positions) - ta.off[req]
    fi = ta.off[req] + pos
    x = ta.acc[method][fi] - 1
    if method not in MODEL_FREE:
        r, v = km_counts(x, np.full(len(x), kmax), depth)
        risk, surv = np.zeros(PRIOR_DEPTH), np.zeros(PRIOR_DEPTH)
        risk[:depth], surv[:depth] = r.sum(axis=0), v.sum(axis=0)
        return risk, surv
    npr = ta.nprop[method]
    view = StepView(req, pos, pos * 0, {method: npr}, None, past={method: (ta.acc[method], fi, npr)})
    now, _ = states(view.hindsight(method, 2), None, 0)
    if npr is not None:
        now = now + 3 * (npr[fi] > 0)
    risk, surv = np.zeros((NSTATES, PRIOR_DEPTH)), np.zeros((NSTATES, PRIOR_DEPTH))
    for st in range(NSTATES):
        sel = now == st
        r, v = km_counts(x[sel], np.full(int(sel.sum()), kmax), depth)
        risk[st, :depth], surv[st, :depth] = r.sum(axis=0), v.sum(axis=0)
    return risk, surv


def prior_for(prior: dict[str, np.ndarray], method: str) -> np.ndarray:
    """The prior of `method`; one fitted on another method of its kind where it has none (a lookup: any
    lookup's; a model drafter: a flat MB_PRIOR per draft)."""
    if method in prior:
        return prior[method]
    if method in MODEL_FREE:
        for m in sorted(prior):
            if m in MODEL_FREE:
                return prior[m]
        return np.full((NSTATES, PRIOR_DEPTH), MB_PRIOR)
    return np.full(PRIOR_DEPTH, MB_PRIOR)


@contextmanager
def prior_trained_on(traces: list[RequestTrace]) -> Iterator[dict[str, np.ndarray]]:
    """Within the block, `adaptive-survival` uses a prior fitted on `traces` (the evaluation's leave one set
    out) instead of the default one."""
    global _OVERRIDE
    old, _OVERRIDE = _OVERRIDE, train_prior(traces)
    try:
        yield _OVERRIDE
    finally:
        _OVERRIDE = old


def default_prior() -> dict[str, np.ndarray]:
    global _DEFAULT
    if _OVERRIDE is not None:
        return _OVERRIDE
    if _DEFAULT is None:
        from speclab.simulate.adaptive.synth import SHAPES, make_set

        tr = [t for s in SHAPES for t in make_set(s, n=60, seed=1)]
        tr += [t for s in SHAPES for t in make_set(s, n=60, seed=2, offers=False)]
        _DEFAULT = train_prior(tr)
    return _DEFAULT


def lookup_survival(
    hind: np.ndarray, offers: np.ndarray | None, now_offer: np.ndarray | None, prior: np.ndarray, km: int
) -> np.ndarray:
    """(n, km) survival of a lookup proposer at the current position from its hindsight (WINDOW + 2
    columns), past offers and current offer (None where not recorded), and the per-state prior hazards."""
    now, past = states(hind, offers, WINDOW)
    if now_offer is not None:
        now = now + 3 * (now_offer > 0)
    x = hind[:, :WINDOW]
    d = np.arange(1, WINDOW + 1)[None, :]
    # a censored match (x == d) is seen to depth d; a complete one (x < d) to its end, capped at km
    depth_ok = np.where(x >= 0, np.minimum(d, km), 0)
    same = past == now[:, None]
    risk, surv = km_counts(x, np.where(same, depth_ok, 0), km)
    risk, surv = risk.sum(axis=1), surv.sum(axis=1)
    h0 = prior[now][:, :km] if km <= PRIOR_DEPTH else np.concatenate(
        [prior[now], np.repeat(prior[now][:, -1:], km - PRIOR_DEPTH, axis=1)], axis=1)  # fmt: skip
    # each depth's hazard shrunk to the prior's with PRIOR_WEIGHT pseudo-positions at risk: deep hazards rest
    # on few positions of one request (a copy or two), and an estimate picked because it came out high
    # would otherwise be picked too often (checked: shrinking the survival curve instead did no better)
    h = (surv + PRIOR_WEIGHT * h0) / (risk + PRIOR_WEIGHT)
    return hazards_to_survival(h)


class AdaptiveSurvival(AdaptiveBase):
    def begin(self, ctx: PolicyContext) -> None:
        super().begin(ctx)
        n = ctx.num_requests
        prior = self.extra.get("prior")
        prior = default_prior() if prior is None else prior
        self.priors = [prior_for(prior, m) for m in self.methods]
        # model-based: the prior's per-depth hazards and its overall rate; discounted trials and successes
        # per depth of the request's own steps
        self.h0 = [
            None if m in self.probes else _pad(h if h.ndim == 1 else np.full(PRIOR_DEPTH, MB_PRIOR), km)
            for m, h, km in zip(self.methods, self.priors, self.kmax, strict=True)
        ]  # a model-free method the cost model cannot charge as a probe runs only when chosen, like a drafter
        self.dn = [np.zeros((n, km)) for km in self.kmax]
        self.ds = [np.zeros((n, km)) for km in self.kmax]

    def decide(self, view: StepView) -> tuple[np.ndarray, np.ndarray]:
        surv = []
        for j, m in enumerate(self.methods):
            km = self.kmax[j]
            npr = view.num_proposed(m)
            if m in self.probes:
                s = lookup_survival(view.hindsight(m, WINDOW + 2), view.past_offers(m, WINDOW + 2), npr,
                                    self.priors[j], km)  # fmt: skip
            else:
                s = self.depth_survival(view.req, j)
            if npr is not None:
                s = np.where(np.arange(km)[None, :] < npr[:, None], s, 0.0)
            surv.append(s)
        group = np.zeros(len(view), np.int64) if view.one_batch else np.arange(len(view))
        return batch_choice(self.cm, self.methods, surv, self.kmax, view.occupancy, view.batch_kv, self.probes,
                            group, lookahead=self.extra.get("lookahead", True),
                            offers=self.offer_caps(view))  # fmt: skip

    def depth_survival(self, req: np.ndarray, j: int) -> np.ndarray:
        """Per-depth acceptance: the prior's depth profile, scaled to this request's overall rate (shrunk to
        the prior's), then each depth's own discounted counts with DEPTH_WEIGHT pseudo-trials of that."""
        h0 = self.h0[j]
        s0 = np.concatenate([[1.0], np.cumprod(h0)[:-1]])  # prior P(reaching depth i)
        rate0 = float((s0 * h0).sum() / s0.sum())  # prior per-draft rate, as the counts below weigh it
        dn, ds = self.dn[j][req], self.ds[j][req]
        rate = (ds.sum(axis=1) + RATE_WEIGHT * rate0) / (dn.sum(axis=1) + RATE_WEIGHT)
        q = np.clip(h0[None, :] * (rate / rate0)[:, None], 0.01, 0.99)
        p = (ds + DEPTH_WEIGHT * q) / (dn + DEPTH_WEIGHT)
        return hazards_to_survival(p)

    def observe(self, outcome: StepOutcome) -> None:
        for j, m in enumerate(self.methods):
            if m in self.probes:
                continue
            sel = outcome.method == j
            r, k, a = outcome.req[sel], outcome.k[sel], outcome.accepted[sel]
            depth = np.arange(1, self.kmax[j] + 1)[None, :]
            tried = (depth <= k[:, None]) & (depth <= a[:, None] + 1)
            self.dn[j][r] = MB_DECAY * self.dn[j][r] + tried
            self.ds[j][r] = MB_DECAY * self.ds[j][r] + (depth <= a[:, None])


def _pad(h: np.ndarray, km: int) -> np.ndarray:
    return h[:km] if km <= len(h) else np.concatenate([h, np.full(km - len(h), h[-1])])
