"""Expected goodput of speculation choices under a cost model and the live batch (shared by the adaptive
policies).

For a running request, a choice is (method m, k drafts) or off. With S_m(j) the estimated probability that
at least j of m's drafts are accepted, the step produces E = 1 + sum_{j<=k} S_m(j) tokens in expectation.
`batch_choice` picks every request's choice so that its batch's expected tokens over the step's estimated
time (target verify at the batch's KV and tokens, drafting as the cost model charges it, per-step overhead,
the probes the policy runs anyway) is highest. Off (E = 1) wins wherever speculation would cost more than
it returns, which is how SD shrinks or switches itself off at large batch or low acceptance.
"""

from __future__ import annotations

import numpy as np

from speclab.costmodel.model import CostModel, TargetCost


def step_time(
    cm: CostModel, method: str | None, k: np.ndarray, occ: np.ndarray, kv: np.ndarray, probes: tuple[str, ...]
) -> np.ndarray:
    """Estimated engine-step time when all `occ` sequences propose k drafts with `method` (None = off).
    k broadcasts against occ/kv (e.g. occ[:, None] with k[None, :])."""
    verify = cm.target_time(kv, occ * (k + 1), occ * (k + 1))
    t = verify + cm.overhead_time(occ, occ * k)
    for p in probes:  # probes run at every step whatever is chosen
        t = t + cm.draft_for(p).fraction * verify
    if method is None or method in probes:
        return t
    d = cm.draft_for(method)
    if d.form == "verify_fraction":
        return t + np.where(k > 0, d.fraction * verify, 0.0)
    if d.form == "linear":
        return t + np.where(k > 0, d.kv * kv + d.num_spec * k + d.const, 0.0)
    if d.form == "forwards":  # k forwards: the first over the step's tokens, then one token per sequence
        return t + np.where(
            k > 0, k * (d.kv * kv + d.const) + d.batched * (occ * (k + 1) + (k - 1) * occ), 0.0
        )
    return t + k * (d.kv * kv + d.const) + d.num_spec * occ * k  # chained


def run_length(hind: np.ndarray) -> np.ndarray:
    """From StepView.hindsight: how many of the last positions the proposer at that position would have
    predicted all the way to now (the longest d with min(acc - 1, d) == d, counted contiguously from d = 1).
    A copy in progress shows as a long run."""
    d = np.arange(1, hind.shape[1] + 1)[None, :]
    full = hind == d
    return np.where(full.all(axis=1), hind.shape[1], full.argmin(axis=1))


def geometric(alpha: np.ndarray, kmax: int, first: np.ndarray | None = None) -> np.ndarray:
    """Survival S(j) = first * alpha^(j-1) for j = 1..kmax (first defaults to alpha)."""
    j = np.arange(kmax)[None, :]
    # np.minimum/maximum: np.clip's per-call cost shows in the live proposer
    a = np.minimum(np.maximum(alpha, 1e-6), 0.999)[:, None]
    f = a if first is None else np.minimum(np.maximum(first, 1e-6), 0.999)[:, None]
    return f * a**j


PASS_GRID = (0, 1, 2, 3, 4, 6, 8, 12, 16, 20)


