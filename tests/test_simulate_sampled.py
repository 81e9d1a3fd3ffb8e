"""Sampled traces in the simulator (speclab.simulate.sampled): each step's accepted count drawn from
accept_prob (sequential Bernoulli per draft position) from a seeded generator, N realisations averaged with
the speedup's spread; the fast simulator and the reference loop agree for the same seed; greedy traces run
exactly as before."""

from dataclasses import replace

import numpy as np
import pytest

from speclab.errors import ConfigError
from speclab.simulate import sampled, simulate
from speclab.traces import MethodTrace, RequestTrace
from test_simulate_reference import assert_same, random_traces

POLICIES = ["none", "fixed:ngram:3", "fixed:eagle:2", "oracle:ngram", "adaptive-k:ngram:4:2"]
K = 5


def sampled_traces(seed: int, n: int) -> list[RequestTrace]:
    """random_traces with accept_prob on ngram (with proposal counts) and on eagle (a model drafter)."""
    rng = np.random.default_rng(seed + 100)
    out = random_traces(seed, n, nprop=True)
    for t in out:
        for m, mt in t.methods.items():
            nprop = mt.num_proposed if mt.num_proposed is not None else np.full(len(mt.acc_len), K)
            ap = rng.uniform(0.2, 0.95, (len(mt.acc_len), K)).astype(np.float32)
            ap[np.arange(K)[None, :] >= nprop[:, None]] = 0
            mt.num_proposed = nprop.astype(np.int32)
            mt.acc_len = np.minimum(mt.acc_len, nprop + 1)
            mt.accept_prob, mt.accept_source = ap, f"test {m}"
            mt.validate(t.output_len, t.id)
    return out


