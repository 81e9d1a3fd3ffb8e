"""The online policies' fast path: batch_choice weighs every drafter pass count at once, and must choose
exactly what weighing them one at a time chooses; the simulator's figures for the shipped online policy
equal the reference loop's on the study-format fixture, across batch sizes, batching modes and seeds."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest

from speclab.costmodel import get_cost_model
from speclab.policy import goodput
from speclab.simulate import simulate
from speclab.traces.importers import import_specdecode_bench
from test_adaptive_live import with_head  # tests/ is on sys.path
from test_simulate_adaptive import same

FIXTURE = Path(__file__).parent / "data" / "study-simulator" / "combined_instructcoder.jsonl.gz"


def one_at_a_time(iterate, args: tuple) -> tuple[np.ndarray, np.ndarray]:
    """goodput._iterate's answer for each pass count alone (its own rounds, its own early stop)."""
    allowed, shared, no_passes = args[6], args[8], args[12]
    lams, idx = [], []
    for p in range(len(no_passes)):
        sh = shared[p : p + 1] if shared.shape[0] > 1 else shared
        a = (*args[:6], allowed[p : p + 1], args[7], sh, *args[9:12], no_passes[p : p + 1], args[13])
        lam, i = iterate(*a)
        lams.append(lam[0])
        idx.append(i[0])
    return np.stack(lams), np.stack(idx)


@pytest.mark.parametrize("seed", range(3))
def test_all_pass_counts_at_once_equal_one_at_a_time(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random batches under the live table cost model and a linear one with a chained drafter: the
    vectorised rounds give, per pass count, the same goodput and choices (bit for bit) as rounds run for that
    pass count alone, so the first best pass count (argmax) is the one a loop in grid order keeps."""
    rng = np.random.default_rng(seed)
    calls: list[tuple] = []
    inner = goodput._iterate

    def spy(*a):
        out = inner(*a)
        calls.append((a, out))
        return out

    monkeypatch.setattr(goodput, "_iterate", spy)
    live = get_cost_model("smollm2-135m-cpu-live")
    for cm in (live, with_head()):
        draft = {**cm.draft, "eagle3": with_head().draft["eagle3"]}
        cm = type(cm)(cm.name, cm.target, draft, overhead_per_step=cm.overhead_per_step)
        for _ in range(15):
            n = int(rng.integers(2, 12))
            scale = rng.choice([0.3, 0.6, 0.95])
            surv = [
                np.sort(rng.random((n, 8)), axis=1)[:, ::-1] * scale * rng.random((n, 1)),
                np.cumprod(np.full((n, 3), 0.2 + 0.75 * rng.random((n, 1)) * scale), axis=1),
            ]
            group = np.sort(rng.integers(0, 3, n))
            group = np.unique(group, return_inverse=True)[1]
            goodput.batch_choice(cm, ("ngram", "eagle3"), surv, [8, 3], np.full(n, float(n)),
                                 rng.random(n) * 2000, ("ngram",), group, shortcut=False)  # fmt: skip
    assert len(calls) >= 20
    assert any(len(a[12]) > 1 for a, _ in calls)  # several pass counts weighed at once
    for a, (lam, i) in calls:
        lam1, i1 = one_at_a_time(inner, a)
        assert np.array_equal(lam, lam1) and np.array_equal(i, i1)


@pytest.fixture(scope="module")
def fixture_traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("fixture")
    path = d / "ic.jsonl"
    with gzip.open(FIXTURE, "rb") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    recs, _ = import_specdecode_bench([path])
    return recs[:5]


@pytest.mark.parametrize("cm", ["llama3.1-8b-h100-chained", "smollm2-135m-cpu-live"])
def test_shipped_policy_fast_equals_reference_on_the_fixture(fixture_traces, cm: str) -> None:
    """adaptive-gated (gated under the CPU model, not under the GPU one) and adaptive: the fast engine's rows
    equal the reference loop's for every batching mode, several batch sizes and two seeds."""
    specs = ["adaptive-gated", "adaptive"]
    for batching, seed in (("continuous", 0), ("continuous", 7), ("static", 3), ("replicate", 5)):
        kw = dict(seed=seed, switch_overhead=1e-3)
        f = simulate(fixture_traces, cm, specs, batching, [1, 3], **kw)
        r = simulate(fixture_traces, cm, specs, batching, [1, 3], engine="reference", **kw)
        same(f, r)