def batch_choice(
    cm: CostModel,
    methods: tuple[str, ...],
    surv: list[np.ndarray | None],
    kmax: list[int],
    occ: np.ndarray,
    kv: np.ndarray,
    probes: tuple[str, ...],
    group: np.ndarray,
    iters: int = 3,
    shortcut: bool = True,
    offers: list[np.ndarray | None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Choices that maximise a whole batch's expected goodput (sum of E over the step time T).

    `group` numbers the batches in the view (one engine step each; a replicated request is its own batch
    of occupancy copies). A model-based drafter's passes are shared by its batch (the chained form pays
    the longest chain for all), so per batch the number of passes P is chosen on a grid; given P and a
    price lam (tokens per second), each request picks off, a model-free k or a model-based k <= P by
    E - lam * (its own marginal seconds); lam is iterated to the batch's goodput. Each request stands for
    occupancy / (its batch's running requests) sequences (prefilling ones priced like it).

    shortcut: answer "off" for all without the pass grid where its first round shows that is the answer
    (`_all_off`; the same choices, tests/test_adaptive_live.py); False for the tests' comparison.

    offers: per method, the most drafts each request's proposer can give now (a lookup's offer; None: no
    limit). A k above it is not an option: the engine verifies only the drafts the proposer gave, so a
    tabulated forward that is cheaper at 4 tokens than at 1 must not be bought with drafts nobody has."""
    n = len(occ)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ng = int(group.max()) + 1
    size = np.bincount(group, minlength=ng)
    w = occ / size[group]  # sequences each request stands for
    seqs_g = np.bincount(group, weights=w, minlength=ng)  # sequences in each batch
    kv_g = np.bincount(group, weights=kv, minlength=ng) / size  # the batch's KV (same for all members)
    tc = cm.target
    frac = sum(cm.draft_for(p).fraction for p in probes)
    # an all-off step: one token per sequence through the target (probes scale with verify time), the
    # step's overhead and the per-request share of it
    base_g = (
        tc.time(kv_g, seqs_g, seqs_g) * (1 + frac) + cm.overhead_per_step + cm.overhead_per_request * seqs_g
    )
    # what one more verified draft token costs in each batch: the target's slope over the tokens the batch's
    # drafts add (piecewise forms: ~0 below the weights-bound knee, the compute slope above it), re-read for
    # the drafts chosen at each iteration; starts from one draft per sequence
    tok_g = _marginal(tc, kv_g, seqs_g, seqs_g) * (1 + frac)
    M, K, E, S0, Pn = _option_columns(cm, methods, surv, kmax, probes, w, tok_g[group], size[group], offers)
    WK = w[:, None] * K  # verified draft tokens (in sequences) of each option
    # the shared cost of P passes of the model-based drafter(s)
    mb = [cm.draft_for(m) for m in methods if m not in probes]
    per_pass = sum((d.kv * kv_g + d.const) if d.form != "verify_fraction" else 0.0 for d in mb) if mb else 0.0
    best_g = np.full(ng, -np.inf)
    best_i = np.zeros(n, dtype=np.int64)
    r = np.arange(n)
    # one request per batch (batch 1 live; every request in the simulator's replicated batches) under a
    # non-linear target: each option's step time is computed exactly (a tabulated forward can be cheaper
    # with 3 drafts than with 1, which no slope expresses); the linear form's iteration below is exact
    # already (Dinkelbach's), so it keeps it
    exact = bool(size.max() == 1) and type(tc) is not TargetCost
    if exact:
        kvr, sr = kv_g[group][:, None], seqs_g[group][:, None]
        extra = (np.asarray(tc.time(kvr, sr + WK, sr + WK)) - np.asarray(tc.time(kvr, sr, sr))) * (1 + frac)
    else:
        if shortcut and _all_off(w, E, S0 + WK * tok_g[group][:, None], seqs_g / base_g, group):
            return M[:, 0].astype(np.int64), K[:, 0].astype(np.int64)
        added = _Added(tc, kv_g, seqs_g, max(kmax, default=0))  # forward time added by d drafts per batch
    grid = _pass_grid(Pn) if mb else (0,)
    if not exact:
        # every pass count of the grid at once (a leading axis): the same sums, element for element, as
        # one pass count at a time, and the first best of them, as the strict > of a loop in grid order
        Ps = np.asarray(grid, dtype=np.int64)
        allowed = Pn[None, :, :] <= Ps[:, None, None]
        shared = base_g[None, :] + (Ps[:, None] * per_pass if mb else np.zeros((1, 1)))
        lam, i = _iterate(
            group, w, E, S0, WK, Pn, allowed, base_g, shared, tok_g, added, frac, Ps == 0, iters
        )
        pick = lam.argmax(axis=0)
        return M[r, i[pick[group], r]].astype(np.int64), K[r, i[pick[group], r]].astype(np.int64)
    for P in grid:
        allowed = Pn <= P
        shared = base_g + (P * per_pass if mb else 0.0)
        T = np.where(Pn > 0, shared[group][:, None], base_g[group][:, None]) + extra + S0
        val = np.where(allowed, w[:, None] * E / T, -np.inf)
        i = val.argmax(axis=1)
        lam = np.full(ng, -np.inf)
        lam[group] = val[r, i]
        better = lam > best_g
        best_g = np.where(better, lam, best_g)
        best_i = np.where(better[group], i, best_i)
    return M[r, best_i].astype(np.int64), K[r, best_i].astype(np.int64)


def _iterate(
    group: np.ndarray,
    w: np.ndarray,
    E: np.ndarray,
    S0: np.ndarray,
    WK: np.ndarray,
    Pn: np.ndarray,
    allowed: np.ndarray,
    base_g: np.ndarray,
    shared: np.ndarray,
    tok_g: np.ndarray,
    added: _Added,
    frac: float,
    no_passes: np.ndarray,
    iters: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Given the drafter passes allowed, each request's choice by E - lam * (its seconds), lam iterated to
    its batch's goodput and the verified-token price re-read for the drafts chosen. Every pass count at once:
    `allowed` (nP, n, options), `shared` (nP, batches), `no_passes` (nP,). Returns (lam per pass count and
    batch, option index per pass count and request). A round that repeats the choices of the round before
    repeats lam and the price too, so the rounds stop once no pass count's choices change."""
    nP, ng, n = len(no_passes), len(base_g), len(w)
    r = np.arange(n)
    gP = (group[None, :] + ng * np.arange(nP)[:, None]).ravel()  # (pass count, batch) bins

    def per_batch(x: np.ndarray) -> np.ndarray:
        return np.bincount(gP, weights=x.ravel(), minlength=nP * ng).reshape(nP, ng)

    lam = np.broadcast_to(np.bincount(group, weights=w, minlength=ng) / base_g, (nP, ng))  # off: 1 token
    tok = np.broadcast_to(tok_g, (nP, ng))
    wE = w[:, None] * E
    prev = None
    for _ in range(iters):
        S = S0[None, :, :] + WK[None, :, :] * tok[:, group][:, :, None]
        score = np.where(allowed, wE[None, :, :] - lam[:, group][:, :, None] * S, -np.inf)
        i = score.argmax(axis=2)
        if prev is not None and np.array_equal(i, prev):
            break  # the same choices give the same lam and slope: every later round repeats this one
        prev = i
        tot_e = per_batch(w[None, :] * E[r, i])
        used = per_batch(Pn[r, i]) > 0
        drafts = per_batch(WK[r, i])
        # the step's time at the chosen drafts, by the cost model itself (not the slope)
        add = added(drafts)
        t = (
            np.where(used | no_passes[:, None], shared, base_g[None, :])
            + add * (1 + frac)
            + per_batch(S0[r, i])
        )
        lam = tot_e / t
        tok = np.where(drafts > 0, add / np.maximum(drafts, 1e-9), tok_g / (1 + frac)) * (1 + frac)
    return lam, i


def _option_columns(
    cm: CostModel,
    methods: tuple[str, ...],
    surv: list[np.ndarray | None],
    kmax: list[int],
    probes: tuple[str, ...],
    w: np.ndarray,
    tok_r: np.ndarray,
    size_r: np.ndarray,
    offers: list[np.ndarray | None] | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every request's options as columns (off first): method index M, drafts K, expected tokens E, seconds
    besides the verified drafts S0 and the model-based drafter passes Pn it needs. `w`: the sequences each
    request stands for; `tok_r`: a verified draft token's price in its batch; `size_r`: its batch's running
    requests."""
    n = len(w)
    cols: list[list[np.ndarray]] = [[np.full((n, 1), -1)], [np.zeros((n, 1))], [np.ones((n, 1))]]
    cols += [[np.zeros((n, 1))], [np.zeros((n, 1))]]
    wc = w[:, None]
    for j, m in enumerate(methods):
        km = kmax[j]
        if surv[j] is None or km < 1:
            continue
        d = cm.draft_for(m)
        ks = np.arange(1, km + 1, dtype=np.float64)[None, :]
        sec = wc * ks * cm.overhead_per_spec_token
        passes = np.zeros((n, km))
        if m not in probes:
            if d.form == "verify_fraction":
                sec = sec + wc * ks * tok_r[:, None] * d.fraction
            elif d.form == "chained":
                sec = sec + wc * d.num_spec * ks
                passes = np.broadcast_to(ks, (n, km))
            elif d.form == "forwards":  # its tokens through the drafter: k + 1, then 1 per later pass
                sec = sec + wc * d.batched * 2 * ks
                passes = np.broadcast_to(ks, (n, km))
            else:  # linear: charged once per step (max over requests): count it as shared
                sec = sec + wc * d.num_spec * ks / np.maximum(size_r, 1)[:, None]
                passes = np.ones((n, km))
        e = 1.0 + np.cumsum(surv[j][:, :km], axis=1)
        cap = None if offers is None else offers[j]
        if cap is not None:
            e = np.where(ks <= cap[:, None], e, -np.inf)  # drafts the proposer does not have
        blocks = (np.full((n, km), j), np.broadcast_to(ks, (n, km)), e)
        for c, v in zip(cols, (*blocks, sec, passes), strict=True):
            c.append(v)
    M, K, E, S0, Pn = (np.concatenate(c, axis=1) for c in cols)
    return M, K, E, S0, Pn


def _all_off(w: np.ndarray, E: np.ndarray, S: np.ndarray, lam0: np.ndarray, group: np.ndarray) -> bool:
    """Whether the iteration below would answer "off" for every request, decided from its first round
    alone: at the all-off goodput lam0 and the first slope, no option of any request scores above off
    (column 0), with every pass count allowed (a pass grid value only removes options). Then each round
    re-reads the same all-off step (lam stays lam0, the slope stays the first one) and no pass count
    improves on it, so the answer is off, computed without the grid: most steps at a large batch, where
    the live proposer's time per step is what it costs (docs/adaptive.md)."""
    score = w[:, None] * E - lam0[group][:, None] * S
    return bool((score[:, 1:] <= score[:, :1]).all())


def _pass_grid(passes: np.ndarray) -> tuple[int, ...]:
    """PASS_GRID up to its first value >= the most passes any option needs: a larger P allows the same
    options and only pays more passes, so it never wins (the live proposer decides every step, and each
    P is a full pass over the options)."""
    need = float(passes.max(initial=0.0))
    cut = next((i for i, p in enumerate(PASS_GRID) if p >= need), len(PASS_GRID) - 1)
    return PASS_GRID[: cut + 1]


class _Added:
    """The target time that `d` more verified tokens add to each batch's forward, tc.time(kv, seqs + d) -
    tc.time(kv, seqs). Linear form: d * batched. Other forms: read off a grid of whole token counts computed
    once per call of batch_choice (interpolated between them), since the iteration asks many times."""

    def __init__(self, tc: TargetCost, kv: np.ndarray, seqs: np.ndarray, kmax: int) -> None:
        self.tc, self.kv, self.seqs = tc, kv, seqs
        self.linear = type(tc) is TargetCost
        if not self.linear:
            top = int(np.ceil(float(seqs.max(initial=0.0)) * kmax)) + 1
            d = np.arange(top + 1, dtype=np.float64)[None, :]
            hi = seqs[:, None] + d
            base = np.asarray(tc.time(kv, seqs, seqs), dtype=np.float64)[:, None]
            self.grid = np.asarray(tc.time(kv[:, None], hi, hi), dtype=np.float64) - base
            self.top = top

    def __call__(self, d: np.ndarray) -> np.ndarray:
        if self.linear:
            return d * self.tc.batched
        d = np.minimum(np.maximum(d, 0.0), float(self.top))
        lo = np.minimum(np.floor(d).astype(np.int64), self.top - 1)
        f = d - lo
        g = np.arange(d.shape[-1])  # d: per batch, or (pass counts, batches)
        return self.grid[g, lo] * (1 - f) + self.grid[g, lo + 1] * f


def _marginal(tc: TargetCost, kv: np.ndarray, tokens: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """Seconds per token of `extra` more verified tokens on a forward of `tokens` (sampled positions =
    tokens: decode and verify rows). The linear form's `batched` (+ `sampled`), a piecewise form's average
    slope over the span."""
    extra = np.maximum(np.asarray(extra, dtype=np.float64), 1e-9)
    hi = tokens + extra
    return (np.asarray(tc.time(kv, hi, hi)) - np.asarray(tc.time(kv, tokens, tokens))) / extra