def test_draw_acc_len_is_the_leading_run():
    ap = np.array([[0.5, 0.5, 0.5], [1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    u = np.array([[0.1, 0.7, 0.2], [0.99, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert draw_list(ap, u) == [2, 3, 1]


def draw_list(ap, u):
    return sampled.draw_acc_len(ap, u).tolist()


def test_realise_is_seeded_and_leaves_greedy_traces_alone():
    tr = sampled_traces(0, 6)
    tr[0].methods["eagle"].accept_prob = tr[0].methods["eagle"].accept_source = None
    a, b, c = sampled.realise(tr, 7, 0), sampled.realise(tr, 7, 0), sampled.realise(tr, 7, 1)
    assert a[0].methods["eagle"] is tr[0].methods["eagle"]  # no accept_prob: shared as it is
    same = all(
        np.array_equal(x.methods[m].acc_len, y.methods[m].acc_len)
        for x, y in zip(a, b, strict=True)
        for m in x.methods
    )
    differ = any(
        not np.array_equal(x.methods[m].acc_len, y.methods[m].acc_len)
        for x, y in zip(a, c, strict=True)
        for m in x.methods
    )
    assert same and differ
    for t in a:
        for m, mt in t.methods.items():
            mt.validate(t.output_len, f"{t.id} {m}")  # drawn lengths stay within num_proposed + 1


def test_realised_acceptance_averages_to_the_expectation():
    rng = np.random.default_rng(3)
    n = 4000
    ap = rng.uniform(0, 1, (n, 4)).astype(np.float32)
    mt = MethodTrace(
        k_max=4, acc_len=np.ones(n), num_proposed=np.full(n, 4), accept_prob=ap, accept_source="t"
    )
    rec = RequestTrace("r", "w", "chat", 3, n, methods={"ngram": mt})
    drawn = np.mean([sampled.realise([rec], 1, d)[0].methods["ngram"].acc_len.mean() for d in range(10)])
    assert drawn == pytest.approx(mt.expected_acc_len().mean(), rel=0.01)


def test_certain_probabilities_give_certain_acceptance():
    n = 12
    nprop = np.array([0, 1, 2, 3, 4, 5] * 2)
    ap = (np.arange(K)[None, :] < nprop[:, None]).astype(np.float32)
    mt = MethodTrace(k_max=K, acc_len=np.ones(n), num_proposed=nprop, accept_prob=ap, accept_source="t")
    (r,) = sampled.realise([RequestTrace("r", "w", "chat", 3, n, methods={"ngram": mt})], 0, 0)
    assert r.methods["ngram"].acc_len.tolist() == (nprop + 1).tolist()


@pytest.mark.parametrize("batching", ["replicate", "static", "continuous"])
def test_fast_equals_reference_for_the_same_seed(batching):
    tr = sampled_traces(1, 9)
    kw = dict(seed=5, draws=3)
    fast = simulate(tr, "llama3.1-8b-h100", POLICIES, batching, [1, 4], **kw)
    ref = simulate(tr, "llama3.1-8b-h100", POLICIES, batching, [1, 4], engine="reference", **kw)
    for a, b in zip(fast, ref, strict=True):
        sa, sb = a.speedup_spread, b.speedup_spread
        assert sa.keys() == sb.keys() and all(sa[k] == pytest.approx(sb[k], rel=1e-9, abs=1e-12) for k in sa)
    assert_same([_no_spread(r) for r in fast], [_no_spread(r) for r in ref])  # the rest as the greedy check
    row = next(r for r in fast if r.policy == "fixed:ngram:3")
    assert row.draws == 3 and row.speedup_spread["n"] == 3
    assert row.speedup_spread["min"] <= row.speedup <= row.speedup_spread["max"]
    assert any("3 realisation(s)" in n for n in row.notes)
    other = simulate(tr, "llama3.1-8b-h100", POLICIES, batching, [1, 4], seed=6, draws=3)
    assert any(a.speedup != b.speedup for a, b in zip(fast, other, strict=True) if a.policy != "none")


def _no_spread(r):
    return replace(r, speedup_spread=None)


def test_rows_are_the_mean_of_the_realisations():
    tr = sampled_traces(2, 5)
    rows = simulate(tr, "llama3.1-8b-h100", ["fixed:ngram:3"], "static", [2], seed=9, draws=4)
    one = [simulate(sampled.realise(tr, 9, d), "llama3.1-8b-h100", ["fixed:ngram:3"], "static", [2], draws=0)[0]
           for d in range(4)]  # fmt: skip
    assert rows[0].speedup == pytest.approx(np.mean([r.speedup for r in one]), rel=1e-12)
    assert rows[0].speedup_spread["max"] == pytest.approx(max(r.speedup for r in one), rel=1e-12)


def test_greedy_traces_run_exactly_as_before():
    tr = random_traces(0, 8, nprop=True)
    a = simulate(tr, "llama3.1-8b-h100", POLICIES, "static", [1, 3])
    b = simulate(tr, "llama3.1-8b-h100", POLICIES, "static", [1, 3], draws=0)
    assert [x.to_dict() for x in a] == [x.to_dict() for x in b]
    assert all(r.draws == 0 and r.speedup_spread is None for r in a)
    with pytest.raises(ConfigError, match="draws"):
        simulate(tr, "llama3.1-8b-h100", POLICIES, "static", [1], draws=-1)


def test_simulate_cli_draws_and_spread(tmp_path, capsys):
    import csv

    from speclab.cli import main
    from speclab.traces import write_store

    write_store(tmp_path / "s.parquet", sampled_traces(3, 4))
    args = ["simulate", "--traces", str(tmp_path / "s.parquet"), "--cost-model", "llama3.1-8b-h100"]
    args += ["--policy", "fixed:ngram:3", "--batching", "static", "--batch-sizes", "2", "--draws", "2"]
    assert main([*args, "--csv", str(tmp_path / "o.csv")]) in (0, None)
    assert "over 2 draws]" in capsys.readouterr().out
    (row,) = list(csv.DictReader((tmp_path / "o.csv").read_text().splitlines()))
    assert row["draws"] == "2" and float(row["speedup_min"]) <= float(row["speedup"]) <= float(
        row["speedup_max"]
    )


def test_baseline_alone_draws_nothing():
    (row,) = simulate(sampled_traces(4, 5), "llama3.1-8b-h100", ["none"], "static", [2], draws=8)
    assert row.draws == 0 and row.speedup_spread is None
