"""The live adaptive proposer (speclab.live.driver, vllm_custom.SpeclabAdaptiveProposer) driven
with fake vLLM inputs: a small loop that plays the engine (rows compacted, committed tokens = accepted
drafts + one, greedy target = a fixed output per request)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from speclab.costmodel.model import CostModel, DraftCost, TargetCost
from speclab.errors import ConfigError
from speclab.live.driver import AdaptiveDriver
from speclab.live.play import play_engine
from speclab.methods.ngram import IncrementalNgram, NgramProposer

MAX_LEN = 4096


def cpu_like() -> CostModel:
    # the shape of the CPU preset: a verified token costs ~6% of a decode step at batch 1
    return CostModel(
        "test-cpu",
        TargetCost(kv=1e-7, batched=1.6e-3, const=2.6e-2),
        {
            "ngram": DraftCost("verify_fraction", fraction=0.01),
            "suffix": DraftCost("verify_fraction", fraction=0.01),
        },
        overhead_per_step=2e-3,
    )


def with_head() -> CostModel:
    """cpu_like plus an EAGLE-like head run by the engine: chained passes at ~10% of a decode step each."""
    cm = cpu_like()
    cm.draft["eagle3"] = DraftCost("chained", const=2.5e-3, num_spec=3e-4)
    return cm


def play(driver: AdaptiveDriver, reqs: list[tuple[list[int], list[int]]], batch: int, order_seed: int = 0):
    return play_engine(driver, reqs, batch, order_seed=order_seed, max_len=MAX_LEN)


def copy_request(seed: int, n: int = 120) -> tuple[list[int], list[int]]:
    """A code-edit-like request: the output copies long spans of the prompt."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(100, 5000, size=200).tolist()
    out = prompt[20:80] + rng.integers(100, 5000, size=10).tolist() + prompt[100:150]
    return prompt, out[:n]


def chat_request(seed: int, n: int = 100) -> tuple[list[int], list[int]]:
    """No copies anywhere: the lookups offer nothing."""
    rng = np.random.default_rng(1000 + seed)
    return rng.integers(100, 50000, size=60).tolist(), rng.integers(100, 50000, size=n).tolist()


def rejecting_request(seed: int, n: int = 120) -> tuple[list[int], list[int]]:
    """Every 3-gram `1 2 3` recurs with a new continuation: n-gram offers drafts there and they are rejected."""
    rng = np.random.default_rng(seed)
    prompt = [1, 2, 3, 7] + rng.integers(100, 5000, size=40).tolist()
    out: list[int] = []
    while len(out) < n:
        out += [1, 2, 3, int(rng.integers(5000, 90000))]
    return prompt, out[:n]


def make(methods=("ngram",), kmax=8, **kw) -> AdaptiveDriver:
    kw.setdefault("cost_model", cpu_like())
    return AdaptiveDriver(kmax=kmax, max_model_len=MAX_LEN, methods=methods, **kw)


@pytest.mark.parametrize("seed", range(6))
def test_incremental_ngram_equals_speclab_ngram(seed: int) -> None:
    """The probe's incremental index gives exactly speclab's (vLLM's) n-gram proposal at every prefix,
    fed in chunks of varying size as an engine commits tokens."""
    rng = np.random.default_rng(seed)
    vocab = [3, 6, 40][seed % 3]
    x = rng.integers(0, vocab, size=300)
    if seed % 2:
        x[150:250] = x[20:120]  # a copy
    lo, hi = [(3, 7), (1, 4), (2, 2)][seed % 3]
    mml = [None, 250][seed % 2]
    ref = NgramProposer(min_n=lo, max_n=hi, max_model_len=mml)
    inc = IncrementalNgram(lo, hi, mml)
    t = 0
    while t < len(x):
        step = int(rng.integers(1, 6))
        inc.extend(x[t : t + step].tolist())
        t = min(t + step, len(x))
        for k in (1, 5):
            assert inc.propose(k) == ref.propose(x[:t], k).tolist(), (t, k)


