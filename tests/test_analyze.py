import json
import types

import numpy as np
import pytest
from click.testing import CliRunner

from helpers import fake_simulator  # tests/ is on sys.path (pytest prepend mode)
from speclab.analyze import acceptance_stats, analyze, format_tables, observed_stats
from speclab.analyze.acceptance import heavy_tail, summary
from speclab.analyze.oracle import oracle_gap
from speclab.analyze.overlap import overlap_vs_advantage
from speclab.analyze.synthetic import synthetic_results, write_synthetic_run
from speclab.traces import MethodTrace, RequestTrace


def rec(rid, ngram, eagle, prompt=None, output=None, workload="w", observed=None):
    n = len(ngram)
    return RequestTrace(
        id=rid,
        workload=workload,
        category="other",
        prompt_len=len(prompt) if prompt is not None else 3,
        output_len=n,
        prompt_token_ids=prompt if prompt is not None else [1, 2, 3],
        output_token_ids=output if output is not None else list(range(100, 100 + n)),
        methods={"ngram": MethodTrace(k_max=7, acc_len=ngram), "eagle": MethodTrace(k_max=7, acc_len=eagle)},
        meta={"observed": observed} if observed else {},
    )


def test_summary_and_hist_and_rates():
    r = rec("a", [1, 1, 2, 3, 8, 1], [1, 2, 2, 2, 2, 2])
    stats = {e["method"]: e for e in acceptance_stats([r])}
    ng = stats["ngram"]
    # position 0 (prefill) excluded: values 1, 2, 3, 8, 1
    assert ng["n_positions"] == 5
    assert ng["mean"] == pytest.approx(3.0)
    assert ng["p50"] == pytest.approx(2.0)
    assert ng["hist"]["values"] == list(range(1, 9))
    assert ng["hist"]["counts"] == [2, 1, 1, 0, 0, 0, 0, 1]
    # alpha_1 = P(acc-1 >= 1) = 3/5, alpha_2 = 2/5
    assert ng["per_position_rate"][:3] == pytest.approx([0.6, 0.4, 0.2])
    assert ng["heavy_tail"]["share_ge_burst"] == pytest.approx(0.2)
    # accepted tokens 0,1,2,7,0 = 10; the top 10% (1 position) holds 7
    assert ng["heavy_tail"]["top10_share"] == pytest.approx(0.7)
    assert stats["eagle"]["std"] == pytest.approx(0.0)
    json.dumps(stats)  # JSON-able, no NaN


def test_position_curve_normalised_includes_long_outputs():
    short = rec("s", [1, 2, 2, 4, 4], [1] * 5)
    long_ = rec("l", [1] + [2] * 499 + [6] * 500, [1] * 1000)
    e = next(x for x in acceptance_stats([short, long_], n_bins=2) if x["method"] == "ngram")
    pc = e["position_curve"]
    assert pc["count"] == [2 + 499, 2 + 500]
    # request-weighted: first half (2 and 2) -> 2, second half (4 and 6) -> 5
    assert pc["mean_request_weighted"] == pytest.approx([2.0, 5.0])
    assert pc["mean"][1] == pytest.approx((8 + 3000) / 502)


def test_heavy_tail_empty_and_small_k():
    assert heavy_tail(np.array([]), 3)["top10_share"] is None
    assert heavy_tail(np.array([1, 2, 3, 4]), 3)["share_ge_burst"] is None  # k+1 < 5: cannot reach a burst
    assert np.isnan(summary(np.array([]))["mean"])


def test_overlap_vs_advantage_sign_and_crossover():
    prompt = list(range(1000, 1200))
    recs = []
    for i in range(10):
        share = i / 9
        n_copy = int(100 * share)
        output = prompt[:n_copy] + list(range(5000 + 100 * i, 5000 + 100 * i + 100 - n_copy))
        ng = [1] + [1 + int(6 * share)] * 99
        recs.append(rec(f"r{i}", ng, [1] + [3] * 99, prompt=prompt, output=output))
    res = overlap_vs_advantage(recs)
    (g,) = res["groups"]
    assert (g["free_method"], g["model_method"], g["n"]) == ("ngram", "eagle", 10)
    assert g["pearson"] > 0.9
    assert g["crossover_overlap"] is not None and 0 < g["crossover_overlap"] < 1
    assert sum(b["n"] for b in g["bins"]) == 10


def test_observed_stats():
    r = rec(
        "a",
        [1, 2],
        [1, 2],
        observed={"method": "eagle", "k": 3, "per_step_accepted": [0, 3, 1], "per_step_drafted": [3, 3, 3]},
    )
    (o,) = observed_stats([r])
    assert (o["method"], o["k"], o["n_steps"]) == ("eagle", 3, 3)
    assert o["mean"] == pytest.approx((1 + 4 + 2) / 3)


