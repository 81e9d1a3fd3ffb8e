"""Speculation policies: what each running request proposes at each step.

A policy decides, for every running request at a step, which method proposes (an index into
`policy.methods`, -1 = no speculation) and how many draft tokens it proposes (k >= 0; the step then verifies
k + 1 tokens). The simulator then applies the trace: produced = min(acc_len[pos], k + 1).

Two kinds:
- oracle policies (`oracle:M`, `oracle-combine:M1,M2`) may read the trace at the current position through
  `StepView.oracle_acc` -- that is what makes them oracles (upper bounds);
- online policies see only what an engine could observe: the current position, the proposer's offer size
  where the trace recorded it (`num_proposed`, known before verification), static configuration (batch
  size, k_max), and after each step its outcome (`observe`). `StepView.oracle_acc` raises for them, and
  tests perturb future trace positions to show their decisions do not change.

Contract for online policies: keep state per request (arrays indexed by request index); `decide` and
`observe` are called with arrays of request indices in an unspecified interleaving across requests (the
fast engine and the reference loop order calls differently), so a request's decisions may depend only on
its own history and static configuration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speclab.errors import ConfigError
from speclab.traces.model import K_MAX_LIMIT, check_method_name


@dataclass
class PolicyContext:
    num_requests: int
    batch_size: int
    k_max: dict[str, int]  # per method, the smallest k_max over the traces


class StepView:
    """What a policy sees at one step for a set of running requests."""

    def __init__(
        self,
        req: np.ndarray,
        pos: np.ndarray,
        step: np.ndarray,
        nprop: dict[str, np.ndarray | None],
        acc: dict[str, np.ndarray] | None,
        occupancy: np.ndarray | None = None,
        batch_kv: np.ndarray | None = None,
        past: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]] | None = None,
    ) -> None:
        self.req = req  # request indices
        self.pos = pos  # current output position of each (the first token this step would produce)
        self.step = step  # how many SD steps each request has done so far
        # live batch, for policies with uses_occupancy (else None): sequences in this engine step (copies
        # and requests being prefilled included) and the batch's KV tokens before the step
        self.occupancy = occupancy
        self.batch_kv = batch_kv
        self._nprop = nprop
        self._acc = acc
        self._past = past or {}
        # True when the view's requests are one engine step's batch (coupled loop, reference loop); False
        # when each request stands for its own batch (fast.run_steps: replicate batching or B = 1)
        self.one_batch = False
        # rows whose probes ran at this step, set by a gated policy (AdaptiveBase.gate) before it reads any
        # offer; None = every row's (the simulator charges probes per probed row)
        self.probed: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.req)

    def set_offers(self, method: str, offers: np.ndarray) -> None:
        """Record the current offers of a probe (the live driver runs its probes after a gated policy's
        AdaptiveBase.gate has said which rows to probe)."""
        self._nprop[method] = offers

    def num_proposed(self, method: str) -> np.ndarray | None:
        """Draft tokens the proposer can offer at the current position (recorded traces), else None.
        Observable: an engine knows this before verifying."""
        return self._nprop.get(method)

    def hindsight(self, method: str, depth: int) -> np.ndarray:
        """For a probed (model-free) method: at each of the last `depth` positions q = pos - d (d = 1..depth),
        how many of the drafts it would have offered there match the output known now, censored at the d
        tokens known since q: min(acc_len[q] - 1, d); -1 where q < 0. Observable: the proposer is run on the
        known output (that is what `Policy.probes` pays for); nothing at or after pos is read."""
        if method not in self._past:
            raise PermissionError(f"hindsight on {method!r} needs it in the policy's probes")
        flat, fi = self._past[method][:2]
        d = np.arange(1, depth + 1)
        q = self.pos[:, None] - d[None, :]
        vals = flat[np.maximum(fi[:, None] - d[None, :], 0)] - 1
        return np.where(q >= 0, np.minimum(vals, d[None, :]), -1)

    def past_offers(self, method: str, depth: int) -> np.ndarray | None:
        """For a probed method with recorded proposal counts: num_proposed at the last `depth` positions
        (-1 where q < 0), else None."""
        if method not in self._past:
            raise PermissionError(f"past offers of {method!r} need it in the policy's probes")
        npr, fi = self._past[method][2], self._past[method][1]
        if npr is None:
            return None
        d = np.arange(1, depth + 1)
        q = self.pos[:, None] - d[None, :]
        return np.where(q >= 0, npr[np.maximum(fi[:, None] - d[None, :], 0)], -1)

    def oracle_acc(self, method: str) -> np.ndarray:
        """acc_len at the current position: the FUTURE. Only oracle policies get it."""
        if self._acc is None:
            raise PermissionError("online policies cannot read acc_len (it is what verification will reveal)")
        return self._acc[method]


@dataclass
class StepOutcome:
    req: np.ndarray
    method: np.ndarray  # index into policy.methods, -1 = none
    k: np.ndarray  # drafts proposed
    accepted: np.ndarray  # drafts accepted (0..k)


@dataclass
class Policy:
    spec: str
    methods: tuple[str, ...] = ()
    oracle: bool = False
    # Charge drafting as this method instead of the chosen one (the study's combine charges n-gram).
    charge_as: str | None = None
    # Apply the n-gram miss heuristic to this policy's n-gram proposals (never for oracles).
    heuristic_ok: bool = True
    # True if decisions depend on ctx.batch_size (then the step table is recomputed per batch size)
    uses_batch_size: bool = False
    # True if decisions read the live batch (StepView.occupancy / batch_kv): the fast engine then runs the
    # requests of a static or continuous batch together (fast.run_steps_coupled)
    uses_occupancy: bool = False
    # True if decisions use statistics pooled over the requests served before (adaptive.base.pool_counts):
    # the simulator then serves requests in time order also at B = 1 (the coupled loop, one slot). Pooling
    # happens only in views of one engine step's batch (StepView.one_batch), so replicate batching, where
    # each request is an engine of its own, pools nothing
    pools_requests: bool = False
    # model-free methods whose proposer runs at every SD step of every running request besides the chosen
    # one (to read StepView.hindsight); charged as that method's drafting at every such step
    probes: tuple[str, ...] = ()
    # True where the engine runs a model-based drafter (any form but verify_fraction) at every step with a
    # running request even when it proposes nothing: vLLM 0.32's EAGLE / draft-model proposer runs its first
    # forward over the step's tokens before it reads k (a batch-size schedule's k = 0 keeps the drafter's KV
    # cache in sync, v1/spec_decode/llm_base_proposer.py), so such a step pays one pass
    drafter_always_runs: bool = False
    # the simulation's cost model (set by simulate(); None when a policy is driven directly)
    cost_model: Any = None
    extra: dict = field(default_factory=dict)

    def begin(self, ctx: PolicyContext) -> None:
        self.ctx = ctx

    def decide(self, view: StepView) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def observe(self, outcome: StepOutcome) -> None:
        pass


class NoSpec(Policy):
    def decide(self, view: StepView) -> tuple[np.ndarray, np.ndarray]:
        n = len(view)
        return np.full(n, -1, np.int64), np.zeros(n, np.int64)


class Fixed(Policy):
    def decide(self, view: StepView) -> tuple[np.ndarray, np.ndarray]:
        k = np.full(len(view), self.extra["k"], np.int64)
        npr = view.num_proposed(self.methods[0])
        if npr is not None:
            k = np.minimum(k, npr)
        return np.zeros(len(view), np.int64), k


class Oracle(Policy):
    def decide(self, view: StepView) -> tuple[np.ndarray, np.ndarray]:
        acc = view.oracle_acc(self.methods[0])
        return np.zeros(len(view), np.int64), acc.astype(np.int64) - 1


class OracleCombine(Policy):
    def decide(self, view: StepView) -> tuple[np.ndarray, np.ndarray]:
        accs = np.stack([view.oracle_acc(m) for m in self.methods])
        # ties go to the first listed method (list the cheaper proposer first)
        best = accs.argmax(axis=0)
        return best.astype(np.int64), accs.max(axis=0).astype(np.int64) - 1


# --- registry -------------------------------------------------------------------------------------------
@dataclass
class PolicyInfo:
    name: str
    syntax: str
    description: str
    factory: Callable[[str, list[str], dict], Policy]


_REGISTRY: dict[str, PolicyInfo] = {}


def register_policy(
    name: str, syntax: str, description: str, factory: Callable[[str, list[str], dict], Policy]
):
    """Register a policy family. factory(spec, args_after_name, opts) -> Policy (a fresh, stateless object)."""
    _REGISTRY[name] = PolicyInfo(name, syntax, description, factory)


def list_policies() -> list[PolicyInfo]:
    return list(_REGISTRY.values())


def _int(s: str, what: str, spec: str, lo: int = 0, hi: int = K_MAX_LIMIT) -> int:
    try:
        v = int(s)
    except ValueError:
        raise ConfigError(f"policy {spec!r}: {what} must be an integer, got {s!r}") from None
    if not lo <= v <= hi:
        raise ConfigError(f"policy {spec!r}: {what} must be in {lo}..{hi}, got {v}")
    return v


def check_k_within_traces(policies: list[Policy], k_max: dict[str, int]) -> list[str]:
    """Before any simulation: a trace cannot tell what a proposal longer than its k_max would get accepted,
    so a fixed K above the traces' k_max is refused, and a policy's ceiling KMAX (extra "kmax") is
    capped at it (with a note). Without this the run failed partway, or not, depending on the data."""
    notes: list[str] = []
    for p in policies:
        top = p.extra.get("max_k")
        limit = min((k_max[m] for m in p.methods if m in k_max), default=None)
        if top is None or limit is None or top <= limit:
            continue
        if "kmax" not in p.extra:
            raise ConfigError(
                f"policy {p.spec!r}: proposes {top} drafts but the traces record "
                f"{', '.join(p.methods)} only up to k_max={limit}"
            )
        p.extra["kmax"] = p.extra["max_k"] = limit
        if "kstart" in p.extra:
            p.extra["kstart"] = min(p.extra["kstart"], limit)
        notes.append(f"policy {p.spec}: KMAX {top} capped at the traces' k_max {limit}")
    return notes


def _method(s: str, spec: str) -> str:
    try:
        return check_method_name(s)
    except Exception as exc:
        raise ConfigError(f"policy {spec!r}: {exc}") from None


def _need(args: list[str], lo: int, hi: int, spec: str, syntax: str) -> None:
    if not lo <= len(args) <= hi:
        raise ConfigError(f"policy {spec!r}: expected {syntax}")


def _none(spec: str, args: list[str], opts: dict) -> Policy:
    _need(args, 0, 0, spec, "none")
    return NoSpec(spec="none", heuristic_ok=False)


def _fixed(spec: str, args: list[str], opts: dict) -> Policy:
    _need(args, 2, 2, spec, "fixed:METHOD:K")
    m, k = _method(args[0], spec), _int(args[1], "K", spec, 1)
    return Fixed(spec=f"fixed:{m}:{k}", methods=(m,), extra={"k": k, "max_k": k})


def _oracle(spec: str, args: list[str], opts: dict) -> Policy:
    _need(args, 1, 1, spec, "oracle:METHOD")
    m = _method(args[0], spec)
    return Oracle(spec=f"oracle:{m}", methods=(m,), oracle=True, heuristic_ok=False)


def _combine(spec: str, args: list[str], opts: dict) -> Policy:
    _need(args, 1, 1, spec, "oracle-combine:M1,M2[,...]")
    ms = tuple(_method(x.strip(), spec) for x in args[0].split(","))
    if len(ms) < 2 or len(set(ms)) != len(ms):
        raise ConfigError(f"policy {spec!r}: needs two or more distinct methods")
    charge = opts.get("combine_draft", "chosen")
    if charge not in ("chosen", "ngram"):
        raise ConfigError(f"combine drafting charge {charge!r}: use chosen or ngram")
    return OracleCombine(
        spec=f"oracle-combine:{','.join(ms)}",
        methods=ms,
        oracle=True,
        heuristic_ok=False,
        charge_as="ngram" if charge == "ngram" else None,
    )


register_policy("none", "none", "no speculative decoding (the baseline)", _none)
register_policy(
    "fixed", "fixed:METHOD:K", "always propose K drafts with METHOD (capped by recorded offers)", _fixed
)
register_policy(
    "oracle", "oracle:METHOD", "propose exactly what METHOD would get accepted (upper bound)", _oracle
)
register_policy(
    "oracle-combine",
    "oracle-combine:M1,M2[,...]",
    "per position the method with the longest acceptance, oracle length (upper bound)",
    _combine,
)


def make_policy(spec: str, **opts) -> Policy:
    """Parse a policy string into a fresh Policy object."""
    spec = spec.strip()
    name, *rest = spec.split(":")
    if name not in _REGISTRY:
        raise ConfigError(f"unknown policy {spec!r} (known: {', '.join(_REGISTRY)}; see --list-policies)")
    # method names may themselves contain ':' (custom:<name>): rejoin them
    args = _rejoin_custom(rest)
    return _REGISTRY[name].factory(spec, args, opts)


def _rejoin_custom(parts: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(parts):
        p = parts[i]
        if (p == "custom" or p.endswith(",custom")) and i + 1 < len(parts):
            out.append(p + ":" + parts[i + 1])
            i += 2
        else:
            out.append(p)
            i += 1
    return out
