"""Continuous batching: steady state (all B slots busy, requests re-admitted) beside the single pass's
makespan, and the warning when the tail (fewer than B running) is a large share of the makespan."""

import numpy as np
import pytest

from speclab.simulate import costs, fast, simulate
from speclab.traces import MethodTrace, RequestTrace


def traces(
    n: int = 120, runaways: tuple[int, ...] = (), long: int = 3000, seed: int = 3
) -> list[RequestTrace]:
    """Short requests with modest n-gram acceptance; runaways: very long, repetitive (high acceptance), as
    generations that loop until max_tokens."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        L = long if i in runaways else int(rng.integers(30, 120))
        ng = (
            rng.integers(8, 22, L)
            if i in runaways
            else np.where(rng.random(L) < 0.15, rng.integers(3, 12, L), rng.integers(1, 3, L))
        )
        out.append(RequestTrace(id=f"r{i}", workload="instructcoder", category="code-editing",
                                prompt_len=int(rng.integers(50, 400)), output_len=L, methods={"ngram": MethodTrace(20, ng)}))  # fmt: skip
    return out


def test_one_slot_steady_state_equals_makespan():
    # one slot is always busy, and re-admitting the same requests repeats the same work
    res = simulate(
        traces(40), "llama3.1-8b-h100", ["none", "oracle:ngram", "fixed:ngram:3"], "continuous", [1]
    )
    for r in res:
        assert r.throughput_tok_s == pytest.approx(r.makespan_throughput_tok_s, rel=1e-9)
        assert r.speedup == pytest.approx(r.makespan_speedup, rel=1e-9) and r.tail_share == 0.0


def test_runaway_tail_inflates_the_makespan_speedup_not_the_steady_state():
    tr = traces(120, runaways=(10, 70), long=3000)
    sizes = [1, 2, 4, 8, 16, 32]
    res = [r for r in simulate(tr, "llama3.1-8b-h100", ["none", "oracle:ngram"], "continuous", sizes)
           if r.policy == "oracle:ngram"]  # fmt: skip
    steady = [r.speedup for r in res]
    makespan = [r.makespan_speedup for r in res]
    # the makespan figure rises with B (two runaways finish alone, at batch 1-2, where SD gains most) ...
    assert makespan[-1] > 1.3 * makespan[0]
    # ... the steady state does not rise (more running requests: verification costs more)
    assert all(b <= a + 1e-9 for a, b in zip(steady, steady[1:], strict=False))
    assert res[-1].tail_share > 0.3
    assert any("B=32: fewer than 32 requests run for up to" in n for n in res[0].notes)
    assert not any("B=1:" in n for n in res[0].notes)


def test_measure_option_and_other_modes():
    tr = traces(30, runaways=(3,), long=600)
    r = simulate(tr, "llama3.1-8b-h100", ["oracle:ngram"], "continuous", [8], continuous_measure="makespan")[
        0
    ]
    assert r.throughput_tok_s == r.makespan_throughput_tok_s and r.speedup == r.makespan_speedup
    s = simulate(tr, "llama3.1-8b-h100", ["oracle:ngram"], "continuous", [8])[0]
    assert (
        s.makespan_throughput_tok_s == r.makespan_throughput_tok_s
        and s.throughput_tok_s != r.throughput_tok_s
    )
    for batching in ("replicate", "static"):
        x = simulate(tr, "llama3.1-8b-h100", ["oracle:ngram"], batching, [8])[0]
        assert x.tail_share is None and x.makespan_speedup == x.speedup


def test_steady_passes_rule():
    out_len = np.array([100] * 99 + [1000])
    passes, capped = fast.steady_passes(out_len, 1)
    assert passes == 1 and not capped  # 8 * 1 * 1000 / 10900 < 1
    passes, capped = fast.steady_passes(out_len, 16)
    assert passes == int(np.ceil(8 * 16 * 1000 / 10900)) and not capped
    passes, capped = fast.steady_passes(np.array([1_500_000, 10]), 4)
    assert passes == 1 and capped


def _uniform_desync(n: int = 24, out_len: int = 80, prompt: int = 400, seed: int = 5) -> list[RequestTrace]:
    """Requests of one length whose n-gram acceptance varies: without SD they run in lockstep waves, with it
    their ends spread apart (the steady window then cuts through requests in progress)."""
    rng = np.random.default_rng(seed)
    return [
        RequestTrace(id=f"u{i}", workload="chat", category="chat", prompt_len=prompt, output_len=out_len,
                     methods={"ngram": MethodTrace(20, np.where(rng.random(out_len) < 0.3,
                                                                rng.integers(2, 6, out_len), 1))})
        for i in range(n)
    ]  # fmt: skip


def test_steady_state_does_not_depend_on_the_window_length(monkeypatch):
    # each prefill is charged over its request's tokens (costs.prefill_charges): the window's figure no
    # longer carries the prefills of the requests its end cuts through, so 4 requests per slot give what
    # 40 give; the busy window's own tokens over its time (the previous figure) moves by > 1%
    tr = _uniform_desync()
    ta = fast.prepare(tr, {"ngram"})
    from speclab.costmodel import get_cost_model
    from speclab.policy.core import make_policy

    cm = get_cost_model("smollm2-135m-cpu-live")
    got, busy = {}, {}
    for per_slot in (4, 40):
        monkeypatch.setattr(fast, "STEADY_REQUESTS_PER_SLOT", per_slot)
        res = simulate(tr, cm, ["none", "fixed:ngram:3"], "continuous", [8])
        got[per_slot] = res[1].speedup
        passes, _ = fast.steady_passes(ta.out_len, 8)
        tm = {}
        for spec in ("none", "fixed:ngram:3"):
            p = make_policy(spec)
            st = fast.baseline_steps(ta) if spec == "none" else fast.run_steps(ta, p, 8, False, "continuous")
            tx, sx = fast.repeat_requests(ta, st, passes)
            tm[spec] = costs.step_costs(sx, p, tx, cm, "continuous", 8, None, 0.0)
        busy[per_slot] = (tm["fixed:ngram:3"].full_tokens / tm["fixed:ngram:3"].busy_s) / (
            tm["none"].full_tokens / tm["none"].busy_s
        )
        assert got[per_slot] == pytest.approx(
            (tm["fixed:ngram:3"].full_tokens / tm["fixed:ngram:3"].full_s)
            / (tm["none"].full_tokens / tm["none"].full_s),
            rel=1e-9,
        )
    assert got[4] == pytest.approx(got[40], rel=3e-3)
    assert abs(busy[4] / busy[40] - 1) > 0.01 and busy[4] < got[4]


def test_steady_prefill_charges_match_the_reference():
    tr = _uniform_desync(n=12, out_len=30)
    a = simulate(tr, "smollm2-135m-cpu-live", ["none", "fixed:ngram:2"], "continuous", [4])
    b = simulate(
        tr, "smollm2-135m-cpu-live", ["none", "fixed:ngram:2"], "continuous", [4], engine="reference"
    )
    for x, y in zip(a, b, strict=True):
        assert x.throughput_tok_s == pytest.approx(y.throughput_tok_s, rel=1e-9)
        assert x.tail_share == pytest.approx(y.tail_share, abs=1e-12)


def test_lookup_charged_on_the_forward_without_its_prefills():
    # continuous batching mixes prefills into decode steps; a lookup runs over the running requests'
    # context, so its fraction is charged on the forward without the prompts being prefilled: with no KV
    # term, the n-gram charge does not move with the prompts' length while the verify time does
    from speclab.costmodel.model import CostModel

    cm = CostModel.from_toml(
        'name = "flat-kv"\n[target]\nkv = 0.0\nbatched = 2e-5\nconst = 5e-3\n'
        "[overhead]\nper_step = 1e-3\nswitch = 0.0\n"
        '[draft.ngram]\nform = "verify_fraction"\nfraction = 0.01\n',
        "flat-kv.toml",
    )
    base = _uniform_desync(n=12, out_len=30)
    runs = {}
    for mult in (1, 4):
        tr = [RequestTrace(id=t.id, workload=t.workload, category=t.category, prompt_len=t.prompt_len * mult,
                           output_len=t.output_len, methods=t.methods) for t in base]  # fmt: skip
        runs[mult] = simulate(tr, cm, ["fixed:ngram:3"], "continuous", [4])[0]
        ref = simulate(tr, cm, ["fixed:ngram:3"], "continuous", [4], engine="reference")[0]
        assert runs[mult].time_split_s["propose"] == pytest.approx(ref.time_split_s["propose"], rel=1e-9)
    assert runs[4].time_split_s["verify"] > 1.5 * runs[1].time_split_s["verify"]
    assert runs[4].time_split_s["propose"] == pytest.approx(runs[1].time_split_s["propose"], rel=1e-9)
