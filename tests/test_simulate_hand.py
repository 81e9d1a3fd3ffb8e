"""Simulator correctness on tiny traces, with every expected time derived by hand (see comments).

Cost model (easy numbers, seconds): target = 0.001*kv + 0.01*batched + 1.0; overhead 0.1 per step;
eagle "linear" = 0.05*spec + 0.2 (kv term 0); ngram = 0.5 * verify time; chained eagle = 0.1 per pass +
0.01 per draft token.
"""

import numpy as np
import pytest

from speclab.costmodel import CostModel, DraftCost, TargetCost
from speclab.simulate import simulate
from speclab.traces import MethodTrace, RequestTrace


def cm(chained: bool = False, switch: float = 0.0) -> CostModel:
    eagle = (
        DraftCost(form="chained", num_spec=0.01, const=0.1)
        if chained
        else DraftCost(form="linear", num_spec=0.05, const=0.2)
    )
    return CostModel(
        name="hand",
        target=TargetCost(kv=0.001, batched=0.01, const=1.0),
        draft={"eagle": eagle, "ngram": DraftCost(form="verify_fraction", fraction=0.5)},
        overhead_per_step=0.1,
        switch_overhead=switch,
    )


def rec(rid, prompt, ngram, eagle, nprop=None, workload="toy"):
    return RequestTrace(
        id=rid,
        workload=workload,
        category="other",
        prompt_len=prompt,
        output_len=len(ngram),
        methods={
            "ngram": MethodTrace(k_max=5, acc_len=ngram, num_proposed=nprop),
            "eagle": MethodTrace(k_max=5, acc_len=eagle),
        },
    )


A = rec("A", 2, [1, 3, 1, 2], [1, 2, 2, 1])  # prompt 2, 4 output tokens
B = rec("B", 1, [1, 1], [1, 2])  # prompt 1, 2 output tokens
C = rec("C", 1, [1, 1, 3, 1], [1, 2, 1, 1])


def one(res, policy, b):
    [r] = [x for x in res if x.policy == policy and x.batch_size == b]
    return r


# Baseline A alone (replicate B=1): prefill 0.01*2+1 = 1.02 (+0.1 overhead); decode at pos 1,2,3 with kv 2,3,4:
# 1.012, 1.013, 1.014 (+0.1 each). Total 1.12 + 1.112 + 1.113 + 1.114 = 4.459.
BASE_A1 = 4.459
# B=2 copies: prefill 0.01*4+1 -> 1.14; decode kv 4,6,8 batched 2: 1.124, 1.126, 1.128. Total 4.518.
BASE_A2 = 4.518


def test_replicate_baseline_and_oracle_ngram():
    res = simulate([A], cm(), ["none", "oracle:ngram"], "replicate", [1, 2])
    b1 = one(res, "none", 1)
    assert b1.total_time_s == pytest.approx(BASE_A1)
    assert b1.throughput_tok_s == pytest.approx(4 / BASE_A1)
    assert b1.steps == 4 and b1.mean_accepted_len == 1.0 and b1.tokens_rejected == 0
    # oracle ngram at pos 1: acc 3 -> L=3, all 3 remaining tokens in one step. verify kv 2, batched 3: 1.032;
    # ngram drafting 0.5*1.032 = 0.516; overhead 0.1 -> 1.648. Total 1.12 + 1.648 = 2.768.
    o1 = one(res, "oracle:ngram", 1)
    assert o1.total_time_s == pytest.approx(2.768)
    assert o1.speedup == pytest.approx(BASE_A1 / 2.768)
    assert o1.time_split_s == pytest.approx({"verify": 1.02 + 1.032, "propose": 0.516, "overhead": 0.2})
    assert o1.mean_accepted_len == 3.0 and o1.tokens_rejected == 0 and o1.steps == 2
    # B=2: step kv 4, batched 6: 1.064 + 0.532 + 0.1 = 1.696; total 1.14 + 1.696 = 2.836
    o2 = one(res, "oracle:ngram", 2)
    assert o2.total_time_s == pytest.approx(2.836)
    assert o2.speedup == pytest.approx(BASE_A2 / 2.836)
    assert o2.throughput_tok_s == pytest.approx(8 / 2.836)


