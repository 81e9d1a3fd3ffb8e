"""`adaptive-gated`: probes run only for requests that may use a lookup; the simulator charges
probes per probed request; the live driver skips the lookups it was told to skip and feeds the suffix cache
anyway."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from speclab.costmodel import get_cost_model
from speclab.costmodel.model import CostModel, DraftCost
from speclab.errors import ConfigError
from speclab.live.driver import AdaptiveDriver
from speclab.live.play import play_engine
from speclab.policy import bind_methods
from speclab.policy.adaptive import GATE_MIN_COST, REPROBE
from speclab.policy.core import StepView
from speclab.simulate import fast, make_policy, simulate
from speclab.simulate.coupled import run_steps_coupled
from speclab.traces import MethodTrace, RequestTrace
from test_adaptive_live import (  # tests/ is on sys.path
    MAX_LEN,
    assert_records_match_replay,
    chat_request,
    copy_request,
    cpu_like,
    rejecting_request,
)


def flat(n: int = 4, L: int = 120) -> list[RequestTrace]:
    """Nothing is ever accepted and n-gram offers nothing: every lookup is wasted."""
    return [
        RequestTrace(id=f"z{i}", workload="w", category="chat", prompt_len=200, output_len=L,
                     methods={"ngram": MethodTrace(k_max=20, acc_len=np.ones(L, np.int64),
                                                   num_proposed=np.zeros(L, np.int64))})
        for i in range(n)
    ]  # fmt: skip


def late_copy(L: int = 120, start: int = 40, stop: int = 100) -> RequestTrace:
    """No match before `start`; from there a copy the n-gram lookup predicts to its end at `stop`."""
    acc = np.ones(L, np.int64)
    npv = np.zeros(L, np.int64)
    for q in range(start, stop):
        acc[q] = 1 + min(20, stop - q)
        npv[q] = 20
    return RequestTrace(id="c", workload="w", category="code", prompt_len=300, output_len=L,
                        methods={"ngram": MethodTrace(k_max=20, acc_len=acc, num_proposed=npv)})  # fmt: skip


CPU = "smollm2-135m-cpu-live"  # its probes cost 1.5% of the verify each: gated


def decisions(spec: str, traces: list[RequestTrace], cm: CostModel | str = CPU, batch: int = 16):
    """The step table of `spec` over `traces` replicated to fill `batch` slots (all in step)."""
    cm = get_cost_model(cm)
    p = make_policy(spec)
    bind_methods([p], traces, cm)
    p.cost_model = cm
    ta = fast.prepare(traces * batch, set(p.methods))
    _, st = run_steps_coupled(ta, p, "continuous", batch, False)
    return st


def test_registered_and_gated_only_where_asked():
    assert make_policy("adaptive-gated").GATED
    assert not make_policy("adaptive").GATED and not make_policy("adaptive-pooled").GATED


def test_unused_lookups_are_probed_every_reprobe_positions_and_charged_so():
    tr = flat(16)
    st = decisions("adaptive-gated:ngram", tr[:1])
    # every step probes until a few positions show no copy starts (the prior's weight); from then on each
    # request is dormant and probed every REPROBE positions
    for r in range(16):
        probed = st.pos[(st.req == r) & st.probed]
        assert probed[0] == 1 and probed[-1] > 100
        gaps = np.diff(probed[probed >= 12])
        assert gaps.size > 20 and np.all(gaps == REPROBE), gaps
    g, a = (simulate(tr, CPU, [s], "static", [16])[0] for s in ("adaptive-gated:ngram", "adaptive:ngram"))
    share = st.probed.mean()
    # the same steps, verify and speedup ordering; the probe charge falls to the probed share
    assert g.time_split_s["verify"] == pytest.approx(a.time_split_s["verify"])
    assert g.time_split_s["propose"] == pytest.approx(share * a.time_split_s["propose"], rel=0.05)
    assert g.speedup > a.speedup


def test_a_copy_that_starts_while_dormant_is_caught_within_reprobe():
    tr = [late_copy()]
    st = decisions("adaptive-gated:ngram", tr)
    drafted = st.pos[(st.meth == 0) & (st.k > 0)]
    assert drafted.size and 40 <= drafted[0] <= 40 + REPROBE + 1
    # inside the copy the lookup runs at every step
    inside = (st.pos > drafted[0]) & (st.pos < 95)
    assert st.probed[inside].all()
    g, a = (
        simulate(tr * 16, CPU, [s], "static", [16])[0] for s in ("adaptive-gated:ngram", "adaptive:ngram")
    )
    assert g.speedup > 0.95 * a.speedup


def test_hindsight_at_unprobed_positions_reads_unknown():
    """What a gated policy sees at a position it did not probe is -1, never the trace's value."""
    tr = [late_copy(120, 70, 110)]
    p = make_policy("adaptive-gated:ngram")
    bind_methods([p], tr, get_cost_model(CPU))
    p.cost_model = get_cost_model(CPU)
    ta = fast.prepare(tr * 16, {"ngram"})
    seen: list[tuple[int, np.ndarray, np.ndarray]] = []
    inner = p.decide

    def spy(view: StepView):
        m, k = inner(view)
        seen.append((int(view.pos[0]), p.hindsight(view, "ngram", 8)[0], view.probed.copy()))
        return m, k

    p.decide = spy  # type: ignore[method-assign]
    run_steps_coupled(ta, p, "continuous", 16, False)
    flags = {pos: bool(pr[0]) for pos, _, pr in seen}
    checked = 0
    for pos, h, _ in seen:
        for d in range(1, 9):
            q = pos - d
            if q >= 1 and q in flags and not flags[q]:
                assert h[d - 1] == -1
                checked += 1
    assert checked > 0


