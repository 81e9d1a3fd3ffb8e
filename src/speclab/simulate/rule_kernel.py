"""The adaptive rule's per-step work as plain loops over scalars, for numba to compile (simulate/compiled.py).

Each function restates one piece of speclab.policy (adaptive.AdaptiveBase's estimates and calibration,
goodput.batch_choice for one engine step's batch under the linear target form) operation for operation, in
the same order, so that the compiled loop's choices equal the numpy implementation's (tests/
test_compiled_policy.py runs both). Compiled where numba imports (cached beside this module); without
numba the functions stay plain Python and the simulator uses the numpy implementation instead.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np

from speclab.policy.adaptive import (
    CAL_DECAY,
    CAL_MAX,
    CAL_MIN,
    CAL_WEIGHT,
    COPY_PRIOR,
    COPY_START,
    GATE_RING,
    MB_DECAY,
    MB_PRIOR,
    MB_WEIGHT,
    REPROBE,
    START_PRIOR,
    START_WEIGHT,
)
from speclab.policy.pooling import FIRST_WEIGHT, HINDSIGHT, RATE_WINDOW

try:
    import numba

    jit = numba.njit(cache=True)
except ImportError:  # pragma: no cover - numba is optional
    numba = None

    def jit(f):  # type: ignore[no-redef]
        return f


# drafting cost forms (costmodel.model.DraftCost.form) as codes
VERIFY_FRACTION, CHAINED, FORWARDS, LINEAR = 0, 1, 2, 3
NEG_INF = -np.inf
# what the compiled code depends on: the three kernel files and the policy constants it reads. numba
# freezes globals at compile time, and its cache checks only the file of each function, not the files of
# the functions it calls nor of the constants it imports; each kernel module's frozen_stamp() returns STAMP
# as it was when that module was compiled, and compiled.available() recompiles all where one differs
CONSTANTS = (CAL_DECAY, CAL_MAX, CAL_MIN, CAL_WEIGHT, COPY_PRIOR, MB_DECAY, MB_PRIOR, MB_WEIGHT, FIRST_WEIGHT,
             HINDSIGHT, RATE_WINDOW, COPY_START, GATE_RING, REPROBE, START_PRIOR, START_WEIGHT)  # fmt: skip


def _stamp() -> int:
    h = hashlib.sha256(repr(CONSTANTS).encode())
    for name in ("rule_kernel.py", "gate_kernel.py", "compiled.py"):
        path = Path(__file__).with_name(name)
        h.update(path.read_bytes() if path.exists() else name.encode())
    return int(h.hexdigest()[:15], 16)


STAMP = _stamp()


@jit
def frozen_stamp() -> int:
    """STAMP as this module's compiled code holds it."""
    return STAMP


@jit
def _block_sum(a: np.ndarray, lo: int, n: int) -> float:
    """numpy's pairwise float sum of a[lo:lo + n] for n <= 128: in order below 8, else 8 running sums."""
    res = 0.0
    if n < 8:
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r = np.empty(8)
    for j in range(8):
        r[j] = a[lo + j]
    i = 8
    while i < n - (n % 8):
        for j in range(8):
            r[j] += a[lo + i + j]
        i += 8
    res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@jit
def pairwise_sum(a: np.ndarray, n: int) -> float:
    """numpy's float sum of a[:n], value for value: above 128 elements, halves (the first a multiple of 8)
    summed alike and added; the halving without recursion (numba's cache does not keep recursive code)."""
    todo = np.zeros((128, 3), np.int64)  # (start, length, halves summed?)
    vals = np.zeros(128)
    top, nv = 1, 0
    todo[0, 0], todo[0, 1] = 0, n
    while top:
        top -= 1
        lo, m, done = todo[top, 0], todo[top, 1], todo[top, 2]
        if m <= 128:
            vals[nv] = _block_sum(a, lo, m)
            nv += 1
        elif done:
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
        else:
            h = m // 2
            h -= h % 8
            todo[top, 2] = 1
            todo[top + 1, 0], todo[top + 1, 1], todo[top + 1, 2] = lo + h, m - h, 0
            todo[top + 2, 0], todo[top + 2, 1], todo[top + 2, 2] = lo, h, 0
            top += 3
    return vals[0]


