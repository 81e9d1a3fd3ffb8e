"""The study's sampling rule and heuristics, and simulate() argument checks."""

import random

import numpy as np
import pytest

from speclab.errors import ConfigError, TraceError
from speclab.simulate import simulate
from speclab.simulate.study import match_p_for, study_sample
from speclab.traces import MethodTrace, RequestTrace


def test_study_sample_matches_random_module():
    items = list(range(1000))
    random.seed(42)
    expect = random.sample(items, 300)
    got, note = study_sample(items, 42, 300)
    assert got == expect and note is None
    small, note = study_sample(items[:10], 42, 300)
    assert small == items[:10] and "file order" in note


def test_match_p():
    assert match_p_for("instructcoder", "x") == 0.8
    assert match_p_for("auto", "cnn_dailymail") == 0.4
    assert match_p_for("auto", "ShareGPT_V3") == 0.2
    assert match_p_for("gsm8k", "x") == 0.2
    assert match_p_for(0.3, "x") == 0.3
    with pytest.raises(ConfigError, match="no study match_p"):
        match_p_for("auto", "mystery")


def mk(n, L=8):
    rng = np.random.default_rng(0)
    return [
        RequestTrace(
            id=f"r{i}",
            workload="instructcoder",
            category="code-editing",
            prompt_len=4,
            output_len=L,
            methods={
                "ngram": MethodTrace(20, rng.integers(1, 22, L)),
                "eagle": MethodTrace(20, rng.integers(1, 6, L)),
            },
        )  # fmt: skip
        for i in range(n)
    ]


def test_study_aggregate_uses_sample_and_notes_small_sets():
    res = simulate(mk(5), "llama3.1-8b-h100", ["oracle:eagle"], "replicate", [1], aggregate="study")
    assert res[0].num_requests == 5 and "file order" in res[0].notes[0]
    res = simulate(mk(310), "llama3.1-8b-h100", ["oracle:eagle"], "replicate", [1], aggregate="study")
    assert res[0].num_requests == 300


def test_study_aggregate_is_ratio_of_mean_throughputs():
    tr = mk(3)
    res = simulate(tr, "llama3.1-8b-h100", ["none", "oracle:ngram"], "replicate", [4], aggregate="study")
    # the same step rules (the study's, automatic under aggregate="study" with replicate), one request each
    per = [
        simulate([t], "llama3.1-8b-h100", ["none", "oracle:ngram"], "replicate", [4], rules="study")
        for t in tr
    ]
    base = np.mean([p[0].throughput_tok_s for p in per])
    sd = np.mean([p[1].throughput_tok_s for p in per])
    assert res[1].speedup == pytest.approx(sd / base)
    assert res[1].throughput_tok_s == pytest.approx(sd)


def test_argument_errors():
    tr = mk(3)
    with pytest.raises(ConfigError, match="continuous"):
        simulate(tr, "llama3.1-8b-h100", ["none"], "continuous", [1], aggregate="study")
    with pytest.raises(ConfigError, match="batching"):
        simulate(tr, "llama3.1-8b-h100", ["none"], "dynamic", [1])
    with pytest.raises(ConfigError, match="batch sizes"):
        simulate(tr, "llama3.1-8b-h100", ["none"], "static", [0])
    with pytest.raises(ConfigError, match="unknown cost model"):
        simulate(tr, "nope", ["none"], "static", [1])
    with pytest.raises(ConfigError, match="draft_model"):
        simulate(
            [RequestTrace(id="a", workload="w", category="other", prompt_len=1, output_len=3,
                          methods={"draft_model": MethodTrace(3, [1, 2, 1])})],
            "llama3.1-8b-h100", ["oracle:draft_model"], "static", [1],
        )  # fmt: skip
    with pytest.raises(TraceError, match="no trace for method 'eagle3'"):
        simulate(tr, "llama3.1-8b-h100", ["oracle:eagle3"], "static", [1])


def test_speed_300_requests_six_batch_sizes():
    import time

    rng = np.random.default_rng(1)
    tr = [
        RequestTrace(
            id=f"r{i}",
            workload="instructcoder",
            category="code-editing",
            prompt_len=500,
            output_len=260,
            methods={
                "ngram": MethodTrace(20, rng.integers(1, 22, 260)),
                "eagle": MethodTrace(20, rng.integers(1, 8, 260)),
            },
        )  # fmt: skip
        for i in range(300)
    ]
    t0 = time.perf_counter()
    simulate(tr, "llama3.1-8b-h100", ["oracle-combine:ngram,eagle"], "replicate", [1, 8, 16, 32, 64, 128],
             aggregate="study")  # fmt: skip
    assert time.perf_counter() - t0 < 1.0


def test_step_table_is_linear_in_positions():
    from speclab.policy.core import make_policy
    from speclab.simulate import costs, fast

    tr = mk(50, L=40)
    ta = fast.prepare(tr, {"ngram", "eagle"})
    for pol in ("fixed:eagle:1", "oracle-combine:ngram,eagle", "adaptive-k:ngram"):
        st = fast.run_steps(ta, make_policy(pol), 8, heuristic=False)
        assert len(st.req) <= ta.total_positions - ta.n  # at most one row per position after prefill
    sch = costs.schedule(st.n_steps, "continuous", 8)
    assert sch.num_steps <= len(st.req) + ta.n


def test_miss_generator_continues_the_module_generator_after_sampling():
    from speclab.simulate.study import miss_generator, study_sample_state

    items = list(range(500))
    got, _, state = study_sample_state(items, 42, 300)
    random.seed(42)
    assert got == random.sample(items, 300)
    expect = [random.random() for _ in range(1000)]
    assert miss_generator(state).random_sample(1000).tolist() == expect  # bit for bit
