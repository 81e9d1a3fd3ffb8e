"""The hand-configurable baselines on a synthetic mixed trace set with a known answer: n-gram accepts every
draft on code-editing and none on chat, the EAGLE head the reverse."""

from __future__ import annotations

import numpy as np
import pytest

from speclab.errors import ConfigError
from speclab.policy import make_policy
from speclab.simulate.adaptive.baselines import hand_baselines, markdown, route_spec
from speclab.simulate.api import simulate
from speclab.traces import MethodTrace, RequestTrace

CM = "llama3.1-8b-h100-chained"
K = 4


def _trace(i: int, cat: str, length: int = 64) -> RequestTrace:
    full, miss = np.full(length, K + 1, np.int64), np.ones(length, np.int64)
    ng, eg = (full, miss) if cat == "code-editing" else (miss, full)
    return RequestTrace(
        id=f"r{i}", workload="mix", category=cat, prompt_len=100, output_len=length,
        methods={"ngram": MethodTrace(k_max=K, acc_len=ng), "eagle3": MethodTrace(k_max=K, acc_len=eg)},
    )  # fmt: skip


def _mixed(n: int = 16) -> list[RequestTrace]:
    return [_trace(i, "code-editing" if i % 2 == 0 else "chat") for i in range(n)]


def test_route_with_one_choice_is_the_fixed_policy():
    traces = _mixed(8)
    spec = route_spec(["fixed:ngram:3"] * len(traces))
    a, b = simulate(traces, CM, [spec, "fixed:ngram:3"], "continuous", [4])
    assert a.speedup == pytest.approx(b.speedup)
    assert route_spec(["none"] * 3) == "none"


def test_route_spec_is_checked():
    with pytest.raises(ConfigError):
        make_policy("route:ngram@3:01")  # choice 1 names no configuration
    with pytest.raises(ConfigError):
        make_policy("route:ngram3:0")


def test_per_category_best_and_routing_beat_every_static():
    res = hand_baselines(_mixed(), CM, [1, 8], kmax=K)
    for b in (1, 8):
        assert res["per_category"]["code-editing"]["best"][b][0] == f"fixed:ngram:{K}"
        assert res["per_category"]["chat"]["best"][b][0] == f"fixed:eagle3:{K}"
        assert res["per_category"]["chat"]["requests"] == 8
        best_static = res["best_static"][b][1]
        assert max(res["static"][b].values()) == best_static
        # routing gives every request full acceptance: better than any one configuration for all
        assert res["routed"][b]["speedup"] > best_static * 1.2
        assert res["routed"][b]["choice"] == {"chat": f"fixed:eagle3:{K}", "code-editing": f"fixed:ngram:{K}"}
    assert res["schedule"]["method"] in ("ngram", "eagle3")
    text = markdown(res)
    assert "per-category static routing" in text and "chat alone" in text


def test_the_command_writes_what_the_report_shows(tmp_path, capsys):
    from speclab.report.categories import section
    from speclab.report.data import ReportData
    from speclab.simulate.adaptive.baselines import main
    from speclab.traces.store import write_store

    write_store(tmp_path / "store", _mixed(8))
    run = tmp_path / "run"
    main([str(tmp_path / "store"), "--out", str(run / "adaptive"), "--batch-sizes", "1,4", "--kmax", str(K)])
    assert "per-category static routing" in capsys.readouterr().out
    row = {"status": "ok", "workload": "mix", "batching": "continuous", "batch_size": 4, "label": "ngram-k3",
           "speedup": 1.3, "per_category": {"chat": {"num_requests": 2, "output_tokens": 30,
           "mean_acceptance_length": 1.1, "mean_tokens_per_step": 1.05}}}  # fmt: skip
    d = ReportData(rows=[row], run_path=run, traces=None, analysis={}, recs=[], figs={})
    html = "\n".join(section(d))
    assert 'id="categories"' in html and "per-category static routing" in html and "chat alone" in html
    assert "ngram-k3" in html and "1.05" in html
    assert section(ReportData(rows=[], run_path=None, traces=None, analysis={}, recs=[], figs={})) == []


def test_a_run_holds_each_prompt_once_per_cell_and_is_read_once(tmp_path):
    from speclab.simulate.adaptive.baselines import load_traces
    from speclab.traces.store import write_store

    recs = []
    for cell in ("none.mix.cont.b1.x", "ngram-k3.mix.cont.b1.y"):
        for t in _mixed(4):
            t.id, t.meta = f"{cell}:{t.id}", {"prompt_id": t.id, "cell_id": cell}
            recs.append(t)
    other = _trace(99, "chat")
    other.workload = "offline-chat"
    write_store(tmp_path / "run" / "traces", [*recs, other])
    got = load_traces(tmp_path / "run")
    assert len(got) == 5 and [t.meta.get("prompt_id") for t in got[:4]] == ["r0", "r1", "r2", "r3"]
    assert len(load_traces(tmp_path / "run", "mix")) == 4
    with pytest.raises(ConfigError, match="no records of workload 'nope'"):
        load_traces(tmp_path / "run", "nope")
    bare = [RequestTrace(id="a", workload="w", category="chat", prompt_len=3, output_len=4, methods={})]
    with pytest.raises(ConfigError, match="replay a bench run first"):
        hand_baselines(bare, CM, [1])