@jit
def geometric_row(alpha: float, km: int, out: np.ndarray) -> None:
    """goodput.geometric for one request: S(j) = a * a^(j - 1)."""
    a = min(max(alpha, 1e-6), 0.999)
    for j in range(km):
        out[j] = a * a ** float(j)


@jit
def lookup_survival(
    acc: np.ndarray, npr: np.ndarray, has_npr: bool, counts: np.ndarray, fi: np.ndarray, pos: np.ndarray,
    km: int, f0: float, c0: float, rows: np.ndarray, out: np.ndarray,
) -> None:  # fmt: skip
    """AdaptiveBase.free_survival from hindsight (not gated, pool fixed at f0 / c0), capped by the offer.
    The window's counts are integers, so they are read off prefix counts (`counts`: per flat position,
    how many before it have acc >= 2 (a first-draft match), acc >= 1 (a known hindsight) and an offer).
    The estimate is a function of (run, hits, tries) alone: each one's row is computed once (`rows`, by
    key; column 0 negative until then)."""
    w = COPY_PRIOR + 1.0
    cap_c = max(0.95, c0)
    for r in range(len(fi)):
        run = HINDSIGHT
        for d in range(1, HINDSIGHT + 1):  # a copy in progress: matched through to now at each of the last d
            if pos[r] - d < 0 or min(acc[fi[r] - d] - 1, d) != d:
                run = d - 1
                break
        lo = fi[r] - min(pos[r], RATE_WINDOW)
        hit = counts[0, fi[r]] - counts[0, lo]
        tried = (counts[2, fi[r]] - counts[2, lo]) if has_npr else (counts[1, fi[r]] - counts[1, lo])
        key = run if run >= 1 else HINDSIGHT + 1 + hit * (RATE_WINDOW + 1) + tried
        if rows[key, 0] < 0:
            first = (hit + FIRST_WEIGHT * f0) / (tried + FIRST_WEIGHT)
            cont = min((run + w * c0) / (run + w), cap_c)
            geometric_row(cont if run >= 1 else first, km, rows[key])
        out[r, :km] = rows[key, :km]
        if has_npr:
            for j in range(km):
                if j >= npr[fi[r]]:
                    out[r, j] = 0.0


@jit
def model_survival(
    s: np.ndarray, f: np.ndarray, req: np.ndarray, km: int, last: np.ndarray, last_row: np.ndarray,
    out: np.ndarray,
) -> None:  # fmt: skip
    """AdaptiveBase.model_survival: the request's own discounted accepted drafts and stops. A request's
    estimate changes only at steps that drafted from the method: its row is kept (last: the rate it is for)."""
    for r in range(len(req)):
        q = req[r]
        alpha = (s[q] + MB_WEIGHT * MB_PRIOR) / (s[q] + f[q] + MB_WEIGHT)
        if alpha != last[q]:
            geometric_row(alpha, km, last_row[q])
            last[q] = alpha
        out[r, :km] = last_row[q, :km]


@jit
def calibration(cal: np.ndarray, j: int) -> float:
    """AdaptiveBase.calibration (a calibrating policy)."""
    x = (cal[j, 1] + CAL_WEIGHT) / (cal[j, 0] + CAL_WEIGHT)
    return min(max(x, CAL_MIN), CAL_MAX)


