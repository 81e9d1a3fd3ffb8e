"""adaptive-gated's gate (AdaptiveBase.gate / gate_done) for the compiled loop: which requests run their
probes at a step, what an unprobed position reads as (-1), and which requests go dormant after it. As
rule_kernel, operation for operation in numpy's order (tests/test_compiled_policy.py compares the loops)."""

from __future__ import annotations

import numpy as np

from speclab.policy.adaptive import COPY_PRIOR, COPY_START, GATE_RING, REPROBE, START_PRIOR, START_WEIGHT
from speclab.policy.pooling import FIRST_WEIGHT, HINDSIGHT, RATE_WINDOW
from speclab.simulate.rule_kernel import (
    STAMP,
    batch_choice,
    calibrated,
    finish_step,
    geometric_row,
    jit,
    model_survival,
)

INT64_MAX = np.iinfo(np.int64).max


@jit
def frozen_stamp() -> int:
    """rule_kernel.STAMP as this module's compiled code holds it."""
    return STAMP


@jit
def windows(
    acc: np.ndarray, npr: np.ndarray, has_npr: bool, fi: np.ndarray, pos: np.ndarray, req: np.ndarray,
    ring_q: np.ndarray, ring_f: np.ndarray, hind: np.ndarray, offs: np.ndarray,
) -> None:  # fmt: skip
    """StepView.hindsight / past_offers over RATE_WINDOW, -1 where q < 0 or the policy did not probe q."""
    for r in range(len(req)):
        for d in range(1, RATE_WINDOW + 1):
            q = pos[r] - d
            h, o = -1, -1
            if q >= 0:
                h = min(acc[fi[r] - d] - 1, d)
                o = npr[fi[r] - d] if has_npr else -1
            col = q % GATE_RING
            if ring_q[req[r], col] == q and not ring_f[req[r], col]:
                h, o = -1, -1
            hind[r, d - 1], offs[r, d - 1] = h, o


@jit
def gate(
    req: np.ndarray, pos: np.ndarray, gst: tuple, hind: np.ndarray, probes: np.ndarray, probe: np.ndarray,
    incopy: np.ndarray,
) -> None:  # fmt: skip
    """AdaptiveBase.gate after the ring is brought up to date (ring_update): fills probe and incopy."""
    ring_q, ring_f, prev_pos, prev_probed, last_probe, dormant = gst
    for r in range(len(req)):
        q = req[r]
        inc = False
        for j in probes:
            inc = inc or hind[j, r, 0] >= 1
        incopy[r] = inc
        probe[r] = (not dormant[q]) or (pos[r] - last_probe[q] >= REPROBE) or inc
        if probe[r]:
            last_probe[q] = pos[r]
        prev_pos[q] = pos[r]
        prev_probed[q] = probe[r]


@jit
def ring_update(req: np.ndarray, pos: np.ndarray, gst: tuple) -> None:
    """The previous decision's probe flag over the positions it covered (prev_pos .. pos - 1)."""
    ring_q, ring_f, prev_pos, prev_probed = gst[0], gst[1], gst[2], gst[3]
    for r in range(len(req)):
        q, pp = req[r], prev_pos[req[r]]
        if pp < 0:
            continue
        for d in range(1, min(pos[r] - pp, GATE_RING) + 1):
            ring_q[q, (pos[r] - d) % GATE_RING] = pos[r] - d
            ring_f[q, (pos[r] - d) % GATE_RING] = prev_probed[q]


@jit
def lookup_rows(
    hind: np.ndarray, offs: np.ndarray, has_npr: bool, km: int, f0: float, c0: float, rows: np.ndarray,
    out: np.ndarray,
) -> None:  # fmt: skip
    """AdaptiveBase.free_survival from the masked window (rows cached by (run, hits, tries))."""
    w = COPY_PRIOR + 1.0
    for r in range(hind.shape[0]):
        run = HINDSIGHT
        for d in range(1, HINDSIGHT + 1):
            if hind[r, d - 1] != d:
                run = d - 1
                break
        hit, tried = 0, 0
        for d in range(RATE_WINDOW):
            hit += hind[r, d] >= 1
            tried += (offs[r, d] > 0) if has_npr else (hind[r, d] >= 0)
        key = run if run >= 1 else HINDSIGHT + 1 + hit * (RATE_WINDOW + 1) + tried
        if rows[key, 0] < 0:
            first = (hit + FIRST_WEIGHT * f0) / (tried + FIRST_WEIGHT)
            cont = min((run + w * c0) / (run + w), max(0.95, c0))
            geometric_row(cont if run >= 1 else first, km, rows[key])
        out[r, :km] = rows[key, :km]


@jit
def copy_starts(hind: np.ndarray, probes: np.ndarray) -> np.ndarray:
    """AdaptiveBase.copy_starts: per request, the shrunk rate of copy starts among its probed positions."""
    n = hind.shape[1]
    out = np.zeros(n)
    for r in range(n):
        starts, seen = 0.0, 0.0
        for j in probes:
            st, sn = 0, 0
            for d in range(COPY_START, RATE_WINDOW + 1):
                h = hind[j, r, d - 1]
                prev = hind[j, r, d] if d < RATE_WINDOW else -1
                if h >= 0:
                    sn += 1
                    st += h >= COPY_START and prev < 1
            starts, seen = max(starts, float(st)), max(seen, float(sn))
        out[r] = (starts + START_WEIGHT * START_PRIOR) / (seen + START_WEIGHT)
    return out


