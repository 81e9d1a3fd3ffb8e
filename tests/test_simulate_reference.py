"""The vectorised simulator (fast.py) and the plain per-step reference loop agree on small random traces."""

import numpy as np
import pytest

from speclab.simulate import simulate
from speclab.traces import MethodTrace, RequestTrace

POLICIES = [
    "none",
    "fixed:ngram:3",
    "fixed:eagle:2",
    "oracle:ngram",
    "oracle:eagle",
    "oracle-combine:ngram,eagle",
    "adaptive-k:eagle:5",
    "adaptive-k:ngram:4:2",
    "select-ema:ngram,eagle:3",
]


def random_traces(seed: int, n: int, nprop: bool) -> list[RequestTrace]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        L = int(rng.integers(1, 25))
        ng = rng.integers(1, 7, L)
        npv = np.minimum(np.maximum(ng - 1, rng.integers(0, 6, L)), 5) if nprop else None
        out.append(
            RequestTrace(
                id=f"r{i}",
                workload="instructcoder",
                category="code-editing",
                prompt_len=int(rng.integers(0, 30)),
                output_len=L,
                methods={
                    "ngram": MethodTrace(k_max=5, acc_len=ng, num_proposed=npv),
                    "eagle": MethodTrace(k_max=5, acc_len=rng.integers(1, 7, L)),
                },
            )
        )
    return out


def assert_same(fast, ref):
    assert len(fast) == len(ref)
    for a, b in zip(fast, ref, strict=True):
        da, db = a.to_dict(), b.to_dict()
        for k in da:
            if k == "time_split_s":
                assert da[k] == pytest.approx(db[k], rel=1e-9, abs=1e-12)
            elif isinstance(da[k], float):
                assert da[k] == pytest.approx(db[k], rel=1e-9), (a.policy, a.batch_size, k)
            else:
                assert da[k] == db[k], (a.policy, a.batch_size, k)  # integers exactly


@pytest.mark.parametrize("batching", ["replicate", "static", "continuous"])
@pytest.mark.parametrize("seed", [0, 1])
def test_fast_equals_reference(batching, seed):
    tr = random_traces(seed, 11, nprop=seed == 1)
    for cmodel in ("llama3.1-8b-h100", "llama3.1-8b-h100-chained"):
        for agg in ("total", "study") if batching != "continuous" else ("total",):
            kw = dict(
                aggregate=agg,
                ngram_miss_heuristic=0.5 if seed == 0 else None,
                switch_overhead=1.5e-3,
                linear_draft_kv="request" if seed == 0 else "batch",
            )
            fast = simulate(tr, cmodel, POLICIES, batching, [1, 3, 7], **kw)
            ref = simulate(tr, cmodel, POLICIES, batching, [1, 3, 7], engine="reference", **kw)
            assert_same(fast, ref)
