"""The drafters' data engine (speclab.drafters.generate): the vllm path's sequences, cut at a stop id, become
the same training rows as transformers decoding; self requests are sampled many chunks per engine run, each
row under its own seed, and cached per chunk; the engine is part of the cache keys only where it is not
transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import speclab.drafters.generate as gen
import speclab.drafters.selfgen as sg
from speclab.drafters.similarity import prompt_text

torch = pytest.importorskip("torch")

from test_drafters_selfgen import STOP, TEXTS, FakeModel, FakeTok  # noqa: E402


def test_cut_at_stop_keeps_the_stop_id_and_says_whether_it_ended() -> None:
    assert gen.cut_at_stop([5, 6, 2, 7, 2], {2}) == ([5, 6, 2], True)
    assert gen.cut_at_stop([5, 6], {2}) == ([5, 6], False)
    assert gen.cut_at_stop([], {2}) == ([], False)
    with pytest.raises(Exception, match="not one of"):
        gen.check_engine("onnx")


def test_vllm_sequences_give_the_rows_transformers_decoding_gives(monkeypatch) -> None:
    """An engine that returns what transformers decodes (plus tokens after the stop id, which vLLM would not
    have stopped at) yields the same training rows as decoding in process."""
    import speclab.drafters.data as data
    from helpers import tiny_llama

    VOCAB, AUX = 50, [0, 1]
    torch.set_num_threads(1)
    target = tiny_llama(0, vocab=VOCAB)
    prompts = [[3, 4, 5], [7, 8], [9, 10, 11, 12]]
    stop = {VOCAB - 1}
    free = data.greedy_tokens(target, prompts[:1], 12, set())[0]
    stop = {VOCAB - 1, int(free[len(prompts[0]) + 2])}  # an id it emits: a row stops early
    want = data.greedy_with_features(target, prompts, AUX, 12, stop, batch_size=2)
    assert any(len(t) - n < 12 for t, _, _, n, _, _ in want)

    def fake_engine(ps, target_dir, max_tokens, echo=None, **kw):
        full = data.greedy_tokens(target, ps, max_tokens, stop)
        # a row that ended at a stop id goes on past it (vLLM stops at its own EOS only)
        return [f[len(p) :] + ([4, 5] if f[-1] in stop else []) for p, f in zip(ps, full, strict=True)]

    import speclab.replay.generate as rg

    monkeypatch.setattr(rg, "engine_generate", fake_engine)
    full = gen.engine_sequences(prompts, 12, stop, Path("."))
    got = data.features_of(target, prompts, full, AUX)
    for (t1, f1, l1, n1, _, _), (t2, f2, l2, n2, _, _) in zip(want, got, strict=True):
        assert n1 == n2 and torch.equal(t1, t2) and torch.equal(l1, l2)
        assert torch.allclose(f1.float(), f2.float(), atol=1e-2)
    assert gen.engine_sequences([], 12, stop, Path(".")) == []


class FakeEngine:
    """engine_generate with sampling: row text chosen by the row's own seed; counts runs."""

    def __init__(self) -> None:
        self.runs: list[int] = []

    def __call__(self, prompts, target_dir, max_tokens, echo=None, sampling=None, **kw):
        self.runs.append(len(prompts))
        assert sampling and all(s["temperature"] == 1.0 and "seed" in s for s in sampling)
        out = []
        for s in sampling:
            g = torch.Generator().manual_seed(int(s["seed"]))
            text = TEXTS[int(torch.randint(len(TEXTS), (), generator=g))]
            ids = [ord(c) + 10 for c in text.removesuffix("~")]
            out.append((ids if text.endswith("~") else [*ids, STOP])[:max_tokens])
        return out


def test_pool_on_the_engine_samples_chunks_together_and_caches_each(tmp_path: Path, monkeypatch) -> None:
    import speclab.replay.generate as rg

    engine = FakeEngine()
    monkeypatch.setattr(rg, "engine_generate", engine)
    tok = FakeTok()
    args = ("self-chat", 60, 8, 0, tmp_path, "t", {STOP})
    pool = sg.self_pool(None, tok, *args, engine="vllm", target_dir=tmp_path)
    assert len(engine.runs) <= 2 and engine.runs[0] > sg.CHUNK  # several chunks per engine run
    train, held = sg.pool_side(pool, False, 1000), sg.pool_side(pool, True, 1000)
    assert len(train) >= 60 and len(held) >= 8
    assert all(sg.is_held(prompt_text(p)) for p in held)
    runs = len(engine.runs)
    again = sg.self_pool(None, tok, *args, engine="vllm", target_dir=tmp_path)
    assert len(engine.runs) == runs and [p.id for p in again] == [p.id for p in pool]  # all cached
    # each chunk is its own draw: sampling chunk 1 alone gives what the big run cached for it
    alone = sg.sample_chunks_engine(tok, "self-chat", 0, [1], {STOP}, tmp_path)[1]
    cached = json.loads(sg._chunk_path(tmp_path, "self-chat", 0, 1, "t", "vllm").read_text())["requests"]
    assert alone == cached
    # the engine is in the chunk's key; transformers keeps the key it always had
    assert sg._chunk_path(tmp_path, "self-chat", 0, 3, "t", "vllm") != sg._chunk_path(
        tmp_path, "self-chat", 0, 3, "t", "transformers"
    )
    tf = sg.self_pool(FakeModel(TEXTS), tok, "self-chat", 20, 4, 0, tmp_path, "t", {STOP})
    assert [p.id for p in tf] != [p.id for p in pool[: len(tf)]]


