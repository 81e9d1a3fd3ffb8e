"""speclab.drafters: held-out prompts, feature capture, the EAGLE-3 head's TTT pass against step-by-step
drafting, its vLLM checkpoint layout, deterministic training and the replay metrics. Tiny random models only
(a few training steps); training on the real target is not run here."""

from __future__ import annotations

import json
import random

import pytest
import torch

from helpers import tiny_llama

pytest.importorskip("transformers")

from speclab.drafters.data import (  # noqa: E402
    TRAIN_SEED_OFFSET,
    Sequence,
    eval_prompts,
    greedy_with_features,
    heldout_ids,
    training_prompts,
)
from speclab.drafters.evaluate import chain_accepts, replay_metrics, step_replay  # noqa: E402
from speclab.drafters.train import EagleRecipe, pick_draft_vocab, train_head, ttt_loss  # noqa: E402
from speclab.models.eagle3 import Eagle3Head, head_config  # noqa: E402

VOCAB = 50
AUX = [0, 1]  # HF hidden_states indices below the last (that one is post-norm in HF)


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_llama(0, vocab=VOCAB)


@pytest.fixture(scope="module")
def seqs(target) -> list[Sequence]:
    rng = random.Random(0)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randrange(3, 9))] for _ in range(12)]
    res = greedy_with_features(target, prompts, AUX, 20, {VOCAB - 1}, batch_size=5)
    return [Sequence(str(i), "w" if i % 2 else "v", *r) for i, r in enumerate(res)]


def make_head(target, seqs, draft_vocab: int = 30, seed: int = 0, layers: int = 1) -> Eagle3Head:
    d2t, t2d = pick_draft_vocab(seqs, draft_vocab, VOCAB)
    head = Eagle3Head(
        head_config(target.config.to_dict(), AUX, draft_vocab, layers),
        target.get_input_embeddings().weight,
        d2t,
        t2d,
    )
    head.init_from_target(target.model.norm.weight.detach(), target.lm_head.weight, seed)
    return head


# --- held-out prompts ---------------------------------------------------------------------------------


def test_demo_prompts_are_held_out_of_training() -> None:
    from importlib import resources

    from speclab.bench.spec import load_sweep
    from speclab.workloads.registry import load_workload

    path = resources.files("speclab.presets.sweeps") / "demo-cpu.toml"
    spec = load_sweep(str(path))
    demo = {p.id for w in spec.workloads for p in load_workload(w, limit=spec.num_prompts, seed=spec.seed)}
    assert demo <= heldout_ids(tuple(spec.workloads))
    train = training_prompts({w: 40 for w in spec.workloads}, seed=0)
    assert len(train) == 40 * len(spec.workloads)
    assert not demo & {p.id for p in train}
    # the evaluation set is exactly what the demo draws for those workloads
    assert {p.id for p in eval_prompts(list(spec.workloads), spec.num_prompts, spec.seed)} == demo


# --- data ---------------------------------------------------------------------------------------------


def test_batched_greedy_features_match_a_plain_forward(target, seqs) -> None:
    for s in seqs:
        with torch.no_grad():
            o = target(s.tokens[None], output_hidden_states=True)
        am = o.logits[0].argmax(-1)
        hs = torch.cat([o.hidden_states[a] for a in AUX], -1)[0]
        assert torch.equal(am[s.out_start - 1 : -1], s.tokens[s.out_start :])  # greedy continuation
        assert torch.equal(s.labels[:-1], am[:-1]) and s.labels[-1] == -1
        assert torch.allclose(hs[:-1], s.feats[:-1].float(), atol=5e-3)  # stored as float16


