"""Per-method trace lengths (each method's trace from its own run) and the study's step rules, by hand.

Cost model as in test_simulate_hand.py: target = 0.001*kv + 0.01*batched + 1.0; overhead 0.1 per step;
eagle "linear" = kv_c*kv + 0.05*spec + 0.2; ngram = 0.5 * verify time.
"""

import numpy as np
import pytest

from speclab.costmodel import CostModel, DraftCost, TargetCost
from speclab.errors import ConfigError
from speclab.simulate import simulate
from speclab.traces import MethodTrace, RequestTrace


def cm(eagle_kv: float = 0.0) -> CostModel:
    return CostModel(
        name="hand",
        target=TargetCost(kv=0.001, batched=0.01, const=1.0),
        draft={
            "eagle": DraftCost(form="linear", kv=eagle_kv, num_spec=0.05, const=0.2),
            "ngram": DraftCost(form="verify_fraction", fraction=0.5),
        },
        overhead_per_step=0.1,
    )


# prompt 2; the record's output (the n-gram run) has 4 tokens, the EAGLE run's output 3
A = RequestTrace(
    id="A", workload="toy", category="other", prompt_len=2, output_len=4,
    methods={"ngram": MethodTrace(5, [1, 3, 1, 2]), "eagle": MethodTrace(5, [2, 2, 1])},
)  # fmt: skip


def one(res, policy):
    [r] = [x for x in res if x.policy == policy]
    return r


def test_each_policy_runs_over_its_methods_lengths_against_a_matched_baseline():
    res = simulate(
        [A], cm(), ["none", "oracle:ngram", "oracle:eagle", "oracle-combine:ngram,eagle"], "replicate", [1]
    )
    # none and oracle:ngram: the record's 4 tokens (baseline 4.459, as in test_simulate_hand)
    assert one(res, "none").output_tokens == 4 and one(res, "none").total_time_s == pytest.approx(4.459)
    assert one(res, "oracle:ngram").baseline_throughput_tok_s == pytest.approx(4 / 4.459)
    # oracle:eagle over EAGLE's 3 tokens: pos 1 acc 2 -> done in one step. kv 2, batched 2: 1.022 + drafting
    # 0.05*1 + 0.2 + 0.1. Baseline over 3 tokens: 1.12 + 1.112 + 1.113 = 3.345
    e = one(res, "oracle:eagle")
    assert e.output_tokens == 3 and e.total_time_s == pytest.approx(1.12 + 1.372)
    assert e.baseline_throughput_tok_s == pytest.approx(3 / 3.345)
    assert e.speedup == pytest.approx(3.345 / 2.492)
    # combine: the shorter length (3), acc = max per position = [2, 3, 1]: pos 1 -> n-gram L=3, produces
    # the 2 tokens left (1 rejected). kv 2, batched 3: 1.032 + n-gram 0.516 + 0.1
    c = one(res, "oracle-combine:ngram,eagle")
    assert c.output_tokens == 3 and c.total_time_s == pytest.approx(1.12 + 1.648)
    assert c.speedup == pytest.approx(3.345 / 2.768) and c.tokens_rejected == 1
    assert any("eagle: 1 of 1 request(s) have their own output length" in n for n in c.notes)


def test_common_lengths_put_every_policy_on_the_same_work():
    res = simulate([A], cm(), ["none", "oracle:ngram", "oracle:eagle"], "replicate", [1], lengths="common")
    assert {r.output_tokens for r in res} == {3}
    assert [r.baseline_throughput_tok_s for r in res] == pytest.approx([3 / 3.345] * 3)
    with pytest.raises(ConfigError, match="lengths"):
        simulate([A], cm(), ["none"], "replicate", [1], lengths="longest")


def test_study_rules_by_hand():
    # The study's rules: the first step reads acc_len[0]; a request holds prompt + produced KV tokens;
    # drafting per copy (EAGLE: spec = L, the bonus included).
    res = simulate([A], cm(), ["none", "oracle:ngram", "oracle:eagle", "oracle-combine:ngram,eagle"], "replicate",
                   [1], rules="study")  # fmt: skip
    # baseline (4 tokens): prefill 1.02 + 0.1; decode at kv 3, 4, 5: 1.013, 1.014, 1.015 (+0.1 each) -> 4.462
    assert one(res, "none").total_time_s == pytest.approx(4.462)
    # oracle:ngram: acc[0] = 1 -> L=1 (kv 3, batched 1: 1.013, no drafting); acc[1] = 3 -> L=3 (kv 4, batched
    # 3: 1.034 + 0.517); produced 1 + 1 + 3 = 5 >= 4: done.
    assert one(res, "oracle:ngram").total_time_s == pytest.approx(1.12 + 1.113 + 1.651)
    # oracle:eagle over 3 tokens: acc[0] = 2 -> L=2: kv 3, batched 2: 1.023 + (0.05*2 + 0.2) + 0.1; baseline
    # over 3 tokens 1.12 + 1.113 + 1.114 = 3.347
    e = one(res, "oracle:eagle")
    assert e.total_time_s == pytest.approx(1.12 + 1.423) and e.speedup == pytest.approx(3.347 / 2.543)
    # combine over 3 tokens, acc [2, 3, 1]: acc[0] = 2 -> L=2 (eagle chosen), charged as n-gram 0.5*1.023
    c = one(res, "oracle-combine:ngram,eagle")
    assert c.total_time_s == pytest.approx(1.12 + 1.023 + 0.5115 + 0.1)
    assert c.time_split_s["propose"] == pytest.approx(0.5115)


def test_study_rules_eagle_kv_is_the_per_request_loops_running_count():
    # B=2 copies, EAGLE kv coefficient 0.01. One step (acc[0] = 2 finishes both copies). Copy 0 drafts at the
    # batch's kv 2*3 = 6; it finishes and frees its 3 tokens, so copy 1 drafts at kv 3: mean 4.5.
    # verify kv 6, batched 4: 1.046; drafting 0.01*4.5 + 0.05*2 + 0.2 = 0.345; prefill batched 4: 1.04 + 0.1
    for engine in ("fast", "reference"):
        r = one(simulate([A], cm(eagle_kv=0.01), ["oracle:eagle"], "replicate", [2], rules="study", engine=engine),
                "oracle:eagle")  # fmt: skip
        assert r.total_time_s == pytest.approx(1.14 + 1.046 + 0.345 + 0.1)


def test_study_rules_only_for_replicate():
    with pytest.raises(ConfigError, match="replicate"):
        simulate([A], cm(), ["none"], "static", [1], rules="study")


def test_zero_length_requests_dropped_per_method_before_sampling():
    rng = np.random.default_rng(0)
    recs = [
        RequestTrace(id=f"r{i}", workload="gsm8k", category="math", prompt_len=3, output_len=5,
                     methods={"ngram": MethodTrace(20, rng.integers(1, 4, 5)),
                              "eagle": MethodTrace(20, rng.integers(1, 4, 0 if i == 7 else 5))})
        for i in range(301)
    ]  # fmt: skip
    res = simulate(
        recs, "llama3.1-8b-h100", ["oracle:ngram", "oracle:eagle"], "replicate", [1], aggregate="study"
    )
    assert one(res, "oracle:ngram").num_requests == 300  # sampled 300 of 301
    e = one(res, "oracle:eagle")
    assert e.num_requests == 300 and e.output_tokens == 1500  # r7 dropped first, then 300 of the 300 left
    assert any("skipped 1 request(s) with no output tokens" in n for n in e.notes)
