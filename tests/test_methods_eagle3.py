"""EAGLE-3 replay (speclab.methods.eagle3): the one-pass replay equals naive per-position drafting, row
blocks equal the full training pass, a saved head loads, missing or unsupported heads are refused, and the
crosscheck glue (replay_spec, make_run_replay_fn) agrees with an engine-like walk of live proposals.
Tiny random target and head: logic tests; acceptance numbers mean nothing here."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import assert_replay_equals_naive_chains, tiny_llama

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from speclab.errors import ConfigError  # noqa: E402
from speclab.methods import make_proposer  # noqa: E402
from speclab.methods.eagle3 import Eagle3Proposer  # noqa: E402
from speclab.models.eagle3 import Eagle3Head, head_config  # noqa: E402

VOCAB = 40
AUX = [0, 1]  # HF hidden_states indices of the 2-layer target (both pre-norm)
DRAFT_VOCAB = 24


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_llama(0, vocab=VOCAB)


def random_head(target, seed: int = 0) -> Eagle3Head:
    """A random-init head over a random reduced vocabulary (d2t non-trivial)."""
    torch.manual_seed(seed)
    ids = torch.sort(torch.randperm(VOCAB)[:DRAFT_VOCAB]).values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[ids] = True
    cfg = head_config(target.config.to_dict(), AUX, DRAFT_VOCAB)
    head = Eagle3Head(
        cfg, target.get_input_embeddings().weight.detach(), ids - torch.arange(DRAFT_VOCAB), t2d
    )
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape) * 0.1)  # norms away from 1, every weight matters
    return head.eval()


def self_following_output(prop: Eagle3Proposer, prompt: np.ndarray, n: int, seed: int = 1) -> np.ndarray:
    """An output that mostly follows the head's own chains, so long acceptances occur."""
    rng = np.random.default_rng(seed)
    ctx, out = list(prompt), []
    while len(out) < n:
        d = prop.propose(np.array(ctx), 4)
        take = d[: int(rng.integers(1, 5))].tolist() + [int(rng.integers(0, VOCAB))]
        out += take
        ctx += take
    return np.array(out[:n])


def test_replay_equals_naive_per_position_drafting(target) -> None:
    prop = Eagle3Proposer(head=random_head(target), target=target, block=7)  # small blocks: several
    prompt = np.random.default_rng(0).integers(0, VOCAB, size=9)
    out = self_following_output(prop, prompt, 40)
    k_max = 5
    acc, nprop = prop.replay(prompt, out, k_max)
    assert (nprop == k_max).all()
    assert acc.max() >= 4  # long chains occur, so later chain steps are exercised
    assert_replay_equals_naive_chains(prop, prompt, out, acc, k_max)
    # proposals near max_model_len are cut like an engine's
    capped = Eagle3Proposer(head=prop.head, target=target, block=64, max_model_len=len(prompt) + 37)
    acc_c, nprop_c = capped.replay(prompt, out, k_max)
    assert nprop_c.tolist() == [max(0, min(k_max, 37 - p)) for p in range(40)]
    assert (acc_c <= nprop_c + 1).all()
    assert_replay_equals_naive_chains(capped, prompt, out, acc_c, k_max)


def test_row_blocks_equal_the_full_training_pass(target) -> None:
    head = random_head(target, seed=3)
    x = torch.as_tensor(np.random.default_rng(2).integers(0, VOCAB, size=23))[None]
    feats = torch.randn(1, 23, 2 * 32)
    valid = torch.ones(1, 23, dtype=torch.bool)
    with torch.no_grad():
        full = head.forward_ttt(x, feats, valid, 3)
        for a, b in ((0, 5), (5, 17), (17, 23)):
            part = list(head.iter_ttt(x, feats, valid, 3, rows=slice(a, b)))
            for j in range(3):
                assert torch.allclose(part[j], full[j][:, a:b], atol=1e-5), (a, j)


def test_a_saved_head_loads_and_replays_the_same(target, tmp_path) -> None:
    head = random_head(target, seed=5)
    head.save(tmp_path / "head")
    target.save_pretrained(tmp_path / "target")
    mem = Eagle3Proposer(head=head, target=target)
    disk = make_proposer("eagle3", head=str(tmp_path / "head"), target=str(tmp_path / "target"))
    prompt = np.arange(6) % VOCAB
    out = self_following_output(mem, prompt, 20, seed=4)
    for a, b in zip(mem.replay(prompt, out, 4), disk.replay(prompt, out, 4), strict=True):
        assert np.array_equal(a, b)