def _incremental(model, prompt: list[int], aux: list[int], max_new: int, stop: set[int], topk: int):
    """The reference: one prompt decoded step by step with a KV cache, keeping features, argmax and top-k
    logits of every fed position as decoding computes them (what data version 2 stored)."""
    from transformers import DynamicCache

    toks, feats, labels, tops = list(prompt), [], [], []
    cache, x = DynamicCache(), torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(max_new):
            o = model(input_ids=x, past_key_values=cache, use_cache=True, output_hidden_states=True)
            feats.append(torch.cat([o.hidden_states[a] for a in aux], -1)[0])
            labels.append(o.logits[0].argmax(-1))
            tops.append(o.logits[0].topk(topk, -1))
            nxt = int(labels[-1][-1])
            toks.append(nxt)
            if nxt in stop:
                break
            x = torch.tensor([[nxt]])
    return (
        toks,
        torch.cat(feats),
        torch.cat(labels),
        torch.cat([t.values for t in tops]),
        torch.cat([t.indices for t in tops]),
    )


def test_teacher_forced_features_equal_step_by_step_decoding() -> None:
    """The data path (batched greedy decoding without features, then one teacher-forced forward per finished
    sequence) gives the tokens, labels, features and top-k of step-by-step decoding, up to float rounding."""
    model = tiny_llama(5, vocab=VOCAB)
    rng = random.Random(3)
    prompts = [[rng.randrange(VOCAB - 1) for _ in range(rng.randrange(2, 12))] for _ in range(7)]
    free = greedy_with_features(model, prompts[:1], AUX, 16, set(), topk=6)[0]
    stop = {VOCAB - 1, int(free[0][len(prompts[0]) + 3])}  # an id it emits: some rows stop early in a batch
    got = greedy_with_features(model, prompts, AUX, 16, stop, batch_size=4, topk=6)
    assert any(len(t) - n < 16 for t, _, _, n, _, _ in got)  # some rows stopped at a stop id
    for p, (t, f, lab, n0, ti, tv) in zip(prompts, got, strict=True):
        toks, feats, labels, tvals, tids = _incremental(model, p, AUX, 16, stop, 6)
        assert t.tolist() == toks and n0 == len(p)
        m = len(toks) - 1  # positions fed while decoding; the last token never is
        assert torch.equal(lab[:m], labels[:m]) and lab[m] == -1
        assert torch.allclose(f[:m].float(), feats[:m], atol=2e-3, rtol=1e-3)  # float16 storage
        assert not f[m].any() and not tv[m].any() and not ti[m].any()
        assert torch.equal(ti[:m].long(), tids[:m])
        assert torch.allclose(tv[:m].float(), tvals[:m], atol=2e-2)


def test_teacher_forced_groups_bound_the_padded_tokens() -> None:
    from speclab.drafters.data import teacher_forced

    model = tiny_llama(6, vocab=VOCAB)
    seqs = [list(range(1, n + 1)) for n in (30, 5, 12, 30, 7)]
    small = teacher_forced(model, seqs, AUX, 4, tokens_per_forward=32)  # mostly one sequence per forward
    big = teacher_forced(model, seqs, AUX, 4, tokens_per_forward=10_000)
    for s, a, b in zip(seqs, small, big, strict=True):
        assert a[0].shape == (len(s), 64) and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
        assert torch.allclose(a[0].float(), b[0].float(), atol=2e-3)


# --- the head -----------------------------------------------------------------------------------------