def assert_records_match_replay(
    req, prompt: list[int], out: list[int], probed: dict[str, set[int] | list[int]]
):
    """At every position in probed[method] whose outcome is final (8 tokens known since), the acc_len and offer
    the driver recorded for `req` equal the per-position replay's (k_max 8); returns the n-gram positions."""
    from speclab.methods.suffix import SuffixSpeculator

    replays = {
        "ngram": NgramProposer(max_model_len=MAX_LEN).replay(np.array(prompt), np.array(out), 8),
        "suffix": SuffixSpeculator(max_cached_requests=0).replay(prompt, out, 8, max_model_len=MAX_LEN),
    }
    for meth, (acc_replay, nprop) in replays.items():
        h = req.hist[meth]
        exact = sorted(q for q in probed[meth] if q + 8 < len(h.acc))
        assert len(exact) > 5
        for q in exact:
            assert (h.acc[q], h.off[q]) == (acc_replay[q], nprop[q]), (meth, q)
    return sorted(q for q in probed["ngram"] if q + 8 < len(req.hist["ngram"].acc))


def test_hindsight_bookkeeping_matches_replay() -> None:
    """Across steps, the acc_len and offer recorded at every probed position (position 0 included) equal
    the per-position replay's (k_max = KMAX) once the output is known, for both probes; the policy is told
    the accepted counts of the engine's formula (len(sampled) - 1 after a draft)."""
    pytest.importorskip("arctic_inference")

    d = make(methods=("ngram", "suffix"), suffix={"max_cached_requests": 0})
    prompt, out = copy_request(1)
    seen: dict[str, object] = {}
    probed: set[int] = {0}
    observed: list[tuple[int, int]] = []
    step, observe = d.step, d.policy.observe

    def spy(s, n, t):
        r = step(s, n, t)
        for reqs in d._reqs.values():
            for q in reqs:
                seen["r"] = q
                probed.add(q.hist["ngram"].last[0])
        return r

    def spy_observe(o):
        observed.extend(zip(o.k.tolist(), o.accepted.tolist(), strict=True))
        observe(o)

    d.step = spy  # type: ignore[method-assign]
    d.policy.observe = spy_observe  # type: ignore[method-assign]
    log = play(d, [(prompt, out)], batch=1)
    exact = assert_records_match_replay(seen["r"], prompt, out, {m: probed for m in ("ngram", "suffix")})
    assert exact[0] == 0
    # every draft but the last (its outcome arrives after the request left) was reported with its outcome
    assert observed == log[0][: len(observed)] and len(observed) >= len(log[0]) - 1
    assert sum(a for _, a in log[0]) > 0


def test_switches_off_where_drafts_are_rejected() -> None:
    d = make()
    reqs = [rejecting_request(s) for s in range(3)]
    log = play(d, reqs, batch=1)
    # static n-gram k=8 would propose at every `1 2 3` position (a quarter of the steps) and lose them all
    nrej_static = sum(1 for _, o in reqs for q in range(3, len(o)) if o[q - 3 : q] == [1, 2, 3]) - 3
    drafted = sum(dr for lg in log.values() for dr, _ in lg)
    accepted = sum(a for lg in log.values() for _, a in lg)
    assert nrej_static > 60
    assert accepted == 0
    # it tries little: far fewer drafted tokens than static n-gram's 8 per offer
    assert drafted < 0.1 * 8 * nrej_static, (drafted, nrej_static)
    assert d.counts["off"] > 0.9 * sum(d.counts.values())


def test_copies_get_long_drafts_and_k_varies() -> None:
    d = make(methods=("ngram", "suffix"))
    reqs = [copy_request(s) for s in range(3)]
    log = play(d, reqs, batch=1)
    ks = [dr for lg in log.values() for dr, _ in lg]
    acc = [a for lg in log.values() for _, a in lg]
    assert len(set(ks)) >= 2  # k chosen per step, not fixed
    assert max(ks) == 8
    assert sum(acc) / sum(ks) > 0.6  # on copies most drafts are accepted
    total_out = sum(len(o) for _, o in reqs)
    steps = sum(len(lg) for lg in log.values())
    assert steps < total_out / 2  # far fewer engine steps than tokens


