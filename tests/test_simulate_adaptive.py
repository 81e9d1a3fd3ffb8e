"""Adaptive policies: live batch in the policy interface, probes, the engines' agreement, no
reading of the future, switching off where SD loses, and vLLM's batch-size schedule."""

from __future__ import annotations

import numpy as np
import pytest

from speclab.errors import ConfigError
from speclab.simulate import fast, list_policies, make_policy, simulate
from speclab.simulate.adaptive import derive_schedule, recommend
from speclab.simulate.adaptive.recommend import vllm_config
from speclab.simulate.adaptive.synth import make_set
from speclab.simulate.coupled import run_steps_coupled
from speclab.traces import MethodTrace, RequestTrace

ONLINE = ["adaptive", "adaptive-pooled", "adaptive-gated", "adaptive:eagle:6", "adaptive-gated:ngram:5",
          "schedule:ngram:1=4,3=2,6=0"]  # fmt: skip


def random_traces(seed: int, n: int, nprop: bool) -> list[RequestTrace]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        L = int(rng.integers(1, 40))
        ng = np.where(rng.random(L) < 0.3, rng.integers(2, 9, L), 1)
        npv = np.where(ng > 1, 8, rng.integers(0, 3, L)) if nprop else None
        out.append(
            RequestTrace(
                id=f"r{i}", workload="w", category="other", prompt_len=int(rng.integers(0, 60)), output_len=L,
                methods={"ngram": MethodTrace(k_max=8, acc_len=ng, num_proposed=npv),
                         "eagle": MethodTrace(k_max=8, acc_len=rng.integers(1, 6, L))},
            )
        )  # fmt: skip
    return out


def same(a, b):
    for x, y in zip(a, b, strict=True):
        da, db = x.to_dict(), y.to_dict()
        for k in da:
            if isinstance(da[k], float):
                assert da[k] == pytest.approx(db[k], rel=1e-9), (x.policy, x.batch_size, k)
            elif k == "time_split_s":
                assert da[k] == pytest.approx(db[k], rel=1e-9, abs=1e-12)
            else:
                assert da[k] == db[k], (x.policy, x.batch_size, k)


@pytest.mark.parametrize("batching", ["replicate", "static", "continuous"])
@pytest.mark.parametrize("nprop", [False, True])
def test_fast_equals_reference_for_live_batch_policies(batching, nprop):
    tr = random_traces(3 + nprop, 13, nprop)
    aggs = ("total", "study") if batching == "replicate" else ("total",)
    for agg in aggs:
        kw = dict(aggregate=agg, switch_overhead=1e-3)
        f = simulate(tr, "llama3.1-8b-h100-chained", ONLINE, batching, [1, 3, 8], **kw)
        r = simulate(tr, "llama3.1-8b-h100-chained", ONLINE, batching, [1, 3, 8], engine="reference", **kw)
        same(f, r)


class Log:
    """Wrap a policy; record (request, position, method, k) of every decision."""

    def __init__(self, spec: str, traces):
        from speclab.costmodel import get_cost_model
        from speclab.policy import bind_methods

        self.p = make_policy(spec)
        bind_methods([self.p], traces, get_cost_model("llama3.1-8b-h100-chained"))
        self.log: list[tuple] = []
        inner = self.p.decide

        def decide(view):
            m, k = inner(view)
            self.log += list(zip(view.req.tolist(), view.pos.tolist(), m.tolist(), k.tolist(), strict=True))
            return m, k

        self.p.decide = decide


@pytest.mark.parametrize("spec", ONLINE)
@pytest.mark.parametrize("cut", [3, 11])
def test_decisions_do_not_depend_on_future_positions(spec, cut):
    tr = random_traces(7, 10, True)

    def run(traces):
        lg = Log(spec, traces)
        ta = fast.prepare(traces, set(lg.p.methods))
        if lg.p.uses_occupancy:
            run_steps_coupled(ta, lg.p, "continuous", 1, False)  # one slot: request by request
        else:
            fast.run_steps(ta, lg.p, 1, False)
        return lg.log

    log = run(tr)
    pooled = make_policy(spec).pools_requests
    # a policy that pools over requests (served in order, one slot) legitimately reads the earlier requests'
    # whole outputs: perturb only the last one served, whose decisions up to `cut` must not change
    rng = np.random.default_rng(5)
    for r in tr[-1:] if pooled else tr:
        for m in ("ngram", "eagle"):
            t = r.methods[m]
            a, npv = t.acc_len.copy(), None if t.num_proposed is None else t.num_proposed.copy()
            a[cut:] = rng.integers(1, 9, max(0, len(a) - cut))
            if npv is not None:  # the offer at the current position is observable: perturb after it
                npv[cut + 1 :] = rng.integers(0, 9, max(0, len(npv) - cut - 1))
            r.methods[m] = MethodTrace(k_max=8, acc_len=a, num_proposed=npv)
    log2 = run(tr)
    before = sorted(x for x in log if x[1] <= cut)
    assert before == sorted(x for x in log2 if x[1] <= cut) and before