def _sequential_chain(head: Eagle3Head, s: Sequence, t: int, k: int) -> list[torch.Tensor]:
    """Draft logits after context x[..t+1], step by step as vLLM's proposer runs: a causal prefill over
    positions 0..t with target features, then each draft attends to that cache plus earlier drafts; every
    layer keeps its own cache and feeds its output to the next (written out here, not via the head's
    own step function)."""
    x, f = s.tokens, s.feats.float()
    scale = head.hd**-0.5
    pos = torch.arange(t + 1)[None]
    hidden = head.fc(f[None, : t + 1])
    emb, h, caches = head.embed[x[None, 1 : t + 2]], hidden, []
    for i, layer in enumerate(head.layers):
        q, kc, vc, res = layer.qkv(emb if i == 0 else None, h, pos, head.inv_freq)
        caches.append([kc, vc])
        att = torch.softmax(
            (q @ kc.transpose(-1, -2)) * scale + torch.full((t + 1, t + 1), float("-inf")).triu(1), -1
        )
        h = layer.finish(att @ vc, res)
    out, prev = [head.logits(h)[0, -1]], h[:, -1:]
    for j in range(1, k):
        emb, h = head.embed[x[None, t + 1 + j : t + 2 + j]], prev
        for i, layer in enumerate(head.layers):
            qj, kj, vj, res = layer.qkv(emb if i == 0 else None, h, torch.tensor([[t + j]]), head.inv_freq)
            caches[i] = [torch.cat([caches[i][0], kj], 2), torch.cat([caches[i][1], vj], 2)]
            a = torch.softmax((qj @ caches[i][0].transpose(-1, -2)) * scale, -1) @ caches[i][1]
            h = layer.finish(a, res)
        prev = h
        out.append(head.logits(h)[0, -1])
    return out


@pytest.mark.parametrize("layers", [1, 2])
def test_ttt_pass_equals_step_by_step_drafting(target, seqs, layers) -> None:
    head = make_head(target, seqs, layers=layers)
    with torch.no_grad():  # perturb the zero-initialised outputs so every path matters
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    from speclab.drafters.evaluate import collate

    tokens, feats, _, valid = collate(seqs[:3])
    with torch.no_grad():
        ttt = head.forward_ttt(tokens, feats, valid, 3)
        for r, s in enumerate(seqs[:3]):
            for t in range(0, len(s.tokens) - 4, 3):
                seq = _sequential_chain(head, s, t, 3)
                for j in range(3):
                    assert torch.allclose(ttt[j][r, t], seq[j], atol=1e-4), (r, t, j)
                # live drafting (replay's greedy_chain) takes the argmax of the same chain
                drafted = head.greedy_chain(s.tokens[: t + 2], s.feats.float(), 1)
                assert int(drafted[0]) == int(head.draft_ids()[seq[0].argmax()])
        if layers > 1:  # blocks of rows still equal the full pass when lower layers feed upper ones
            part = list(head.iter_ttt(tokens, feats, valid, 3, rows=slice(5, 11)))
            for j in range(3):
                assert torch.allclose(part[j], ttt[j][:, 5:11], atol=1e-5)


@pytest.mark.parametrize("layers", [1, 2])
def test_checkpoint_layout_is_what_vllm_eagle3_loads(target, seqs, tmp_path, layers) -> None:
    head = make_head(target, seqs, layers=layers)
    with torch.no_grad():  # distinct weights per layer, so a swapped layer would show
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)) * 0.05)
    head.save(tmp_path)
    from safetensors.torch import load_file

    st = load_file(str(tmp_path / "model.safetensors"))
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == layers
    assert cfg["draft_vocab_size"] == 30 and cfg["vocab_size"] == VOCAB
    assert cfg["eagle_aux_hidden_state_layer_ids"] == AUX
    assert st["fc.weight"].shape == (32, 64)
    assert st["midlayer.self_attn.q_proj.weight"].shape[1] == 64  # [embeds, hidden] concatenated
    if layers > 1:  # later layers: vLLM's `layers.<i>.*`, input the first layer's output (hidden size)
        assert st["layers.1.self_attn.q_proj.weight"].shape[1] == 32 and "layers.1.mlp.up_proj.weight" in st
        assert {k.split(".")[1] for k in st if k.startswith("layers.")} == {"1"}
    assert st["lm_head.weight"].shape == (30, 32) and "embed_tokens.weight" not in st
    ids = torch.arange(30) + st["d2t"]
    assert torch.equal(ids, ids.unique()) and st["t2d"].sum() == 30 and st["t2d"][ids].all()
    again = Eagle3Head.load(tmp_path, target.get_input_embeddings().weight)
    from speclab.drafters.evaluate import collate

    tokens, feats, _, valid = collate(seqs[:2])
    with torch.no_grad():
        for a, b in zip(
            head.forward_ttt(tokens, feats, valid, 2), again.forward_ttt(tokens, feats, valid, 2), strict=True
        ):
            assert torch.equal(a, b)


