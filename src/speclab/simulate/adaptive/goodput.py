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

from speclab.costmodel.model import CostModel


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
    a = np.clip(alpha, 1e-6, 0.999)[:, None]
    f = a if first is None else np.clip(first, 1e-6, 0.999)[:, None]
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
    lookahead: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Choices that maximise a whole batch's expected goodput (sum of E over the step time T).

    `group` numbers the batches in the view (one engine step each; a replicated request is its own batch
    of occupancy copies). A model-based drafter's passes are shared by its batch (the chained form pays
    the longest chain for all), so per batch the number of passes P is chosen on a grid; given P and a
    price lam (tokens per second), each request picks off, a model-free k or a model-based k <= P by
    E - lam * (its own marginal seconds); lam is iterated to the batch's goodput. Each request stands for
    occupancy / (its batch's running requests) sequences (prefilling ones priced like it).

    lookahead (adaptive-survival): a copy the model-free probes see is not lost when another choice is made
    now: the probes find it again at the next position, where a later step can take the rest. Each option
    is then also credited with the copy it leaves in progress (`carry`), valued as that later step (its
    tokens less lam times its time); without it, a probe's long tail counts as lost unless taken now."""
    n = len(occ)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ng = int(group.max()) + 1
    size = np.bincount(group, minlength=ng)
    w = occ / size[group]  # sequences each request stands for
    kv_g = np.bincount(group, weights=kv, minlength=ng) / size  # the batch's KV (same for all members)
    tc = cm.target
    frac = sum(cm.draft_for(p).fraction for p in probes)
    tok_s = tc.batched * (1 + frac)  # one verified token, probes scale with verify time
    base_g = (tc.kv * kv_g + tc.const) * (1 + frac) + cm.overhead_per_step
    # the overhead's per-request share is paid whatever is chosen; its per-draft-token share is in S below
    base_g = base_g + cm.overhead_per_request * np.bincount(group, weights=w, minlength=ng)
    # options per request: (method index, k, expected tokens, own marginal seconds, passes needed)
    opts = [(np.full(n, -1), np.zeros(n), np.ones(n), w * tok_s, np.zeros(n))]
    later = None
    if lookahead:
        # a later step that takes R copied tokens: its tokens R + 1 and its time, the request's share of the
        # step's fixed time plus its verified tokens
        share = base_g[group] * w / np.bincount(group, weights=w, minlength=ng)[group]
        later = _carry_tables(
            methods, surv, kmax, probes, share + w * tok_s, w * (tok_s + cm.overhead_per_spec_token)
        )
        carry_tok, carry_sec = [], []
        ct, cs = _carry(later, None, np.ones((n, 1)))  # off: one token, the copy stays
        carry_tok.append(ct)
        carry_sec.append(cs)
    for j, m in enumerate(methods):
        if surv[j] is None or kmax[j] < 1:
            continue
        d = cm.draft_for(m)
        e = 1.0 + np.cumsum(surv[j][:, : kmax[j]], axis=1)
        for k in range(1, kmax[j] + 1):
            if later is not None:
                # P(the step produces 1 + a tokens), a = 0..k
                sk = np.concatenate([np.ones((n, 1)), surv[j][:, :k], np.zeros((n, 1))], axis=1)
                ct, cs = _carry(later, (j, k), sk[:, :-1] - sk[:, 1:])
                carry_tok.append(ct)
                carry_sec.append(cs)
            sec = w * ((k + 1) * tok_s + k * cm.overhead_per_spec_token)
            passes = np.zeros(n)
            if m not in probes:
                if d.form == "verify_fraction":
                    sec = sec + w * (k + 1) * tc.batched * d.fraction
                elif d.form == "chained":
                    sec = sec + w * d.num_spec * k
                    passes = np.full(n, float(k))
                elif d.form == "forwards":  # its tokens through the drafter: k + 1, then 1 per later pass
                    sec = sec + w * d.batched * 2 * k
                    passes = np.full(n, float(k))
                else:  # linear: charged once per step (max over requests): count it as shared
                    sec = sec + w * d.num_spec * k / np.maximum(size[group], 1)
                    passes = np.full(n, 1.0)
            opts.append((np.full(n, j), np.full(n, float(k)), e[:, k - 1], sec, passes))
    M = np.stack([o[0] for o in opts], 1)
    K = np.stack([o[1] for o in opts], 1)
    E = np.stack([o[2] for o in opts], 1)
    S = np.stack([o[3] for o in opts], 1)
    Pn = np.stack([o[4] for o in opts], 1)
    if later is not None:
        E = E + np.stack(carry_tok, 1)  # the copy left in progress, valued as the later step that takes it
        S = S + np.stack(carry_sec, 1)
    # the shared cost of P passes of the model-based drafter(s)
    mb = [cm.draft_for(m) for m in methods if m not in probes]
    per_pass = sum((d.kv * kv_g + d.const) if d.form != "verify_fraction" else 0.0 for d in mb) if mb else 0.0
    best_g = np.full(ng, -np.inf)
    best_i = np.zeros(n, dtype=np.int64)
    lam0 = 1.0 / (base_g + np.bincount(group, weights=w * tok_s, minlength=ng))  # off: 1 token per seq
    for P in PASS_GRID if mb else (0,):
        allowed = Pn <= P
        shared = base_g + (P * per_pass if mb else 0.0)
        lam = lam0 * np.bincount(group, weights=w, minlength=ng)
        for _ in range(iters):
            score = np.where(allowed, w[:, None] * E - lam[group][:, None] * S, -np.inf)
            i = score.argmax(axis=1)
            tot_e = np.bincount(group, weights=w * E[np.arange(n), i], minlength=ng)
            used = np.bincount(group, weights=Pn[np.arange(n), i], minlength=ng) > 0
            t = np.where(used | (P == 0), shared, base_g) + np.bincount(
                group, weights=S[np.arange(n), i], minlength=ng
            )
            lam = tot_e / t
        better = lam > best_g
        best_g = np.where(better, lam, best_g)
        best_i = np.where(better[group], i, best_i)
    r = np.arange(n)
    return M[r, best_i].astype(np.int64), K[r, best_i].astype(np.int64)


def _carry_tables(
    methods: tuple[str, ...],
    surv: list[np.ndarray | None],
    kmax: list[int],
    probes: tuple[str, ...],
    c0: np.ndarray,
    c1: np.ndarray,
) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Per probe p (model-free method with a survival estimate): with X its match length here (P(X >= j) =
    S_p(j), nothing known beyond its kmax), after a step that produced t tokens a copy of R = X - t >= 1
    tokens is left; a later step takes it: R + 1 tokens in c0 + c1 * R seconds. Tables over t = 1..kmax + 1
    of the expected tokens E[(R + 1) 1{R >= 1}] and seconds E[(c0 + c1 R) 1{R >= 1}]."""
    out = []
    for j, m in enumerate(methods):
        if m not in probes or surv[j] is None or kmax[j] < 1:
            continue
        s = np.concatenate([surv[j][:, : kmax[j]], np.zeros((len(c0), 1))], axis=1)  # S(1..kmax), 0 beyond
        # for t = 1..kmax + 1: P(X >= t + 1) = S(t + 1) and E[(X - t)^+] = sum_{i >= t + 1} S(i)
        tail = np.concatenate([s[:, 1:], np.zeros((len(c0), 1))], axis=1)
        rem = np.cumsum(tail[:, ::-1], axis=1)[:, ::-1]
        out.append((j, rem + tail, c0[:, None] * tail + c1[:, None] * rem))
    return out


def _carry(
    tables: list[tuple[int, np.ndarray, np.ndarray]], option: tuple[int, int] | None, pt: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The copy an option leaves, credited through the probe whose later step is worth most (by tokens per
    second of it). pt: (n, a + 1) P(the step produces 1 + a tokens). The probe's own option (j, k) leaves
    only what lies beyond its k drafts and the bonus token (t = k + 1 where X > k)."""
    n = pt.shape[0]
    best_tok, best_sec = np.zeros(n), np.zeros(n)
    for j, tok, sec in tables:
        if option is not None and option[0] == j:
            ct, cs = tok[:, option[1]], sec[:, option[1]]
        else:
            a = min(pt.shape[1], tok.shape[1])
            # beyond the table (t > kmax_p + 1) no copy of p is left
            ct, cs = (pt[:, :a] * tok[:, :a]).sum(axis=1), (pt[:, :a] * sec[:, :a]).sum(axis=1)
        better = ct * np.maximum(best_sec, 1e-12) > best_tok * np.maximum(cs, 1e-12)
        best_tok, best_sec = np.where(better, ct, best_tok), np.where(better, cs, best_sec)
    return best_tok, best_sec
