"""`trace crosscheck --expected` on many records (speclab.replay.runs.expected_traces): each model loaded
once, each distinct (prompt, output, sampling) scored once by the target however many groups hold it, one
forward of the draft model per record, and the accept_prob of this path equal to naive per-position
computations. Tiny random models: logic tests; the numbers mean nothing here."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import tiny_llama

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from speclab.replay import expected as ex  # noqa: E402
from speclab.replay import replay as rp  # noqa: E402
from speclab.replay.runs import expected_traces  # noqa: E402
from speclab.traces import RequestTrace  # noqa: E402

VOCAB = 40
SAMPLING = {"temperature": 0.8, "top_p": 0.9, "top_k": 0}


class CountingScorer:
    def __init__(self, target) -> None:
        self.inner, self.calls = ex.TargetScorer(target), 0

    def probs(self, *a):
        self.calls += 1
        return self.inner.probs(*a)


def _naive(model, x: np.ndarray, **kw) -> np.ndarray:
    with torch.inference_mode():
        lg = model(input_ids=torch.as_tensor(x)[None]).logits[0, -1:]
    return ex.tempered_probs(lg, **kw)[0].numpy()


def _records(draft_dir: str) -> list[RequestTrace]:
    """Two prompts, each output under a draft-model cell at k=3 (twice, as two batch sizes give) and k=2
    (another group) and under an n-gram cell: 4 distinct (prompt, output) in 3 groups."""
    rng = np.random.default_rng(5)
    recs = []
    for i in range(2):
        prompt, out = rng.integers(0, VOCAB, 9 + i).tolist(), rng.integers(0, VOCAB, 8).tolist()
        cells = [
            ("draft_model", 3, "b1"),
            ("draft_model", 3, "b4"),
            ("draft_model", 2, "b1"),
            ("ngram", 3, "b1"),
        ]
        for method, k, b in cells:
            opts = {"model": draft_dir} if method == "draft_model" else {"prompt_lookup_min": 1}
            o = out if method == "draft_model" else rng.integers(0, VOCAB, 8).tolist()
            obs = {
                "method": method,
                "k": k,
                "options": opts,
                "per_step_accepted": [0],
                "per_step_drafted": [k],
            }
            recs.append(RequestTrace(f"{method}-{k}-{b}:p{i}", "w", "chat", len(prompt), len(o),
                                     prompt_token_ids=prompt, output_token_ids=o,
                                     meta={"observed": obs, "sampling": dict(SAMPLING), "cell_id": f"c{k}{b}"}))  # fmt: skip
    return recs


def test_expected_traces_share_models_and_distributions_and_match_naive(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    target, draft = tiny_llama(0, vocab=VOCAB), tiny_llama(1, vocab=VOCAB)
    draft.save_pretrained(tmp_path / "draft")
    made: list[str] = []
    real = rp.make_proposer
    monkeypatch.setattr(rp, "make_proposer", lambda m, **o: made.append(m) or real(m, **o))
    scorer, seen = CountingScorer(target), []
    recs = _records(str(tmp_path / "draft"))
    out, skipped = expected_traces(tmp_path / "no-run", recs, {}, scorer, progress=lambda *a: seen.append(a))
    assert not skipped and set(out) == {r.id for r in recs}
    assert made.count("draft_model") == 1  # loaded once for both k groups
    assert scorer.calls == 4  # 2 draft-model outputs (shared by 3 cells in 2 groups) + 2 n-gram outputs
    assert sorted(a for a in seen if a[1] == a[2]) == sorted(
        [("[1/3] draft_model k=3", 4, 4), ("[2/3] draft_model k=2", 2, 2), ("[3/3] ngram k=3", 2, 2)]
    )
    for r in recs:
        mt, k = out[r.id][0], r.meta["observed"]["k"]
        if r.meta["observed"]["method"] != "draft_model":
            continue
        x = np.concatenate([r.prompt_token_ids, r.output_token_ids]).astype(np.int64)
        assert mt.accept_prob.shape == (r.output_len, k)
        for p in range(r.output_len):
            ctx = x[: r.prompt_len + p]
            # acc_len: the greedy chain of the draft along the output (the previous, per-position path)
            chain, a = [], 0
            while len(chain) < k:
                chain.append(
                    int(
                        _naive(draft, np.concatenate([ctx, chain]).astype(np.int64), temperature=1.0).argmax()
                    )
                )
            while a < k and p + a < r.output_len and chain[a] == int(r.output_token_ids[p + a]):
                a += 1
            assert mt.acc_len[p] == 1 + a
            for j in range(k):  # greedy-draft (vLLM's default): p_T(argmax q) along the output
                c = x[: r.prompt_len + p + j]
                want = 0.0
                if p + j <= r.output_len:
                    want = _naive(target, c, **SAMPLING)[_naive(draft, c, temperature=0.8).argmax()]
                assert mt.accept_prob[p, j] == pytest.approx(want, abs=1e-5)


def test_cli_expected_runs_on_one_thread_unless_told(tmp_path, monkeypatch, capsys):
    import speclab.cli.trace_sampled as ts
    from speclab.cli import main
    from test_crosscheck_expected import HalfScorer, _run

    got: list = []
    monkeypatch.setattr(
        ts, "make_scorer", lambda target, records, threads: got.append(threads) or HalfScorer()
    )
    run = _run(tmp_path, 1)
    for extra, want in (([], 1), (["--threads", "2"], 2)):
        assert main(["trace", *extra, "crosscheck", str(run), "--expected"]) in (0, None)
        assert got[-1] == want
    err = capsys.readouterr().err
    assert "expected acceptance [1/1] ngram k=3: 3/3 records" in err  # the progress line
