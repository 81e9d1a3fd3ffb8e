"""Two small online policies the simulator's tests check by hand: `adaptive-k:METHOD[:KMAX[:KSTART]]` (k from
an EMA of the request's own accepted drafts) and `select-ema:M1,M2[,...]:K` (per request the method with the
best EMA proposes K). They are not shipped (the adaptive rule beats both on every evaluated set,
docs/results/2026-12-03-adaptive-policies.md); their arithmetic is simple enough to follow step by step, so
the tests use them to pin the engines' online path (observe, method switches, probes of recorded offers).
tests/conftest.py registers them for every test."""

from __future__ import annotations

import numpy as np

from speclab.errors import ConfigError
from speclab.policy.core import (
    Policy,
    PolicyContext,
    StepOutcome,
    StepView,
    _int,
    _method,
    _need,
    register_policy,
)


class AdaptiveK(Policy):
    """Online adaptive proposal length: k = clip(round(ema) + 1, 1, kmax), where ema is an exponential moving
    average (weight alpha on the newest step) of the request's accepted drafts; starts at k = kstart.
    A step that accepts everything pushes k up by about one; rejections pull it down."""

    def begin(self, ctx: PolicyContext) -> None:
        super().begin(ctx)
        self.ema = np.full(ctx.num_requests, float(self.extra["kstart"] - 1))

    def decide(self, view: StepView) -> tuple[np.ndarray, np.ndarray]:
        k = np.clip(np.floor(self.ema[view.req] + 0.5).astype(np.int64) + 1, 1, self.extra["kmax"])
        npr = view.num_proposed(self.methods[0])
        if npr is not None:
            k = np.minimum(k, npr)
        return np.zeros(len(view), np.int64), k

    def observe(self, outcome: StepOutcome) -> None:
        a = self.extra["alpha"]
        self.ema[outcome.req] = a * outcome.accepted + (1 - a) * self.ema[outcome.req]


class SelectEMA(Policy):
    """Online method selector: per request, the method with the highest exponential moving average of accepted
    drafts proposes K (capped by recorded offers). Only the chosen method's outcome is observed (what an engine
    sees); every EMA starts optimistic at K so each method gets tried. Ties go to the first listed method."""

    def begin(self, ctx: PolicyContext) -> None:
        super().begin(ctx)
        self.ema = np.full((len(self.methods), ctx.num_requests), float(self.extra["k"]))

    def decide(self, view: StepView) -> tuple[np.ndarray, np.ndarray]:
        meth = self.ema[:, view.req].argmax(axis=0).astype(np.int64)
        k = np.full(len(view), self.extra["k"], np.int64)
        for j, m in enumerate(self.methods):
            npr = view.num_proposed(m)
            if npr is not None:
                sel = meth == j
                k[sel] = np.minimum(k[sel], npr[sel])
        return meth, k

    def observe(self, outcome: StepOutcome) -> None:
        a = self.extra["alpha"]
        sel = outcome.method >= 0
        m, r = outcome.method[sel], outcome.req[sel]
        self.ema[m, r] = a * outcome.accepted[sel] + (1 - a) * self.ema[m, r]


def _adaptive(spec: str, args: list[str], opts: dict) -> Policy:
    _need(args, 1, 3, spec, "adaptive-k:METHOD[:KMAX[:KSTART]]")
    m = _method(args[0], spec)
    kmax = _int(args[1], "KMAX", spec, 1) if len(args) > 1 else 8
    kstart = _int(args[2], "KSTART", spec, 1) if len(args) > 2 else min(3, kmax)
    if kstart > kmax:
        raise ConfigError(f"policy {spec!r}: KSTART {kstart} exceeds KMAX {kmax}")
    canon = (
        f"adaptive-k:{m}" + (f":{kmax}" if len(args) > 1 else "") + (f":{kstart}" if len(args) > 2 else "")
    )
    return AdaptiveK(
        spec=canon, methods=(m,), extra={"kmax": kmax, "kstart": kstart, "alpha": 0.5, "max_k": kmax}
    )


def _select(spec: str, args: list[str], opts: dict) -> Policy:
    _need(args, 2, 2, spec, "select-ema:M1,M2[,...]:K")
    ms = tuple(_method(x.strip(), spec) for x in args[0].split(","))
    if len(ms) < 2 or len(set(ms)) != len(ms):
        raise ConfigError(f"policy {spec!r}: needs two or more distinct methods")
    k = _int(args[1], "K", spec, 1)
    return SelectEMA(
        spec=f"select-ema:{','.join(ms)}:{k}", methods=ms, extra={"k": k, "alpha": 0.5, "max_k": k}
    )


def register() -> None:
    register_policy(
        "adaptive-k",
        "adaptive-k:METHOD[:KMAX[:KSTART]]",
        "test only: k from an EMA of the request's own accepted drafts (default KMAX 8, KSTART 3)",
        _adaptive,
    )
    register_policy(
        "select-ema",
        "select-ema:M1,M2[,...]:K",
        "test only: per request the method with the best EMA of its own observed acceptance proposes K",
        _select,
    )
