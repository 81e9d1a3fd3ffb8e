"""Requests the target writes itself (speclab.drafters.selfgen): sampling, the pool and its split, caching,
deduplication against evaluation prompts, and the whole-run time budget of the training loop."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import speclab.drafters.data as data
import speclab.drafters.selfgen as sg
from speclab.drafters.similarity import prompt_text
from speclab.drafters.sources import source_kind
from speclab.workloads.base import Prompt, user

torch = pytest.importorskip("torch")

STOP = 2


class FakeTok:
    """Characters are tokens (id = code point + 10); a chat template that marks system and user turns."""

    eos_token_id = STOP

    def apply_chat_template(self, msgs, tokenize=False):
        sys = next((m["content"] for m in msgs if m["role"] == "system"), "default system")
        users = "".join(f"[user]{m['content']}[end]" for m in msgs if m["role"] == "user")
        return f"[system]{sys}[end]{users}"

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) + 10 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i - 10) for i in ids if i >= 10)


class FakeModel:
    """generate() writes, per row, a text chosen by a draw from torch's generator (so the chunk's seed
    decides it), ending with STOP unless the text is marked unfinished."""

    generation_config = SimpleNamespace(eos_token_id=STOP)

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.calls = 0

    def generate(self, prefix, attention_mask, do_sample, max_new_tokens, eos_token_id, pad_token_id, **kw):
        assert do_sample and kw == sg.SAMPLING and STOP in eos_token_id
        self.calls += 1
        rows = []
        for _ in range(prefix.shape[0]):
            text = self.texts[int(torch.randint(len(self.texts), ()))]
            ids = [ord(c) + 10 for c in text.removesuffix("~")]
            rows.append((ids if text.endswith("~") else [*ids, STOP])[:max_new_tokens])
        width = max(len(r) for r in rows)
        body = torch.tensor([r + [pad_token_id] * (width - len(r)) for r in rows])
        return torch.cat([prefix, body], 1)


TEXTS = [f"please tell me about topic number {i} today" for i in range(300)] + [
    "too short",
    "this one never ends because it runs out of tokens~",
]


def test_prefix_ends_where_the_users_words_begin() -> None:
    tok = FakeTok()
    chat = tok.decode(sg.request_prefix(tok, "self-chat"))
    assert chat == "[system]default system[end][user]"
    math = tok.decode(sg.request_prefix(tok, "self-math"))
    assert math.startswith("[system]You are a helpful math tutor") and math.endswith("[user]")


def test_sampled_requests_keep_finished_ones_and_follow_the_chunk_seed() -> None:
    model, tok = FakeModel(TEXTS), FakeTok()
    a = sg.sample_requests(model, tok, "self-chat", 0, 0, {STOP})
    assert a == sg.sample_requests(model, tok, "self-chat", 0, 0, {STOP})
    assert a != sg.sample_requests(model, tok, "self-chat", 0, 1, {STOP})
    assert a != sg.sample_requests(model, tok, "self-math", 0, 0, {STOP})
    assert all(len(t.split()) >= sg.MIN_WORDS and not t.endswith("~") for t in a)
    few = FakeModel(["too short", "never ends at all here~"])
    assert sg.sample_requests(few, tok, "self-chat", 0, 0, {STOP}) == []
    # torch's global generator is left as it was (the head's initialisation follows the recipe seed)
    torch.manual_seed(5)
    expect = torch.rand(())
    torch.manual_seed(5)
    sg.sample_requests(model, tok, "self-chat", 0, 0, {STOP})
    assert torch.rand(()) == expect


def test_pool_is_cached_grows_by_prefix_and_splits_by_content(tmp_path: Path) -> None:
    model, tok = FakeModel(TEXTS), FakeTok()
    small = sg.self_pool(model, tok, "self-chat", 20, 4, 0, tmp_path, "t", {STOP})
    calls = model.calls
    again = sg.self_pool(model, tok, "self-chat", 20, 4, 0, tmp_path, "t", {STOP})
    assert model.calls == calls and [p.id for p in again] == [p.id for p in small]  # read from the cache
    big = sg.self_pool(model, tok, "self-chat", 60, 8, 0, tmp_path, "t", {STOP})
    assert [p.id for p in big[: len(small)]] == [p.id for p in small]
    texts = [prompt_text(p) for p in big]
    assert len(set(texts)) == len(texts)  # a request sampled twice is one request
    train, held = sg.pool_side(big, False, 1000), sg.pool_side(big, True, 1000)
    assert len(train) >= 60 and len(held) >= 8
    assert all(sg.is_held(prompt_text(p)) for p in held) and not any(
        sg.is_held(prompt_text(p)) for p in train
    )
    assert {p.workload for p in big} == {"self-chat"} and {p.category for p in big} == {"chat"}
    other = sg.self_pool(FakeModel(TEXTS), tok, "self-chat", 20, 4, 1, tmp_path, "t", {STOP})
    assert [p.id for p in other] != [p.id for p in small]  # another seed, other requests
    files = list(tmp_path.glob("requests-*.json"))
    assert files and all(json.loads(f.read_text())["source"] == "self-chat" for f in files)


def test_pool_that_keeps_nothing_fails_with_one_line(tmp_path: Path, monkeypatch) -> None:
    from speclab.errors import SpeclabError

    monkeypatch.setattr(sg, "MAX_CHUNKS", 3)
    with pytest.raises(SpeclabError, match="3 chunks of sampled requests gave only 0"):
        sg.self_pool(FakeModel(["x~"]), FakeTok(), "self-code", 5, 0, 0, tmp_path, "t", {STOP})


def test_training_prompts_from_a_pool_drop_duplicates_of_evaluation_prompts(
    tmp_path: Path, monkeypatch
) -> None:
    pool = sg.self_pool(FakeModel(TEXTS), FakeTok(), "self-math", 40, 8, 0, tmp_path, "t", {STOP})
    planted = sg.pool_side(pool, False, 3)[2]
    evals = [Prompt("e1", "offline-math", "math", [user(prompt_text(planted).upper())])]
    monkeypatch.setattr(data, "heldout_prompts", lambda workloads=(): evals)
    report: dict[str, int] = {}
    train = data.training_prompts({"self-math": 30}, 0, report, {"self-math": pool})
    held = data.eval_prompts(["self-math"], 8, 42, {"self-math": pool})
    assert source_kind("self-math") == "self" and len(train) == 30 and report["self-math"] >= 1
    assert planted.id not in {p.id for p in train}
    assert not {p.id for p in train} & {p.id for p in held} and len(held) == 8
    with pytest.raises(ValueError, match="sampled first"):
        data.training_prompts({"self-math": 3}, 0, None, None)


def test_the_self_corpus_leaves_the_built_in_workloads_out(monkeypatch) -> None:
    from click.testing import CliRunner

    from speclab.cli import cli
    from speclab.cli.drafters import apply_corpus
    from speclab.drafters.evaluate import left_out_sources
    from speclab.drafters.train import EagleRecipe

    r = EagleRecipe()
    apply_corpus(r, "self", 1.0, ())
    assert set(r.workloads) == {"self-chat", "self-math", "self-code"}
    assert {"offline-chat", "offline-math", "offline-code-edit"} <= left_out_sources(r)
    assert r.key("t") != EagleRecipe().key("t")
    apply_corpus(r, "self", 1.0, (), "offline-math, self-code")
    assert r.eval_workloads == ["offline-math", "self-code"]
    bad = CliRunner().invoke(
        cli, ["drafters", "train", "eagle", "--corpus", "self", "--eval-sources", "nope"]
    )
    assert bad.exit_code != 0 and "--eval-sources 'nope': unknown workload nope" in str(bad.exception)
    # both together: the offline workloads are training sources, held out; stdlib-complete stays left out
    both = EagleRecipe()
    apply_corpus(both, "self+offline", 1.0, ())
    assert set(both.workloads) == {"self-chat", "self-math", "self-code", *EagleRecipe().workloads}
    assert both.workloads["offline-math"] == EagleRecipe().workloads["offline-math"]
    assert both.workloads["self-chat"] == 384 and both.epochs == 6  # the trainer's default recipe
    assert left_out_sources(both) == {"stdlib-complete", "stdlib-docqa", "stdlib-math"}


def test_a_run_deadline_caps_training_and_the_curve_counts_run_time() -> None:
    from speclab.drafters.loop import fit

    w = torch.nn.Linear(2, 1)
    recipe = SimpleNamespace(lr=0.1, seed=0, epochs=1000, evals=4)
    lrs: list[float] = []

    def loss(batch):
        time.sleep(0.01)
        return (w(torch.ones(1, 2)) ** 2).sum()

    def metrics():
        return {"all": {"first_acceptance": 0.0, "tokens_per_step": 1.0}}

    orig = torch.optim.AdamW.step
    torch.optim.AdamW(w.parameters())  # imports done before the clock starts
    start = time.perf_counter() - 5.0  # the data stage took 5 s of the run

    def step(self, *a, **k):
        lrs.append(self.param_groups[0]["lr"])
        return orig(self, *a, **k)

    torch.optim.AdamW.step = step
    try:
        stats = fit(
            w,
            [SimpleNamespace(tokens=[0])],
            [[0]] * 10,
            loss,
            metrics,
            recipe,
            lambda m: None,
            clock=(start, start + 6.0),
        )
    finally:
        torch.optim.AdamW.step = orig
    assert stats["time_capped"] and 0 < stats["steps"] < 10_000
    assert all("run_seconds" in p for p in stats["curve"]) and stats["curve"][0]["run_seconds"] >= 5.0
    assert lrs[-1] < 0.2 * max(lrs)  # the decay followed the time left, not the 10,000 planned steps


def test_under_a_deadline_points_are_taken_by_time() -> None:
    from speclab.drafters.loop import _eval_due

    now = time.perf_counter()
    start, deadline = now - 10.0, now + 30.0  # 40 s run, 4 points: one every 10 s
    assert _eval_due([{"run_seconds": 0.0}], start, deadline, 4)
    assert not _eval_due([{"run_seconds": 5.0}], start, deadline, 4)
    assert not _eval_due([], start, deadline, 4)
