"""Replay driver and suffix speculation."""

from __future__ import annotations

import numpy as np
import pytest

from speclab.errors import ConfigError, TraceError
from speclab.methods import make_proposer
from speclab.methods.suffix import SuffixSpeculator, suffix_available, suffix_options
from speclab.replay.replay import load_records, replay_records
from speclab.traces import RequestTrace, write_store

# suffix decoding is arctic-inference's cache (scripts/setup.sh installs it; its build may fail there)
needs_arctic = pytest.mark.skipif(not suffix_available(), reason="arctic-inference not installed")


def _rec(i: int, prompt, output, workload: str = "w") -> RequestTrace:
    return RequestTrace(f"r{i}", workload, "other", len(prompt), len(output),
                        prompt_token_ids=prompt, output_token_ids=output)  # fmt: skip


@needs_arctic
def test_suffix_repeats_a_seen_continuation() -> None:
    sp = SuffixSpeculator(max_cached_requests=0, max_spec_factor=10.0)
    prompt = np.array([5, 6, 7, 8, 9, 10, 11], dtype=np.int32)
    ctx = np.array([*prompt, 5, 6], dtype=np.int32)
    # the first proposing step of a request: start it with its prompt, add the sampled tokens, speculate
    assert sp.step("a", prompt, [5, 6], ctx, 4) == [7, 8, 9, 10]
    assert sp.step("a", prompt, [7], np.array([*ctx, 7], np.int32), 2) == [8, 9]  # capped at k
    assert sp.step("a", prompt, [8], np.array([*ctx, 7, 8], np.int32), 4, max_model_len=12) == []


@needs_arctic
def test_suffix_defaults_and_options_are_vllms() -> None:
    sp = SuffixSpeculator()
    assert (sp.max_tree_depth, sp.max_cached_requests, sp.max_spec_factor, sp.min_token_prob) == (
        24, 10000, 1.0, 0.1,
    )  # fmt: skip
    opts = suffix_options({"suffix_decoding_max_tree_depth": 8, "min_token_prob": 0.2})
    assert opts == {"max_tree_depth": 8, "min_token_prob": 0.2}
    assert make_proposer("suffix", suffix_decoding_max_spec_factor=2.0).max_spec_factor == 2.0
    with pytest.raises(ConfigError, match="max_match"):
        make_proposer("suffix", max_match=12)  # the former trie's options are gone
    with pytest.raises(ConfigError):
        SuffixSpeculator(min_token_prob=1.5)


def test_suffix_without_arctic_inference_says_how_to_install(monkeypatch) -> None:
    import builtins

    real_import = builtins.__import__

    def fail(name, *args, **kwargs):
        if name.startswith("arctic_inference"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fail)
    with pytest.raises(ConfigError, match="scripts/setup.sh"):
        SuffixSpeculator()


@needs_arctic
def test_suffix_global_tree_uses_earlier_outputs() -> None:
    sp = SuffixSpeculator(max_spec_factor=10.0)
    a_out = [20, 21, 22, 23, 24]
    acc_a, _ = sp.replay(np.array([1, 2, 3]), np.array(a_out), 4)
    assert (acc_a == 1).all()  # nothing seen before, own output never repeats
    acc_b, nprop_b = sp.replay(np.array([9, 9, 20]), np.array([21, 22, 23, 24]), 4)
    # after "20", request A's response predicts 21 22 23 24 (capped at the end of the output)
    assert nprop_b[0] >= 3 and acc_b[0] == 5
    # with the global tree off, B only has its own prompt
    sp0 = SuffixSpeculator(max_cached_requests=0, max_spec_factor=10.0)
    sp0.replay(np.array([1, 2, 3]), np.array(a_out), 4)
    acc_b0, _ = sp0.replay(np.array([9, 9, 20]), np.array([21, 22, 23, 24]), 4)
    assert (acc_b0 == 1).all()


@needs_arctic
def test_suffix_forgotten_response_leaves_the_global_tree() -> None:
    sp = SuffixSpeculator(max_spec_factor=10.0)
    sp.replay(np.array([1, 2, 3]), np.array([20, 21, 22, 23, 24]), 4, keep=False)
    assert len(sp.cache.cached_requests) == 0 and len(sp.cache.active_requests) == 0
    acc_b, _ = sp.replay(np.array([9, 9, 20]), np.array([21, 22, 23, 24]), 4)
    assert (acc_b == 1).all()