def test_drafting_from_a_lookup_not_run_is_refused():
    class Cheat:
        spec, methods, probes = "cheat", ("ngram",), ("ngram",)

    v = StepView(np.arange(2), np.ones(2, np.int64), np.zeros(2, np.int64), {}, None)
    v.probed = np.array([True, False])
    with pytest.raises(ConfigError, match="did not run"):
        fast.check_probed(Cheat(), v, np.array([0, 0]), np.array([3, 2]))  # type: ignore[arg-type]
    fast.check_probed(Cheat(), v, np.array([0, -1]), np.array([3, 0]))  # type: ignore[arg-type]


def test_cheap_probes_are_never_gated():
    """Under the H100 preset (probes at 0.59% of a step) adaptive-gated is the rule, decision for decision."""
    tr = flat(3) + [late_copy()]
    cm = get_cost_model("llama3.1-8b-h100-chained")
    assert cm.draft["ngram"].fraction < GATE_MIN_COST
    a, g = (decisions(s, tr, cm, 4) for s in ("adaptive:ngram", "adaptive-gated:ngram"))
    assert np.array_equal(a.meth, g.meth) and np.array_equal(a.k, g.k) and g.probed.all()


@pytest.mark.parametrize("batching", ["replicate", "continuous"])
def test_gated_floor_where_nothing_pays(batching):
    """Under the CPU live cost model every probe costs 1.5% of a step: ungated, two probes alone put a
    policy below 0.98x where SD never pays; gated, it stays at or above 0.98x at every batch size."""
    tr = flat(12, 200)
    for t in tr:
        t.methods["suffix"] = t.methods["ngram"]
    res = simulate(tr, "smollm2-135m-cpu-live", ["adaptive-gated", "adaptive"], batching, [1, 4, 16])
    by = {(r.policy, r.batch_size): r.speedup for r in res}
    for b in (1, 4, 16):
        assert by[("adaptive-gated", b)] >= 0.98, (b, by)
        assert by[("adaptive-gated", b)] > by[("adaptive", b)]


# --- live driver ---------------------------------------------------------------------------------------------
def gated(methods=("ngram", "suffix"), **kw) -> AdaptiveDriver:
    kw.setdefault("cost_model", cpu_like())
    return AdaptiveDriver(kmax=8, max_model_len=MAX_LEN, methods=methods, policy="adaptive-gated", **kw)


def test_live_skips_lookups_where_unused_and_keeps_copies():
    pytest.importorskip("arctic_inference")
    d = gated()
    reqs = [chat_request(s) for s in range(3)]  # no copies: the lookups never offer
    play_engine(d, reqs, 4, max_len=MAX_LEN)
    assert d.probe_rows["skipped"] > 2 * d.probe_rows["probed"]  # most rows are not probed
    d = gated()
    reqs = [copy_request(s) for s in range(3)]
    log = play_engine(d, reqs, 1, max_len=MAX_LEN)
    ks = [dr for lg in log.values() for dr, _ in lg]
    acc = [a for lg in log.values() for _, a in lg]
    assert max(ks) == 8 and sum(acc) / sum(ks) > 0.6
    assert sum(len(lg) for lg in log.values()) < sum(len(o) for _, o in reqs) / 2


def test_live_records_at_probed_positions_match_the_replay():
    """Where the gated driver ran its lookups, what it recorded equals the per-position replay's: skipping a
    step leaves the suffix cache and the n-gram context complete."""
    pytest.importorskip("arctic_inference")

    d = gated(suffix={"max_cached_requests": 0})
    prompt, out = copy_request(4)
    prompt2, _ = rejecting_request(2)
    # a stretch without copies first (the request goes dormant), then the copy
    prompt = prompt + prompt2
    out = [int(x) for x in np.random.default_rng(9).integers(60000, 90000, 30)] + out[:80]
    ran: dict[str, list[int]] = {m: [] for m in d.probes}
    holder: dict[str, object] = {}
    for m, fn in list(d.probes.items()):

        def wrapped(req, row, sampled, n, fn=fn, m=m):
            ran[m].append(req.pos)
            holder["r"] = req
            return fn(req, row, sampled, n)

        d.probes[m] = wrapped
    play_engine(d, [(prompt, out)], 1, max_len=MAX_LEN)
    assert d.probe_rows["skipped"] > 0
    assert_records_match_replay(holder["r"], prompt, out, ran)


