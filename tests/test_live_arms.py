"""benchmarks/live_arms.py: the arms' order per round, the summary of per-round records (best static arm,
adaptive / best static and the A/A control as medians with their sign-test interval, tokens per step by
category), and one small real engine (marked `engine`): every arm of one start-up token-exact against the
no-SD reference run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks.live_arms import format_summary, parse_arms, rotation, summarise

ROOT = Path(__file__).resolve().parents[1]
ARMS = {"adaptive": "adaptive", "ngram": "ngram:3", "eagle3": "eagle3:3", "eagle3-again": "eagle3:3"}


def test_arms_parse_and_rotate() -> None:
    assert parse_arms("adaptive,ngram=ngram:3, head=eagle3:2") == {
        "adaptive": "adaptive",
        "ngram": "ngram:3",
        "head": "eagle3:2",
    }
    for bad in ("ngram=ngram:3", "adaptive", "adaptive,a=off,a=ngram:2"):
        with pytest.raises(SystemExit):
            parse_arms(bad)
    arms = list(ARMS)
    orders = [rotation(arms, r) for r in range(4)]
    assert orders[0] == arms and orders[1] == arms[1:] + arms[:1]
    # over as many rounds as arms, every arm runs once in every place
    assert all(sorted(o[i] for o in orders) == sorted(arms) for i in range(4))
    assert rotation(arms, 4) == arms


def _rec(rnd: int, arm: str, b: int, tok_s: float, exact: bool = True) -> dict:
    # two requests: a code edit whose drafts are mostly accepted under the lookup, a chat one
    acc_code = {"ngram": [3, 3, 2], "adaptive": [3, 3, 1], "eagle3": [1, 0], "eagle3-again": [1, 0]}[arm]
    acc_chat = {"ngram": [], "adaptive": [1, 1], "eagle3": [1, 1], "eagle3-again": [1, 1]}[arm]
    return {
        "round": rnd, "arm": arm, "mode": ARMS[arm], "batch_size": b, "tok_s": tok_s, "token_exact": exact,
        "loadavg_end": 1.5, "cpu_pressure": 0.01,
        "requests": [{"id": "c", "tokens": 16, "accepted": acc_code}, {"id": "h", "tokens": 8, "accepted": acc_chat}],
    }  # fmt: skip


def test_summary_ratios_intervals_and_categories() -> None:
    records = []
    for rnd in range(8):
        wobble = 1.0 + 0.01 * (rnd % 3)
        records += [
            _rec(rnd, "adaptive", 1, 60.0 * wobble),
            _rec(rnd, "ngram", 1, 50.0),
            _rec(rnd, "eagle3", 1, 40.0),
            _rec(rnd, "eagle3-again", 1, 40.0 * (1.02 if rnd % 2 else 0.98)),
        ]
    records.append(_rec(8, "adaptive", 1, 99.0))  # an unfinished round: not paired, not counted
    s = summarise(records, ARMS, ("eagle3", "eagle3-again"), {1: {"c": "code", "h": "chat"}})["1"]
    assert s["rounds"] == 8 and s["best_static"] == "ngram"
    a = s["adaptive_over_best"]
    assert a["rounds"] == 8 and a["median"] == pytest.approx(1.212)
    lo, hi = a["interval"]
    assert 1.19 < lo <= a["median"] <= hi < 1.25 and a["coverage"] >= 0.95
    assert s["aa"]["median"] == pytest.approx(1.0) and s["aa"]["interval"] == pytest.approx([0.98, 1.02])
    assert set(s["adaptive_over"]) == {"ngram", "eagle3"}  # the A/A copy is not a static configuration
    tps = s["tokens_per_step"]
    assert tps["code"]["ngram"] == pytest.approx(16 / 8) and tps["chat"]["ngram"] == 1.0
    assert tps["chat"]["eagle3"] == pytest.approx(8 / 6)
    assert s["token_exact"] is True
    text = format_summary({"1": s}, ARMS)
    assert "| 1 | 8 |" in text and "ngram" in text and "1.212 [" in text

    records[3] = _rec(0, "eagle3-again", 1, 40.0, exact=False)
    assert summarise(records, ARMS, None)["1"]["token_exact"] is False


@pytest.mark.engine
def test_arms_of_one_engine_are_token_exact(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from speclab.models.prepare import resolve_model

    try:
        resolve_model("smollm2-135m", prepare=False)
        resolve_model("smollm2-135m-eagle3", prepare=False)
    except Exception:
        pytest.skip("smollm2-135m or its EAGLE-3 head not prepared (speclab models prepare ...)")
    small = ["--num-prompts", "3", "--max-tokens", "12", "--batch-sizes", "1,2", "--enforce-eager"]
    ref = tmp_path / "ref"
    from speclab.cli import main

    main(["bench", "run", "--preset", "adaptive-mixed-cpu", "--methods", "none", "--repeats", "1",
          "--no-progress", "--out", str(ref), *small])  # fmt: skip
    out = tmp_path / "arms"
    cmd = [sys.executable, "-m", "benchmarks.live_arms", "--preset", "adaptive-mixed-cpu", "--entry",
           "adaptive-eagle3", "--reference", str(ref), "--rounds", "1", "--out", str(out), *small]  # fmt: skip
    res = subprocess.run(cmd, cwd=ROOT, timeout=900, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    records = [json.loads(line) for line in (out / "arms.jsonl").read_text().splitlines()]
    assert {(r["arm"], r["batch_size"]) for r in records} == {(a, b) for a in ARMS for b in (1, 2)}
    assert all(r["token_exact"] for r in records)
    for r in records:
        drafted = [d for q in r["requests"] for d in (q["drafted"] or [])]
        if r["mode"] == "adaptive":  # the policy chose per row: its decisions were counted
            assert sum(r["counts"].values()) > 0, r["counts"]
        else:  # static modes bypass the policy
            assert sum(r["counts"].values()) == 0, r["counts"]
        assert max(drafted, default=0) <= 3
    summary = json.loads((out / "summary.json").read_text())["by_batch_size"]
    tps = summary["1"]["tokens_per_step"]
    # the lookup alone drafts on the code edit, where it finds the text to copy
    assert tps["code-editing"]["ngram"] > 1.0, tps
    # a rerun resumes: nothing left to run, the same summary
    again = subprocess.run(cmd, cwd=ROOT, timeout=900, capture_output=True, text=True)
    assert again.returncode == 0 and len((out / "arms.jsonl").read_text().splitlines()) == len(records)


def test_simulated_arms_rank_the_lookup_first_on_copying_traces(tmp_path: Path) -> None:
    """Each arm's mode as the simulator's policy, the adaptive arm priced with the head paid at every step;
    on requests that copy (the lookup accepts 3 of 3, the head 1 of 3) the lookup ranks first."""
    import numpy as np
    from benchmarks.live_arms import arm_policy, ranking, simulate_arms

    from speclab.traces.model import MethodTrace, RequestTrace
    from speclab.traces.store import write_store

    opts = {"methods": ["ngram", "eagle3"], "policy": "adaptive", "cost_model": "smollm2-135m-cpu-live"}
    assert arm_policy("adaptive", opts, 3) == "adaptive:ngram,eagle3:3"
    assert arm_policy("ngram:3", opts, 3) == "fixed:ngram:3" and arm_policy("off", opts, 3) == "none"
    n = 64
    recs = [
        RequestTrace(
            id=f"r{i}",
            workload="mix",
            category="code-editing",
            prompt_len=200,
            output_len=n,
            methods={
                "ngram": MethodTrace(k_max=3, acc_len=np.full(n, 4), num_proposed=np.full(n, 3)),
                "eagle3": MethodTrace(k_max=3, acc_len=np.full(n, 2), num_proposed=np.full(n, 3)),
            },
        )  # fmt: skip
        for i in range(6)
    ]
    store = write_store(tmp_path / "t.parquet", recs)
    arms = {"adaptive": "adaptive", "ngram": "ngram:3", "eagle3": "eagle3:3"}
    sim = simulate_arms(str(store), arms, {"proposer_options": opts}, "eagle3", 3, [1, 4])
    assert set(sim) == {"1", "4"} and all(set(v) == set(arms) for v in sim.values())
    for b in ("1", "4"):
        assert ranking(sim[b], list(arms))[0] == "ngram", sim[b]
        assert sim[b]["ngram"] > sim[b]["eagle3"]


def test_measured_ranking_marks_what_the_rounds_cannot_order() -> None:
    from benchmarks.live_arms import measured_ranking, resolved_order

    pairs = {
        "adaptive/ngram": {"interval": [0.90, 1.08]},  # level
        "adaptive/eagle3": {"interval": [1.20, 1.40]},
        "ngram/eagle3": {"interval": [1.25, 1.45]},
    }
    order = resolved_order(pairs)
    assert set(order) == {("adaptive", "eagle3"), ("ngram", "eagle3")}
    assert (
        measured_ranking({"adaptive": 44.7, "ngram": 44.6, "eagle3": 33.0}, order)
        == "adaptive = ngram > eagle3"
    )
    assert resolved_order({"a/b": {"interval": [0.8, 0.9]}, "a/c": {"interval": None}}) == [("b", "a")]
