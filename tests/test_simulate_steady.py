"""Continuous batching: steady state (all B slots busy, requests re-admitted) beside the single pass's
makespan, and the warning when the tail (fewer than B running) is a large share of the makespan."""

import numpy as np
import pytest

from speclab.simulate import fast, simulate
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
