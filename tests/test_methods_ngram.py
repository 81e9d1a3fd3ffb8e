"""n-gram replay must reproduce vLLM's own n-gram lookup exactly (installed vLLM is the reference)."""

from __future__ import annotations

import numpy as np
import pytest

from speclab.methods.ngram import NgramProposer, ngram_lookup


def _vllm_fn():
    mod = pytest.importorskip("vllm.v1.spec_decode.ngram_proposer")
    return mod._find_longest_matched_ngram_and_propose_tokens


@pytest.mark.parametrize("vocab", [2, 3, 5, 50])
@pytest.mark.parametrize("min_n,max_n", [(1, 1), (2, 4), (3, 7), (1, 5)])
def test_lookup_matches_vllm_on_every_prefix(vocab: int, min_n: int, max_n: int) -> None:
    vllm_find = _vllm_fn()
    rng = np.random.default_rng(vocab * 100 + min_n * 10 + max_n)
    for trial in range(6):
        m = int(rng.integers(1, 120))
        x = rng.integers(0, vocab, size=m).astype(np.int32)
        k = int(rng.integers(1, 25))
        mml = None if trial % 2 == 0 else int(m + rng.integers(0, 8))
        ends = np.arange(0, m + 1)
        s, n = ngram_lookup(x, ends, min_n, max_n, k, mml)
        for T in range(0, m + 1):
            want = vllm_find(x[:T], min_n, max_n, mml if mml is not None else 10**9, k)
            got = x[s[T] : s[T] + n[T]]
            assert got.tolist() == want.tolist(), (x[:T].tolist(), T, min_n, max_n, k)


def test_propose_and_replay_agree() -> None:
    rng = np.random.default_rng(7)
    prop = NgramProposer(min_n=2, max_n=4)
    prompt = rng.integers(0, 4, size=30)
    output = rng.integers(0, 4, size=60)
    x = np.concatenate([prompt, output])
    acc, nprop = prop.replay(prompt, output, k_max=6)
    for p in range(len(output)):
        d = prop.propose(x[: len(prompt) + p], 6)
        assert len(d) == nprop[p]
        target = output[p:]
        a = 0
        while a < len(d) and a < len(target) and d[a] == target[a]:
            a += 1
        assert acc[p] == a + 1


def test_periodic_text_proposes_full_k() -> None:
    prop = NgramProposer(min_n=3, max_n=7)
    ctx = np.array([1, 2, 3, 4, 5] * 6)
    d = prop.propose(ctx, 4)
    # the 7-gram suffix [4,5,1,2,3,4,5] first occurs at 3..9, so the proposal is x[10:14]
    assert d.tolist() == [1, 2, 3, 4]
