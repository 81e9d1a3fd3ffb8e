"""Cross-check logic and the vLLM custom_class adapters, against a simulated engine loop (no vLLM)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from speclab.methods.ngram import NgramProposer
from speclab.methods.suffix import SuffixSpeculator, suffix_available
from speclab.methods.vllm_custom import OPTIONS_ENV, SpeclabNgramProposer, SpeclabSuffixProposer
from speclab.replay.crosscheck import check_request, crosscheck_records, expected_engine_steps
from speclab.traces import RequestTrace


def _config(k: int, max_model_len: int = 4096) -> SimpleNamespace:
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=max_model_len),
    )


def simulate_engine(adapter, prompts, outputs, width: int = 4096):
    """Greedy engine loop over several concurrent requests with known target outputs. Returns per request
    (per_step_accepted, per_step_drafted) as vLLM's detailed metrics would report them."""
    n_req = len(prompts)
    pos = [1] * n_req  # output[0] came from prefill
    acc: list[list[int]] = [[] for _ in range(n_req)]
    drf: list[list[int]] = [[] for _ in range(n_req)]
    sampled = [[int(o[0])] for o in outputs]
    while True:
        rows = [i for i in range(n_req) if pos[i] < len(outputs[i])]
        if not rows:
            break
        buf = np.zeros((len(rows), width), dtype=np.int32)
        ntok = np.zeros(len(rows), dtype=np.int32)
        for r, i in enumerate(rows):
            ctx = np.concatenate([prompts[i], outputs[i][: pos[i]]])
            buf[r, : len(ctx)] = ctx
            ntok[r] = len(ctx)
        if hasattr(adapter, "rows"):
            adapter.rows = rows  # an id-keyed proposer is told which request each row is
        drafts = adapter.propose([sampled[i] for i in rows], ntok, buf)
        for r, i in enumerate(rows):
            d = drafts[r]
            tgt = outputs[i][pos[i] :]
            a = 0
            while a < len(d) and a < len(tgt) and d[a] == tgt[a]:
                a += 1
            if d:
                acc[i].append(a)
                drf[i].append(len(d))
            new = tgt[: a + 1]
            sampled[i] = [int(t) for t in new]
            pos[i] += len(new)
    return acc, drf


def _data(seed: int, n_req: int = 3):
    rng = np.random.default_rng(seed)
    prompts, outputs = [], []
    for _ in range(n_req):
        base = rng.integers(0, 6, size=40)
        prompts.append(base)
        # outputs copy stretches of the prompt, so lookups hit and miss
        out = np.concatenate([base[5:25], rng.integers(0, 6, size=15), base[10:30]])
        outputs.append(out)
    return prompts, outputs


def test_expected_steps_walk() -> None:
    acc = np.array([1, 3, 1, 1, 2, 1, 1])
    nprop = np.array([0, 4, 2, 0, 2, 0, 1])
    # p=1: accept 2 -> p=4: accept 1 -> p=6: accept 0 (drafted 1) -> end
    assert expected_engine_steps(acc, nprop, k=4) == [(1, 2, 4), (4, 1, 2), (6, 0, 1)]
    # cap at k=1: p=1 accepts 1 of 1 -> p=3 no proposal -> p=4 accepts 1 -> p=6
    assert expected_engine_steps(acc, nprop, k=1) == [(1, 1, 1), (4, 1, 1), (6, 0, 1)]


@pytest.mark.parametrize("k", [1, 3, 6])
def test_ngram_adapter_agrees_with_replay(k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OPTIONS_ENV, json.dumps({"min_n": 2, "max_n": 4}))
    prompts, outputs = _data(k)
    adapter = SpeclabNgramProposer(_config(k))
    obs_a, obs_d = simulate_engine(adapter, prompts, outputs)
    prop = NgramProposer(min_n=2, max_n=4)
    for i in range(len(prompts)):
        acc, nprop = prop.replay(prompts[i], outputs[i], 20)
        rec = RequestTrace(f"r{i}", "w", "other", len(prompts[i]), len(outputs[i]),
                           prompt_token_ids=prompts[i], output_token_ids=outputs[i])  # fmt: skip
        obs = {"method": "ngram", "k": k, "per_step_accepted": obs_a[i], "per_step_drafted": obs_d[i]}
        rc = check_request(rec, acc, nprop, "ngram", k, obs)
        assert rc.status in ("agree", "output_end"), vars(rc)
        assert len(obs_a[i]) > 0