def test_missing_or_unsupported_heads_are_refused(target, tmp_path) -> None:
    with pytest.raises(ConfigError, match="needs a trained EAGLE-3 head"):
        make_proposer("eagle3")
    with pytest.raises(ConfigError, match="not found"):
        make_proposer("eagle3", head=str(tmp_path / "nope"), target=target)
    with pytest.raises(ConfigError, match="needs its target"):
        make_proposer("eagle3", head=str(tmp_path / "nope"))
    head = random_head(target)
    head.save(tmp_path / "h")
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    (tmp_path / "h" / "config.json").write_text(json.dumps({**cfg, "norm_before_fc": True}))
    with pytest.raises(ConfigError, match="norm_before_fc"):
        make_proposer("eagle3", head=str(tmp_path / "h"), target=target)
    (tmp_path / "h" / "config.json").write_text(
        json.dumps({**cfg, "eagle_aux_hidden_state_layer_ids": [1, 2]})
    )
    with pytest.raises(ConfigError, match="aux layers"):  # HF's hidden_states[2] is post-norm here
        make_proposer("eagle3", head=str(tmp_path / "h"), target=target)


def test_crosscheck_glue_agrees_with_an_engine_like_walk(target, tmp_path) -> None:
    """Observed steps made by drafting live at every step (as vLLM steps: first proposal at position 1, a
    step commits accepted + 1 tokens) are what crosscheck predicts from the replay of the saved head."""
    from speclab.replay.crosscheck import crosscheck_records
    from speclab.replay.runs import make_run_replay_fn, replay_spec
    from speclab.traces import RequestTrace

    head = random_head(target, seed=7)
    head.save(tmp_path / "head")
    target.save_pretrained(tmp_path / "target")
    prop = Eagle3Proposer(head=head, target=target)
    k = 3
    records = []
    for i in range(3):
        prompt = np.random.default_rng(10 + i).integers(0, VOCAB, size=5 + i)
        out = self_following_output(prop, prompt, 24, seed=20 + i)
        x = np.concatenate([prompt, out])
        acc_obs, drafted, p = [], [], 1
        while p < len(out):
            d = prop.propose(x[: len(prompt) + p], k)
            a = 0
            while a < len(d) and p + a < len(out) and d[a] == out[p + a]:
                a += 1
            acc_obs.append(a)
            drafted.append(len(d))
            p += a + 1
        observed = {"method": "eagle3", "k": k, "per_step_accepted": acc_obs, "per_step_drafted": drafted,
                    "options": {"model": str(tmp_path / "head")}}  # fmt: skip
        records.append(
            RequestTrace(
                f"r{i}",
                "w",
                "chat",
                len(prompt),
                len(out),
                prompt_token_ids=prompt,
                output_token_ids=out,
                meta={"target": str(tmp_path / "target"), "dtype": "float32", "observed": observed},
            )
        )
    assert sum(max(r.meta["observed"]["per_step_accepted"]) for r in records) > 0
    fn, skipped = make_run_replay_fn(tmp_path, {})
    summary = crosscheck_records(records, fn).summary()["eagle3"]
    assert not skipped
    assert summary["agree"] == 3 and summary["steps_matched"] == summary["steps_observed"] > 10
    # the same through the CLI: replay with the target named by the records, then crosscheck
    from click.testing import CliRunner

    from speclab.cli import cli
    from speclab.replay.replay import load_records
    from speclab.traces import write_store

    store = write_store(tmp_path / "in.parquet", records)
    runner = CliRunner()
    res = runner.invoke(cli, ["trace", "--from", str(store), "--methods", "eagle3", "--eagle3-head",
                              str(tmp_path / "head"), "--k-max", "5", "--out", str(tmp_path / "o.parquet")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "eagle3" in res.output
    assert load_records(tmp_path / "o.parquet")[0].methods["eagle3"].k_max == 5
    res = runner.invoke(cli, ["trace", "crosscheck", str(store), "--json"])
    assert res.exit_code == 0, res.output
    assert '"agreement_rate": 1.0' in res.output
    res = runner.invoke(cli, ["trace", "--from", str(store), "--methods", "eagle3", "--out", "x.parquet"])
    assert res.exit_code != 0 and "trained EAGLE-3 head" in (res.output + str(res.exception))
    # what is missing is said, not guessed
    assert "--eagle3-head" in replay_spec("eagle3", {}, {"target": "x"})
    assert "--target" in replay_spec("eagle3", {"model": "h"}, {})
