"""The shipped online policy's compiled loop (simulate/compiled.py, numba) against the numpy loop it
restates: the same step table, bit for bit, and the same estimates left in the policy, over the study-format
fixture and random traces (recorded offers or not, every drafting form); where it does not cover a policy,
or numba is not installed, the numpy loop runs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from speclab.costmodel import get_cost_model
from speclab.costmodel.forms import TargetCost
from speclab.costmodel.model import CostModel, DraftCost
from speclab.policy import make_policy
from speclab.policy.rules import bind_methods
from speclab.simulate import compiled, fast, rule_kernel, simulate
from speclab.simulate.coupled import run_steps_coupled
from test_adaptive_gated import flat, late_copy
from test_fast_policy import fixture_traces  # noqa: F401  (a fixture; tests/ is on sys.path)
from test_simulate_adaptive import random_traces

pytest.importorskip("numba")

FIELDS = ("req", "t", "pos", "meth", "k", "acc", "produced", "switched", "cand", "n_steps", "probed")


def both(monkeypatch, traces, cm, spec: str, batching: str, b: int, study: bool = False, passes: int = 1):
    """(step table, policy) from the compiled loop, then from the numpy loop."""
    out = []
    for on in (True, False):
        monkeypatch.setattr(compiled, "ENABLED", on)
        p = make_policy(spec)
        bind_methods([p], traces, cm)
        p.cost_model = cm
        ta = fast.prepare(traces, set(p.methods))
        if on:  # the compiled loop does run here
            assert compiled.run_steps_compiled(ta, p, batching, b, study, passes) is not None
        _, st = run_steps_coupled(ta, p, batching, b, False, study, passes)
        out.append((st, p))
    return out


def assert_same(pair) -> None:
    (a, pa), (b, pb) = pair
    assert len(a.req) > 0
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and np.array_equal(x, y), f
    assert np.array_equal(pa.s, pb.s) and np.array_equal(pa.f, pb.f)
    # the calibration sums predicted drafts: powers computed by numba's pow and numpy's own (vectorised) one
    # may differ in the last bit, so its record is equal to rounding, while every choice above is identical
    np.testing.assert_allclose(pa.cal, pb.cal, rtol=1e-12, atol=0)
    np.testing.assert_allclose(pa.pending, pb.pending, rtol=1e-12, atol=0)


CASES = [
    ("continuous", 1, False, 1),
    ("continuous", 4, False, 2),
    ("static", 3, False, 1),
    ("continuous", 16, True, 2),
]


@pytest.mark.parametrize("cm", ["llama3.1-8b-h100-chained", "llama3.1-8b-h100", "gated"])
@pytest.mark.parametrize("spec", ["adaptive-gated", "adaptive"])
def test_compiled_equals_numpy_on_the_fixture(monkeypatch, fixture_traces, cm: str, spec: str) -> None:  # noqa: F811
    """The shipped GPU models, and the chained one with a lookup at 1.5% of the verify (gated)."""
    model = get_cost_model("llama3.1-8b-h100-chained" if cm == "gated" else cm)
    if cm == "gated":
        model = dataclasses.replace(
            model, draft={**model.draft, "ngram": DraftCost("verify_fraction", fraction=0.015)}
        )
    for batching, b, study, passes in CASES:
        assert_same(both(monkeypatch, fixture_traces, model, spec, batching, b, study, passes))


def forms_model(form: str) -> CostModel:
    """A linear target, a cheap lookup (not gated), the model-based drafter in `form`, overheads per request
    and per draft token (every term of the rule's option prices)."""
    eagle = {"chained": DraftCost("chained", kv=1e-9, num_spec=1e-6, const=7e-4),
             "linear": DraftCost("linear", kv=1e-9, num_spec=1e-6, const=9e-4),
             "forwards": DraftCost("forwards", kv=1e-9, batched=2e-6, const=5e-4),
             "verify_fraction": DraftCost("verify_fraction", fraction=0.08)}[form]  # fmt: skip
    return CostModel("forms", TargetCost(kv=4e-8, batched=2e-5, const=6e-3),
                     {"ngram": DraftCost("verify_fraction", fraction=0.004), "eagle": eagle},
                     overhead_per_step=1.2e-3, overhead_per_request=1e-5, overhead_per_spec_token=2e-6)  # fmt: skip


def gated_model(form: str = "chained") -> CostModel:
    """forms_model with a lookup dear enough (2% of the verify) that adaptive-gated gates its probes."""
    cm = forms_model(form)
    cm.draft["ngram"] = DraftCost("verify_fraction", fraction=0.02)
    return cm


@pytest.mark.parametrize("form", ["chained", "linear", "forwards", "verify_fraction"])
@pytest.mark.parametrize("nprop", [False, True])
@pytest.mark.parametrize("gated", [False, True])
def test_compiled_equals_numpy_for_every_form_and_offers(
    monkeypatch, form: str, nprop: bool, gated: bool
) -> None:
    tr = random_traces(11 + nprop, 24, nprop)
    cm = gated_model(form) if gated else forms_model(form)
    for spec in ("adaptive-gated", "adaptive", "adaptive:eagle:6", "adaptive-gated:ngram:5"):
        for batching, b, study, passes in CASES:
            assert_same(both(monkeypatch, tr, cm, spec, batching, b, study, passes))


def test_compiled_equals_numpy_where_the_gate_puts_requests_to_sleep(monkeypatch) -> None:
    """Lookups that offer nothing (dormant requests, probed every REPROBE positions, unprobed positions read
    as unknown) beside copies that start late (woken by the reprobe): the gate's flags, ring and dormancy."""
    tr = flat(6, 90) + [late_copy(), late_copy(100, 20, 60)] + flat(3, 70)
    for batching, b, study, passes in (*CASES, ("static", 16, False, 1)):
        pair = both(monkeypatch, tr, gated_model(), "adaptive-gated:ngram", batching, b, study, passes)
        assert_same(pair)
        assert pair[0][0].probed.mean() < 0.6  # most positions were not probed
        for f in ("dormant", "last_probe", "ring_q", "ring_f"):
            assert np.array_equal(getattr(pair[0][1], f), getattr(pair[1][1], f)), f


def test_the_simulator_figures_are_the_same(monkeypatch, fixture_traces) -> None:  # noqa: F811
    rows = []
    for on in (True, False):
        monkeypatch.setattr(compiled, "ENABLED", on)
        rows.append(
            simulate(fixture_traces, "llama3.1-8b-h100-chained", ["adaptive-gated"], "continuous", [1, 4])
        )
    for x, y in zip(*rows, strict=True):
        assert x.to_dict() == y.to_dict()


def _ran_compiled(monkeypatch, traces, cm, spec: str, patch=None) -> bool:
    calls = []
    inner = compiled.coupled_loop
    monkeypatch.setattr(compiled, "coupled_loop", lambda *a: calls.append(1) or inner(*a))
    p = make_policy(spec)
    bind_methods([p], traces, cm)
    p.cost_model = cm
    if patch:
        patch(p)
    run_steps_coupled(fast.prepare(traces, set(p.methods)), p, "continuous", 2, False)
    return bool(calls)


def test_the_numpy_loop_runs_where_the_compiled_one_does_not_cover(monkeypatch) -> None:
    tr = random_traces(3, 6, True)
    gpu, cpu = get_cost_model("llama3.1-8b-h100-chained"), get_cost_model("smollm2-135m-cpu")
    assert _ran_compiled(monkeypatch, tr, gpu, "adaptive-gated")
    assert _ran_compiled(monkeypatch, tr, cpu, "adaptive-gated:ngram")  # a linear target, probes cheap
    assert _ran_compiled(monkeypatch, tr, gated_model(), "adaptive-gated")  # gated probes
    # a tabulated target, pooled priors, a patched instance: the numpy loop
    assert not _ran_compiled(monkeypatch, tr, get_cost_model("smollm2-135m-cpu-live"), "adaptive-gated:ngram")
    assert not _ran_compiled(monkeypatch, tr, gpu, "adaptive-pooled")
    assert not _ran_compiled(monkeypatch, tr, gpu, "adaptive-gated", lambda p: setattr(p, "decide", p.decide))
    monkeypatch.setattr(rule_kernel, "numba", None)  # numba not installed
    assert not compiled.available() and not _ran_compiled(monkeypatch, tr, gpu, "adaptive-gated")


def test_without_numba_the_numpy_loop_is_chosen_and_gives_the_same_figures(fixture_traces) -> None:  # noqa: F811
    """A process where numba does not import: the kernel module still imports, nothing compiles, and the
    simulator's figures equal the compiled loop's here."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, json; sys.modules['numba'] = None\n"
        "from speclab.simulate import compiled, simulate\n"
        "from test_fast_policy import FIXTURE\n"
        "from benchmarks.bench_online_policy import load_traces\n"
        "rows = simulate(load_traces(FIXTURE, 5), 'llama3.1-8b-h100-chained', ['adaptive-gated'], 'continuous',"
        " [1, 4])\n"
        "print(json.dumps([compiled.available(), [r.speedup for r in rows]]))\n"
    )
    root = Path(__file__).parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (root / "src", root, root / "tests"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root)
    assert out.returncode == 0, out.stderr
    avail, speedups = json.loads(out.stdout.strip().splitlines()[-1])
    assert avail is False
    here = simulate(fixture_traces, "llama3.1-8b-h100-chained", ["adaptive-gated"], "continuous", [1, 4])
    assert speedups == [r.speedup for r in here]


def test_compiled_code_of_other_source_or_constants_is_compiled_afresh(monkeypatch) -> None:
    """numba's cache checks only each function's own file: code compiled from other kernel source or other
    policy constants (rule_kernel.STAMP) is compiled again; where it still differs, the numpy loop runs."""
    assert compiled.available() and not compiled._stale()
    calls = []
    monkeypatch.setattr(compiled, "_CURRENT", None)
    monkeypatch.setattr(compiled, "_recompile", lambda: calls.append(1))
    monkeypatch.setattr(rule_kernel, "STAMP", rule_kernel.STAMP + 1)
    assert not compiled.available() and calls == [1]
    assert not _ran_compiled(monkeypatch, random_traces(3, 6, True), gated_model(), "adaptive-gated")