@needs_arctic
def test_replay_records_fills_methods_and_dedupes(tmp_path) -> None:
    rng = np.random.default_rng(0)
    p = rng.integers(0, 5, size=50)
    o = np.concatenate([p[:20], rng.integers(0, 5, size=10)])
    recs = [_rec(0, p, o), _rec(1, p, o), RequestTrace("x", "w", "other", 3, 2)]
    with pytest.raises(TraceError):
        replay_records(recs, ["ngram"], 8)
    out = replay_records(recs, ["ngram", "suffix"], 8, skip_missing_ids=True)
    assert set(out[0].methods) == {"ngram", "suffix"} and out[2].methods == {}
    for m in ("ngram", "suffix"):
        assert np.array_equal(out[0].methods[m].acc_len, out[1].methods[m].acc_len)
        out[0].methods[m].validate(len(o), "t")
    assert out[0].methods["ngram"].acc_len[1:].mean() > 1.5
    path = write_store(tmp_path / "s.parquet", out)
    back = load_records(path)
    assert np.array_equal(back[0].methods["ngram"].num_proposed, out[0].methods["ngram"].num_proposed)


def test_make_proposer_errors() -> None:
    with pytest.raises(ConfigError):
        make_proposer("eagle")
    with pytest.raises(ConfigError):
        make_proposer("draft_model")
    with pytest.raises(ConfigError):
        make_proposer("ngram", bogus=1)
    with pytest.raises(ConfigError):
        make_proposer("mtp")


@needs_arctic
def test_cli_trace_from_store_and_crosscheck(tmp_path) -> None:
    from click.testing import CliRunner

    from speclab.cli import cli
    from speclab.methods.ngram import NgramProposer
    from speclab.replay.crosscheck import expected_engine_steps

    rng = np.random.default_rng(3)
    recs = []
    for i in range(3):
        p = rng.integers(0, 6, size=40)
        o = np.concatenate([p[3:23], rng.integers(0, 6, size=10)])
        acc, nprop = NgramProposer(3, 7).replay(p, o, 4)
        steps = expected_engine_steps(acc, nprop, 4)
        r = _rec(i, p, o)
        r.meta["observed"] = {"method": "ngram", "k": 4, "per_step_accepted": [s[1] for s in steps],
                              "per_step_drafted": [s[2] for s in steps],
                              "options": {"prompt_lookup_min": 3, "prompt_lookup_max": 7}}  # fmt: skip
        recs.append(r)
    store = write_store(tmp_path / "in.parquet", recs)
    runner = CliRunner()
    res = runner.invoke(cli, ["trace", "--from", str(store), "--methods", "ngram,suffix", "--out",
                              str(tmp_path / "out.parquet")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "ngram" in res.output and "suffix" in res.output
    assert set(load_records(tmp_path / "out.parquet")[0].methods) == {"ngram", "suffix"}
    res = runner.invoke(cli, ["trace", "crosscheck", str(store), "--json"])
    assert res.exit_code == 0, res.output
    assert '"agreement_rate": 1.0' in res.output


def test_crosscheck_uses_vllm_default_ngram_options_when_unrecorded() -> None:
    from speclab.replay.runs import replay_spec

    assert replay_spec("ngram", {}, {"max_model_len": None})[1]["min_n"] == 5
    assert replay_spec("custom:SpeclabNgramProposer", {}, {"max_model_len": None})[1]["max_n"] == 7
    assert replay_spec("ngram", {"prompt_lookup_max": 4}, {"max_model_len": None})[1]["min_n"] == 4
    # suffix decoding: vLLM's options (by their SpeculativeConfig names) carry over; the engine is re-enacted
    assert replay_spec("suffix", {"suffix_decoding_max_tree_depth": 16}, {}) == (
        "suffix",
        {"max_tree_depth": 16},
    )
    assert isinstance(replay_spec("custom:SpeclabSuffixProposer", {"use_global": False}, {}), str)


@needs_arctic
def test_variants_of_one_prompt_do_not_see_each_other() -> None:
    prompt = np.array([1, 2, 3])
    a = np.arange(20, 40)
    b = a.copy()
    b[-1] = 99  # same request, a slightly different answer (e.g. another cell in bf16)
    other = _rec(2, np.array([7, 20, 21]), np.arange(22, 30))
    out = replay_records([_rec(0, prompt, a), _rec(1, prompt, b), other], ["suffix"], 8,
                         {"suffix": {"max_spec_factor": 10.0}})  # fmt: skip
    alone, _ = SuffixSpeculator(max_spec_factor=10.0).replay(prompt, b, 8)
    assert np.array_equal(out[1].methods["suffix"].acc_len, alone)
    assert (out[1].methods["suffix"].acc_len == 1).all()
    # a later request does see the earlier answer through the global tree
    assert out[2].methods["suffix"].acc_len[0] > 1
