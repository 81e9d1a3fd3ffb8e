"""speclab.drafters.distill and .named: the distilled draft model (tiny random models only, no engine):
top-k capture, the student's init, KL training, replay stepping against naive drafting, the checkpoint as
transformers loads it, the shared data cache and manifest, held-out rules, and resolution by preset name."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from helpers import tiny_llama

pytest.importorskip("transformers")

from speclab.drafters.data import Sequence, eval_prompts, greedy_with_features, heldout_ids  # noqa: E402
from speclab.drafters.distill import (  # noqa: E402
    DraftRecipe,
    build_student,
    kl_loss,
    replay_draft,
    token_batches,
    train_student,
    unique_params,
)
from speclab.errors import ConfigError, SpeclabError  # noqa: E402

VOCAB = 50
AUX = [0, 1]


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_llama(0, vocab=VOCAB)


@pytest.fixture(scope="module")
def seqs(target) -> list[Sequence]:
    rng = random.Random(0)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randrange(3, 9))] for _ in range(12)]
    res = greedy_with_features(target, prompts, AUX, 20, {VOCAB - 1}, batch_size=5, topk=8)
    return [Sequence(str(i), "w" if i % 2 else "v", *r) for i, r in enumerate(res)]


def test_topk_logits_are_the_targets(target, seqs) -> None:
    for s in seqs[:4]:
        with torch.no_grad():
            logits = target(s.tokens[None]).logits[0]
        top = logits.topk(8, -1)
        m = len(s.tokens) - 1  # the last token is never fed: zeros there
        assert s.topk_ids.shape == (len(s.tokens), 8) and s.topk_ids.dtype == torch.int32
        assert torch.equal(s.topk_ids[:m, 0].long(), s.labels[:m])
        assert torch.allclose(s.topk_logits[:m].float(), top.values[:m], atol=2e-2)  # float16
        assert not s.topk_logits[m].any()


def test_student_starts_as_the_targets_chosen_layers(target, seqs) -> None:
    student = build_student(target, [1])
    assert student.config.num_hidden_layers == 1 and target.config.num_hidden_layers == 2
    for name, p in student.model.layers[0].state_dict().items():
        assert torch.equal(p, target.model.layers[1].state_dict()[name]), name
    assert torch.equal(student.model.embed_tokens.weight, target.model.embed_tokens.weight)
    assert not student.model.embed_tokens.weight.requires_grad  # frozen by default
    assert unique_params(student) < unique_params(target)
    full = build_student(target, [0, 1])
    x = seqs[0].tokens[None]
    with torch.no_grad():
        assert torch.allclose(full(x).logits, target(x).logits, atol=1e-5)  # all layers: the target itself


def test_kl_training_lowers_the_loss_and_is_deterministic(target, seqs) -> None:
    # the tiny target's lm_head is random and untied: let the 1-layer student train it too
    recipe = DraftRecipe(epochs=5, tokens_per_batch=64, evals=2, lr=1e-2, seed=3, k=3, train_embedding=True)
    states = []
    for _ in range(2):
        torch.manual_seed(recipe.seed)
        student = build_student(target, [0], train_embedding=True)
        before = float(kl_loss(student, seqs[:8]).detach())
        stats = train_student(student, seqs[:8], seqs[8:], recipe, log=lambda m: None)
        after = float(kl_loss(student, seqs[:8]).detach())
        assert after < 0.6 * before
        assert stats["steps"] == stats["planned_steps"] == len(token_batches(seqs[:8], 64)) * 5
        assert len(stats["curve"]) == 3 and stats["curve"][0]["train_tokens"] == 0
        assert stats["curve"][-1]["all"]["steps"] > 0 and stats["curve"][-1]["train_kl"] is not None
        states.append(student.state_dict())
    for name in states[0]:
        assert torch.equal(states[0][name], states[1][name]), name


def test_token_batches_respect_the_budget(seqs) -> None:
    batches = token_batches(seqs, 60)
    assert sorted(i for b in batches for i in b) == list(range(len(seqs)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(len(seqs[i].tokens) for i in b) <= 60


def test_replay_stepping_equals_naive_drafting(target, seqs) -> None:
    """replay_draft (teacher-forced replay) gives the same per-step acceptances as drafting k tokens with the
    draft at every step and comparing them with the target's greedy output, as vLLM does."""
    from speclab.methods.draft_model import DraftModelProposer

    torch.manual_seed(0)
    student = build_student(target, [0])
    with torch.no_grad():  # a draft that agrees sometimes: mix the target's layer 1 in
        student.model.layers[0].mlp.down_proj.weight.mul_(0.5)
    prop = DraftModelProposer(student)
    naive: list[int] = []
    for s in seqs:
        x = s.tokens.numpy()
        out = x[s.out_start :]
        p = 1
        while p < len(out):
            d = prop.propose(x[: s.out_start + p], 3)
            a = 0
            while a < len(d) and p + a < len(out) and d[a] == out[p + a]:
                a += 1
            naive.append(a)
            p += a + 1
    m = replay_draft(student, seqs, 3)
    assert m["all"]["steps"] == len(naive) and m["all"]["steps"] == m["v"]["steps"] + m["w"]["steps"]
    assert m["all"]["tokens_per_step"] == pytest.approx(np.mean([a + 1 for a in naive]), abs=1e-4)
    assert m["all"]["first_acceptance"] == pytest.approx(np.mean([a >= 1 for a in naive]), abs=1e-4)