def test_init_step0_is_the_targets_early_exit_at_the_last_aux_layer(target, seqs) -> None:
    head = make_head(target, seqs, draft_vocab=VOCAB)  # full vocabulary: step 0 == the target's early exit
    s = seqs[0]
    with torch.no_grad():
        o = target(s.tokens[None], output_hidden_states=True)
        exit_logits = target.lm_head(target.model.norm(o.hidden_states[AUX[-1]]))[0]
        from speclab.drafters.evaluate import collate

        lg = head.forward_ttt(*[x for i, x in enumerate(collate([s])) if i != 2], 1)[0][0]
    assert torch.allclose(lg[:-1], exit_logits[:-1][:, head.draft_ids()], atol=2e-2)


# --- training and replay --------------------------------------------------------------------------------


def test_training_lowers_the_loss_and_is_deterministic(target, seqs) -> None:
    recipe = EagleRecipe(epochs=6, batch_size=4, evals=2, lr=3e-3, seed=3)
    heads = []
    for _ in range(2):
        head = make_head(target, seqs, seed=recipe.seed)
        before = float(ttt_loss(head, seqs[:8], 3, 0.8).detach())
        stats = train_head(head, seqs[:8], seqs[8:], recipe, log=lambda m: None)
        after = float(ttt_loss(head, seqs[:8], 3, 0.8).detach())
        assert after < before
        assert stats["steps"] == 12 and len(stats["curve"]) == 3 and stats["curve"][0]["train_tokens"] == 0
        heads.append(head.state_dict())
    for name in heads[0]:
        assert torch.equal(heads[0][name], heads[1][name]), name


def test_step_replay_counts_steps_like_vllm() -> None:
    acc = torch.tensor([0, 0, 0, 3, 0, 0, 1, 0, 2, 0, 0])
    # prompt of 3 (out_start 3): contexts 4 -> uses acc[2]=0 (commit 1), 5 -> acc[3]=3 (commit 4), 9 -> acc[7]=0,
    # 10 -> acc[8]=2 but only 1 token left -> 1
    assert step_replay(acc, 3, 11, 3) == [0, 3, 0, 1]


def test_replay_metrics_agree_with_chain_accepts(target, seqs) -> None:
    head = make_head(target, seqs)
    m = replay_metrics(head, seqs, 3)
    accs = chain_accepts(head, seqs, 3)
    steps = [
        a for s, acc in zip(seqs, accs, strict=True) for a in step_replay(acc, s.out_start, len(s.tokens), 3)
    ]
    assert m["all"]["steps"] == len(steps) == m["v"]["steps"] + m["w"]["steps"]
    assert m["all"]["tokens_per_step"] == pytest.approx(sum(a + 1 for a in steps) / len(steps), abs=1e-4)
    assert m["all"]["first_acceptance"] == pytest.approx(sum(a >= 1 for a in steps) / len(steps), abs=1e-4)


def test_cli_rejects_bad_options(capsys) -> None:
    from speclab.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["drafters", "train", "eagle", "--prompts-scale", "0"])
    assert exc.value.code == 2
    assert "speclab: error: --prompts-scale must be > 0" in capsys.readouterr().err


