"""The switch proposer (several proposers in one engine, one active at a time) and the same-engine benchmark's
summary, against the simulated engine loop of test_crosscheck (no vLLM engine)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from speclab.methods.ngram import NgramProposer
from speclab.methods.suffix import suffix_available
from speclab.methods.vllm_custom import OPTIONS_ENV, SpeclabSwitchProposer, set_arm, switch_arms
from test_crosscheck import simulate_engine  # tests/ is on sys.path (pytest prepend mode)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import same_engine  # noqa: E402


def _config(k: int) -> SimpleNamespace:
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=4096),
    )


def _requests(seed: int = 0, n: int = 3) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Prompts whose outputs copy spans of them (so the lookups draft and get drafts accepted)."""
    rng = np.random.default_rng(seed)
    prompts, outputs = [], []
    for _ in range(n):
        p = rng.integers(0, 50, 120).astype(np.int32)
        out = np.concatenate([p[30:60], rng.integers(50, 90, 10), p[70:100]]).astype(np.int32)
        prompts.append(p)
        outputs.append(out)
    return prompts, outputs


@pytest.fixture(autouse=True)
def _reset_arm():
    set_arm(None)
    yield
    set_arm(None)


def test_switch_runs_the_active_arm(monkeypatch: pytest.MonkeyPatch) -> None:
    arms = {
        "off": {"proposer": "off"},
        "ngram-k3": {"proposer": "ngram", "k": 3, "options": {"min_n": 2, "max_n": 4}},
    }
    monkeypatch.setenv(OPTIONS_ENV, json.dumps({"arms": arms}))
    sw = SpeclabSwitchProposer(_config(6))
    prompts, outputs = _requests()
    # no arm set: the first one (off) drafts nothing
    acc, drf = simulate_engine(sw, prompts, outputs)
    assert all(not d for d in drf)
    # the n-gram arm drafts what speclab's n-gram rule drafts at its own k (3 < the engine's 6)
    set_arm("ngram-k3")
    acc, drf = simulate_engine(sw, prompts, outputs)
    assert any(drf) and max(max(d) for d in drf if d) <= 3
    ref = NgramProposer(min_n=2, max_n=4, max_model_len=4096)
    ctx = np.concatenate([prompts[0], outputs[0][:40]])
    got = sw.arms["ngram-k3"].propose([[int(outputs[0][39])]], np.array([len(ctx)]), ctx[None, :])
    assert got == [ref.propose(ctx, 3).tolist()]
    assert sw.calls["off"] > 0 and sw.calls["ngram-k3"] > 0
    set_arm("nope")
    with pytest.raises(ValueError, match="no arm 'nope'"):
        sw.propose([[1]], np.array([5]), np.zeros((1, 8), np.int32))


def test_ngram_arm_with_vllms_kernel_drafts_the_same() -> None:
    pytest.importorskip("vllm")
    prompts, outputs = _requests(1)
    cfg = _config(5)
    mine = SpeclabSwitchProposer(
        cfg, {"arms": {"a": {"proposer": "ngram", "options": {"min_n": 3, "max_n": 7}}}}
    )
    theirs = SpeclabSwitchProposer(
        cfg, {"arms": {"a": {"proposer": "ngram", "options": {"min_n": 3, "max_n": 7, "impl": "vllm"}}}}
    )
    assert simulate_engine(mine, prompts, outputs) == simulate_engine(theirs, prompts, outputs)


@pytest.mark.skipif(not suffix_available(), reason="arctic-inference not installed")
def test_arms_keep_their_own_state_across_switches() -> None:
    """Switching arms between cells: each arm sees only the cells it ran, and a suffix or adaptive arm run
    after others drafts as it does alone."""
    arms = {
        "off": {"proposer": "off"},
        "suffix": {"proposer": "suffix", "options": {"max_cached_requests": 0}},
        "adaptive": {
            "proposer": "adaptive",
            "options": {"methods": ["ngram"], "cost_model": "smollm2-135m-cpu-live"},
        },
    }
    prompts, outputs = _requests(2)
    alone: dict[str, list] = {}  # each arm alone, run twice (a pooling policy remembers the first pass)
    for name in ("suffix", "adaptive"):
        sw = SpeclabSwitchProposer(_config(8), {"arms": {name: arms[name]}})
        alone[name] = [simulate_engine(sw, prompts, outputs) for _ in range(2)]
    sw = SpeclabSwitchProposer(_config(8), {"arms": arms})
    passes = {"suffix": 0, "adaptive": 0}
    for name in ("off", "suffix", "adaptive", "off", "suffix", "adaptive"):
        set_arm(name)
        got = simulate_engine(sw, prompts, outputs)
        if name != "off":
            assert got == alone[name][passes[name]], (name, passes[name])
            passes[name] += 1