def test_observed_stats_apart_per_sweep_entry():
    """Two entries with the same method and k (other options) are two groups once the run names them."""
    recs = []
    for cell, acc in (("c-narrow", [0, 0]), ("c-wide", [3, 3]), ("c-narrow", [0, 1])):
        observed = {"method": "ngram", "k": 3, "per_step_accepted": acc, "per_step_drafted": [3, 3]}
        r = rec(f"{cell}:p", [1, 2], [1, 2], observed=observed)
        r.meta["cell_id"] = cell
        recs.append(r)
    by_label = {o["label"]: o for o in observed_stats(recs, {"c-narrow": "ngram-k3", "c-wide": "ngram-wide"})}
    assert set(by_label) == {"ngram-k3", "ngram-wide"}
    assert by_label["ngram-k3"]["n_requests"] == 2 and by_label["ngram-wide"]["mean"] == pytest.approx(4.0)
    assert "ngram-wide" in format_tables({"observed": list(by_label.values())})
    (merged,) = observed_stats(recs)  # a trace store without its run: one group, no label
    assert merged["label"] is None and merged["n_requests"] == 3


def test_oracle_gap_with_fake_simulator(monkeypatch):
    fake_simulator(monkeypatch)
    recs = [rec(f"r{i}", [1, 4, 4, 4], [1, 2, 2, 2], workload="synthetic-code") for i in range(3)]
    rows = [r for r in synthetic_results() if r.get("workload") == "synthetic-code"]
    gap = oracle_gap(recs, rows, cost_model=None, cost_model_desc="fake")
    assert gap["status"] == "ok"
    assert [g["batch_size"] for g in gap["rows"]] == [1, 8, 32]
    g1 = gap["rows"][0]
    assert g1["best_measured_method"] == "ngram@k3"
    assert g1["best_measured"] == pytest.approx(2.1)
    assert "fixed:ngram:3" in g1["simulated"] and "oracle-combine:eagle,ngram" in g1["simulated"]
    assert g1["oracle_best_single_policy"] == "oracle:ngram"
    assert g1["gap_combine"] == pytest.approx(g1["oracle_combine"] / 2.1)


def test_analyze_on_synthetic_run_and_cli(tmp_path, monkeypatch):
    run = write_synthetic_run(tmp_path / "run", n_per_workload=6)
    a = analyze(None, run=run, max_requests=6)
    assert a["inputs"]["n_records"] == 12
    assert {(e["workload"], e["method"]) for e in a["acceptance"]} == {
        (w, m) for w in ("synthetic-chat", "synthetic-code") for m in ("eagle", "ngram")
    }
    assert a["oracle_gap"]["status"] in ("ok", "skipped")
    json.dumps(a, allow_nan=False)
    assert "Acceptance length" in format_tables(a)

    from speclab.cli.analyze import command

    out = tmp_path / "analysis.json"
    res = CliRunner().invoke(command, ["--run", str(run), "--no-oracle", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "synthetic-code" in res.output
    assert json.loads(out.read_text())["oracle_gap"]["status"] == "skipped"


def test_dedupe_same_request_under_several_cells():
    from speclab.analyze import dedupe

    a = rec("cellA:p1", [1, 2, 3], [1, 1, 2])
    b = rec("cellB:p1", [1, 2, 3], [1, 1, 2])
    for r, cell in ((a, "cellA"), (b, "cellB")):
        r.meta = {"prompt_id": "p1", "cell_id": cell, "target": "t"}
    c = rec("cellA:p2", [1, 2, 3], [1, 1, 2])
    c.meta = {"prompt_id": "p2", "target": "t"}
    kept, dropped = dedupe([a, b, c])
    assert [r.id for r in kept] == ["cellA:p1", "cellA:p2"] and dropped == 1


def test_oracle_gap_with_real_simulator(tmp_path):
    pytest.importorskip("speclab.simulate", reason="simulator not available")
    pytest.importorskip("speclab.costmodel", reason="cost models not available")
    run = write_synthetic_run(tmp_path / "run", n_per_workload=6)
    a = analyze(None, run=run, max_requests=6)
    og = a["oracle_gap"]
    assert og["status"] == "ok", og.get("reason")
    assert og["cost_model"].startswith("fitted from")
    for g in og["rows"]:
        assert g["oracle_combine"] >= 0.98 * g["oracle_best_single"]
        assert g["best_measured"] is not None and g["sim_best_fixed"] is not None


def test_oracle_gap_one_failing_policy_and_uncosted_method(monkeypatch):
    fake_simulator(monkeypatch)
    import speclab.analyze.oracle as oracle_mod

    ok_simulate = oracle_mod.simulate

    def picky(traces, cost_model, policies, **kw):
        from speclab.errors import ConfigError

        if any(p.startswith("fixed:") for p in policies):
            raise ConfigError("fixed policies unsupported here")
        return ok_simulate(traces, cost_model, policies, **kw)

    monkeypatch.setattr(oracle_mod, "simulate", picky)
    recs = [rec(f"r{i}", [1, 4, 4, 4], [1, 2, 2, 2]) for i in range(3)]
    cm = types.SimpleNamespace(draft={"ngram": object()})  # no drafting cost for eagle
    gap = oracle_gap(recs, None, cost_model=cm, cost_model_desc="fake", batch_sizes=[1, 4])
    assert gap["status"] == "ok"
    assert set(gap["rows"][0]["simulated"]) == {"oracle:ngram"}
    assert any("no drafting cost for eagle" in w for w in gap["warnings"])
    assert any("fixed:ngram:3: simulation failed" in w for w in gap["warnings"])