def _fake_trainer(monkeypatch, target, seqs, tmp_path, workload: str, modules=()):
    """The trainer on the tiny target: 8 training and 4 evaluation prompts of `workload`, sequences copied
    from `seqs`; returns (the prompt counts each data build was asked for, the prompt maker). `modules` also
    get the target (load_target / target_path)."""
    import speclab.drafters.train as tr
    from speclab.workloads.base import Prompt

    tdir = tmp_path / "target"
    tdir.mkdir()
    (tdir / "config.json").write_text(json.dumps(target.config.to_dict()))
    calls: list[int] = []

    def fake_build(model, tok, prompts, aux, max_new, max_prompt, batch_size=8, log=None):
        calls.append(len(prompts))
        return [
            Sequence(**{**s.__dict__, "prompt_id": p.id, "workload": p.workload})
            for p, s in zip(prompts, seqs, strict=False)
        ]

    def prompts(n: int, tag: str, w: str = workload) -> list:
        return [Prompt(f"{tag}{i}", w, "chat", [{"role": "user", "content": str(i)}]) for i in range(n)]

    for mod in (tr, *modules):
        monkeypatch.setattr(mod, "load_target", lambda name: (target, None, tdir))
        monkeypatch.setattr(mod, "target_path", lambda name, prepare=True: tdir)
    monkeypatch.setattr(
        tr, "training_prompts", lambda w, seed, report=None, pools=None, eval_sources=(): prompts(8, "t")
    )
    monkeypatch.setattr(tr, "eval_prompts", lambda w, n, seed, pools=None: prompts(4, "e"))
    monkeypatch.setattr(tr, "build_sequences", fake_build)
    return calls, prompts


def test_train_eagle_saves_a_manifest_and_reuses_the_cache(target, seqs, tmp_path, monkeypatch) -> None:
    import speclab.drafters.train as tr

    calls, _ = _fake_trainer(monkeypatch, target, seqs, tmp_path, "w")
    recipe = EagleRecipe(target="tiny", draft_vocab=30, epochs=2, batch_size=4, evals=1, aux_layers=AUX)
    out = tr.train_eagle(recipe, cache_dir=str(tmp_path / "cache"))
    m = json.loads((out / "speclab-manifest.json").read_text())
    assert out.parent == tmp_path / "cache" / "tiny" and tr.is_trained(out)
    assert set(m["files"]) == {"config.json", "model.safetensors"}
    assert m["data"]["train_prompts"] == 8 and m["training"]["steps"] == 4 and m["final"]["all"]["steps"] > 0
    assert calls == [8, 4]
    again = tr.train_eagle(EagleRecipe(**{**recipe.__dict__}), cache_dir=str(tmp_path / "cache"))
    assert again == out and calls == [8, 4]  # cached: neither data nor training ran again
    from click.testing import CliRunner

    from speclab.cli import cli

    shown = CliRunner().invoke(cli, ["drafters", "show", str(out)])
    assert shown.exit_code == 0 and "first-position acceptance" in shown.output
    assert "(4/4 steps, 2 epochs planned)" in shown.output
    (out / "model.safetensors").write_bytes(b"corrupt")
    assert not tr.is_trained(out)


def test_evaluate_replays_a_trained_head_on_the_same_cached_prompts(
    target, seqs, tmp_path, monkeypatch
) -> None:
    """`drafters evaluate` on the sources training evaluated gives training's own final figures, from the
    cached evaluation data (nothing decoded again), and marks a source the head never trained on left out."""
    import speclab.drafters.assess as assess
    import speclab.drafters.train as tr

    calls, prompts = _fake_trainer(monkeypatch, target, seqs, tmp_path, "offline-chat", (assess,))
    recipe = EagleRecipe(
        target="tiny",
        workloads={"offline-chat": 8},
        eval_workloads=["offline-chat"],
        draft_vocab=30,
        epochs=2,
        batch_size=4,
        evals=1,
        aux_layers=AUX,
    )
    out = tr.train_eagle(recipe, cache_dir=str(tmp_path / "cache"))
    final = json.loads((out / "speclab-manifest.json").read_text())["final"]
    monkeypatch.setattr(assess, "eval_prompts", lambda w, n, seed, pools=None: prompts(4, "e"))
    res = assess.evaluate_head(out, ["offline-chat"], 4, cache_dir=str(tmp_path / "cache"))
    assert calls == [8, 4]  # the evaluation data came from the cache
    assert res["offline-chat"]["left_out"] is False
    assert res["offline-chat"]["tokens_per_step"] == final["offline-chat"]["tokens_per_step"]
    monkeypatch.setattr(
        assess, "eval_prompts", lambda w, n, seed, pools=None: prompts(4, "x", "offline-math")
    )
    res = assess.evaluate_head(out, ["offline-math"], 4, cache_dir=str(tmp_path / "cache"))
    assert calls == [8, 4, 4] and res["offline-math"]["left_out"] is True and res["left-out"]["steps"] > 0
    from speclab.errors import ConfigError

    with pytest.raises(ConfigError, match="not a speclab-trained drafter"):
        assess.evaluate_head(tmp_path, ["offline-math"], 4)


