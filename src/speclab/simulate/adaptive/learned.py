"""`adaptive-learned`: the learned family. The model-free proposer's acceptance comes from a small logistic
model over observable features (hindsight run length, the window's match and offer rates, the current
offer), trained on OTHER workloads' traces; the rest is the rule (base.AdaptiveBase, goodput.batch_choice).

Two models, each logistic in the same features: the first draft's acceptance, P(acc >= 2), and the
per-draft continuation after it (a geometric tail, fitted on each position's accepted run as successes and
its stop as a failure). Features are computed from the trace arrays exactly as a policy sees them at a
step (StepView.hindsight / past_offers / num_proposed), so training and use agree. By default the model is
trained on speclab's synthetic shapes (synth.SHAPES), none of which is a user's traces; the evaluation
trains it on every set but the one it is evaluated on (leave one set out)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from speclab.simulate.adaptive.base import HINDSIGHT, RATE_WINDOW, AdaptiveBase, match_rate
from speclab.simulate.adaptive.goodput import batch_choice, geometric, run_length
from speclab.simulate.fast import prepare
from speclab.simulate.policies import StepOutcome, StepView
from speclab.traces.model import RequestTrace

_DEFAULT: dict[str, np.ndarray] | None = None
_OVERRIDE: dict[str, np.ndarray] | None = None


def features(hind: np.ndarray, offers: np.ndarray | None, now: np.ndarray | None) -> np.ndarray:
    r = run_length(hind)
    valid = np.maximum((hind >= 0).sum(axis=1), 1)
    hit = (hind >= 1).sum(axis=1) / valid
    cols = [np.ones(len(r)), np.log1p(r), (r >= 1).astype(float), hit]
    if offers is None:
        cols += [np.zeros(len(r)), np.zeros(len(r)), np.zeros(len(r))]
    else:
        off_rate = (offers > 0).sum(axis=1) / valid
        cols += [off_rate, (now > 0).astype(float), np.log1p(now) / 3.0]
    return np.stack(cols, axis=1)


def _fit(x: np.ndarray, s: np.ndarray, f: np.ndarray, iters: int = 25, ridge: float = 1e-3) -> np.ndarray:
    """Logistic regression with s successes and f failures per row (Newton's method, small ridge)."""
    w = np.zeros(x.shape[1])
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(x @ w)))
        g = x.T @ (s - (s + f) * p) - ridge * w
        h = (x * ((s + f) * p * (1 - p))[:, None]).T @ x + ridge * np.eye(len(w))
        w = w + np.linalg.solve(h, g)
    return w


def training_rows(traces: list[RequestTrace], method: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features, acc_len, offers-known flag) at every position >= 1 of every request."""
    ta = prepare(traces, {method})
    req = np.repeat(np.arange(ta.n), ta.out_len)
    pos = np.arange(ta.total_positions) - ta.off[req]
    keep = pos >= 1
    req, pos = req[keep], pos[keep]
    fi = ta.off[req] + pos
    view = StepView(req, pos, pos * 0, {method: ta.nprop[method]}, None,
                    past={method: (ta.acc[method], fi, ta.nprop[method])})  # fmt: skip
    npr = ta.nprop[method]
    x = features(view.hindsight(method, HINDSIGHT), view.past_offers(method, HINDSIGHT),
                 None if npr is None else npr[fi])  # fmt: skip
    return x, ta.acc[method][fi], np.full(len(fi), npr is not None)


def train(traces: list[RequestTrace], method: str = "ngram") -> dict[str, np.ndarray]:
    x, acc, _ = training_rows(traces, method)
    first = _fit(x, (acc >= 2).astype(float), (acc < 2).astype(float))
    on = acc >= 2
    kmax = acc.max()
    cont = _fit(x[on], (acc[on] - 2).astype(float), (acc[on] <= kmax - 1).astype(float))
    return {"first": first, "cont": cont}


@contextmanager
def trained_on(traces: list[RequestTrace]) -> Iterator[dict[str, np.ndarray]]:
    """Within the block, `adaptive-learned` uses a model trained on `traces` (the evaluation's leave one
    set out) instead of the default one."""
    global _OVERRIDE
    old, _OVERRIDE = _OVERRIDE, train(traces)
    try:
        yield _OVERRIDE
    finally:
        _OVERRIDE = old


def default_weights() -> dict[str, np.ndarray]:
    global _DEFAULT
    if _OVERRIDE is not None:
        return _OVERRIDE
    if _DEFAULT is None:
        from speclab.simulate.adaptive.synth import SHAPES, make_set

        tr = [t for s in SHAPES for t in make_set(s, n=60, seed=1)]
        tr += [t for s in SHAPES for t in make_set(s, n=60, seed=2, offers=False)]
        _DEFAULT = train(tr)
    return _DEFAULT


class AdaptiveLearned(AdaptiveBase):
    def decide(self, view: StepView) -> tuple[np.ndarray, np.ndarray]:
        w = self.extra.get("weights") or default_weights()
        surv = []
        for j, m in enumerate(self.methods):
            if m in self.probes:
                npr = view.num_proposed(m)
                hind, offers = view.hindsight(m, RATE_WINDOW), view.past_offers(m, RATE_WINDOW)
                x = features(hind[:, :HINDSIGHT], None if offers is None else offers[:, :HINDSIGHT], npr)
                # never above what this request's own lookups showed: the model was fitted elsewhere
                p1 = np.minimum(1.0 / (1.0 + np.exp(-(x @ w["first"]))), np.maximum(match_rate(hind, offers),
                                np.where(run_length(hind[:, :HINDSIGHT]) >= 1, 1.0, 0.0)))  # fmt: skip
                pc = 1.0 / (1.0 + np.exp(-(x @ w["cont"])))
                s = geometric(pc, self.kmax[j], p1)
                if npr is not None:
                    s = np.where(np.arange(self.kmax[j])[None, :] < npr[:, None], s, 0.0)
                surv.append(s)
            else:
                surv.append(self.survival(view, j))
        group = np.zeros(len(view), np.int64) if view.one_batch else np.arange(len(view))
        return batch_choice(
            self.cm, self.methods, surv, self.kmax, view.occupancy, view.batch_kv, self.probes, group,
            offers=self.offer_caps(view),
        )  # fmt: skip

    def observe(self, outcome: StepOutcome) -> None:
        self.learn(outcome.req, outcome.method, outcome.k, outcome.accepted)