def test_chunks_ahead_covers_the_rarer_side() -> None:
    # nothing kept yet: enough chunks for the held side at its 15 % share
    n = sg.chunks_ahead([0, 0], 10, 16, 0, 0)
    assert n * 0.85 * sg.CHUNK * sg.HELD_PERMILLE / 1000 >= 16
    assert sg.chunks_ahead([100, 20], 100, 16, 5, 120) == 1  # nothing left to get
    assert sg.chunks_ahead([0, 0], 10**6, 0, 0, 0) == sg.MAX_CHUNKS


def test_engines_with_seeded_requests_keep_prefills_whole(monkeypatch) -> None:
    """vLLM's CPU build cannot rewind a seeded generator when a prefill is split across steps: a job with a
    seeded request gets an engine with chunked prefill off and a step budget that fits a whole prompt."""
    pytest.importorskip("vllm")
    from speclab.engine import cpu_sampling
    from speclab.engine.protocol import CellSpec, EngineSpec, Job, PromptSpec
    from speclab.engine.worker import job_is_seeded

    def job(sampling):
        cell = CellSpec("c", "continuous", 2, 4, [PromptSpec("p", [1, 2, 3], sampling=sampling)])
        return Job(EngineSpec(target="t", max_num_seqs=2), [cell])

    assert job_is_seeded(job({"temperature": 1.0, "seed": 3}))
    assert not job_is_seeded(job({"temperature": 1.0})) and not job_is_seeded(job(None))
    from vllm.platforms import current_platform

    kw = cpu_sampling.whole_prefill_kwargs(True, 8192, {})
    if current_platform.is_cpu():
        assert kw == {"enable_chunked_prefill": False, "max_num_batched_tokens": 8192}
    else:
        assert kw == {}
    assert cpu_sampling.whole_prefill_kwargs(False, 8192, {}) == {}
    assert cpu_sampling.whole_prefill_kwargs(True, 8192, {"enable_chunked_prefill": True}) == {}
    monkeypatch.setenv(cpu_sampling.FIX_ENV, "off")
    assert cpu_sampling.whole_prefill_kwargs(True, 8192, {}) == {}


def test_the_data_engine_is_in_the_recipe_key_only_when_not_transformers() -> None:
    from dataclasses import asdict

    from speclab.drafters.train import EagleRecipe, chunk_key
    from speclab.workloads.base import Prompt

    a, b = EagleRecipe(), EagleRecipe(data_engine="vllm")
    assert "data_engine" in asdict(a) and a.key("t") != b.key("t")
    chunk = [Prompt("p1", "w", "chat", [{"role": "user", "content": "x"}])]
    assert chunk_key(chunk, a, [1], "t") != chunk_key(chunk, b, [1], "t")


@pytest.mark.engine
def test_seeded_requests_whose_prefills_overflow_a_step_run_on_the_engine() -> None:
    """32 seeded requests of 151 prompt tokens at T = 1 overflow a 2,048-token step: on vLLM's CPU build a
    split prefill killed the engine ("CPU Generator does not use offset"); with whole prefills every request
    finishes, and a request's draw does not depend on what ran beside it."""
    pytest.importorskip("vllm")
    from speclab.models.prepare import resolve_model
    from speclab.replay.generate import engine_generate

    try:
        target = resolve_model("smollm2-135m", prepare=False)
    except Exception as exc:  # noqa: BLE001 - any reason the checkpoint is missing
        pytest.skip(f"target checkpoint not prepared: {exc}")
    prompts = [[1] + [100 + (i * 7 + j) % 500 for j in range(150)] for i in range(32)]
    sampling = [{"temperature": 1.0, "seed": 1000 + i} for i in range(32)]
    outs = engine_generate(prompts, target, 8, max_batch=32, sampling=sampling)
    assert len(outs) == 32 and all(len(o) >= 1 for o in outs)
    alone = engine_generate(prompts[5:6], target, 8, max_batch=1, sampling=sampling[5:6])
    assert alone[0] == outs[5]