def test_replicate_fixed_eagle_linear_and_chained():
    # fixed:eagle:1 on A: pos 1 L=2, acc 2 -> produce 2 (pos 3); pos 3 L=2, acc 1 -> produce 1, done.
    # step1: verify kv 2 batched 2 = 1.022, draft 0.05*1+0.2 = 0.25, +0.1 -> 1.372
    # step2: verify kv 4 batched 2 = 1.024, draft 0.25, +0.1 -> 1.374. Total 1.12 + 1.372 + 1.374 = 3.866
    r = one(simulate([A], cm(), ["fixed:eagle:1"], "replicate", [1]), "fixed:eagle:1", 1)
    assert r.total_time_s == pytest.approx(3.866)
    assert r.speedup == pytest.approx(BASE_A1 / 3.866)
    assert r.mean_accepted_len == 1.5 and r.tokens_rejected == 1
    # chained: 1 pass * 0.1 + 0.01 * 1 draft = 0.11 per step -> 1.12 + 1.232 + 1.234 = 3.586
    r = one(simulate([A], cm(chained=True), ["fixed:eagle:1"], "replicate", [1]), "fixed:eagle:1", 1)
    assert r.total_time_s == pytest.approx(3.586)
    # chained at B=2 copies: 1 pass 0.1 + 0.01 * 2 drafts = 0.12; verify kv 4, 8 batched 4: 1.044, 1.048
    # total 1.14 + (1.044 + 0.12 + 0.1) + (1.048 + 0.12 + 0.1) = 3.672
    r = one(simulate([A], cm(chained=True), ["fixed:eagle:1"], "replicate", [2]), "fixed:eagle:1", 2)
    assert r.total_time_s == pytest.approx(3.672)


def test_oracle_eagle_charges_linear_drafting_even_for_zero_drafts():
    # oracle:eagle on B: pos 1 acc 2 -> L=2, produce min(2, 1 remaining) = 1: overshoot capped, 1 rejected.
    # prefill 0.01*1+1 = 1.01 + 0.1; step kv 1, batched 2: 1.021 + draft (0.05*1 + 0.2) + 0.1 = 1.371
    r = one(simulate([B], cm(), ["oracle:eagle"], "replicate", [1]), "oracle:eagle", 1)
    assert r.total_time_s == pytest.approx(1.11 + 1.371)
    assert r.tokens_rejected == 1 and r.mean_accepted_len == 1.0
    # oracle:eagle on C: pos 1 acc 2 (L=2) -> pos 3 acc 1: L=1, 0 drafts, linear form still charges 0.2
    # step1 kv 1 b 2: 1.021+0.25+0.1 = 1.371; step2 kv 3 b 1: 1.013+0.2+0.1 = 1.313; prefill 1.11
    r = one(simulate([C], cm(), ["oracle:eagle"], "replicate", [1]), "oracle:eagle", 1)
    assert r.total_time_s == pytest.approx(1.11 + 1.371 + 1.313)


def test_static_batching_total_and_study_aggregate():
    # [A, B] as one static batch, no SD. prefill kv 0, batched 3: 1.03 + 0.1 = 1.13.
    # step1 (A pos1 kv 2, B pos1 kv 1): kv 3 batched 2: 1.023 + 0.1 = 1.123 (B finishes)
    # step2 (A pos2 kv 3): 1.013 + 0.1 = 1.113; step3 (A pos3 kv 4): 1.114. Total 4.48, 6 tokens.
    res = simulate([A, B], cm(), ["none"], "static", [2])
    assert res[0].total_time_s == pytest.approx(4.48)
    assert res[0].throughput_tok_s == pytest.approx(6 / 4.48)
    # study: latency A 4.48, B 1.13 + 1.123 = 2.253; batch throughput 6 / mean latency
    res = simulate([A, B], cm(), ["none"], "static", [2], aggregate="study")
    assert res[0].throughput_tok_s == pytest.approx(6 / ((4.48 + 2.253) / 2))
    # static B=1 = each request alone, one after the other: 4.459 + (1.11 + 1.111) = 6.68
    res = simulate([A, B], cm(), ["none"], "static", [1])
    assert res[0].total_time_s == pytest.approx(6.68)
    # study at B=1: mean of per-batch throughputs 4/4.459 and 2/2.221
    res = simulate([A, B], cm(), ["none"], "static", [1], aggregate="study")
    assert res[0].throughput_tok_s == pytest.approx((4 / 4.459 + 2 / 2.221) / 2)


def test_static_oracle_combine_chosen_vs_ngram_charging():
    # A pos1: ngram 3 > eagle 2 -> ngram L=3, done. B pos1: ngram 1 < eagle 2 -> eagle L=2, produce 1, done.
    # one step: kv 3, batched 5: 1.053. chosen: ngram 0.5*1.053 + eagle max(0.05*1+0.2) = 0.7765
    res = simulate([A, B], cm(), ["oracle-combine:ngram,eagle"], "static", [2], combine_draft="chosen")
    assert res[0].total_time_s == pytest.approx(1.13 + 1.053 + 0.7765 + 0.1)
    assert res[0].tokens_rejected == 1 and res[0].mean_accepted_len == 2.0
    # the study charges n-gram drafting for every step: 0.5*1.053
    res = simulate([A, B], cm(), ["oracle-combine:ngram,eagle"], "static", [2], combine_draft="ngram")
    assert res[0].total_time_s == pytest.approx(1.13 + 1.053 + 0.5265 + 0.1)
    # aggregate study selects ngram charging by default
    res2 = simulate([A, B], cm(), ["oracle-combine:ngram,eagle"], "static", [2], aggregate="study")
    assert res2[0].time_split_s["propose"] == pytest.approx(0.5265)


