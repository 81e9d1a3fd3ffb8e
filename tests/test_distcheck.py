"""The two-sample check that sampled speculative decoding keeps the target's distribution (analyze.distcheck),
on a toy target/draft pair over a small vocabulary: a correct speculative-sampling rule passes, broken rules
fail at the sample size used, and the stated power figure matches simulated detection rates."""

from __future__ import annotations

import numpy as np
import pytest

from speclab.analyze.distcheck import (
    binned_table,
    chi2_isf,
    chi2_sf,
    distribution_check,
    ncx2_sf,
    tv_detectable,
)

V = 5  # vocabulary
K = 2  # drafts per step
M = 3  # positions compared
T = 1.0  # the requested temperature
N = 1500  # draws per prompt and side

_rng = np.random.default_rng(1234)
TARGET_LOGITS = _rng.normal(0, 1.6, size=(V, V))  # row: previous token
DRAFT_LOGITS = TARGET_LOGITS + _rng.normal(0, 1.4, size=(V, V))  # a related but different drafter


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def p_target(prev: int, temp: float = T) -> np.ndarray:
    return softmax(TARGET_LOGITS[prev] / temp)


def q_draft(prev: int) -> np.ndarray:
    return softmax(DRAFT_LOGITS[prev] / T)


def base_sample(rng: np.random.Generator, start: int) -> list[int]:
    out, prev = [], start
    for _ in range(M):
        prev = int(rng.choice(V, p=p_target(prev)))
        out.append(prev)
    return out


def sd_sample(rng: np.random.Generator, start: int, rule: str) -> list[int]:
    """First token from prefill (the target), then SD steps of K drafts until M tokens. `rule`: "correct",
    "accept-always", "wrong-temperature" (the verifier's target at T / 2), "no-residual" (resample from p)."""
    out = [int(rng.choice(V, p=p_target(start)))]
    while len(out) < M:
        prev = out[-1]
        drafts, qs = [], []
        for _ in range(K):
            q = q_draft(prev)
            d = int(rng.choice(V, p=q))
            drafts.append(d)
            qs.append(q)
            prev = d
        ctx = out[-1]
        for d, q in zip(drafts, qs, strict=True):
            p = p_target(ctx, T / 2 if rule == "wrong-temperature" else T)
            if rule == "accept-always" or rng.random() < min(1.0, p[d] / q[d]):
                out.append(d)
                ctx = d
                continue
            resid = p if rule == "no-residual" else np.maximum(p - q, 0)
            out.append(int(rng.choice(V, p=resid / resid.sum())))
            break
        else:
            out.append(int(rng.choice(V, p=p_target(ctx))))  # bonus token
    return out[:M]


def samples(rule: str | None, seed: int, n: int = N) -> dict[str, list[list[int]]]:
    rng = np.random.default_rng(seed)
    return {
        f"prompt{s}": [base_sample(rng, s) if rule is None else sd_sample(rng, s, rule) for _ in range(n)]
        for s in (0, 3)
    }


@pytest.fixture(scope="module")
def base() -> dict[str, list[list[int]]]:
    return samples(None, seed=1)


def test_chi_square_helpers_match_known_values():
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(11.070497693516351, 5) == pytest.approx(0.05, rel=1e-9)
    assert chi2_isf(0.01, 4) == pytest.approx(13.2767, rel=1e-4)
    assert ncx2_sf(3.0, 2, 0.0) == pytest.approx(chi2_sf(3.0, 2))
    rng = np.random.default_rng(0)
    sim = (rng.noncentral_chisquare(3, 10, 100_000) > 11.34).mean()
    assert ncx2_sf(11.34, 3, 10) == pytest.approx(sim, abs=0.01)


def test_correct_rule_passes(base):
    r = distribution_check(samples("correct", seed=2), base, positions=M)
    assert r["verdict"] == "pass", r
    assert r["p_value"] > 0.01 and r["prompts"] == 2 and r["samples"] == N and r["positions"] == M
    assert 0 < r["tv_detectable_80"] < 0.25
    assert "bonferroni" in r["method"]


