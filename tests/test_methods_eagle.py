"""EAGLE replay: batched chains == naive per-position recomputation. A RANDOM head and target: this is a
logic/shape test only; it says nothing about EAGLE acceptance (no trained head exists offline)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import assert_replay_equals_naive_chains, tiny_llama

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from speclab.methods.eagle import EagleHead, EagleProposer  # noqa: E402


def test_eagle_replay_equals_naive_chains() -> None:
    torch.set_num_threads(1)
    vocab = 11
    target = tiny_llama(0, vocab=vocab, max_positions=256)
    hcfg = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 10000.0}  # fmt: skip
    head = EagleHead.random(
        hcfg, target.get_input_embeddings().weight.detach(), target.lm_head.weight.detach()
    )
    prop = EagleProposer(head=head, target=target, block=7)  # small blocks: exercises batching
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, vocab, size=8)
    # an output that mostly follows the head's own chain, so long acceptances occur
    ctx = list(prompt)
    out = []
    while len(out) < 30:
        d = prop.propose(np.array(ctx), 4)
        take = d[: int(rng.integers(1, 5))].tolist() + [int(rng.integers(0, vocab))]
        out.extend(take)
        ctx.extend(take)
    out = np.array(out[:30])
    k_max = 5
    acc, nprop = prop.replay(prompt, out, k_max)
    assert (nprop == k_max).all()
    assert acc.max() >= 3
    assert_replay_equals_naive_chains(prop, prompt, out, acc, k_max)


def test_eagle_without_head_is_refused() -> None:
    from speclab.errors import ConfigError

    with pytest.raises(ConfigError):
        EagleProposer()