def test_registered_and_bare_uses_every_method():
    names = [p.name for p in list_policies()]
    for n in ("adaptive", "adaptive-pooled", "adaptive-gated", "schedule"):
        assert n in names
    tr = random_traces(1, 6, False)
    res = simulate(tr, "llama3.1-8b-h100-chained", ["adaptive"], "continuous", [1])
    assert res[0].policy == "adaptive" and res[0].speedup > 1.0
    with pytest.raises(ConfigError):
        make_policy("schedule:ngram:2=3")  # must start at B=1
    with pytest.raises(ConfigError):
        make_policy("adaptive:ngram,ngram")


def nothing_accepted(n: int = 30) -> list[RequestTrace]:
    return [
        RequestTrace(id=f"z{i}", workload="w", category="chat", prompt_len=200, output_len=120,
                     methods={"ngram": MethodTrace(k_max=20, acc_len=np.ones(120, np.int64)),
                              "eagle": MethodTrace(k_max=20, acc_len=np.ones(120, np.int64))})
        for i in range(n)
    ]  # fmt: skip


@pytest.mark.parametrize("spec", ["adaptive", "adaptive-pooled", "adaptive-gated"])
def test_switches_itself_off_where_nothing_is_accepted(spec):
    res = simulate(nothing_accepted(), "llama3.1-8b-h100-chained", [spec], "continuous", [1, 16, 128])
    for r in res:
        # only the n-gram probe (0.59% of verify) and a first EAGLE try per request are paid
        assert 0.98 <= r.speedup < 1.0, (r.batch_size, r.speedup)


def test_probe_is_charged_at_every_step():
    tr = nothing_accepted(4)
    (r,) = simulate(tr, "llama3.1-8b-h100", ["adaptive:ngram"], "static", [4])
    assert r.time_split_s["propose"] == pytest.approx(0.005875 * (r.time_split_s["verify"] - _prefill(tr)))


def _prefill(tr) -> float:
    from speclab.costmodel import get_cost_model

    return float(get_cost_model("llama3.1-8b-h100").target_time(0, sum(t.prompt_len for t in tr)))


def test_occupancy_is_the_live_batch():
    """In static batching the batch shrinks as requests finish: the policy must see it shrink."""
    seen: list[int] = []
    p = make_policy("schedule:eagle:1=1")
    inner = p.decide
    p.decide = lambda v: (seen.extend(v.occupancy.tolist()), inner(v))[1]
    tr = [RequestTrace(id=f"s{i}", workload="w", category="other", prompt_len=5, output_len=5 + 10 * i,
                       methods={"eagle": MethodTrace(k_max=4, acc_len=np.ones(5 + 10 * i, np.int64))})
          for i in range(3)]  # fmt: skip
    run_steps_coupled(fast.prepare(tr, {"eagle"}), p, "static", 3, False)
    assert seen[0] == 3 and min(seen) == 1 and sorted(set(seen)) == [1, 2, 3]