@jit
def option_columns(
    surv: np.ndarray, kmax: np.ndarray, is_probe: np.ndarray, form: np.ndarray, dpar: np.ndarray,
    caps: np.ndarray, has_cap: np.ndarray, w: float, tok: float, size: int, opst: float,
) -> tuple:  # fmt: skip
    """goodput._option_columns for one batch of `size` requests each standing for w sequences. dpar: per
    method (kv, num_spec, const, fraction, batched) of its drafting cost. Every request of one batch stands
    for the same w, so an option's method M, drafts K, seconds S0 and passes Pn are one row for all; only the
    expected tokens E are per request."""
    n = surv.shape[1]
    nopt = 1 + int(kmax.sum())
    M = np.full(nopt, -1, np.int64)
    K, S0, Pn = np.zeros(nopt), np.zeros(nopt), np.zeros(nopt)
    E = np.ones((n, nopt))
    c = 1
    for j in range(len(kmax)):
        km = kmax[j]
        for q in range(km):
            ks = q + 1.0
            sec = w * ks * opst
            p = 0.0
            if not is_probe[j]:
                if form[j] == VERIFY_FRACTION:
                    sec = sec + w * ks * tok * dpar[j, 3]
                elif form[j] == CHAINED:
                    sec = sec + w * dpar[j, 1] * ks
                    p = ks
                elif form[j] == FORWARDS:
                    sec = sec + w * dpar[j, 4] * 2 * ks
                    p = ks
                else:
                    sec = sec + w * dpar[j, 1] * ks / max(size, 1)
                    p = 1.0
            M[c + q], K[c + q], S0[c + q], Pn[c + q] = j, ks, sec, p
        for r in range(n):
            cum = 0.0
            for q in range(km):
                cum += surv[j, r, q]  # 1 + np.cumsum: the running sum first
                ok = not has_cap[j] or q + 1.0 <= caps[j, r]
                E[r, c + q] = 1.0 + cum if ok else NEG_INF
        c += km
    return M, K, E, S0, Pn


@jit
def iterate(
    g: int, wET: np.ndarray, S0: np.ndarray, WK: np.ndarray, Pn: np.ndarray, P: float, Pprev: float,
    lam0: float, base: float, shared: float, tok0: float, tbat: float, frac: float, choice: np.ndarray,
    memo_v: np.ndarray, memo_lam: np.ndarray, memo: np.ndarray,
) -> float:  # fmt: skip
    """goodput._iterate for the g-th pass count P and one batch (wET: w * E, option-major): fills `choice`,
    returns lam. A pass count whose choices repeat repeats lam, so stopping it alone equals the joint stop.
    An option is allowed where Pn <= P (the rest score -inf in numpy). A round that starts from the same
    lam and slope as the previous pass count's same round scores every option alike, so its first best is
    that round's first best (memo_v, memo[g - 1, it]: value and option per request) weighed against the
    options P adds alone (ties to the lower column, as a scan in column order keeps the first)."""
    nopt, n = wET.shape
    iters = memo.shape[1]
    lam, tok = lam0, tok0
    price = np.empty(nopt)
    for it in range(iters):
        for o in range(nopt):
            price[o] = S0[o] + WK[o] * tok
        inc = g > 0 and memo[g - 1, it, 0] >= 0 and memo_lam[g - 1, it, 0] == lam
        inc = inc and memo_lam[g - 1, it, 1] == tok
        bv, bo = memo_v[g, it], memo[g, it]  # this round's first best per request: value, option
        if inc:
            bv[:] = memo_v[g - 1, it]
            bo[:] = memo[g - 1, it]
        else:
            lp = lam * price[0]
            for r in range(n):
                bv[r], bo[r] = wET[0, r] - lp, 0
        for o in range(1, nopt):  # option by option, each across the requests (contiguous)
            if Pn[o] <= P and (not inc or Pn[o] > Pprev):
                lp = lam * price[o]
                row = wET[o]
                for r in range(n):
                    sc = row[r] - lp
                    if sc > bv[r] or (inc and sc == bv[r] and o < bo[r]):
                        bv[r], bo[r] = sc, o
        same = it > 0
        for r in range(n):
            if bo[r] != choice[r]:
                same = False
            choice[r] = bo[r]
        memo_lam[g, it, 0], memo_lam[g, it, 1] = lam, tok
        if same:
            break
        tot_e, pas, drafts, s0 = 0.0, 0.0, 0.0, 0.0
        for r in range(n):
            tot_e += wET[choice[r], r]
            pas += Pn[choice[r]]
            drafts += WK[choice[r]]
            s0 += S0[choice[r]]
        add = drafts * tbat
        t = (shared if (pas > 0 or P == 0) else base) + add * (1 + frac) + s0
        lam = tot_e / t
        tok = (add / max(drafts, 1e-9) if drafts > 0 else tok0 / (1 + frac)) * (1 + frac)
    return lam


