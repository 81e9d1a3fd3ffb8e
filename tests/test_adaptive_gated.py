"""`adaptive-gated` (issue 12): probes run only for requests that may use a lookup; the simulator charges
probes per probed request; the live driver skips the lookups it was told to skip and feeds the suffix cache
anyway."""

from __future__ import annotations

import numpy as np
import pytest

from speclab.costmodel import get_cost_model
from speclab.errors import ConfigError
from speclab.methods.adaptive_live import AdaptiveDriver, play_engine
from speclab.methods.ngram import NgramProposer
from speclab.simulate import fast, make_policy, simulate
from speclab.simulate.adaptive import bind_methods
from speclab.simulate.adaptive.base import REPROBE
from speclab.simulate.coupled import run_steps_coupled
from speclab.simulate.policies import StepView
from speclab.traces import MethodTrace, RequestTrace
from test_adaptive_live import MAX_LEN, copy_request, cpu_like, rejecting_request  # tests/ is on sys.path


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


def decisions(spec: str, traces: list[RequestTrace], cm: str = "llama3.1-8b-h100-chained"):
    p = make_policy(spec)
    bind_methods([p], traces, get_cost_model(cm))
    p.cost_model = get_cost_model(cm)
    ta = fast.prepare(traces, set(p.methods))
    _, st = run_steps_coupled(ta, p, "continuous", 1, False)
    return st


def test_registered_and_gated_only_where_asked():
    assert make_policy("adaptive-gated").GATED
    assert not make_policy("adaptive").GATED and not make_policy("adaptive-pooled").GATED


def test_unused_lookups_are_probed_every_reprobe_positions_and_charged_so():
    tr = flat()
    st = decisions("adaptive-gated:ngram", tr[:1])
    probed = st.pos[st.probed]
    # the first step probes; after it the request is dormant and probed every REPROBE positions
    assert probed[0] == 1 and np.all(np.diff(probed) == REPROBE)
    g, a = (
        simulate(tr, "llama3.1-8b-h100", [s], "static", [4])[0]
        for s in ("adaptive-gated:ngram", "adaptive:ngram")
    )
    share = len(probed) / len(st.pos)
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
    g, a = (simulate(tr, "llama3.1-8b-h100-chained", [s], "continuous", [1])[0]
            for s in ("adaptive-gated:ngram", "adaptive:ngram"))  # fmt: skip
    assert g.speedup > 0.95 * a.speedup


def test_hindsight_at_unprobed_positions_reads_unknown():
    """What a gated policy sees at a position it did not probe is -1, never the trace's value."""
    tr = [late_copy(60, 5, 50)]
    p = make_policy("adaptive-gated:ngram")
    bind_methods([p], tr, get_cost_model("llama3.1-8b-h100-chained"))
    ta = fast.prepare(tr, {"ngram"})
    seen: list[tuple[int, np.ndarray, np.ndarray]] = []
    inner = p.decide

    def spy(view: StepView):
        m, k = inner(view)
        seen.append((int(view.pos[0]), p.hindsight(view, "ngram", 8)[0], view.probed.copy()))
        return m, k

    p.decide = spy  # type: ignore[method-assign]
    run_steps_coupled(ta, p, "continuous", 1, False)
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
    reqs = [rejecting_request(s) for s in range(3)]
    play_engine(d, reqs, 4, max_len=MAX_LEN)
    assert d.probe_rows["skipped"] > d.probe_rows["probed"]  # most rows are not probed
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
    from speclab.methods.suffix import SuffixSpeculator

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
    req = holder["r"]
    replays = {
        "ngram": NgramProposer(max_model_len=MAX_LEN).replay(np.array(prompt), np.array(out), 8),
        "suffix": SuffixSpeculator(max_cached_requests=0).replay(prompt, out, 8, max_model_len=MAX_LEN),
    }
    for m, (acc_replay, nprop) in replays.items():
        h = req.hist[m]  # type: ignore[attr-defined]
        exact = [q for q in ran[m] if q + 8 < len(h.acc)]
        assert len(exact) > 5
        for q in exact:
            assert (h.acc[q], h.off[q]) == (acc_replay[q], nprop[q]), (m, q)