# --- the cache, the checkpoint and the shared data ---------------------------------------------------------


@pytest.fixture
def fake_target(target, seqs, tmp_path, monkeypatch):
    """The tiny target as a checkpoint directory, with the data stage, prompts and target loading faked."""
    import speclab.drafters.distill as di
    import speclab.drafters.train as tr
    from speclab.workloads.base import Prompt

    tdir = tmp_path / "target"
    target.save_pretrained(str(tdir))
    (tdir / "tokenizer.json").write_text('{"fake": true}')
    calls: list[int] = []

    def fake_build(model, tok, prompts, aux, max_new, max_prompt, batch_size=8, log=None):
        calls.append(len(prompts))
        return [
            Sequence(**{**s.__dict__, "prompt_id": p.id, "workload": p.workload})
            for p, s in zip(prompts, seqs, strict=False)
        ]

    def prompts(n: int, tag: str) -> list:
        return [Prompt(f"{tag}{i}", "w", "chat", [{"role": "user", "content": str(i)}]) for i in range(n)]

    for mod in (tr, di):
        monkeypatch.setattr(mod, "load_target", lambda name: (target, None, tdir))
        monkeypatch.setattr(mod, "target_path", lambda name, prepare=True: tdir)
    monkeypatch.setattr(
        tr, "training_prompts", lambda w, seed, report=None, pools=None, eval_sources=(): prompts(8, "t")
    )
    monkeypatch.setattr(tr, "eval_prompts", lambda w, n, seed, pools=None: prompts(4, "e"))
    monkeypatch.setattr(tr, "build_sequences", fake_build)
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    return tdir, calls, prompts