@pytest.mark.parametrize("batching", ["replicate", "static", "continuous"])
def test_fast_equals_reference_while_gating(batching):
    """The vectorised engines and the reference loop charge gated probes alike (per probed request)."""
    from test_simulate_adaptive import random_traces, same

    tr = random_traces(11, 13, True)
    aggs = ("total", "study") if batching == "replicate" else ("total",)
    specs = ["adaptive-gated", "adaptive-gated:ngram:6"]
    for agg in aggs:
        kw = dict(aggregate=agg, switch_overhead=1e-3)
        f = simulate(tr, CPU, specs, batching, [1, 3, 8], **kw)
        r = simulate(tr, CPU, specs, batching, [1, 3, 8], engine="reference", **kw)
        same(f, r)


@pytest.mark.parametrize("cut", [3, 11])
def test_gated_decisions_do_not_depend_on_future_positions(cut):
    """As test_simulate_adaptive's no-future test, with gating active (the CPU model's dear probes); one slot
    (at B > 1 a request's decisions legitimately depend on its batch mates' whole state)."""
    from test_simulate_adaptive import random_traces

    tr = random_traces(7, 10, True)

    def run(traces):
        # probes at 5% of a step (an H100 preset with dear lookups): requests go dormant also at B = 1
        cm = get_cost_model("llama3.1-8b-h100-chained")
        cm = replace(cm, draft={**cm.draft, "ngram": DraftCost("verify_fraction", fraction=0.05)})
        p = make_policy("adaptive-gated")
        bind_methods([p], traces, cm)
        p.cost_model = cm
        log: list[tuple] = []
        inner = p.decide

        def decide(view):
            m, k = inner(view)
            log.extend(
                zip(
                    view.req.tolist(),
                    view.pos.tolist(),
                    m.tolist(),
                    k.tolist(),
                    view.probed.tolist(),
                    strict=True,
                )
            )
            return m, k

        p.decide = decide  # type: ignore[method-assign]
        run_steps_coupled(fast.prepare(traces, set(p.methods)), p, "continuous", 1, False)
        return log

    log = run(tr)
    assert any(not x[4] for x in log)  # some rows were not probed
    rng = np.random.default_rng(5)
    for r in tr:
        for m in ("ngram", "eagle"):
            t = r.methods[m]
            a, npv = t.acc_len.copy(), None if t.num_proposed is None else t.num_proposed.copy()
            a[cut:] = rng.integers(1, 9, max(0, len(a) - cut))
            if npv is not None:
                npv[cut + 1 :] = rng.integers(0, 9, max(0, len(npv) - cut - 1))
            r.methods[m] = MethodTrace(k_max=8, acc_len=a, num_proposed=npv)
    before = sorted(x for x in log if x[1] <= cut)
    assert before == sorted(x for x in run(tr) if x[1] <= cut) and before


def lookup_traces(acc: np.ndarray, n: int = 16) -> list[RequestTrace]:
    L = len(acc)
    return [
        RequestTrace(id=f"s{i}", workload="w", category="code", prompt_len=100, output_len=L,
                     methods={"ngram": MethodTrace(k_max=8, acc_len=acc.astype(np.int64),
                                                   num_proposed=np.full(L, 8))})
        for i in range(n)
    ]  # fmt: skip


def calibrated_policy(tr: list[RequestTrace], batch: int):
    cm = get_cost_model(CPU)
    p = make_policy("adaptive-gated:ngram:8")
    bind_methods([p], tr, cm)
    p.cost_model = cm
    run_steps_coupled(fast.prepare(tr, {"ngram"}), p, "continuous", batch, False)
    return p


def test_calibration_follows_what_the_lookup_drafts_get():
    """Short copies (one or two tokens, where hindsight promises the rule's long continuation): the factor
    falls below 1; long exact copies: it rises above 1; only the engine's own outcomes are used."""
    L = 240
    q = np.arange(L)
    short = np.where(q % 2 == 0, 3, 1)  # a two-token match every other position, nothing between
    long = np.minimum(9, 60 - q % 60)  # copies of 60 tokens, all drafts right
    assert calibrated_policy(lookup_traces(short), 4).calibration(0) < 0.9
    assert calibrated_policy(lookup_traces(long), 4).calibration(0) > 1.0