def test_larger_batch_drafts_less() -> None:
    """The same requests, alone vs 32 at once: the live batch makes verified tokens dearer, so fewer drafts
    per step (or none) where acceptance is uncertain."""
    reqs = [copy_request(s, 80) for s in range(4)] + [rejecting_request(s, 80) for s in range(4)]
    per: dict[int, float] = {}
    for b, copies in ((1, 1), (32, 4)):
        d = make(methods=("ngram", "suffix"))
        log = play(d, reqs * copies, batch=b)
        per[b] = sum(dr for lg in log.values() for dr, _ in lg) / (len(reqs) * copies)
    assert per[32] < per[1]


def test_rows_compacted_and_requests_recognised() -> None:
    """Shuffled rows and requests joining/leaving: every request keeps its own record (no mix-ups): the
    output equals a run where each request is alone."""
    reqs = [copy_request(s, 60) for s in range(5)] + [rejecting_request(s, 60) for s in range(3)]
    a = play(make(), reqs, batch=3, order_seed=1)
    b = play(make(), reqs, batch=3, order_seed=2)
    assert a == b  # row order does not change any decision
    assert len(make()._free) == 0


def test_deterministic() -> None:
    reqs = [copy_request(s, 60) for s in range(3)] + [rejecting_request(0, 60)]
    assert play(make(("ngram", "suffix")), reqs, batch=2) == play(make(("ngram", "suffix")), reqs, batch=2)


def test_vllm_ngram_kernel_probe_equals_speclab_index() -> None:
    """The live n-gram probe runs vLLM's compiled lookup where vLLM imports; it must offer exactly what
    speclab's incremental index offers, so whole runs (every draft, every decision) are identical."""
    pytest.importorskip("vllm")
    fast = make(("ngram", "suffix"), ngram_impl="vllm")
    assert fast._kernel is not None
    rng = np.random.default_rng(3)
    reqs = [copy_request(s, 80) for s in range(4)] + [rejecting_request(1, 80)]
    reqs += [(rng.integers(0, 6, 150).tolist(), rng.integers(0, 6, 60).tolist())]  # many short repeats
    slow = make(("ngram", "suffix"), ngram_impl="python")
    assert slow._kernel is None
    for b in (1, 3):
        assert play(fast, reqs, batch=b) == play(slow, reqs, batch=b)
    assert fast.counts == slow.counts and fast.counts["ngram"] > 0
    with pytest.raises(ConfigError, match="ngram_impl"):
        make(ngram_impl="numba")


def test_prefill_rows_and_limits() -> None:
    d = make()
    table = np.zeros((2, 64), np.int32)
    table[0, :10] = np.arange(10)
    out = d.step([[], [5]], np.array([10, 10], np.int32), table)  # a partial prefill row gets nothing
    assert out[0] == []
    d2 = AdaptiveDriver(kmax=4, max_model_len=10, methods=("ngram",), cost_model=cpu_like())
    assert d2.step([[5]], np.array([10], np.int32), table[:1]) == [[]]  # at max_model_len


def test_bad_options() -> None:
    from speclab.errors import ConfigError

    with pytest.raises(ConfigError, match="custom_class proposer cannot run it"):
        make(methods=("draft_model",))
    with pytest.raises(ConfigError, match="unknown method"):
        make(methods=("nope",))
    with pytest.raises(ConfigError, match="custom_class proposer cannot run it"):
        make(methods=("ngram", "eagle3"), cost_model=with_head())
    with pytest.raises(ConfigError, match="kmax"):
        make(kmax=0)
    with pytest.raises(ConfigError, match="ngram option"):
        make(ngram={"nope": 1})