class _BuiltinLikeSuffix:
    """vLLM's built-in suffix proposer as far as the cache sees it: real request ids (the engine loop
    sets `rows`, the request index of each row), SuffixSpeculator.step per row, then stop the requests
    that left the batch."""

    def __init__(self, k: int, prompts) -> None:
        self.k, self.prompts = k, prompts
        self.spec = SuffixSpeculator()
        self.rows: list[int] = []

    def propose(self, sampled, ntok, buf):
        out = []
        for r, i in enumerate(self.rows):
            n = int(ntok[r])
            out.append(self.spec.step(f"req-{i}", self.prompts[i], sampled[r], buf[r, :n].copy(), self.k))
        self.spec.stop_missing([f"req-{i}" for i in self.rows])
        return out


@pytest.mark.skipif(not suffix_available(), reason="arctic-inference not installed")
@pytest.mark.parametrize("copies", [1, 3])
def test_suffix_adapter_matches_the_builtin_way_of_driving_the_cache(copies: int) -> None:
    """The custom_class adapter (no request ids: identity by context hash) proposes exactly what the
    built-in's id-keyed stepping proposes, also with replicated copies whose contexts are identical."""
    k = 5
    prompts, outputs = _data(11)
    prompts = [p for p in prompts for _ in range(copies)]
    outputs = [o for o in outputs for _ in range(copies)]
    obs = simulate_engine(SpeclabSuffixProposer(_config(k)), prompts, outputs)
    exp = simulate_engine(_BuiltinLikeSuffix(k, prompts), prompts, outputs)
    assert obs == exp
    assert any(a > 0 for steps in obs[0] for a in steps)  # the cache did predict something


def test_crosscheck_classifies_mismatch_and_output_end() -> None:
    prompt = np.array([1, 2, 3, 4, 1, 2, 3, 4, 1, 2])
    output = np.array([3, 4, 1, 2, 3])
    rec = RequestTrace(
        "r", "w", "other", len(prompt), len(output), prompt_token_ids=prompt, output_token_ids=output
    )
    acc, nprop = NgramProposer(min_n=2, max_n=3).replay(prompt, output, 4)
    exp = expected_engine_steps(acc, nprop, 4)
    assert len(exp) == 1 and exp[0][0] == 1
    p, a, d = exp[0]
    fn = lambda r, m, k, o: (acc, nprop)  # noqa: E731
    # engine accepted more at the last step (tokens past the recorded end): explained
    rec.meta["observed"] = {"method": "ngram", "k": 4, "per_step_accepted": [a + 1], "per_step_drafted": [d]}
    res = crosscheck_records([rec], fn)
    assert res.per_request[0].status == "output_end"
    rec.meta["observed"] = {"method": "ngram", "k": 4, "per_step_accepted": [a], "per_step_drafted": [d + 1]}
    res = crosscheck_records([rec], fn)
    assert res.per_request[0].status == "mismatch"
    assert res.summary()["ngram"]["agreement_rate"] == 0.0


def test_custom_class_proposer_options_reach_the_replay():
    # a custom_class n-gram run with proposer_options must be replayed with those lookup bounds,
    # not the adapter's defaults (3/7)
    from speclab.bench.results import effective_options
    from speclab.replay.runs import replay_spec

    engine_opts = {
        "model": "speclab.methods.vllm_custom.SpeclabNgramProposer",
        "proposer_options": {"min_n": 2, "max_n": 4},
    }
    opts = effective_options("custom_class", engine_opts)
    assert opts["min_n"] == 2 and opts["max_n"] == 4
    method, replay_opts = replay_spec("custom:SpeclabNgramProposer", opts, {})
    assert method == "ngram" and (replay_opts["min_n"], replay_opts["max_n"]) == (2, 4)
    # without options the adapter's own defaults apply
    _, defaults = replay_spec("custom:SpeclabNgramProposer", effective_options("custom_class", {}), {})
    assert (defaults["min_n"], defaults["max_n"]) == (3, 7)