@pytest.mark.parametrize("rule", ["accept-always", "wrong-temperature", "no-residual"])
def test_broken_rules_fail(base, rule):
    r = distribution_check(samples(rule, seed=3), base, positions=M)
    assert r["verdict"] == "fail", (rule, r["p_value"], r["tv_detectable_80"])
    assert r["p_value"] < 1e-3


def test_position_one_alone_sees_nothing(base):
    """The first token comes from prefill: even an accept-always engine agrees there."""
    r = distribution_check(samples("accept-always", seed=3), base, positions=1)
    assert r["verdict"] != "fail"


def test_few_samples_are_underpowered_not_pass(base):
    few = {k: v[:12] for k, v in samples("correct", seed=4, n=12).items()}
    r = distribution_check(few, {k: v[:12] for k, v in base.items()}, positions=M)
    assert r["verdict"] == "underpowered"
    assert distribution_check({}, base)["verdict"] == "underpowered"


def test_rare_categories_are_pooled():
    a = [(0,)] * 40 + [(1,)] * 30 + [(7,)] * 3 + [(8,)] * 3 + [(9,)] * 5
    b = [(0,)] * 42 + [(1,)] * 28 + [(7,)] * 2 + [(8,)] * 4 + [(9,)] * 4
    table, labels = binned_table(a, b, min_count=10)
    assert labels == [(0,), (1,), ("<other>",)]
    assert table.tolist() == [[40, 30, 11], [42, 28, 10]]
    assert table.sum() == len(a) + len(b)


def test_power_figure_matches_simulation():
    """Shifts of exactly tv_detectable_80 (least favourable shape) are detected about 80% of the time."""
    n, probs = 300, np.array([0.3, 0.2, 0.25, 0.25])
    tv = tv_detectable(n, n, df=3, alpha=0.01)
    shifted = probs * np.array([1 + 2 * tv, 1 + 2 * tv, 1 - 2 * tv, 1 - 2 * tv])  # halves of mass 1/2
    assert 0.5 * np.abs(shifted - probs).sum() == pytest.approx(tv)
    rng = np.random.default_rng(7)
    hits = null_hits = 0
    reps = 300
    for _ in range(reps):
        a = [[int(x)] for x in rng.choice(4, n, p=probs)]
        b = [[int(x)] for x in rng.choice(4, n, p=shifted)]
        c = [[int(x)] for x in rng.choice(4, n, p=probs)]
        hits += distribution_check({"p": a}, {"p": b}, positions=1)["verdict"] == "fail"
        null_hits += distribution_check({"p": a}, {"p": c}, positions=1)["verdict"] == "fail"
    assert 0.68 <= hits / reps <= 0.93, hits / reps
    assert null_hits / reps <= 0.04  # the level holds
    assert distribution_check({"p": a}, {"p": c}, positions=1)["tv_detectable_80"] == pytest.approx(tv)


def test_a_prompt_with_one_bin_is_underpowered():
    same = [[1, 2, 3]] * 200
    r = distribution_check({"p": same}, {"p": same}, positions=3)
    assert r["verdict"] == "underpowered" and r["tv_detectable_80"] == 1.0 and r["p_value"] == 1.0


def test_rare_sequences_are_pooled_by_their_common_prefix():
    # 30 draws start with 5 and go on in 30 different ways; 4 start with 6 (rare); 20 are (7, 7); 12 ended early
    a = [(5, i) for i in range(15)] + [(7, 7)] * 10 + [(6, 1), (6, 2)] + [(8, "<end>")] * 6
    b = [(5, 100 + i) for i in range(15)] + [(7, 7)] * 10 + [(6, 3), (6, 4)] + [(8, "<end>")] * 6
    table, labels = binned_table(a, b, min_count=10)
    assert labels == [(5, "*"), (7, 7), (8, "<end>")]  # "other" (the 6s, 4 draws) went into the smallest bin
    assert table.tolist() == [[15, 10, 8], [15, 10, 8]]
    assert distribution_check({"p": [[1, 2]] * 3 + [[1]]}, {"p": [[1]]}, positions=2)["per_prompt"]["p"][
        "top"
    ][0][0] == ["<other>"]