def test_bad_arms_are_refused() -> None:
    with pytest.raises(ValueError, match="needs 'arms'"):
        switch_arms({})
    with pytest.raises(ValueError, match="proposer 'eagle'"):
        switch_arms({"arms": {"x": {"proposer": "eagle"}}})
    with pytest.raises(ValueError, match="above the engine"):
        switch_arms({"arms": {"x": {"proposer": "ngram", "k": 9}}}, 8)
    with pytest.raises(ValueError, match="k must be"):
        switch_arms({"arms": {"x": {"proposer": "ngram", "k": 0}}})
    with pytest.raises(ValueError, match="unknown switch"):
        switch_arms({"arms": {"x": {"proposer": "off"}}, "extra": 1})
    with pytest.raises(ValueError, match="unknown ngram option"):
        SpeclabSwitchProposer(_config(4), {"arms": {"x": {"proposer": "ngram", "options": {"min": 2}}}})
    assert set(switch_arms({"arms": same_engine.DEFAULT_ARMS}, 8)) == set(same_engine.DEFAULT_ARMS)


def _unit(start, rnd, arm, tok_s, w="chat", b=1, outputs="x", steps=10, propose_s=0.01):
    return {
        "start": start, "round": rnd, "cell_id": f"c.{w}.b{b}", "workload": w, "batch_size": b, "arm": arm,
        "tok_s": tok_s, "outputs": outputs, "steps": steps, "propose_s": propose_s,
        "output_tokens": tok_s * 10.0, "elapsed_s": 10.0,
    }  # fmt: skip


def test_summary_pairs_within_a_round_and_a_start_up() -> None:
    units = []
    # start-up A runs everything 10% slower than start-up B: the ratios within each are what count
    for start, f in (("A", 0.9), ("B", 1.0)):
        for rnd in (1, 2):
            units += [
                _unit(start, rnd, "off", 100 * f),
                _unit(start, rnd, "ngram", 104 * f),
                _unit(start, rnd, "suffix", 102 * f),
                _unit(start, rnd, "adaptive", (106 if rnd == 1 else 103) * f),
                _unit(start, rnd, "adaptive-fast", 200 * f),  # another adaptive arm: never the "best static"
            ]
    units.append(_unit("C", 1, "adaptive", 500.0))  # no off in its round: not paired with anything
    (row,) = same_engine.summarize(units)
    assert row["best_static"] == "ngram"
    med, lo, hi, n = row["ratio_to_off"]["adaptive"]
    assert (n, lo, hi) == (4, pytest.approx(1.03), pytest.approx(1.06)) and med == pytest.approx(1.045)
    med, lo, hi, n, wins = row["vs_best"]["adaptive"]
    assert n == 4 and wins == 2 and lo == pytest.approx(103 / 104) and hi == pytest.approx(106 / 104)
    assert row["vs_best"]["adaptive-fast"][4] == 4
    assert all(row["exact"].values())
    assert row["propose_ms"]["off"] == pytest.approx(1.0)
    # one arm's outputs differ from off's in one round: not exact
    units = [u for u in units if not (u["start"] == "B" and u["round"] == 2 and u["arm"] == "suffix")]
    units.append(_unit("B", 2, "suffix", 99.0, outputs="different"))
    (row,) = same_engine.summarize(units)
    assert row["exact"]["suffix"] is False and row["exact"]["adaptive"] is True
    text = same_engine.table([row])
    assert "NO: suffix" in text and "adaptive / best static (rounds >=)" in text and "(2/4)" in text


def test_rotation_and_resume_reading(tmp_path: Path) -> None:
    arms = ["off", "a", "b"]
    firsts = {same_engine.order(arms, r, c)[0] for r in range(3) for c in range(3)}
    assert firsts == set(arms) and all(sorted(same_engine.order(arms, 1, 1)) == sorted(arms) for _ in arms)
    p = tmp_path / "units.jsonl"
    p.write_text(json.dumps(_unit("A", 1, "off", 1.0)) + "\n" + '{"start": "A", "rou')  # a torn last line
    assert [u["arm"] for u in same_engine.read_units(p)] == ["off"]
    assert same_engine.read_units(tmp_path / "missing.jsonl") == []