@jit
def decide_observe_gated(
    acc: np.ndarray, npr: np.ndarray, has_npr: np.ndarray, kmax: np.ndarray, is_probe: np.ndarray,
    form: np.ndarray, dpar: np.ndarray, cpar: np.ndarray, grid: np.ndarray, prior: np.ndarray,
    calibrates: bool, state: tuple, gst: tuple, req: np.ndarray, fi: np.ndarray, pos: np.ndarray, occ: int,
    kv: int, meth: np.ndarray, k: np.ndarray, a: np.ndarray, prod_raw: np.ndarray, probe: np.ndarray,
) -> None:  # fmt: skip
    """rule_kernel.decide_observe for a gating policy: gate, the estimates from what was probed, the choice,
    gate_done's two further choices (as if every lookup offered all it may; as if each were in a copy) and
    who goes dormant, then the outcome. Fills probe (the rows whose probes ran) besides."""
    s, f, cal, rows, last, last_rows = state[0], state[1], state[2], state[4], state[5], state[6]
    nm, n, km_all = len(kmax), len(req), max(kmax.max(), 1)
    probes = np.flatnonzero(is_probe)
    ring_update(req, pos, gst)
    hind = np.full((nm, n, RATE_WINDOW), -1, np.int64)
    offs = np.full((nm, n, RATE_WINDOW), -1, np.int64)
    for j in probes:
        windows(acc[j], npr[j], has_npr[j], fi, pos, req, gst[0], gst[1], hind[j], offs[j])
    incopy = np.zeros(n, np.bool_)
    gate(req, pos, gst, hind, probes, probe, incopy)
    free = np.zeros((nm, n, km_all))  # offered=False: before the offer cap and the probe mask
    for j in range(nm):
        if is_probe[j]:
            lookup_rows(hind[j], offs[j], has_npr[j], kmax[j], prior[0], prior[1], rows[j], free[j])
        else:
            model_survival(s[j], f[j], req, kmax[j], last[j], last_rows[j], free[j])
    raw = free.copy()
    caps = np.zeros((nm, n), np.int64)
    for j in probes:
        for r in range(n):
            for q in range(kmax[j]):
                if (has_npr[j] and q >= npr[j, fi[r]]) or not probe[r]:
                    raw[j, r, q] = 0.0
            if probe[r]:
                caps[j, r] = npr[j, fi[r]] if has_npr[j] else INT64_MAX
    surv = calibrated(raw, kmax, is_probe, cal, calibrates)
    batch_choice(surv, kmax, is_probe, form, dpar, caps, is_probe, occ, kv, cpar, grid, 3, meth, k)
    nocap = np.zeros(nm, np.bool_)
    freec = calibrated(free, kmax, is_probe, cal, calibrates)
    fm, fk = np.zeros(n, np.int64), np.zeros(n, np.int64)
    batch_choice(freec, kmax, is_probe, form, dpar, caps, nocap, occ, kv, cpar, grid, 3, fm, fk)
    cs = freec.copy()  # AdaptiveBase.copy_survival for the lookups
    w = COPY_PRIOR + 1.0
    c0 = COPY_PRIOR / w
    for j in probes:
        for r in range(n):
            geometric_row(min((1 + w * c0) / (1 + w), max(0.95, c0)), kmax[j], cs[j, r])
    cm_, ck = np.zeros(n, np.int64), np.zeros(n, np.int64)
    batch_choice(calibrated(cs, kmax, is_probe, cal, calibrates), kmax, is_probe, form, dpar, caps, nocap,
                 occ, kv, cpar, grid, 3, cm_, ck)  # fmt: skip
    gate_done(req, gst, hind, offs, has_npr, probes, kmax, cpar[6], freec, fm, fk, cm_, ck, incopy)
    finish_step(acc, fi, req, kmax, is_probe, calibrates, raw, state, meth, k, a, prod_raw)


@jit
def gate_done(
    req: np.ndarray, gst: tuple, hind: np.ndarray, offs: np.ndarray, has_npr: np.ndarray, probes: np.ndarray,
    kmax: np.ndarray, cost: float, free: np.ndarray, fm: np.ndarray, fk: np.ndarray, cm_: np.ndarray,
    ck: np.ndarray, incopy: np.ndarray,
) -> None:  # fmt: skip
    """AdaptiveBase.gate_done: which requests stay awake (the rest go dormant)."""
    dormant = gst[5]
    n = len(req)
    starts = copy_starts(hind, probes)
    awake = np.zeros(n, np.bool_)
    for r in range(n):
        often = starts[r] * 0.75 * REPROBE / 2 >= cost * (1 - 1 / REPROBE)
        pays = cm_[r] >= 0 and ck[r] > 0
        if pays:
            pays = False
            for j in probes:
                pays = pays or cm_[r] == j
        awake[r] = incopy[r] or (often and pays)
    for j in probes:
        for r in range(n):
            if fm[r] != j or fk[r] <= 0:
                continue
            gain = 0.0
            for q in range(min(fk[r], kmax[j])):
                gain += free[j, r, q]
            if has_npr[j]:
                got, seen = 0, 0
                for d in range(RATE_WINDOW):
                    got += offs[j, r, d] > 0
                    seen += offs[j, r, d] >= 0
                gain = gain * (got + 1.0) / (seen + 2.0)
            awake[r] = awake[r] or gain >= cost
    for r in range(n):
        dormant[req[r]] = not awake[r]