def test_train_draft_checkpoint_manifest_and_cache(target, fake_target, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    import speclab.drafters.distill as di
    import speclab.drafters.train as tr

    tdir, calls, _ = fake_target
    recipe = DraftRecipe(target="tiny", depth=1, epochs=2, tokens_per_batch=64, evals=1, aux_layers=AUX)
    out = di.train_draft(recipe)
    assert out.parent == tmp_path / "cache" / "drafters" / "tiny" and out.name.startswith("draft-")
    m = json.loads((out / "speclab-manifest.json").read_text())
    assert m["kind"] == "draft_model" and tr.is_trained(out, version=di.RECIPE_VERSION)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(m["files"])
    assert m["cost"]["layers_from_target"] == [0] and 0 < m["cost"]["params_ratio"] < 1
    assert m["data"]["train_prompts"] == 8 and m["final"]["all"]["steps"] > 0 and calls == [8, 4]
    loaded = AutoModelForCausalLM.from_pretrained(str(out))  # a normal checkpoint with the target's config
    assert loaded.config.num_hidden_layers == 1 and loaded.config.vocab_size == VOCAB
    assert loaded.config.hidden_size == target.config.hidden_size
    # the embedding and lm_head are the target's, frozen by default
    assert torch.equal(loaded.model.embed_tokens.weight, target.model.embed_tokens.weight)
    assert torch.equal(loaded.lm_head.weight, target.lm_head.weight)
    assert (out / "tokenizer.json").read_text() == '{"fake": true}'
    # cached: neither data nor training runs again; an EAGLE head of the same data fields reuses the data
    assert di.train_draft(DraftRecipe(**{**recipe.__dict__, "layers": None})) == out and calls == [8, 4]
    head = tr.train_eagle(tr.EagleRecipe(target="tiny", draft_vocab=30, epochs=1, evals=1, aux_layers=AUX))
    assert head.name.startswith("eagle3-") and calls == [8, 4]
    # another recipe is another entry
    other = di.train_draft(DraftRecipe(**{**recipe.__dict__, "layers": None, "lr": 7e-4}))
    assert other != out and calls == [8, 4]
    from click.testing import CliRunner

    from speclab.cli import cli

    shown = CliRunner().invoke(cli, ["drafters", "show", str(out)])
    assert shown.exit_code == 0 and "first-position acceptance" in shown.output and "cost:" in shown.output


def test_training_refuses_heldout_prompts_in_the_data(fake_target, monkeypatch) -> None:
    import speclab.drafters.distill as di
    import speclab.drafters.train as tr

    _, _, prompts = fake_target
    monkeypatch.setattr(
        tr, "eval_prompts", lambda w, n, seed, pools=None: prompts(2, "t")
    )  # ids of training prompts
    with pytest.raises(SpeclabError, match="evaluation prompts are in the training data"):
        di.train_draft(DraftRecipe(target="tiny", depth=1, epochs=1, evals=1, aux_layers=AUX))


def test_draft_sweep_prompts_are_the_heldout_evaluation_set() -> None:
    from importlib import resources

    from speclab.bench.spec import load_sweep
    from speclab.workloads.registry import load_workload

    spec = load_sweep(str(resources.files("speclab.presets.sweeps") / "draft-cpu.toml"))
    drawn = {p.id for w in spec.workloads for p in load_workload(w, limit=spec.num_prompts, seed=spec.seed)}
    assert drawn <= heldout_ids(tuple(spec.workloads))
    r = DraftRecipe()
    assert (spec.seed, spec.num_prompts, list(spec.workloads)) == (
        r.eval_seed,
        r.eval_prompts,
        r.eval_workloads,
    )
    assert {p.id for p in eval_prompts(r.eval_workloads, r.eval_prompts, r.eval_seed)} == drawn
    models = {m.label: m.options.get("model") for m in spec.methods}
    assert (
        models["distilled-k3"] == "smollm2-135m-distilled"
        and models["eagle3-k3"] == "smollm2-135m-eagle3"
        and models["l8-probe-k3"] == "smollm2-135m-draft-l8"
    )
    demo = load_sweep(str(resources.files("speclab.presets.sweeps") / "demo-cpu.toml"))
    assert [m.options["model"] for m in demo.methods if m.name == "draft_model"] == ["smollm2-135m-distilled"]


# --- by preset name ------------------------------------------------------------------------------------------


def test_trained_presets_parse() -> None:
    from speclab.drafters.named import recipe_for
    from speclab.drafters.train import EagleRecipe
    from speclab.models import get_preset
    from speclab.models.presets import _parse

    p = get_preset("smollm2-135m-distilled")
    assert p.trained and p.buildable and p.role == "draft_model" and p.base == "smollm2-135m"
    r = recipe_for(p)
    assert isinstance(r, DraftRecipe) and r.target == "smollm2-135m"
    e = get_preset("smollm2-135m-eagle3")
    assert e.trained and e.role == "eagle3" and isinstance(recipe_for(e), EagleRecipe)
    assert not get_preset("smollm2-135m-draft-l8").trained
    bad = _parse({"name": "x", "source": "distill", "base": "smollm2-135m", "train": {"nope": 1}}, "x")
    with pytest.raises(ConfigError, match="unknown recipe field"):
        recipe_for(bad)
    with pytest.raises(ConfigError, match="field base"):
        _parse({"name": "x", "source": "distill"}, "x")


def test_name_resolves_to_the_trained_draft_and_trains_on_first_use(fake_target, monkeypatch) -> None:
    import dataclasses

    import speclab.drafters.distill as di
    import speclab.models.prepare as prep
    from speclab.models import get_preset, list_models, prepare_model, resolve_model

    base = get_preset("smollm2-135m-distilled")
    tiny = dataclasses.replace(
        base,
        base="tiny",
        train={"depth": 1, "epochs": 1, "evals": 1, "aux_layers": AUX, "tokens_per_batch": 64},
    )
    table = {**prep.presets(), "smollm2-135m-distilled": tiny}
    monkeypatch.setattr(prep, "presets", lambda: table)
    monkeypatch.setattr(prep, "get_preset", lambda name: table[name])
    with pytest.raises(SpeclabError, match="not trained yet: speclab models prepare smollm2-135m-distilled"):
        resolve_model("smollm2-135m-distilled", prepare=False)
    trained: list[str] = []
    real = di.train_draft
    monkeypatch.setattr(di, "train_draft", lambda *a, **kw: trained.append("x") or real(*a, **kw))
    msgs: list[str] = []
    d = prepare_model("smollm2-135m-distilled", "bfloat16", log=msgs.append)
    assert trained == ["x"] and any("not trained yet; training it now" in m for m in msgs)
    assert resolve_model("smollm2-135m-distilled", "float32", prepare=False) == d
    assert resolve_model("smollm2-135m-distilled") == d and trained == ["x"]  # cached: no second training
    row = next(r for r in list_models() if r["preset"].name == "smollm2-135m-distilled")
    assert row["prepared"]["float32"] == str(d)
