"""Draft-model replay (one teacher-forced pass) must equal naive per-position greedy chains."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import assert_replay_equals_naive_chains, tiny_llama
from speclab.methods.draft_model import DraftModelProposer, runs_of_hits

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_runs_of_hits() -> None:
    hit = np.array([1, 1, 0, 1, 1, 1, 0, 0, 1], dtype=bool)
    assert runs_of_hits(hit).tolist() == [2, 1, 0, 3, 2, 1, 0, 0, 1]


def test_replay_equals_naive_chains() -> None:
    torch.set_num_threads(1)  # tiny model: threads only add contention on a shared machine
    model = tiny_llama(0, vocab=13)
    prop = DraftModelProposer(model, chunk=16)  # small chunks: exercises the reused KV cache
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 13, size=9)
    # make the "target" output mostly what the draft itself would say, so long acceptances occur
    ctx = list(prompt)
    out = []
    for i in range(30):
        d = prop.propose(np.array(ctx), 1)
        t = int(d[0]) if i % 7 else int(rng.integers(0, 13))
        out.append(t)
        ctx.append(t)
    out = np.array(out)
    k_max = 6
    acc, nprop = prop.replay(prompt, out, k_max)
    assert (nprop == k_max).all()
    assert acc.max() > 2
    assert_replay_equals_naive_chains(prop, prompt, out, acc, k_max)