def test_scaling_one_workload_generates_only_its_new_chunks(target, seqs, tmp_path, monkeypatch) -> None:
    import speclab.drafters.train as tr
    from speclab.drafters.data import DATA_CHUNK
    from speclab.workloads.base import Prompt

    tdir = tmp_path / "target"
    tdir.mkdir()
    (tdir / "config.json").write_text(json.dumps(target.config.to_dict()))
    calls: list[list[str]] = []

    def fake_build(model, tok, prompts, aux, max_new, max_prompt, batch_size=8, log=None):
        calls.append([p.id for p in prompts])
        return [
            Sequence(**{**seqs[i % len(seqs)].__dict__, "prompt_id": p.id, "workload": p.workload})
            for i, p in enumerate(prompts)
        ]

    # a larger draw starts with a smaller one
    def draw(
        workloads: dict[str, int], seed: int, report: dict | None = None, pools=None, eval_sources=()
    ) -> list:
        return [
            Prompt(f"{w}{i}", w, "chat", [{"role": "user", "content": str(i)}])
            for w, n in workloads.items()
            for i in range(n)
        ]

    monkeypatch.setattr(tr, "load_target", lambda name: (target, None, tdir))
    monkeypatch.setattr(tr, "target_path", lambda name, prepare=True: tdir)
    monkeypatch.setattr(tr, "training_prompts", draw)
    monkeypatch.setattr(tr, "build_sequences", fake_build)
    monkeypatch.setattr(tr, "eval_prompts", lambda w, n, seed, pools=None: draw({"e": 4}, 0))
    base = dict(target="tiny", draft_vocab=30, epochs=1, batch_size=16, evals=1, aux_layers=AUX)
    small = tr.train_eagle(
        tr.EagleRecipe(**base, workloads={"a": DATA_CHUNK + 8, "b": 5}), str(tmp_path / "c")
    )
    assert [len(c) for c in calls] == [DATA_CHUNK, 8, 5, 4]
    calls.clear()
    big = tr.train_eagle(
        tr.EagleRecipe(**base, workloads={"a": 2 * DATA_CHUNK + 3, "b": 5}), str(tmp_path / "c")
    )
    # a's first chunk, b and the held-out set come from the cache; a's other prompts are new chunks
    assert calls == [
        [f"a{i}" for i in range(DATA_CHUNK, 2 * DATA_CHUNK)],
        [f"a{i}" for i in range(2 * DATA_CHUNK, 2 * DATA_CHUNK + 3)],
    ]
    m = json.loads((big / "speclab-manifest.json").read_text())
    assert big != small and m["data"]["train_prompts"] == 2 * DATA_CHUNK + 8
    assert m["data"]["train_prompts_by_workload"] == {"a": 2 * DATA_CHUNK + 3, "b": 5}
    assert (m["data"]["generated_prompts"], m["data"]["cached_prompts"]) == (
        DATA_CHUNK + 3,
        DATA_CHUNK + 5 + 4,
    )