def test_schedule_follows_occupancy_and_derivation():
    tr = make_set("synth-code-copy", n=40)
    pts, sp = derive_schedule(tr, "llama3.1-8b-h100-chained", "ngram", [1, 8, 64], kmax=6)
    assert pts[0][0] == 1 and [k for _, k in pts] == sorted((k for _, k in pts), reverse=True)
    assert sp[1] > sp[64]
    cfg = vllm_config("ngram", pts, 128)
    rng = cfg["num_speculative_tokens_per_batch_size"]
    assert rng[0][0] == 1 and rng[-1][1] == 128
    assert all(a[1] + 1 == b[0] for a, b in zip(rng, rng[1:], strict=False))
    # the derived schedule in the simulator matches the best fixed k at each batch size
    res = simulate(tr, "llama3.1-8b-h100-chained", [f"schedule:ngram:{','.join(f'{b}={k}' for b, k in pts)}"],
                   "continuous", [1, 8, 64])  # fmt: skip
    for r in res:
        assert r.speedup == pytest.approx(sp[r.batch_size], rel=0.05)
    rec = recommend(nothing_accepted(), "llama3.1-8b-h100-chained", [1, 32])
    assert all(k == 0 for _, _, k in rec["speculative_config"]["num_speculative_tokens_per_batch_size"])


def test_cli_recommend_prints_a_speculative_config(tmp_path):
    import json

    from click.testing import CliRunner

    from speclab.cli.simulate import command
    from speclab.traces import write_store

    write_store(tmp_path / "t", make_set("synth-code-copy", n=30))
    out = CliRunner().invoke(command, ["--traces", str(tmp_path / "t"), "--cost-model",
                                       "llama3.1-8b-h100-chained", "--recommend", "--batch-sizes", "1,64"])  # fmt: skip
    assert out.exit_code == 0, out.output
    cfg = json.loads(out.output.splitlines()[-1])
    assert cfg["method"] == "ngram" and cfg["num_speculative_tokens_per_batch_size"][0][0] == 1
    lst = CliRunner().invoke(command, ["--list-policies"]).output.split()
    assert {"adaptive", "adaptive-pooled", "adaptive-gated", "schedule"} <= set(lst)


def test_evaluation_tables_plot_and_report_section(tmp_path):
    from speclab.report.sections import ReportData, adaptive
    from speclab.simulate.adaptive.evaluate import run

    sets = {"a": make_set("synth-code-copy", n=15), "b": make_set("synth-chat", n=15, offers=False)}
    res = run(sets, "llama3.1-8b-h100-chained", [1, 8], tmp_path)
    for f in ("adaptive_eval.json", "adaptive_eval.csv", "adaptive_eval.md", "adaptive_eval.png"):
        assert (tmp_path / f).stat().st_size > 0
    s = {x["set"]: x for x in res["summary"]}
    assert set(s["a"]) >= {"adaptive", "adaptive-pooled", "adaptive-gated", "vllm_schedule"}
    roles = {r["role"] for r in res["rows"]}
    assert roles == {"baseline", "best static", "oracle", "vllm schedule", "online"}
    comb = next(r for r in res["rows"] if r["set"] == "a" and r["batch_size"] == 1
                and r["policy"].startswith("oracle-combine"))  # fmt: skip
    ad = next(
        r for r in res["rows"] if r["set"] == "a" and r["batch_size"] == 1 and r["policy"] == "adaptive"
    )
    assert 1.0 < ad["speedup"] <= comb["speedup"]
    d = ReportData(rows=None, run_path=None, traces=None, analysis={"adaptive": res}, recs=[], figs={})
    html = "".join(adaptive(d))
    assert "best static" in html and "adaptive-gated" in html and "num_speculative_tokens" in html


def test_report_shows_a_runs_adaptive_evaluation(tmp_path, monkeypatch):
    """`speclab report --run RUN` picks up RUN/adaptive/ (written by the evaluation module) as a section."""
    from helpers import fake_simulator  # tests/ is on sys.path (pytest prepend mode)
    from speclab.analyze.synthetic import write_synthetic_run
    from speclab.report import build_report
    from speclab.simulate.adaptive.evaluate import run

    fake_simulator(monkeypatch)
    rundir = write_synthetic_run(tmp_path / "run", n_per_workload=4)
    run({"code": make_set("synth-code-copy", n=10)}, "llama3.1-8b-h100-chained", [1, 4], rundir / "adaptive")
    html = build_report(tmp_path / "rep", run=rundir).read_text()
    assert "Adaptive speculation (simulated)" in html and "adaptive-gated" in html
    assert (tmp_path / "rep" / "adaptive_eval.png").read_bytes()[:4] == b"\x89PNG"
    # without it the section says what is missing instead
    bare = build_report(tmp_path / "rep2", run=write_synthetic_run(tmp_path / "run2", n_per_workload=4))
    assert "No adaptive evaluation" in bare.read_text()