def test_combine_switch_overhead():
    # C: pos1 ngram 1, eagle 2 -> eagle (L=2) -> pos 3: tie 1/1 -> ngram (listed first), L=1, 0 drafts.
    # step1 kv 1 b 2: 1.021 + eagle 0.25 + 0.1; step2 kv 3 b 1: 1.013 + 0 + 0.1 + switch 0.07
    res = simulate([C], cm(switch=0.07), ["oracle-combine:ngram,eagle"], "replicate", [1])
    assert res[0].total_time_s == pytest.approx(1.11 + 1.371 + 1.113 + 0.07)
    res = simulate([C], cm(switch=0.07), ["oracle-combine:ngram,eagle"], "replicate", [1], switch_overhead=0)
    assert res[0].total_time_s == pytest.approx(1.11 + 1.371 + 1.113)


def test_continuous_batching_admits_on_free_slot():
    C2 = rec("C2", 1, [1, 1], [1, 1])
    # slots 2: A and B prefill together (1.13), step1 A+B (1.123), B done; step2: A pos 2 (kv 3) + C2 prefill
    # (batched 1+1): 1.023 + 0.1; step3: A pos3 (kv 4) + C2 pos1 (kv 1): kv 5 batched 2 -> 1.125. Total 4.501
    res = simulate([A, B, C2], cm(), ["none"], "continuous", [2])
    assert res[0].total_time_s == pytest.approx(1.13 + 1.123 + 1.123 + 1.125)
    assert res[0].throughput_tok_s == pytest.approx(8 / 4.501) and res[0].steps == 4
    assert res[0].makespan_throughput_tok_s == pytest.approx(8 / 4.501) and res[0].tail_share == 0.0
    # one slot = one request after the other: 4.459 + 2.221 + 2.221
    res = simulate([A, B, C2], cm(), ["none"], "continuous", [1])
    assert res[0].total_time_s == pytest.approx(4.459 + 2 * 2.221)


def test_recorded_proposal_counts_cap_fixed_k():
    # ngram offers 0 drafts at pos 1 (miss: L=1, no drafting), 2 at pos 2 (k=min(3,2)=2, acc 1 -> produce 1)
    D = rec("D", 1, [1, 1, 1, 1], [1, 1, 1, 1], nprop=[0, 0, 2, 0])
    # pos1: kv 1 b 1: 1.011 + 0 + 0.1; pos2: kv 2 b 3: 1.032 + 0.516 + 0.1; pos3 (offer 0): kv 3 b 1: 1.013 + 0.1
    r = one(simulate([D], cm(), ["fixed:ngram:3"], "replicate", [1]), "fixed:ngram:3", 1)
    assert r.total_time_s == pytest.approx(1.11 + 1.111 + 1.648 + 1.113)
    assert r.tokens_rejected == 2


@pytest.mark.parametrize("p,expect_vtok", [(0.0, 1), (1.0, 3)])
def test_miss_heuristic_extremes(p, expect_vtok):
    # B: pos1 ngram acc 1 -> candidate for a miss. p=0: always a miss (L=1, no drafting);
    # p=1: always a match (L=3, drafting 0.5*verify).
    r = one(
        simulate([B], cm(), ["fixed:ngram:2"], "replicate", [1], ngram_miss_heuristic=p), "fixed:ngram:2", 1
    )
    verify = 0.001 * 1 + 0.01 * expect_vtok + 1.0
    draft = 0.5 * verify if expect_vtok > 1 else 0.0
    assert r.total_time_s == pytest.approx(1.11 + verify + draft + 0.1)
    # without the heuristic a lookup is assumed to find k drafts (note says so)
    r = one(simulate([B], cm(), ["fixed:ngram:2"], "replicate", [1]), "fixed:ngram:2", 1)
    assert r.total_time_s == pytest.approx(1.11 + 1.031 + 0.5155 + 0.1)
    assert any("proposal counts" in n for n in r.notes)