@jit
def batch_choice(
    surv: np.ndarray, kmax: np.ndarray, is_probe: np.ndarray, form: np.ndarray, dpar: np.ndarray,
    caps: np.ndarray, has_cap: np.ndarray, occ: int, kv: int, cpar: np.ndarray, grid: np.ndarray,
    iters: int, meth: np.ndarray, k: np.ndarray,
) -> None:  # fmt: skip
    """goodput.batch_choice for one engine step's batch (every request at occupancy occ and batch KV kv)
    under the linear target form; cpar: (target kv, batched, const, overhead per step, per request, per
    spec token, the probes' verify fraction). Fills meth, k."""
    n = surv.shape[1]
    tkv, tbat, tconst, ops, opr, opst, frac = cpar[0], cpar[1], cpar[2], cpar[3], cpar[4], cpar[5], cpar[6]
    w = occ / n
    seqs, kvs = 0.0, 0.0
    for _r in range(n):
        seqs += w
        kvs += float(kv)
    kv_g = kvs / n
    base = (tkv * kv_g + tbat * seqs + tconst) * (1 + frac) + ops + opr * seqs
    extra = max(seqs, 1e-9)
    hi = seqs + extra
    tok = ((tkv * kv_g + tbat * hi + tconst) - (tkv * kv_g + tbat * seqs + tconst)) / extra * (1 + frac)
    M, K, E, S0, Pn = option_columns(surv, kmax, is_probe, form, dpar, caps, has_cap, w, tok, n, opst)
    WK = w * K
    mb = False
    per_pass = 0.0
    for j in range(len(kmax)):
        if not is_probe[j]:
            mb = True
            per_pass = per_pass + ((dpar[j, 0] * kv_g + dpar[j, 2]) if form[j] != VERIFY_FRACTION else 0.0)
    lam0 = seqs / base
    wE = w * E
    sc0 = wE - lam0 * (S0 + WK * tok)  # the first round's scores (goodput._all_off)
    off = True
    for r in range(n):
        for o in range(1, E.shape[1]):
            if sc0[r, o] > sc0[r, 0]:
                off = False
    if off:
        for r in range(n):
            meth[r], k[r] = M[0], int(K[0])
        return
    need = 0.0
    for o in range(len(Pn)):
        need = max(need, Pn[o])
    cut = len(grid) - 1
    for g in range(len(grid)):
        if grid[g] >= need:
            cut = g
            break
    if not mb:
        cut = 0
    best_lam, best = NEG_INF, np.zeros(n, np.int64)
    choice = np.zeros(n, np.int64)
    wET = np.ascontiguousarray(wE.T)  # option-major: a round scores one option across the requests
    memo = np.full((cut + 1, iters, n), -1, np.int64)  # per pass count and round: each request's choice
    memo_v, memo_lam = np.empty((cut + 1, iters, n)), np.empty((cut + 1, iters, 2))
    for g in range(cut + 1):
        P = float(grid[g]) if mb else 0.0
        shared = base + grid[g] * per_pass if mb else base + 0.0
        choice[:] = -1
        Pprev = float(grid[g - 1]) if g > 0 else -1.0
        lam = iterate(g, wET, S0, WK, Pn, P, Pprev, lam0, base, shared, tok, tbat, frac, choice, memo_v,
                      memo_lam, memo)  # fmt: skip
        if lam > best_lam or g == 0:
            best_lam = lam
            best[:] = choice
    for r in range(n):
        meth[r], k[r] = M[best[r]], int(K[best[r]])


@jit
def calibrated(raw: np.ndarray, kmax: np.ndarray, is_probe: np.ndarray, cal: np.ndarray, calibrates: bool):
    """AdaptiveBase.calibrated: a lookup's survival scaled by its calibration, at most 0.999."""
    surv = np.zeros_like(raw)
    for j in range(len(kmax)):
        fac = calibration(cal, j) if calibrates and is_probe[j] else 1.0
        for r in range(raw.shape[1]):
            for q in range(kmax[j]):
                x = raw[j, r, q]
                surv[j, r, q] = min(x * fac, 0.999) if calibrates and is_probe[j] else x
    return surv


