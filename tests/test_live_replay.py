"""benchmarks/live_replay.py: the offline model of a live bench run (its forward table, the no-SD steps of
continuous batching, and a static lookup played through the engine loop)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


def _load():
    sys.path.insert(0, str(_DIR))  # live_replay imports its sibling bench_adaptive_driver
    try:
        spec = importlib.util.spec_from_file_location("live_replay", _DIR / "live_replay.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(_DIR))


lr = _load()


def _timings(path: Path) -> Path:
    rows = ["kind,kv_tokens,batched_tokens,num_spec_tokens,num_requests,seconds"]
    for i in range(7):  # one request: 1 token ~20 ms, 3 tokens ~26 ms; a prefill of 100 tokens 0.5 s
        rows.append(f"target,{100 + i},1,0,1,{0.020 + 0.0001 * (i - 3)}")
        rows.append(f"target,{100 + i},3,2,1,{0.026 + 0.0001 * (i - 3)}")
        rows.append(f"target,0,{100 + 10 * i},0,1,{0.5 + 0.005 * 10 * i}")
        rows.append(f"draft:ngram,{100 + i},1,0,1,0.0002")
    rows.append("target,100,2,1,1,0.9")  # one sample only: not tabulated
    path.write_text("\n".join(rows) + "\n")
    return path


def test_forward_table_medians_interpolation_and_prefills(tmp_path: Path) -> None:
    t = lr.ForwardTable(_timings(tmp_path / "timings.csv"))
    assert t(1, 1) == pytest.approx(0.020)
    assert t(1, 3) == pytest.approx(0.026)
    assert t(1, 2) == pytest.approx(0.023)  # between measured counts: interpolated, the lone 0.9 s ignored
    assert t(1, 5) == pytest.approx(0.032)  # beyond: the same slope
    assert t.prefills([100, 160]) == pytest.approx(0.5 + 0.8)  # 0.5 s + 5 ms per 10 prompt tokens
    assert t.draft_ms["ngram"] == [pytest.approx(0.2)] * 7


def test_no_sd_steps_under_continuous_batching() -> None:
    rs = [([1], [0] * 3), ([1], [0] * 5)]  # prefill makes each request's first token
    assert lr._none_steps(rs, 1) == [1] * 6
    assert lr._none_steps(rs, 2) == [2, 2, 1, 1]


def test_static_ngram_drafts_k_where_it_matches() -> None:
    from speclab.methods.adaptive_live import play_engine, vllm_ngram_kernel

    if vllm_ngram_kernel() is None:
        pytest.skip("vLLM's n-gram kernel is not importable here")
    rng = np.random.default_rng(0)
    span = rng.integers(10, 500, 40).tolist()
    prompt, out = [*span, *rng.integers(10, 500, 5).tolist()], span[:30]  # the output copies the prompt
    rec = lr.Recorder(lr.Static("ngram", 5))
    log = play_engine(rec, [(prompt, out)], 1)
    drafted = [d for d, _ in log[0]]
    assert drafted and set(drafted) <= {5} | set(range(1, 5))  # k = 5, less only where the context ends
    assert sum(a for _, a in log[0]) >= 20  # a copy: most drafts accepted
    assert [n for n, _ in rec.steps] == [1] * len(rec.steps)
    assert sum(d for _, d in rec.steps) == sum(drafted)