def test_miss_heuristic_replicate_counts_copies():
    from speclab.simulate import fast

    tr = [rec(f"r{i}", 3, [1] * 6, [1] * 6, workload="cnn_dailymail") for i in range(5)]
    ta = fast.prepare(tr, {"ngram", "eagle"})
    draws = fast.miss_draws(ta, np.full(5, 0.4), "replicate", 8, 42)
    # every position of every request: verify tokens = 8 copies + 2 drafts per matching copy
    r = one(
        simulate(tr, cm(), ["fixed:ngram:2"], "replicate", [8], ngram_miss_heuristic="auto"),
        "fixed:ngram:2",
        8,
    )
    visited = np.concatenate([draws[ta.off[i] + 1 : ta.off[i + 1]] for i in range(5)])
    assert r.tokens_rejected == int((2 * visited).sum())  # acc 1 everywhere: every draft rejected
    assert 0 < visited.mean() / 8 < 1  # cnn -> match_p 0.4


def test_none_policy_table_shapes():
    res = simulate([A, B], cm(), ["none", "oracle:ngram"], "continuous", [1, 2, 4])
    assert [(r.batch_size, r.policy) for r in res] == [
        (b, p) for b in (1, 2, 4) for p in ("none", "oracle:ngram")
    ]
    for r in res:
        d = r.to_dict()
        assert set(d["time_split_s"]) == {"verify", "propose", "overhead"}
        assert sum(d["time_split_s"].values()) == pytest.approx(d["total_time_s"])


def test_continuous_fixed_eagle():
    # [A, B] in 2 slots, fixed:eagle:1. A: pos1 L=2 acc 2 -> pos 3; pos3 L=2 acc 1 -> done. B: pos1 L=2, acc 2
    # capped at 1 remaining. prefill 1.13; step1 kv 3 batched 4: 1.043 + 0.25 + 0.1; step2 kv 4 b 2: 1.024+0.25+0.1
    res = simulate([A, B], cm(), ["none", "fixed:eagle:1"], "continuous", [2])
    r = one(res, "fixed:eagle:1", 2)
    assert r.total_time_s == pytest.approx(1.13 + 1.393 + 1.374)
    # the single pass's figure (the steady state, with the requests re-admitted, is the default speedup)
    assert r.makespan_speedup == pytest.approx(4.48 / 3.897)
    assert r.tokens_rejected == 2 and r.mean_accepted_len == pytest.approx(4 / 3)


def test_static_fixed_ngram():
    # A pos1 L=3 acc 3 -> done; B pos1 L=3 acc 1 -> done. one step kv 3 batched 6: 1.063 + 0.5315 + 0.1
    r = one(simulate([A, B], cm(), ["fixed:ngram:2"], "static", [2]), "fixed:ngram:2", 2)
    assert r.total_time_s == pytest.approx(1.13 + 1.6945)
    assert r.speedup == pytest.approx(4.48 / 2.8245) and r.tokens_rejected == 2


def test_adaptive_k_by_hand():
    # ema starts at KSTART-1 = 2 -> k 3. pos1: L=4, eagle acc 2 -> produce 2, 1 accepted; ema 1.5 -> k 3.
    # pos3: L=4, acc 1 -> produce 1, done. step1 kv 2 b 4: 1.042 + (0.05*3+0.2) + 0.1; step2 kv 4: 1.044+0.35+0.1
    r = one(simulate([A], cm(), ["adaptive-k:eagle:8"], "replicate", [1]), "adaptive-k:eagle:8", 1)
    assert r.total_time_s == pytest.approx(1.12 + 1.492 + 1.494)
    assert r.speedup == pytest.approx(BASE_A1 / 4.106) and r.tokens_rejected == 5


def test_select_ema_by_hand():
    # C, K=2, both EMAs start at 2 (tie -> ngram). pos1 ngram L=3 acc 1: 0 accepted, ema_ngram 1.
    # pos2: eagle (2 > 1) L=3 acc 1: ema_eagle 1. pos3: tie -> ngram L=3 acc 1 -> done. Two switches.
    # step1 kv 1 b 3: 1.031 + 0.5*1.031 + 0.1; step2 kv 2: 1.032 + (0.05*2+0.2) + 0.1; step3 kv 3: 1.033*1.5 + 0.1
    expect = 1.11 + 1.6465 + 1.432 + 1.6495
    r = one(
        simulate([C], cm(), ["select-ema:ngram,eagle:2"], "replicate", [1]), "select-ema:ngram,eagle:2", 1
    )
    assert r.total_time_s == pytest.approx(expect)
    r = one(
        simulate([C], cm(switch=0.07), ["select-ema:ngram,eagle:2"], "replicate", [1]),
        "select-ema:ngram,eagle:2",
        1,
    )
    assert r.total_time_s == pytest.approx(expect + 2 * 0.07)