def test_workload_prompts_option() -> None:
    from speclab.cli.drafters import scaled_workloads
    from speclab.errors import ConfigError

    base = {"offline-math": 64, "offline-chat": 64, "offline-code-edit": 16}
    assert scaled_workloads(base, 1.0, ("offline-chat=256",)) == {**base, "offline-chat": 256}
    assert scaled_workloads(base, 2.0, ("offline-chat=512,offline-code-edit=0",)) == {
        "offline-math": 128,
        "offline-chat": 512,
    }
    assert (
        scaled_workloads(base, 1.0, ("offline-summarization=3", "offline-math=1"))["offline-summarization"]
        == 3
    )
    for bad, msg in (
        ("offline-chat", "expected WORKLOAD=N"),
        ("offline-chat=-2", "expected WORKLOAD=N"),
        ("offline-chat=x", "expected WORKLOAD=N"),
        ("chat=5", "unknown workload chat"),
        ("offline-math=0,offline-chat=0,offline-code-edit=0", "no training prompts left"),
    ):
        with pytest.raises(ConfigError, match=msg):
            scaled_workloads(base, 1.0, (bad,))


def test_training_prompts_scale_as_prefixes_and_refuse_too_many(monkeypatch) -> None:
    from speclab.errors import ConfigError

    small = training_prompts({"offline-chat": 64}, seed=0)
    big = training_prompts({"offline-chat": 512}, seed=0)
    assert [p.id for p in big[:64]] == [p.id for p in small] and len({p.id for p in big}) == 512
    assert not {p.id for p in big} & heldout_ids(("offline-chat",))
    import speclab.workloads.registry as reg

    few = big[:100]  # a workload that can only make 100 distinct prompts
    monkeypatch.setattr(
        reg, "load_workload", lambda w, limit, seed: few[:limit] if seed == TRAIN_SEED_OFFSET else []
    )
    assert len(training_prompts({"offline-chat": 90}, seed=0)) == 90
    with pytest.raises(ConfigError, match="only 100 distinct training prompts outside the held-out set"):
        training_prompts({"offline-chat": 101}, seed=0)


def test_soft_loss_is_cross_entropy_with_the_targets_topk_distribution(target, seqs) -> None:
    """soft_weight 0 is the hard loss; 1 is, per step, the mean over drafted positions of -sum q log p with q
    the softmax of the target's stored top-k logits at the drafted position, restricted to the draft
    vocabulary (computed here by hand for step 0)."""
    from speclab.drafters.evaluate import collate
    from speclab.drafters.train import ttt_loss

    head = make_head(target, seqs)
    batch = seqs[:3]
    assert all(s.topk_ids is not None for s in batch)
    with torch.no_grad():
        hard = ttt_loss(head, batch, 1, 0.8)
        assert torch.equal(ttt_loss(head, batch, 1, 0.8, soft_weight=0.0), hard)
        soft = ttt_loss(head, batch, 1, 0.8, soft_weight=1.0)
        half = ttt_loss(head, batch, 1, 0.8, soft_weight=0.5)
        tokens, feats, labels, valid = collate(batch)
        logp = torch.log_softmax(head.forward_ttt(tokens, feats, valid, 1)[0], -1)
        terms = []
        for r, s in enumerate(batch):
            for t in range(len(s.tokens) - 1):
                lab = int(s.labels[t + 1])
                if lab < 0 or int(head.t2d_index[lab]) < 0:
                    continue
                ids, vals = s.topk_ids[t + 1].long(), s.topk_logits[t + 1].float()
                d = head.t2d_index[ids]
                q = torch.softmax(vals[d >= 0], -1)
                terms.append(-(q * logp[r, t, d[d >= 0]]).sum())
        want = torch.stack(terms).mean()
    assert soft.item() == pytest.approx(want.item(), rel=1e-5)
    assert half.item() == pytest.approx(0.5 * hard.item() + 0.5 * want.item(), rel=1e-5)
    assert soft.item() != pytest.approx(hard.item(), rel=1e-3)