@jit
def decide_observe(
    acc: np.ndarray, npr: np.ndarray, has_npr: np.ndarray, counts: np.ndarray, kmax: np.ndarray,
    is_probe: np.ndarray, form: np.ndarray, dpar: np.ndarray, cpar: np.ndarray, grid: np.ndarray,
    prior: np.ndarray, calibrates: bool, state: tuple, req: np.ndarray, fi: np.ndarray, pos: np.ndarray,
    occ: int, kv: int,
    meth: np.ndarray, k: np.ndarray, a: np.ndarray, prod_raw: np.ndarray,
) -> None:  # fmt: skip
    """AdaptiveRule.decide and .observe for one engine step's running requests (not gated): fills meth, k,
    the acceptance a at the position and the tokens produced (uncapped). state: (s, f, cal, pending, the
    lookups' survival rows, each request's model-based rate and row)."""
    s, f, cal, pending, rows, last, last_rows = state
    nm, n = len(kmax), len(req)
    raw = np.zeros((nm, n, max(kmax.max(), 1)))
    caps = np.zeros((nm, n), np.int64)
    for j in range(nm):
        if is_probe[j]:
            lookup_survival(
                acc[j], npr[j], has_npr[j], counts[j], fi, pos, kmax[j], prior[0], prior[1], rows[j], raw[j]
            )
            for r in range(n):
                caps[j, r] = npr[j, fi[r]] if has_npr[j] else 0
        else:
            model_survival(s[j], f[j], req, kmax[j], last[j], last_rows[j], raw[j])
    surv = calibrated(raw, kmax, is_probe, cal, calibrates)
    batch_choice(surv, kmax, is_probe, form, dpar, caps, has_npr & is_probe, occ, kv, cpar, grid, 3, meth, k)
    finish_step(acc, fi, req, kmax, is_probe, calibrates, raw, state, meth, k, a, prod_raw)


@jit
def finish_step(
    acc: np.ndarray, fi: np.ndarray, req: np.ndarray, kmax: np.ndarray, is_probe: np.ndarray,
    calibrates: bool, raw: np.ndarray, state: tuple, meth: np.ndarray, k: np.ndarray, a: np.ndarray,
    prod_raw: np.ndarray,
) -> None:  # fmt: skip
    """After the choice: the acceptance at the position and the tokens produced, AdaptiveBase.predict
    (from the uncalibrated estimates `raw`), then .observe (learn, calibrate_with)."""
    s, f, cal, pending = state[0], state[1], state[2], state[3]
    nm, n = len(kmax), len(req)
    for r in range(n):
        m = meth[r]
        a[r] = acc[m, fi[r]] if m >= 0 else 1
        prod_raw[r] = min(a[r], k[r] + 1)
        if calibrates:  # predict: the uncalibrated estimate of the drafts a lookup's choice gets accepted
            pred = 0.0
            if m >= 0 and k[r] > 0 and is_probe[m]:
                cum = 0.0
                for q in range(min(k[r], kmax[m])):
                    cum += raw[m, r, q]
                pred = cum
            pending[req[r]] = pred
    # observe: learn (model-based estimates), then calibrate_with
    for r in range(n):
        m = meth[r]
        if m >= 0 and not is_probe[m]:
            got = prod_raw[r] - 1
            s[m, req[r]] = MB_DECAY * s[m, req[r]] + got
            f[m, req[r]] = MB_DECAY * f[m, req[r]] + (1.0 if got < k[r] else 0.0)
    if calibrates:
        vals = np.empty(n)
        for j in range(nm):
            if not is_probe[j]:
                continue
            cnt, got_sum = 0, 0
            for r in range(n):
                if meth[r] == j and k[r] > 0 and not np.isnan(pending[req[r]]):
                    vals[cnt] = pending[req[r]]
                    got_sum += prod_raw[r] - 1
                    cnt += 1
            if cnt:
                d = math.pow(CAL_DECAY, float(cnt))
                cal[j, 0] *= d
                cal[j, 1] *= d
                cal[j, 0] += pairwise_sum(vals, cnt)
                cal[j, 1] += float(got_sum)
        for r in range(n):
            pending[req[r]] = np.nan