def test_vllm_adapter_reads_options(monkeypatch: pytest.MonkeyPatch) -> None:
    from speclab.live.vllm_custom import OPTIONS_ENV, SpeclabAdaptiveProposer, adapter_options

    cfg = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=6),
        model_config=SimpleNamespace(max_model_len=MAX_LEN),
    )
    monkeypatch.setenv(OPTIONS_ENV, json.dumps({"methods": ["ngram"], "kmax": 4, "ngram": {"min_n": 2}}))
    p = SpeclabAdaptiveProposer(cfg)
    p.load_model(None)
    assert p.driver.kmax == 4 and p.driver.methods == ("ngram",) and p.driver.min_n == 2
    prompt, out = copy_request(3, 40)
    log = play(p.driver, [(prompt, out)], batch=1)
    assert log[0]
    monkeypatch.setenv(OPTIONS_ENV, json.dumps({"kmax": 9}))
    with pytest.raises(ValueError, match="kmax"):
        SpeclabAdaptiveProposer(cfg)
    monkeypatch.setenv(OPTIONS_ENV, json.dumps({"bogus": 1}))
    with pytest.raises(ValueError, match="unknown adaptive"):
        SpeclabAdaptiveProposer(cfg)
    model = "speclab.live.vllm_custom.SpeclabAdaptiveProposer"
    got = adapter_options({"model": model, "proposer_options": {"kmax": 4, "ngram": {"min_n": 2}}})
    assert got == {"model": model, "kmax": 4, "ngram": {"min_n": 2}}


def test_crosscheck_refuses_adaptive_with_a_reason() -> None:
    from speclab.catalog import trace_method_name
    from speclab.replay.runs import replay_spec

    name = trace_method_name("custom_class", {"model": "speclab.live.vllm_custom.SpeclabAdaptiveProposer"})
    assert name == "custom:SpeclabAdaptiveProposer"
    why = replay_spec(name, {}, {})
    assert isinstance(why, str) and "live batch" in why


def test_sweep_preset_parses() -> None:
    from speclab.bench.spec import load_preset

    sw = load_preset("adaptive-cpu")
    labels = {m.label for m in sw.methods}
    assert {"none", "ngram-k3", "ngram-k5", "suffix-k8", "adaptive"} <= labels
    assert any(lb.startswith("schedule") for lb in labels)
    assert sw.repeats == 3 and sw.dtype == "float32" and sw.batch_sizes == [1, 4, 16]


def test_piecewise_cost_prices_drafts_by_the_batch() -> None:
    """With a weights-bound target (a forward costs the same up to 8 tokens, 2 ms per token above: the CPU
    preset's shape), the policy's price of a draft token is the slope where the batch is: at batch 1 drafts
    are nearly free, so uncertain ones are tried; at batch 32 the same requests draft less. A linear model
    with the compute slope everywhere tries fewer at batch 1."""
    from speclab.costmodel.forms import PiecewiseTargetCost

    def model(target: TargetCost) -> CostModel:
        probe = DraftCost("verify_fraction", fraction=0.001)
        return CostModel("t", target, {"ngram": probe, "suffix": probe}, overhead_per_step=2e-3)

    pw = model(PiecewiseTargetCost(kv=1e-7, batched=0.0, const=0.03, knee=8.0, batched_hi=2e-3))
    lin = model(TargetCost(kv=1e-7, batched=2e-3, const=0.03))
    reqs = [copy_request(s, 80) for s in range(4)] + [rejecting_request(s, 80) for s in range(4)]

    def drafted(cm: CostModel, batch: int, copies: int) -> float:
        d = AdaptiveDriver(kmax=8, max_model_len=MAX_LEN, methods=("ngram", "suffix"), cost_model=cm)
        log = play(d, reqs * copies, batch=batch)
        return sum(dr for lg in log.values() for dr, _ in lg) / (len(reqs) * copies)

    pw1, pw32, lin1 = drafted(pw, 1, 1), drafted(pw, 32, 4), drafted(lin, 1, 1)
    assert pw1 > lin1 and pw1 > pw32, (pw1, lin1, pw32)


def test_tabulated_cost_prefers_the_cheap_verify_width() -> None:
    """Where the forward of 4 tokens is cheaper than that of 2 (as measured on CPU), a lone request offered 8
    drafts it barely trusts takes 3 (4 tokens) rather than 1 or none; priced linearly it takes none."""
    from speclab.costmodel.forms import TableTargetCost
    from speclab.policy.goodput import batch_choice

    tab = TableTargetCost(
        kv=0.0, batched=0.0, const=0.03, knee=8.0, batched_hi=2e-3,
        table=((1, 0.030), (2, 0.035), (3, 0.0285), (4, 0.0275), (5, 0.029), (9, 0.035)),
    )  # fmt: skip
    probe = DraftCost("verify_fraction", fraction=0.001)
    surv = [np.full((1, 8), 0.03) ** np.arange(1, 9)[None, :]]  # 3% first-draft acceptance

    def choose(target: TargetCost) -> tuple[int, int]:
        cm = CostModel("t", target, {"ngram": probe}, overhead_per_step=2e-3)
        m, k = batch_choice(
            cm, ("ngram",), surv, [8], np.ones(1), np.full(1, 500.0), ("ngram",), np.zeros(1, np.int64)
        )
        return int(m[0]), int(k[0])

    assert choose(tab) == (0, 3)
    assert choose(TargetCost(kv=0.0, batched=1.4e-3, const=0.03))[1] == 0


