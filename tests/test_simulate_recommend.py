"""`speclab simulate --recommend` offers only what the installed vLLM (0.32) can run: batch-size schedules for
proposers that follow one, one fixed k for suffix (it asserts k == num_speculative_tokens) and custom_class
(it is called without the scheduled k). Synthetic traces only."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

from speclab.cli.simulate import command
from speclab.costmodel import get_cost_model
from speclab.errors import ConfigError
from speclab.simulate.adaptive import recommend
from speclab.simulate.adaptive.recommend import (
    fixed_from_grid,
    schedule_from_grid,
    schedule_support,
    vllm_config,
)
from speclab.simulate.adaptive.synth import make_set
from speclab.traces import MethodTrace, RequestTrace, write_store

CM = "llama3.1-8b-h100-chained"


def with_methods(names: tuple[str, ...], n: int = 24, seed: int = 0) -> list[RequestTrace]:
    """The synthetic code-copy shape with its n-gram acceptance recorded under each name in `names`."""
    out = []
    for t in make_set("synth-code-copy", n=n, seed=seed, offers=False):
        ng = t.methods["ngram"]
        ms = {m: MethodTrace(k_max=ng.k_max, acc_len=ng.acc_len.copy()) for m in names}
        out.append(RequestTrace(id=t.id, workload=t.workload, category=t.category, prompt_len=t.prompt_len,
                                output_len=t.output_len, methods=ms))  # fmt: skip
    return out


def test_which_proposers_follow_a_schedule():
    for m in ("ngram", "eagle", "eagle3", "mtp", "draft_model"):
        assert schedule_support(m) == (True, "")
    ok, why = schedule_support("suffix")
    assert not ok and "suffix_decoding.py:43" in why
    ok, why = schedule_support("custom:SpeclabAdaptiveProposer")
    assert not ok and "custom_class" in why
    with pytest.raises(ConfigError, match="no batch-size schedule for suffix"):
        vllm_config("suffix", [(1, 4), (16, 2)], 32)


def test_grid_choices():
    grid = {1: {1: 1.5, 2: 1.9, 3: 1.8}, 8: {1: 1.2, 2: 1.3, 3: 1.1}, 64: {1: 0.97, 2: 0.9, 3: 0.8}}
    pts, sp = schedule_from_grid(grid)
    assert pts == [(1, 2), (64, 0)] and sp == {1: 1.9, 8: 1.3, 64: 1.0}
    k, spk = fixed_from_grid(grid)  # mean speedup: k=1 1.223, k=2 1.367, k=3 1.233
    assert k == 2 and spk == {1: 1.9, 8: 1.3, 64: 0.9}


@pytest.mark.parametrize("names", [("suffix",), ("custom:MyProposer",), ("ngram", "suffix")])
def test_recommend_never_offers_a_schedule_vllm_cannot_run(names):
    cm = get_cost_model(CM)
    cm = dataclasses.replace(cm, draft={**cm.draft, "custom:MyProposer": cm.draft["ngram"]})
    rec = recommend(with_methods(names), cm, [1, 8, 64])
    for m, o in rec["others"].items():
        assert o["kind"] == ("schedule" if schedule_support(m)[0] else "fixed")
        if o["kind"] == "fixed":
            assert o["policy"].startswith(f"fixed:{m}:") and "no schedule" in o["note"]
    cfg = rec["speculative_config"]
    if rec["method"] in ("suffix",) or rec["method"].startswith("custom:"):
        assert rec["kind"] == "fixed" and "num_speculative_tokens_per_batch_size" not in cfg
        assert cfg["num_speculative_tokens"] == int(rec["policy"].rsplit(":", 1)[1])
        assert cfg["method"] == ("suffix" if rec["method"] == "suffix" else "custom_class")
    else:
        assert rec["kind"] == "schedule" and cfg["num_speculative_tokens_per_batch_size"][0][0] == 1
    if len(names) == 2:
        # same acceptance: the schedule (it can also shrink k and switch off at large batch) wins the tie
        assert rec["method"] == "ngram"


def test_fixed_k_says_where_it_cannot_switch_off():
    # suffix never accepted: a fixed k loses at every batch size, and the note says so
    tr = with_methods(("suffix",))
    for t in tr:
        t.methods["suffix"] = MethodTrace(k_max=20, acc_len=np.ones(t.output_len, np.int64))
    rec = recommend(tr, CM, [1, 64])
    assert rec["kind"] == "fixed" and "cannot switch SD off where it loses (B = 1, 64)" in rec["note"]


def test_cli_recommend_says_what_vllm_can_run(tmp_path):
    write_store(tmp_path / "t", with_methods(("ngram", "suffix")))
    out = CliRunner().invoke(command, ["--traces", str(tmp_path / "t"), "--cost-model", CM, "--recommend",
                                       "--batch-sizes", "1,64"])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "only what vLLM 0.32 can run is offered" in out.output
    assert "other: fixed:suffix:" in out.output and "suffix_decoding.py:43" in out.output
    cfg = json.loads(out.output.splitlines()[-1])
    assert cfg["method"] == "ngram" and "num_speculative_tokens_per_batch_size" in cfg
    js = CliRunner().invoke(command, ["--traces", str(tmp_path / "t"), "--cost-model", CM, "--recommend",
                                      "--batch-sizes", "1,64", "--json"])  # fmt: skip
    assert js.exit_code == 0, js.output
    rec = json.loads(js.output)
    assert rec["others"]["suffix"]["kind"] == "fixed" and rec["vllm_checked"] == "0.32"


def test_grid_prices_k0_where_the_grid_has_it():
    # a model-based drafter that vLLM runs at k = 0 too: k = 0 is the grid's own figure, not 1.0x
    grid = {1: {0: 0.96, 1: 1.5, 2: 1.9}, 64: {0: 0.96, 1: 0.9, 2: 0.8}}
    pts, sp = schedule_from_grid(grid)
    assert pts == [(1, 2), (64, 0)] and sp == {1: 1.9, 64: 0.96}
    assert fixed_from_grid(grid)[0] == 2  # k = 0 is never "one fixed k"


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_schedule_k0_pays_the_model_drafters_forward(engine):
    """vLLM 0.32's EAGLE runs its first forward before it reads k, so a schedule's k = 0 costs one pass per
    step; n-gram at k = 0 costs nothing. Fast engine and reference loop agree."""
    from speclab.simulate.api import simulate

    cm = get_cost_model(CM)
    traces = with_methods(("ngram", "eagle3"), n=8)
    res = simulate(
        traces, cm, ["schedule:ngram:1=0", "schedule:eagle3:1=0"], "continuous", [1, 8], engine=engine
    )
    for b in (1, 8):
        ng = next(r for r in res if r.policy.startswith("schedule:ngram") and r.batch_size == b)
        ea = next(r for r in res if r.policy.startswith("schedule:eagle3") and r.batch_size == b)
        assert ng.speedup == pytest.approx(1.0)
        d = cm.draft_for("eagle3")
        assert d.form == "chained"
        assert ea.speedup < 1.0  # one pass per step, nothing drafted
        # same steps and target work; the difference is the drafter's pass, at least its constant per
        # decode step (prefill-only steps run no pass)
        assert ea.steps == ng.steps and ea.time_split_s["verify"] == pytest.approx(ng.time_split_s["verify"])
        assert ng.time_split_s["propose"] == 0.0
        decode_steps = ng.steps - len(traces) // b  # at most this many steps hold a running request
        assert ea.time_split_s["propose"] >= d.const * decode_steps * 0.5
        assert ea.time_split_s["propose"] <= ea.steps * (d.const + d.kv * 1e6)


def test_fast_and_reference_agree_on_a_model_drafter_schedule():
    from speclab.simulate.api import simulate

    traces = with_methods(("eagle3",), n=8)
    pol = ["schedule:eagle3:1=2,4=0"]
    fast = simulate(traces, CM, pol, "continuous", [1, 8], engine="fast")
    ref = simulate(traces, CM, pol, "continuous", [1, 8], engine="reference")
    for a, b in zip(fast, ref, strict=True):
        assert a.batch_size == b.batch_size and a.steps == b.steps
        assert a.speedup == pytest.approx(b.speedup, rel=1e-9)
        assert a.time_split_s["propose"] == pytest.approx(b.time_split_s["propose"], rel=1e-9)


def test_speedup_grid_has_k0_for_model_drafters_only():
    from speclab.simulate.adaptive.recommend import speedup_grid

    traces = with_methods(("ngram", "eagle3"), n=8)
    g_ea = speedup_grid(traces, CM, "eagle3", [1, 8], kmax=3)
    g_ng = speedup_grid(traces, CM, "ngram", [1, 8], kmax=3)
    assert all(0 in row and row[0] < 1.0 for row in g_ea.values())
    assert all(0 not in row for row in g_ng.values())


def test_only_base_proposer_methods_run_at_k0():
    from speclab.policy.core import make_policy

    for m, runs in (("ngram", False), ("eagle3", True), ("eagle", True), ("draft_model", True)):
        assert make_policy(f"schedule:{m}:1=2,8=0").drafter_always_runs is runs
