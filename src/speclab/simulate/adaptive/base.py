"""What the adaptive policies share: method resolution (bare names use every method the traces hold), the
live-batch flags, per-request acceptance estimates from observable signals, and argument parsing."""

from __future__ import annotations

import numpy as np

from speclab.costmodel import get_cost_model
from speclab.costmodel.model import CostModel
from speclab.errors import ConfigError
from speclab.methods.catalog import MODEL_FREE
from speclab.simulate.adaptive.goodput import geometric, run_length
from speclab.simulate.policies import Policy, PolicyContext, StepView, _int, _method
from speclab.traces.model import RequestTrace

DEFAULT_COST_MODEL = "llama3.1-8b-h100-chained"
HINDSIGHT = 16  # positions a model-free probe looks back over for a copy in progress
RATE_WINDOW = 64  # ... and for its rate of matches
KMAX_DEFAULT = 20
COPY_PRIOR = 3.0  # pseudo-successes of a copy in progress (free_survival)
# model-based drafter: prior per-draft acceptance and its weight in pseudo-trials; per-observation decay
MB_PRIOR, MB_WEIGHT, MB_DECAY = 0.5, 2.0, 0.95


class AdaptiveBase(Policy):
    """An online policy that reads the live batch and probes the model-free methods it uses."""

    @classmethod
    def create(cls, spec: str, methods: tuple[str, ...], extra: dict) -> AdaptiveBase:
        return cls(
            spec=spec,
            methods=methods,
            extra=extra,
            uses_batch_size=True,
            uses_occupancy=True,
            heuristic_ok=False,
        )  # fmt: skip  (misses are what the probes observe, not a guess)

    def bind(self, methods: tuple[str, ...], cm: CostModel | None, named: bool = True) -> None:
        """Set the methods (bare policy: every method the traces hold that the cost model can charge) and
        probe the model-free ones."""
        if cm is not None:
            missing = [m for m in methods if m not in cm.draft]
            if named and missing:
                raise ConfigError(
                    f"policy {self.spec}: cost model {cm.name!r} has no drafting cost for {missing[0]}"
                )
            methods = tuple(m for m in methods if m in cm.draft)
            probes = tuple(m for m in methods if m in MODEL_FREE and cm.draft[m].form == "verify_fraction")
        else:
            probes = tuple(m for m in methods if m in MODEL_FREE)
        if not methods:
            raise ConfigError(f"policy {self.spec}: no method that both the traces and the cost model have")
        self.methods = methods
        self.probes = probes

    def begin(self, ctx: PolicyContext) -> None:
        super().begin(ctx)
        self.cm = self.cost_model or get_cost_model(DEFAULT_COST_MODEL)
        cap = self.extra.get("kmax", KMAX_DEFAULT)
        self.kmax = [min(cap, ctx.k_max[m]) for m in self.methods]
        n = ctx.num_requests
        # model-based methods: discounted accepted drafts (s) and stops (f) of the request's own steps
        self.s = np.zeros((len(self.methods), n))
        self.f = np.zeros((len(self.methods), n))

    # --- estimates ------------------------------------------------------------------------------------
    def survival(self, view: StepView, j: int) -> np.ndarray:
        """(n, kmax) estimated survival of methods[j]'s drafts at the current position, capped by the
        proposer's recorded offer where known."""
        m, km = self.methods[j], self.kmax[j]
        if m in self.probes:
            s = self.free_survival(view.hindsight(m, RATE_WINDOW), view.past_offers(m, RATE_WINDOW), km)
        else:
            s = self.model_survival(view.req, j, km)
        npr = view.num_proposed(m)
        if npr is not None:
            s = np.where(np.arange(km)[None, :] < npr[:, None], s, 0.0)
        return s

    @staticmethod
    def free_survival(hind: np.ndarray, offers: np.ndarray | None, km: int) -> np.ndarray:
        """A lookup proposer from hindsight: inside a copy (its proposal at the last r positions would have
        matched through to now) the copy continues with probability (r + C) / (r + C + 1) per token (the
        rule of succession with C pseudo-successes: copies are long, and at small batch an extra draft
        costs little); outside, the window's rate of first-draft matches (among positions where the lookup
        offered drafts, when offers are recorded), continuing as often."""
        r = run_length(hind[:, :HINDSIGHT])
        first = match_rate(hind, offers)
        cont = np.minimum((r + COPY_PRIOR) / (r + COPY_PRIOR + 1.0), 0.95)
        inrun = r >= 1
        alpha = np.where(inrun, cont, first)
        return geometric(alpha, km)

    def model_survival(self, req: np.ndarray, j: int, km: int) -> np.ndarray:
        s, f = self.s[j, req], self.f[j, req]
        alpha = (s + MB_WEIGHT * MB_PRIOR) / (s + f + MB_WEIGHT)
        return geometric(alpha, km)

    def learn(self, req: np.ndarray, meth: np.ndarray, k: np.ndarray, accepted: np.ndarray) -> None:
        """Update the model-based estimates with the steps where a model-based method was chosen."""
        for j, m in enumerate(self.methods):
            if m in self.probes:
                continue
            sel = meth == j
            r = req[sel]
            self.s[j, r] = MB_DECAY * self.s[j, r] + accepted[sel]
            self.f[j, r] = MB_DECAY * self.f[j, r] + (accepted[sel] < k[sel])


def match_rate(hind: np.ndarray, offers: np.ndarray | None) -> np.ndarray:
    """Laplace estimate of a lookup's first-draft acceptance over the hindsight window (among positions
    where it offered drafts, when offers are recorded)."""
    hit = (hind >= 1).sum(axis=1)
    tried = (hind >= 0).sum(axis=1) if offers is None else (offers > 0).sum(axis=1)
    return (hit + 0.25) / (tried + 4.0)


def parse_methods_kmax(spec: str, args: list[str], name: str) -> tuple[tuple[str, ...], dict]:
    """`NAME[:M1,M2,...[:KMAX]]` -> (methods, extra); no methods = every method the traces hold."""
    if len(args) > 2:
        raise ConfigError(f"policy {spec!r}: expected {name}[:M1,M2,...[:KMAX]]")
    ms: tuple[str, ...] = ()
    if args and args[0].strip():
        ms = tuple(_method(x.strip(), spec) for x in args[0].split(","))
        if len(set(ms)) != len(ms):
            raise ConfigError(f"policy {spec!r}: a method is listed twice")
    extra: dict = {}
    if len(args) > 1:
        extra["kmax"] = _int(args[1], "KMAX", spec, 1)
    return ms, extra


def bind_methods(policies: list[Policy], traces: list[RequestTrace], cm: CostModel) -> None:
    """Give every adaptive policy its methods: those it names, or (bare) every method all traces hold,
    model-free ones first (ties in goodput go to the cheaper proposer)."""
    held = set.intersection(*(set(t.methods) for t in traces)) if traces else set()
    order = sorted(held, key=lambda m: (m not in MODEL_FREE, m))
    for p in policies:
        if isinstance(p, AdaptiveBase):
            p.bind(p.methods or tuple(order), cm, named=bool(p.methods))
