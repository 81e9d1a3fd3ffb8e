"""Expected acceptance of sampled traces (speclab.replay.expected): the target's sampling distribution
(temperature, top-k, top-p), lookup p_T(d), model sum-min / greedy-draft against naive per-position
computations, and replay_records filling accept_prob for sampled records only. Tiny random models: logic
tests; the numbers mean nothing here."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import tiny_llama

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from speclab.methods.draft_model import DraftModelProposer  # noqa: E402
from speclab.methods.ngram import NgramProposer  # noqa: E402
from speclab.replay import expected as ex  # noqa: E402
from speclab.replay.generate import engine_generate, prompt_sampling, prompt_seed  # noqa: E402
from speclab.replay.replay import replay_records  # noqa: E402
from speclab.traces import RequestTrace  # noqa: E402

VOCAB = 40
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 1}


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    return tiny_llama(0, vocab=VOCAB), tiny_llama(1, vocab=VOCAB)


def test_tempered_probs_temperature_top_k_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = ex.tempered_probs(logits, 0.5)
    np.testing.assert_allclose(p.numpy(), torch.softmax(logits / 0.5, -1).numpy(), rtol=1e-6)
    p = ex.tempered_probs(logits, 1.0, top_k=2)
    assert p[0, 2:].sum() == 0 and abs(float(p[0, :2].sum()) - 1) < 1e-6
    base = torch.softmax(logits, -1)[0]  # 0.644, 0.237, 0.087, 0.032
    p = ex.tempered_probs(logits, 1.0, top_p=0.8)  # the two most probable hold 0.88 >= 0.8: they stay
    assert (p[0] > 0).tolist() == [True, True, False, False]
    np.testing.assert_allclose(p[0, :2].numpy(), (base[:2] / base[:2].sum()).numpy(), rtol=1e-5)
    p = ex.tempered_probs(logits, 1.0, top_p=0.01)  # the top token always stays
    assert p[0].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_lookup_accept_prob_scores_each_draft_at_its_position():
    probs = np.arange(5 * 6, dtype=np.float32).reshape(5, 6) / 100  # 4 outputs + the row after the last
    drafts = np.array([[1, 2, -1], [-1, -1, -1], [3, 4, 5], [0, 1, 2]])
    ap = ex.lookup_accept_prob(torch.as_tensor(probs), drafts)
    assert ap[0].tolist() == pytest.approx([probs[0, 1], probs[1, 2], 0.0])
    assert ap[1].tolist() == [0.0, 0.0, 0.0]
    assert ap[2].tolist() == pytest.approx([probs[2, 3], probs[3, 4], probs[4, 5]])
    assert ap[3].tolist() == pytest.approx([probs[3, 0], probs[4, 1], 0.0])  # past the known rows: 0


def test_ngram_drafts_equal_live_proposals():
    rng = np.random.default_rng(0)
    prompt, out = rng.integers(0, 5, 12), rng.integers(0, 5, 20)
    prop = NgramProposer(min_n=1, max_n=3)
    d = ex.ngram_drafts(prop, prompt, out, 4)
    x = np.concatenate([prompt, out])
    for p in range(len(out)):
        live = prop.propose(x[: len(prompt) + p], 4)
        assert d[p][d[p] >= 0].tolist() == live.tolist()


def _naive_probs(model, x: np.ndarray, temperature: float, **kw) -> np.ndarray:
    """Distribution of the token after x (one forward per context)."""
    with torch.inference_mode():
        lg = model(input_ids=torch.as_tensor(x)[None]).logits[0, -1:]
    return ex.tempered_probs(lg, temperature, **kw)[0].numpy()


def test_target_scorer_and_draft_model_sum_min_match_naive(models):
    target, draft = models
    rng = np.random.default_rng(1)
    prompt, out = rng.integers(0, VOCAB, 6), rng.integers(0, VOCAB, 7)
    scorer = ex.TargetScorer(target, chunk=4)
    probs = scorer.probs(prompt, out, SAMPLING)
    x = np.concatenate([prompt, out])
    assert probs.shape == (len(out) + 1, VOCAB)
    for i in (0, 3, len(out)):
        want = _naive_probs(target, x[: len(prompt) + i], 0.7, top_p=0.9, top_k=20)
        np.testing.assert_allclose(probs[i].numpy(), want, atol=1e-5)
    prop = DraftModelProposer(draft, chunk=3)
    nprop = np.array([3, 3, 3, 3, 3, 2, 1])
    for how in ex.DRAFT_SAMPLING:
        ap = ex.draft_model_accept_prob(prop, prompt, out, probs, 0.7, nprop, how)
        assert ap.shape == (7, 3) and ap[5, 2] == 0 and ap[6, 1] == 0
        for p, j in ((0, 0), (2, 1), (4, 2), (6, 0)):
            ctx = x[: len(prompt) + p + j]
            pt = _naive_probs(target, ctx, 0.7, top_p=0.9, top_k=20)
            q = _naive_probs(draft, ctx, 0.7)
            want = np.minimum(pt, q).sum() if how == "probabilistic" else pt[q.argmax()]
            assert ap[p, j] == pytest.approx(want, abs=1e-5)


def test_eagle3_first_draft_matches_live_proposal(models):
    from speclab.methods.eagle3 import Eagle3Proposer
    from test_methods_eagle3 import random_head

    target, _ = models
    prop = Eagle3Proposer(random_head(target), target, block=3)
    rng = np.random.default_rng(2)
    prompt, out = rng.integers(0, VOCAB, 5), rng.integers(0, VOCAB, 8)
    probs = ex.TargetScorer(target).probs(prompt, out, SAMPLING)
    nprop = np.full(len(out), 3)
    greedy = ex.eagle3_accept_prob(prop, prompt, out, probs, 0.7, nprop, "greedy")
    summin = ex.eagle3_accept_prob(prop, prompt, out, probs, 0.7, nprop, "probabilistic")
    x = np.concatenate([prompt, out])
    for p in range(len(out)):
        d = prop.propose(x[: len(prompt) + p], 1)[0]  # the live head's first draft at this position
        assert greedy[p, 0] == pytest.approx(float(probs[p, d]), abs=1e-6)
    assert ((summin >= 0) & (summin <= 1 + 1e-6)).all() and summin.shape == (len(out), 3)
    assert (summin[:, 1] > 0).any()  # deeper drafts are scored too


class FixedScorer:
    """Distributions that give token t probability (t + 1) / sum: what any lookup draft gets is known."""

    calls = 0

    def probs(self, prompt_ids, output_ids, sampling):
        FixedScorer.calls += 1
        row = torch.arange(1, VOCAB + 1, dtype=torch.float32)
        return (row / row.sum()).expand(len(output_ids) + 1, VOCAB).clone()


def _record(rid: str, sampled: bool) -> RequestTrace:
    prompt = [1, 2, 3, 4, 1, 2, 3, 4]
    out = [1, 2, 3, 9, 1, 2, 3, 4, 1, 2]
    meta = {"sampling": dict(SAMPLING)} if sampled else {}
    return RequestTrace(rid, "w", "chat", len(prompt), len(out), prompt_token_ids=prompt,
                        output_token_ids=out, meta=meta)  # fmt: skip


def test_replay_fills_accept_prob_for_sampled_records_only():
    FixedScorer.calls = 0
    recs = replay_records(
        [_record("s", True), _record("g", False)], ["ngram"], k_max=3,
        options={"ngram": {"min_n": 1, "max_n": 3}}, scorer=FixedScorer,
    )  # fmt: skip
    s, g = recs[0].methods["ngram"], recs[1].methods["ngram"]
    assert g.accept_prob is None and g.accept_source is None
    assert s.accept_source == ex.LOOKUP_SOURCE and s.accept_prob.shape == (10, 3)
    drafts = ex.ngram_drafts(NgramProposer(1, 3), _record("s", True).prompt_token_ids,
                             _record("s", True).output_token_ids, 3)  # fmt: skip
    known = (np.arange(10)[:, None] + np.arange(3)[None, :]) <= 10  # the scorer has rows 0..10
    want = np.where((drafts >= 0) & known, (drafts + 1) / (VOCAB * (VOCAB + 1) / 2), 0.0)
    np.testing.assert_allclose(s.accept_prob, want, rtol=1e-6)
    assert (s.accept_prob[np.arange(3)[None, :] >= s.num_proposed[:, None]] == 0).all()
    s.__class__.validate(s, 10, "t")
    assert FixedScorer.calls == 1
    np.testing.assert_array_equal(s.acc_len, g.acc_len)  # acc_len keeps its greedy-rule meaning


def test_replay_suffix_drafts_give_accept_prob():
    from speclab.methods.suffix import suffix_available

    if not suffix_available():
        pytest.skip("arctic-inference not installed")
    recs = replay_records([_record("a", True), _record("b", True)], ["suffix"], k_max=4, scorer=FixedScorer)
    for r in recs:
        mt = r.methods["suffix"]
        assert mt.accept_source == ex.LOOKUP_SOURCE
        mt.validate(r.output_len, "t")
        known = (np.arange(10)[:, None] + np.arange(4)[None, :]) <= 10  # past the scorer's rows: 0
        proposed = np.arange(4)[None, :] < mt.num_proposed[:, None]
        assert ((mt.accept_prob > 0) == (proposed & known)).all() and proposed.any()


def test_prompt_seeds_and_sampling_settings():
    assert prompt_seed(3, "a") == prompt_seed(3, "a") != prompt_seed(3, "b")
    assert prompt_seed(3, "a") != prompt_seed(4, "a") and 0 <= prompt_seed(3, "a") < 2**31
    assert prompt_sampling({"temperature": 0.0, "seed": 1}, "a") is None
    s = prompt_sampling({"temperature": 0.7, "top_p": 0.9, "top_k": 0, "seed": 1}, "a")
    assert s == {"temperature": 0.7, "top_p": 0.9, "top_k": 0, "seed": prompt_seed(1, "a")}


def test_engine_generate_sends_each_prompt_its_sampling(tmp_path, monkeypatch):
    from test_generate import FAKE_WORKER

    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    monkeypatch.setenv("SPECLAB_WORKER_CMD", f"{__import__('sys').executable} {script}")
    monkeypatch.setenv("FAKE_JOB_COPY", str(tmp_path / "job.json"))
    per = [prompt_sampling(SAMPLING, "a"), prompt_sampling(SAMPLING, "b")]
    engine_generate([[5, 6], [7, 8]], "t", max_tokens=2, sampling=per, echo=lambda s: None, work_dir=tmp_path)
    (cell,) = json.loads((tmp_path / "job.json").read_text())["cells"]
    assert [p["sampling"] for p in cell["prompts"]] == per


def test_trace_cli_samples_and_fills_accept_prob(tmp_path, monkeypatch, capsys):
    import speclab.cli.trace as cli_trace
    import speclab.replay.generate as gen
    from speclab.cli import main
    from speclab.traces import read_store

    got: dict = {}

    def generate_records(workload, target, sampling=None, **kw):
        got["sampling"] = sampling
        return [_record("s", True), _record("g", False)]

    monkeypatch.setattr(gen, "generate_records", generate_records)
    monkeypatch.setattr(cli_trace, "make_scorer", lambda *a: FixedScorer())
    out = tmp_path / "t.parquet"
    (tmp_path / "config.json").write_text("{}")  # a checkpoint directory for --target (never loaded here)
    args = [
        "trace",
        "--workload",
        "w",
        "--target",
        str(tmp_path),
        "--methods",
        "ngram",
        "--k-max",
        "3",
        "--out",
        str(out),
    ]
    assert main([*args, "--temperature", "0.7", "--top-p", "0.9", "--top-k", "5", "--seed", "4"]) in (0, None)
    assert got["sampling"] == {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 4}
    s, g = read_store(out)
    assert s.methods["ngram"].accept_prob.shape == (10, 3) and g.methods["ngram"].accept_prob is None
    assert "expected acc_len (sampled)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["trace", "--from", str(out), "--temperature", "0.7", "--out", str(tmp_path / "x.parquet")])
    assert exc.value.code == 2


@pytest.mark.parametrize("how", ex.DRAFT_SAMPLING)
def test_replay_fills_model_drafter_accept_prob(models, how):
    target, draft = models
    (rec,) = replay_records(
        [_record("s", True)], ["draft_model"], k_max=3, options={"draft_model": {"model": draft}},
        scorer=lambda: ex.TargetScorer(target), draft_sampling=how,
    )  # fmt: skip
    mt = rec.methods["draft_model"]
    assert mt.accept_source == (ex.SUM_MIN_SOURCE if how == "probabilistic" else ex.GREEDY_DRAFT_SOURCE)
    probs = ex.TargetScorer(target).probs(rec.prompt_token_ids, rec.output_token_ids, SAMPLING)
    want = ex.draft_model_accept_prob(
        DraftModelProposer(draft),
        rec.prompt_token_ids,
        rec.output_token_ids,
        probs,
        0.7,
        mt.num_proposed,
        how,
    )
    np.testing.assert_allclose(mt.accept_prob, want, atol=1e-6)
    mt.validate(rec.output_len, "t")
    if how == "probabilistic":  # a model drafter proposes k everywhere; the overlap is never 0 here
        assert (mt.accept_prob[:-2] > 0).all()  # (an argmax draft can fall outside top-k/top-p: 0)
