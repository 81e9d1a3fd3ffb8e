"""What the adaptive policies share: method binding, the live-batch flags, per-request acceptance estimates
from observable signals, gating and calibration (adaptive-gated). Registration and argument parsing:
speclab.policy.rules; the pooled lookup statistics: speclab.policy.pooling."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from speclab.catalog import MODEL_FREE
from speclab.costmodel import get_cost_model
from speclab.costmodel.model import CostModel
from speclab.errors import ConfigError
from speclab.policy.core import Policy, PolicyContext, StepOutcome, StepView
from speclab.policy.goodput import geometric, run_length
from speclab.policy.pooling import HINDSIGHT, POOL_LAG, RATE_WINDOW, match_rate, pool_counts

DEFAULT_COST_MODEL = "llama3.1-8b-h100-chained"
KMAX_DEFAULT = 20
COPY_PRIOR = 3.0  # pseudo-successes of a copy in progress (free_survival), before any pooled evidence
# model-based drafter: prior per-draft acceptance and its weight in pseudo-trials; per-observation decay
MB_PRIOR, MB_WEIGHT, MB_DECAY = 0.5, 2.0, 0.95
# gated policies (adaptive-gated): a request whose lookups are not in use is probed only every REPROBE
# positions, where the probes cost at least GATE_MIN_COST of the verify time per step under the cost model
# (below it the copy starts found late cost more than the probes saved: docs/adaptive.md, "Gated probes");
# GATE_RING positions of probe flags are remembered per request (more than any depth read)
REPROBE = 4
GATE_MIN_COST = 0.01
# a copy start (gate_done): a draft matching >= COPY_START tokens; its rate's prior, and weight in positions
COPY_START = 3
START_PRIOR, START_WEIGHT = 1.0 / 64.0, 4.0
# calibration (adaptive-gated): prior weight in drafts, bounds of the factor, discount per lookup step
CAL_WEIGHT, CAL_MIN, CAL_MAX, CAL_DECAY = 8.0, 0.25, 1.5, 0.995
GATE_RING = 128
_NEVER = -(1 << 40)
# per-request state of gating and calibration: attribute -> (value of a new request, dtype, width or 0)
_SLOT_STATE = {
    "ring_q": (
        _NEVER,
        np.int64,
        GATE_RING,
    ),  # a ring of (position, probed?) over the last GATE_RING positions
    "ring_f": (True, bool, GATE_RING),
    "prev_pos": (-1, np.int64, 0),  # position and probe flag of the previous decision
    "prev_probed": (True, bool, 0),
    "last_probe": (_NEVER, np.int64, 0),  # last probed position
    "dormant": (False, bool, 0),
    "pending": (np.nan, float, 0),  # the pending step's predicted accepted drafts (nan: none recorded)
}


def _slot_array(n: int, fill: object, dtype: type, width: int) -> np.ndarray:
    return np.full((n, width) if width else n, fill, dtype)


class AdaptiveBase(Policy):
    """An online policy that reads the live batch and probes the model-free methods it uses."""

    POOLS: ClassVar[bool] = False  # Policy.pools_requests of the family (adaptive-pooled, -gated: True)
    POOL_PRIORS: ClassVar[bool] = False  # lookup priors pooled over requests (pool_counts; adaptive-pooled)
    POOL_LAG: ClassVar[int] = POOL_LAG  # ... a past position joins the pool this many positions back
    CALIBRATES: ClassVar[bool] = False  # lookup estimates scaled by their pooled record (adaptive-gated)
    GATED: ClassVar[bool] = False  # probes only the requests that may use them (adaptive-gated: True)

    @classmethod
    def create(cls, spec: str, methods: tuple[str, ...], extra: dict) -> AdaptiveBase:
        return cls(
            spec=spec,
            methods=methods,
            extra=extra,
            uses_batch_size=True,
            uses_occupancy=True,
            heuristic_ok=False,
            pools_requests=cls.POOLS,
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
        # model-free: counts pooled over every request served so far (pool_counts); per request the last
        # position folded into them
        self.pool = {m: np.zeros(4) for m in self.probes}
        self.folded = {m: np.full(n, -1, np.int64) for m in self.probes}
        # gating (GATED) and calibration (CALIBRATES), per request (_SLOT_STATE)
        for name, (fill, dtype, width) in _SLOT_STATE.items():
            setattr(self, name, _slot_array(n, fill, dtype, width))
        self._view: StepView | None = None  # the view gate() last masked, and its rows' state
        self._incopy = np.zeros(0, bool)
        self._masked: dict[tuple[str, str, int], np.ndarray | None] = {}  # this view's masked reads
        # calibration: per method, discounted [drafts predicted accepted, drafts accepted] of the lookup
        # drafts of every request served
        self.cal = np.zeros((len(self.methods), 2))

    def reset_request(self, slot: int) -> None:
        """A request slot reused for a new request (the live proposer recycles them)."""
        self.s[:, slot] = 0.0
        self.f[:, slot] = 0.0
        for f in self.folded.values():
            f[slot] = -1
        for name, (fill, _, _) in _SLOT_STATE.items():
            getattr(self, name)[slot] = fill

    def grow(self, n: int) -> None:
        """Room for n request slots (the live proposer's grow as requests arrive)."""
        extra = n - self.s.shape[1]
        if extra > 0:
            self.s = np.pad(self.s, ((0, 0), (0, extra)))
            self.f = np.pad(self.f, ((0, 0), (0, extra)))
            for m, f in self.folded.items():
                self.folded[m] = np.concatenate([f, np.full(extra, -1, np.int64)])
            for name, (fill, dtype, width) in _SLOT_STATE.items():
                setattr(
                    self, name, np.concatenate([getattr(self, name), _slot_array(extra, fill, dtype, width)])
                )

    # --- gating (GATED families) ------------------------------------------------------------------------
    def gate(self, view: StepView) -> np.ndarray | None:
        """Which rows of `view` run their probes at this step (None: all; not gated). Decided before any
        probe runs, from what earlier probes saw: a request is probed unless it is dormant (gate_done, at
        its previous step), and then still every REPROBE positions, and at once where the lookup at the
        position before (probed) matched its next token. Sets view.probed; the live driver calls it before
        running the probes, decide() again (same view: no second update)."""
        if not self.gating:
            return None
        if self.gated(view):
            return view.probed
        req, pos = view.req, view.pos
        # the previous decision's flag over the positions it covered (pos_prev .. pos - 1)
        pp, pf = self.prev_pos[req], self.prev_probed[req]
        seen = pp >= 0
        if seen.any():
            for d in range(1, min(int((pos - pp)[seen].max()), GATE_RING) + 1):
                q = pos - d
                sel = seen & (q >= pp)
                if not sel.any():
                    break
                col = q[sel] % GATE_RING
                self.ring_q[req[sel], col] = q[sel]
                self.ring_f[req[sel], col] = pf[sel]
        self._view = view
        self._masked = {}
        view.probed = np.ones(len(req), bool)  # while reading hindsight below (nothing at pos is read)
        incopy = np.zeros(len(req), bool)
        for m in self.probes:
            incopy |= self.hindsight(view, m, 1)[:, 0] >= 1
        probe = ~self.dormant[req] | (pos - self.last_probe[req] >= REPROBE) | incopy
        self.last_probe[req[probe]] = pos[probe]
        self.prev_pos[req] = pos
        self.prev_probed[req] = probe
        self._incopy = incopy
        view.probed = probe
        return probe

    def gated(self, view: StepView) -> bool:
        """Whether gate() has decided this view's probes (its rows' masks apply)."""
        return self._view is view

    @property
    def gating(self) -> bool:
        """Whether gate() ever skips a probe: a GATED family, with probes that cost >= GATE_MIN_COST."""
        return self.GATED and bool(self.probes) and self.probe_cost() >= GATE_MIN_COST

    def probe_cost(self) -> float:
        """The probes' charge per step as a share of the verify time (cost model: verify_fraction forms)."""
        return float(sum(self.cm.draft_for(m).fraction for m in self.probes))

    def gate_done(
        self,
        view: StepView,
        meth: np.ndarray,
        k: np.ndarray,
        surv: list[np.ndarray] | None = None,
        copies_pay: np.ndarray | None = None,
    ) -> None:
        """After the decision, which requests go dormant. `meth`, `k`: the decision this step would have made
        if every lookup offered all it may (with this step's estimates `surv` and live batch). A request stays
        awake where a lookup shows a copy in progress, or where that decision drafts from a lookup and the
        tokens it expects from it, times how often the lookup offers at all (its probed positions in the
        window), are worth the probes' cost (a share of a step, in tokens of a plain decode): where lookup
        drafts pay at the rate seen outside copies it keeps probing; where they would not be used, or
        the lookup hardly ever offers, it goes dormant. Where copies start often (copy_starts) and a copy
        would be drafted from at this batch (`copies_pay`: the decision with every lookup in a copy), it
        stays awake too: found late, a copy costs more than the probes saved."""
        if not self.gated(view):
            return
        cost = self.probe_cost()
        # where copies start often, a late find costs more than the probes saved: dormant, a copy start
        # is found on average REPROBE / 2 positions late, each decoded one token per step instead of
        # within a copy (~3/4 of a step lost per position), against the probes' cost at every position
        often = self.copy_starts(view) * 0.75 * REPROBE / 2 >= cost * (1 - 1 / REPROBE)
        awake = self._incopy | (often & (True if copies_pay is None else copies_pay))
        n = len(view)
        for j, m in enumerate(self.methods):
            sel = (meth == j) & (k > 0)
            if m not in self.probes or not sel.any():
                continue
            gain = np.ones(n)  # without estimates: a draft worth a token
            if surv is not None:  # the tokens it expects beyond the one a plain step gives
                cum = np.concatenate([np.zeros((n, 1)), np.cumsum(surv[j], axis=1)], axis=1)
                gain = cum[np.arange(n), np.minimum(k, surv[j].shape[1])]
            off = self.past_offers(view, m, RATE_WINDOW)
            if off is not None:  # how often it offers (among probed positions; one offer in two a priori)
                gain = gain * ((off > 0).sum(axis=1) + 1.0) / ((off >= 0).sum(axis=1) + 2.0)
            awake |= sel & (gain >= cost)
        self.dormant[view.req] = ~awake

    def copy_survival(self, n: int, j: int) -> np.ndarray:
        """methods[j]'s survival as if a copy had just been seen in progress (a run of 1, the rule's
        continuation with its prior; for gate_done's `copies_pay`)."""
        w = COPY_PRIOR + 1.0
        c0 = COPY_PRIOR / w
        return geometric(np.full(n, min((1 + w * c0) / (1 + w), max(0.95, c0))), self.kmax[j])

    def copy_starts(self, view: StepView) -> np.ndarray:
        """Per request, the rate of copy starts among its probed positions in the window, any lookup: a
        position whose draft matched >= COPY_START tokens where the position before did not match its next
        token; shrunk to START_PRIOR with START_WEIGHT pseudo-positions."""
        starts = np.zeros(len(view))
        seen = np.zeros(len(view))
        for m in self.probes:
            h = self.hindsight(view, m, RATE_WINDOW)
            prev = np.concatenate([h[:, 1:], np.full((len(view), 1), -1)], axis=1)  # at q - 1
            known = (h >= 0) & (np.arange(1, h.shape[1] + 1)[None, :] >= COPY_START)
            starts = np.maximum(starts, (known & (h >= COPY_START) & (prev < 1)).sum(axis=1))
            seen = np.maximum(seen, known.sum(axis=1))
        return (starts + START_WEIGHT * START_PRIOR) / (seen + START_WEIGHT)

    def _unprobed(self, view: StepView, depth: int) -> np.ndarray:
        """(n, depth) True where position pos - d was not probed (a gated view)."""
        q = view.pos[:, None] - np.arange(1, depth + 1)[None, :]
        col = q % GATE_RING
        r = view.req[:, None]
        return (self.ring_q[r, col] == q) & ~self.ring_f[r, col]

    def hindsight(self, view: StepView, m: str, depth: int) -> np.ndarray:
        """view.hindsight, -1 (unknown) at positions this policy did not probe."""
        return self._mask(view, "hind", m, depth)  # type: ignore[return-value]

    def past_offers(self, view: StepView, m: str, depth: int) -> np.ndarray | None:
        """view.past_offers, -1 at positions this policy did not probe."""
        return self._mask(view, "offers", m, depth)

    def _mask(self, view: StepView, what: str, m: str, depth: int) -> np.ndarray | None:
        if not self.gated(view):
            return view.hindsight(m, depth) if what == "hind" else view.past_offers(m, depth)
        key = (what, m, depth)  # a gated step reads the same window up to five times: once
        if key not in self._masked:
            x = view.hindsight(m, depth) if what == "hind" else view.past_offers(m, depth)
            self._masked[key] = None if x is None else np.where(self._unprobed(view, depth), -1, x)
        return self._masked[key]

    # --- estimates ------------------------------------------------------------------------------------
    def survival(self, view: StepView, j: int, offered: bool = True) -> np.ndarray:
        """(n, kmax) estimated survival of methods[j]'s drafts at the current position, capped by the
        proposer's recorded offer where known (offered=False: as if a lookup offered all it may, for
        gate_done's question)."""
        m, km = self.methods[j], self.kmax[j]
        if m in self.probes:
            hind, offers = self.hindsight(view, m, RATE_WINDOW), self.past_offers(view, m, RATE_WINDOW)
            # pool only one engine's requests in time order (Policy.pools_requests)
            if self.POOL_PRIORS and self.pools_requests and view.one_batch:
                self.pool[m] += pool_counts(hind, offers, view.pos, self.folded[m], view.req, self.POOL_LAG)
            s = self.free_survival(hind, offers, km, self.pool[m])
        else:
            s = self.model_survival(view.req, j, km)
        if not offered:
            return s
        npr = view.num_proposed(m)
        if npr is not None:
            s = np.where(np.arange(km)[None, :] < npr[:, None], s, 0.0)
        if m in self.probes and self.gated(view):
            s = np.where(view.probed[:, None], s, 0.0)  # a lookup not run offers nothing
        return s

    @staticmethod
    def free_survival(
        hind: np.ndarray, offers: np.ndarray | None, km: int, pool: np.ndarray | None = None
    ) -> np.ndarray:
        """A lookup proposer from hindsight: inside a copy (its proposal at the last r positions would have
        matched through to now) the copy continues with probability (r + W c) / (r + W) per token (the rule
        of succession with W = COPY_PRIOR + 1 pseudo-tokens continuing at rate c); outside, the window's
        rate of first-draft matches (among positions where the lookup offered drafts, when offers are
        recorded), continuing as often, shrunk to a rate f with FIRST_WEIGHT pseudo-tries.

        c and f are the deployment's own: `pool` (pool_counts: every past position of every request served so
        far, once it lies POOL_LAG back) gives c = the copies' per-token continuation and f = the first-draft
        rate outside copies, each with the hand-set prior as pseudo-counts (c = 3/4, f = 1/16 with no
        evidence: the rule as first written, and what `adaptive` always uses). Where copies run on for tens
        of tokens the pooled c rises and drafts grow from a copy's start (adaptive-pooled;
        docs/adaptive.md: that pays at B = 1, not at larger batches)."""
        h, t, cs, ck = (0.0, 0.0, 0.0, 0.0) if pool is None else (float(x) for x in pool)
        f0 = (h + 0.25) / (t + 4.0)
        c0 = (cs + COPY_PRIOR) / (ck + COPY_PRIOR + 1.0)
        r = run_length(hind[:, :HINDSIGHT])
        first = match_rate(hind, offers, f0)
        w = COPY_PRIOR + 1.0
        cont = np.minimum((r + w * c0) / (r + w), max(0.95, c0))
        inrun = r >= 1
        alpha = np.where(inrun, cont, first)
        return geometric(alpha, km)

    def offer_caps(self, view: StepView) -> list[np.ndarray | None]:
        """Per method, the most drafts each row's proposer can give now (goodput.batch_choice's `offers`):
        a lookup's recorded offer (0 where a gated policy did not run it); None where not recorded or for a
        model-based drafter (it drafts as many as asked)."""
        gated = self.gated(view)
        caps: list[np.ndarray | None] = []
        for m in self.methods:
            npr = view.num_proposed(m) if m in self.probes else None
            if m in self.probes and gated:
                npr = np.where(view.probed, np.iinfo(np.int64).max if npr is None else npr, 0)
            caps.append(npr)
        return caps

    def model_survival(self, req: np.ndarray, j: int, km: int) -> np.ndarray:
        s, f = self.s[j, req], self.f[j, req]
        alpha = (s + MB_WEIGHT * MB_PRIOR) / (s + f + MB_WEIGHT)
        return geometric(alpha, km)

    # --- calibration (CALIBRATES) --------------------------------------------------------------------------
    def calibration(self, j: int) -> float:
        """The factor on methods[j]'s estimated survival: drafts accepted over drafts predicted, pooled over
        the lookup drafts of every request served (discounted), shrunk to 1 with CAL_WEIGHT drafts, in
        [CAL_MIN, CAL_MAX]. A rule whose lookup estimates run high on this deployment (copies that end
        sooner than its continuation prior says) drafts less."""
        if not self.CALIBRATES:
            return 1.0
        pred, got = self.cal[j]
        return float(np.clip((got + CAL_WEIGHT) / (pred + CAL_WEIGHT), CAL_MIN, CAL_MAX))

    def calibrated(self, surv: list[np.ndarray]) -> list[np.ndarray]:
        if not self.CALIBRATES:
            return surv
        return [
            np.minimum(s * self.calibration(j), 0.999) if m in self.probes else s
            for j, (m, s) in enumerate(zip(self.methods, surv, strict=True))
        ]

    def predict(self, view: StepView, surv: list[np.ndarray], meth: np.ndarray, k: np.ndarray) -> None:
        """Record each row's predicted accepted drafts (uncalibrated estimates) for calibrate_with."""
        if not (self.CALIBRATES and view.one_batch):
            return
        pred = np.zeros(len(view))
        for j, m in enumerate(self.methods):
            sel = (meth == j) & (k > 0)
            if m in self.probes and sel.any():
                cum = np.cumsum(surv[j], axis=1)
                pred[sel] = cum[np.flatnonzero(sel), np.minimum(k[sel], surv[j].shape[1]) - 1]
        self.pending[view.req] = pred

    def calibrate_with(self, outcome: StepOutcome) -> None:
        if not self.CALIBRATES:
            return
        known = ~np.isnan(self.pending[outcome.req])
        for j, m in enumerate(self.methods):
            sel = (outcome.method == j) & (outcome.k > 0) & known
            if m not in self.probes or not sel.any():
                continue
            n = int(sel.sum())
            self.cal[j] *= CAL_DECAY**n
            self.cal[j] += (self.pending[outcome.req[sel]].sum(), float(outcome.accepted[sel].sum()))
        self.pending[outcome.req] = np.nan

    def learn(self, req: np.ndarray, meth: np.ndarray, k: np.ndarray, accepted: np.ndarray) -> None:
        """Update the model-based estimates with the steps where a model-based method was chosen."""
        for j, m in enumerate(self.methods):
            if m in self.probes:
                continue
            sel = meth == j
            r = req[sel]
            self.s[j, r] = MB_DECAY * self.s[j, r] + accepted[sel]
            self.f[j, r] = MB_DECAY * self.f[j, r] + (accepted[sel] < k[sel])