def test_parts_are_summed_before_pairing() -> None:
    """A batch-1 cell run in parts (--chunk): tokens over seconds of all parts, outputs compared part by part;
    a cell with a part missing is left out."""
    units = []
    for arm, secs in (("off", (1.0, 3.0)), ("ngram", (1.0, 1.0))):
        for part, s in enumerate(secs):
            u = _unit("A", 1, arm, 0.0, outputs=f"p{part}") | {"part": part, "parts": 2}
            units.append(u | {"output_tokens": 10, "elapsed_s": s})
    units.append(
        _unit("A", 1, "suffix", 0.0) | {"part": 0, "parts": 2, "output_tokens": 10, "elapsed_s": 1.0}
    )
    (row,) = same_engine.summarize(units)
    assert row["ratio_to_off"]["ngram"][0] == pytest.approx((20 / 2.0) / (20 / 4.0))
    assert "suffix" not in row["ratio_to_off"] and row["exact"]["ngram"] is True


def test_split_cell_splits_batch_one_only() -> None:
    from speclab.engine.protocol import CellSpec, PromptSpec

    prompts = [PromptSpec(id=f"p{i}", prompt_token_ids=[1, 2, 3]) for i in range(10)]
    one = CellSpec(cell_id="x.w.c.b1", batching="continuous", batch_size=1, max_tokens=4, prompts=prompts)
    parts = same_engine.split_cell(one, 4)
    assert [(len(c.prompts), i, n) for c, i, n in parts] == [(4, 0, 3), (4, 1, 3), (2, 2, 3)]
    assert [p.id for c, _, _ in parts for p in c.prompts] == [p.id for p in prompts]
    four = CellSpec(cell_id="x.w.c.b4", batching="continuous", batch_size=4, max_tokens=4, prompts=prompts)
    assert same_engine.split_cell(four, 4) == [(four, 0, 1)] and same_engine.split_cell(one, None) == [
        (one, 0, 1)
    ]


def test_median_interval_is_the_sign_test_interval() -> None:
    """The interval's coverage is exact (binomial), checked against a brute-force sum for every n up to 30,
    and it is the widest-j order-statistic pair that reaches the level."""
    import math

    from speclab.bench.repeats import interval_verdict, median_interval

    assert median_interval([]) is None and median_interval([1.0] * 5) is None  # n < 6: no 95% interval
    for n in range(6, 31):
        xs = [float(i) for i in range(n)][::-1]  # unsorted input
        lo, hi, cover = median_interval(xs)
        j = int(lo) + 1
        assert hi == n - j
        miss = 2 * sum(math.comb(n, i) for i in range(j)) / 2**n
        assert cover == pytest.approx(1 - miss) and cover >= 0.95
        tighter = 2 * sum(math.comb(n, i) for i in range(j + 1)) / 2**n
        assert j >= n // 2 or 1 - tighter < 0.95  # one step tighter would fall below the level
    assert interval_verdict(median_interval([1.01, 1.02, 1.03, 1.04, 1.05, 1.06]), 6) == "ahead"
    assert interval_verdict(median_interval([0.91, 0.92, 0.93, 0.94, 0.95, 0.96]), 6) == "behind"
    assert interval_verdict(median_interval([0.9, 1.1, 0.95, 1.05, 1.0, 1.02]), 6) == "level"
    assert interval_verdict(None, 3) == "too few rounds (3)"


def test_control_arm_is_noise_not_a_static_candidate() -> None:
    """An A/A arm (off-again, drafting nothing) is never the best static arm even where the noise puts it
    ahead; it gets an interval against off only; the adaptive arm gets both."""
    units = []
    for rnd in range(1, 8):
        units += [
            _unit("A", rnd, "off", 100.0),
            _unit("A", rnd, "off-again", 110.0 + rnd),  # noise made it the fastest arm
            _unit("A", rnd, "ngram", 104.0),
            _unit("A", rnd, "adaptive", 105.0 + rnd),
        ]
    (row,) = same_engine.summarize(units)
    assert row["best_static"] == "ngram" and "off-again" not in row["vs_best"]
    assert set(row["interval"]["off-again"]) == {"vs_off"}
    (lo, hi, cover), verdict = row["interval"]["adaptive"]["vs_best"]
    assert verdict == "ahead" and lo == pytest.approx(106 / 104) and hi == pytest.approx(112 / 104)
    assert cover == pytest.approx(1 - 2 / 128)
    text = same_engine.table([row])
    assert "off-again: / off [1.110-1.170]" in text and "95% distribution-free interval" in text