@pytest.mark.parametrize("seed", range(4))
def test_pass_grid_cut_changes_no_choice(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """batch_choice tries drafter pass counts only up to what an option needs; the choices equal those over
    the whole grid."""
    from speclab.policy import goodput

    rng = np.random.default_rng(seed)
    n = 12
    # some rows with good copies, some where only the head is likely right
    surv = [
        np.sort(rng.random((n, 8)), axis=1)[:, ::-1] * rng.random((n, 1)),
        np.full((n, 3), 0.5 + 0.45 * rng.random((n, 1))),
    ]
    args = (with_head(), ("suffix", "eagle3"), surv, [8, 3], np.full(n, 4.0), rng.random(n) * 1000,
            ("suffix",), np.repeat(np.arange(3), 4))  # fmt: skip
    assert goodput._pass_grid(np.array([[0, 1, 3]])) == (0, 1, 2, 3)
    assert goodput._pass_grid(np.array([[0, 5]])) == (0, 1, 2, 3, 4, 6)
    cut = goodput.batch_choice(*args)
    monkeypatch.setattr(goodput, "_pass_grid", lambda passes: goodput.PASS_GRID)
    full = goodput.batch_choice(*args)
    assert all(np.array_equal(a, b) for a, b in zip(cut, full, strict=True))
    assert (cut[0] == 1).any()  # the head is chosen somewhere, so the pass count mattered


@pytest.mark.parametrize("seed", range(6))
def test_all_off_shortcut_changes_no_choice(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """batch_choice answers "off" for all without its pass grid only where the grid would say the same
    (goodput._all_off): random batches, the live table cost model and a linear one, rows from hopeless to
    long copies; the shortcut must fire on some of them and not on others."""
    from speclab.costmodel import get_cost_model
    from speclab.policy import goodput

    rng = np.random.default_rng(seed)
    fired = kept = 0
    certified: list[bool] = []
    all_off = goodput._all_off
    monkeypatch.setattr(goodput, "_all_off", lambda *a: certified.append(all_off(*a)) or certified[-1])
    live = get_cost_model("smollm2-135m-cpu-live")
    for cm in (live, with_head()):
        if "eagle3" not in cm.draft:
            cm = CostModel(cm.name, cm.target, {**cm.draft, "eagle3": with_head().draft["eagle3"]},
                           overhead_per_step=cm.overhead_per_step)  # fmt: skip
        for trial in range(40):
            n = int(rng.integers(2, 17))
            scale = rng.choice([0.05, 0.3, 0.6, 0.95])
            surv = [
                np.sort(rng.random((n, 8)), axis=1)[:, ::-1] * scale * rng.random((n, 1)),
                np.sort(rng.random((n, 8)), axis=1)[:, ::-1] * scale * rng.random((n, 1)),
                np.cumprod(np.full((n, 3), 0.2 + 0.75 * rng.random((n, 1)) * scale), axis=1),
            ]
            occ = np.full(n, float(n))
            args = (cm, ("ngram", "suffix", "eagle3"), surv, [8, 8, 3], occ, np.full(n, 300.0 * n),
                    ("ngram", "suffix"), np.zeros(n, np.int64))  # fmt: skip
            fast = goodput.batch_choice(*args)
            full = goodput.batch_choice(*args, shortcut=False)
            assert all(np.array_equal(a, b) for a, b in zip(fast, full, strict=True)), (trial, cm.name)
            if (full[1] == 0).all():
                fired += certified[-1]
            else:
                kept += 1
                assert not certified[-1]
    assert fired > 10 and kept > 10, (fired, kept)
