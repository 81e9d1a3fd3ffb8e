"""Simulation sweeps split into tasks (speclab.simulate.distributed): the split gives exactly the rows of one
simulate() call; on a local Ray cluster too; the CLI's --trace-set and --ray."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from speclab.cli import main
from speclab.errors import ConfigError
from speclab.simulate import simulate
from speclab.simulate.distributed import SimTask, plan, simulate_sweep
from speclab.traces import MethodTrace, RequestTrace, write_store


def traces(n: int, seed: int, workload: str = "instructcoder") -> list[RequestTrace]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        L = int(rng.integers(20, 60))
        ng = np.where(rng.random(L) < 0.3, rng.integers(3, 8, L), rng.integers(1, 3, L))
        ea = np.clip(rng.poisson(2.0, L) + 1, 1, 8)
        out.append(
            RequestTrace(
                id=f"{workload}-{i}",
                workload=workload,
                category="code-editing",
                prompt_len=int(rng.integers(50, 200)),
                output_len=L,
                methods={"ngram": MethodTrace(7, ng), "eagle": MethodTrace(7, ea)},
            )
        )
    return out


def numbers(r) -> dict:
    d = r.to_dict()
    d.pop("notes")
    return d


POLICIES = ["fixed:ngram:3", "oracle:eagle", "oracle-combine:ngram,eagle", "none"]


def test_plan_one_task_per_set_and_batch_size_or_per_policy_too():
    both = ("none", "fixed:ngram:3")
    t = plan(["a", "b"], list(both), [1, 8, 1], {})
    assert t == [SimTask(n, both, b) for n in "ab" for b in (1, 8)]
    t = plan(["a", "b"], list(both), [1, 8, 1], {}, by_policy=True)
    assert len(t) == 8 and t[0] == SimTask("a", ("none",), 1) and t[-1] == SimTask("b", ("fixed:ngram:3",), 8)
    t = plan(["a"], list(both), [1, 8], {"lengths": "common"}, by_policy=True)
    assert t == [SimTask("a", both, 1), SimTask("a", both, 8)]


@pytest.mark.parametrize(
    "batching,aggregate,opts",
    [
        ("continuous", "total", {}),
        ("replicate", "study", {"ngram_miss_heuristic": "instructcoder", "sample": 8}),
        ("static", "total", {"lengths": "common"}),
    ],
)
@pytest.mark.parametrize("by_policy", [False, True])
def test_split_rows_equal_one_simulate_call(batching, aggregate, opts, by_policy):
    sets = {"a": traces(12, 1), "b": traces(9, 2)}
    sizes = [1, 4, 16]
    rows = simulate_sweep(
        sets, "llama3.1-8b-h100", POLICIES, batching, sizes, aggregate, 7, by_policy=by_policy, **opts
    )
    assert [(n, r.batch_size, r.policy) for n, r in rows] == [
        (n, b, p) for n in sets for b in sizes for p in POLICIES
    ]
    for name, tr in sets.items():
        whole = simulate(tr, "llama3.1-8b-h100", POLICIES, batching, sizes, aggregate, 7, **opts)
        mine = [r for n, r in rows if n == name]
        assert [numbers(r) for r in mine] == [numbers(r) for r in whole]
        assert set(mine[0].notes) >= {
            n for n in whole[0].notes if not n.startswith("continuous batching, B=")
        }


def test_bad_input_fails_before_any_task():
    with pytest.raises(ConfigError, match="batch sizes"):
        simulate_sweep({"a": traces(3, 0)}, "llama3.1-8b-h100", ["none"], "static", [0], ray_address="local")


def test_on_a_local_ray_cluster_the_rows_are_the_same():
    pytest.importorskip("ray")
    sets = {"a": traces(10, 3), "b": traces(8, 4)}
    pols = ["fixed:ngram:3", "oracle-combine:ngram,eagle"]
    msgs: list[str] = []
    rows = simulate_sweep(
        sets,
        "llama3.1-8b-h100",
        pols,
        "continuous",
        [1, 8],
        ray_address="local",
        echo=msgs.append,
        by_policy=True,
    )
    serial = simulate_sweep(sets, "llama3.1-8b-h100", pols, "continuous", [1, 8])
    assert [(n, numbers(r)) for n, r in rows] == [(n, numbers(r)) for n, r in serial]
    assert any("127.0.0.1" in m for m in msgs)
    import ray

    assert not ray.is_initialized()  # the local cluster was stopped


def run(argv, capsys):
    code = 0
    try:
        main(argv)
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_trace_sets(tmp_path, capsys):
    write_store(tmp_path / "a", traces(6, 5))
    write_store(tmp_path / "b", traces(5, 6, "gsm8k"))
    base = [
        "simulate",
        "--cost-model",
        "llama3.1-8b-h100",
        "--policy",
        "fixed:ngram:3",
        "--batch-sizes",
        "1,4",
    ]
    sets = ["--trace-set", f"ic={tmp_path / 'a'}", "--trace-set", f"math={tmp_path / 'b'}"]
    code, out, err = run([*base, *sets], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["set", "batch", "policy"] and len(lines) == 5
    assert [ln.split()[0] for ln in lines[1:]] == ["ic", "ic", "math", "math"]
    code, out, err = run([*base, *sets, "--json"], capsys)
    rows = json.loads(out)
    assert [r["trace_set"] for r in rows] == ["ic", "ic", "math", "math"]
    one = simulate(traces(5, 6, "gsm8k"), "llama3.1-8b-h100", ["fixed:ngram:3"], "continuous", [4])[0]
    assert rows[3]["speedup"] == pytest.approx(one.speedup, rel=1e-12)
    code, _, err = run([*base, *sets, "--traces", str(tmp_path / "a")], capsys)
    assert code == 2 and "not both" in err
    code, _, err = run([*base, "--trace-set", "nope"], capsys)
    assert code == 2 and "NAME=STORE" in err


def test_cli_ray_without_ray_is_one_line(tmp_path, capsys, monkeypatch):
    write_store(tmp_path / "a", traces(4, 5))
    monkeypatch.setitem(sys.modules, "ray", None)
    code, _, err = run(
        ["simulate", "--traces", str(tmp_path / "a"), "--policy", "fixed:ngram:3", "--ray"], capsys
    )
    assert code == 2 and "speclab[ray]" in err and len(err.strip().splitlines()) == 1
