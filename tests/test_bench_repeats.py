"""Repeats and noise: matched pairs, the contention flag, and verdicts that the noise must support."""

from __future__ import annotations

import pytest

from speclab.bench.repeats import (
    add_run,
    apply_pairs,
    contended,
    evidence,
    runs_done,
    split_unit,
    unit_id,
)
from speclab.bench.show import contention_note, format_table
from speclab.report.recommend import CANNOT_TELL, headline, recommendations
from speclab.report.sections import ReportData, summary

QUIET, BUSY = 1.0, 6.0  # 1-minute load averages on 2 CPUs
# a machine noise record (RUN/noise.json) of a quiet host: A/A pairs with a log spread of 2%
CALM = {"pairs": 12, "sd_log": 0.02, "unit_s": 0.3, "measured_at": "t"}


def run(repeat: int, tps: float, load: float = QUIET) -> dict:
    return {"repeat": repeat, "throughput_tok_s": tps, "loadavg_1m": load, "cpus": 2}


def row(label: str, method: str, tps: list[float], loads: list[float] | None = None, **kw) -> dict:
    loads = loads or [QUIET] * len(tps)
    r = {
        "cell_id": f"{label}.w.cont.b{kw.get('batch_size', 1)}.x",
        "status": "ok",
        "label": label,
        "method": method,
        "k": None if method == "none" else 3,
        "target": "t",
        "dtype": "float32",
        "workload": kw.get("workload", "w"),
        "batching": "continuous",
        "batch_size": kw.get("batch_size", 1),
        "throughput_tok_s": tps[0],
        "speedup": 1.0 if method == "none" else None,
        "host": {"loadavg_1m": loads[0], "cpus": 2},
    }
    for i, (t, ld) in enumerate(zip(tps, loads, strict=True), 1):
        add_run(r, run(i, t, ld))
    return r


def paired(base: dict, sd: dict) -> dict:
    apply_pairs(sd, base)
    return sd


def test_unit_ids_keep_repeat_one_as_the_cell_id():
    assert unit_id("ngram-k3.w.cont.b1.abc", 1) == "ngram-k3.w.cont.b1.abc"
    assert split_unit(unit_id("ngram-k3.w.cont.b1.abc", 3)) == ("ngram-k3.w.cont.b1.abc", 3)
    assert split_unit("ngram-k3.w.cont.b1.abc") == ("ngram-k3.w.cont.b1.abc", 1)
    assert runs_done({"status": "ok"}) == {1} and runs_done({"status": "failed"}) == set()


def test_matched_pairs_median_and_spread():
    base = row("none", "none", [10.0, 20.0, 10.0])
    sd = paired(base, row("ngram-k3", "ngram", [21.0, 22.0, 19.0]))
    # pairs 2.1, 1.1, 1.9: the median of ratios (1.9), not the ratio of medians (21 / 10 = 2.1)
    assert [p["speedup"] for p in sd["speedup_runs"]] == pytest.approx([2.1, 1.1, 1.9])
    assert sd["speedup"] == pytest.approx(1.9)
    assert sd["speedup_spread"] == {"min": pytest.approx(1.1), "max": pytest.approx(2.1), "n": 3}
    assert sd["throughput_tok_s"] == 21.0 and sd["throughput_spread"] == {"min": 19.0, "max": 22.0}
    # a baseline measured once (an older run) pairs with repeat 1 only
    one = {
        "status": "ok",
        "method": "none",
        "throughput_tok_s": 10.0,
        "host": {"loadavg_1m": QUIET, "cpus": 2},
    }
    sd1 = paired(one, row("ngram-k3", "ngram", [21.0, 22.0]))
    assert sd1["speedup_spread"]["n"] == 1 and sd1["speedup"] == pytest.approx(2.1)


def test_evidence_rules():
    base = row("none", "none", [10.0, 10.0, 10.0])
    # quiet pairs on one side of 1.0 decide
    kind, fig, why = evidence(paired(base, row("a", "ngram", [12.0, 13.0, 11.0])))
    assert kind == "faster" and fig == pytest.approx(1.2) and "3 quiet matched pair(s)" in why
    assert evidence(paired(base, row("a", "ngram", [8.0, 9.0, 9.5])))[0] == "slower"
    # a spread that straddles 1.0 does not
    kind, _, why = evidence(paired(base, row("a", "ngram", [9.0, 12.0, 13.0])))
    assert kind == "unsure" and "straddles 1.00x" in why
    # contended pairs do not count (either side contended): one quiet pair does not decide alone; with the
    # machine's A/A noise measured, its interval does
    sd = paired(base, row("a", "ngram", [5.0, 12.0, 6.0], loads=[BUSY, QUIET, BUSY]))
    kind, fig, why = evidence(sd)
    assert (kind, fig) == ("unsure", pytest.approx(1.2)) and "1 quiet matched pair(s) of 3" in why
    kind, fig, why = evidence(sd, noise=CALM)
    assert (kind, fig) == ("faster", pytest.approx(1.2)) and "1 quiet matched pair(s) of 3" in why
    busy_base = row("none", "none", [10.0, 10.0], loads=[BUSY, BUSY])
    kind, _, why = evidence(paired(busy_base, row("a", "ngram", [5.0, 6.0])))
    assert kind == "unsure" and "all 2 matched pair(s) ran while other processes competed" in why
    # no repeats: one run is one pair; it decides by the machine's noise unless it was contended
    single = {"speedup": 0.8, "host": {"loadavg_1m": QUIET, "cpus": 2}}
    assert evidence(single)[0] == "unsure" and evidence(single)[2].startswith("one run: 0.80x")
    kind, fig, why = evidence(single, noise=CALM)
    assert (kind, fig) == ("slower", 0.8) and why.startswith("one run")
    kind, _, why = evidence({"speedup": 0.8, "host": {"loadavg_1m": BUSY, "cpus": 2}})
    assert kind == "unsure" and "one run" in why and "6.0 on 2 CPUs" in why
    # CPU pressure (PSI: share of the cell in which some task waited for a CPU) flags a cell the load
    # average (a 1-minute mean) has not caught up with yet
    hot = row("a", "ngram", [12.0, 13.0, 11.0])
    hot["runs"][1]["cpu_pressure"] = 0.8
    sd = paired(base, hot)
    assert [p["contended"] for p in sd["speedup_runs"]] == [False, True, False]
    assert "2 quiet matched pair(s) of 3" in evidence(sd)[2]
    assert contended({"host": {"loadavg_1m": 1.0, "cpus": 2}, "engine_info": {"cpu_pressure": 0.7}})
    assert not contended({"host": {"loadavg_1m": 1.0, "cpus": 2}, "engine_info": {"cpu_pressure": 0.1}})
    # without PSI the load average decides; with it, PSI alone (a quiet engine alone ran at load 2.05-2.66
    # on 2 cores with CPU pressure 3-5%: that must not read as contended)
    assert contended({"host": {"loadavg_1m": 3.2, "cpus": 2}}) and not contended(
        {"host": {"loadavg_1m": 2.6, "cpus": 2}}
    )
    assert not contended({"host": {"loadavg_1m": 2.66, "cpus": 2}, "engine_info": {"cpu_pressure": 0.04}})
    assert contended({"host": {"loadavg_1m": 1.9, "cpus": 2}, "engine_info": {"cpu_pressure": 0.99}})


def _recs(rows: list[dict], noise: dict | None = None) -> dict:
    return {(r["workload"], r["batch_size"]): r for r in recommendations(rows, None, noise)}


def test_recommendations_never_call_sd_off_or_on_on_noise():
    base = row("none", "none", [10.0, 10.0, 10.0])
    rows = [base]
    # B=1: ngram straddles 1.0 -> cannot tell
    rows.append(paired(base, row("ngram-k3", "ngram", [9.0, 12.0, 13.0])))
    rec = _recs(rows)[("w", 1)]
    assert rec["verdict"] == CANNOT_TELL and rec["recommend"] == CANNOT_TELL
    assert "ngram-k3" in rec["why"] and "straddles" in rec["why"] and rec["spread"] == "0.90-1.30 (n=3)"
    # a second candidate that is clearly faster decides: use it
    rows.append(paired(base, row("suffix-k8", "suffix", [11.0, 11.5, 12.0])))
    rec = _recs(rows)[("w", 1)]
    assert (rec["verdict"], rec["recommend"]) == ("use SD", "suffix-k8")
    assert rec["best_speedup"] == pytest.approx(1.15) and rec["runner_up"] == "ngram-k3"
    assert "3 quiet matched pair(s)" in rec["why"]
    # "SD off" only when every candidate is clearly slower
    slow = [base, paired(base, row("ngram-k3", "ngram", [8.0, 9.0, 9.5]))]
    assert _recs(slow)[("w", 1)]["verdict"] == "SD off"
    slow.append(paired(base, row("draft-k3", "draft_model", [7.0, 12.0, 8.0])))
    rec = _recs(slow)[("w", 1)]
    assert rec["verdict"] == CANNOT_TELL and rec["why"].startswith("draft-k3:")


def test_a_contended_run_says_cannot_tell_instead_of_sd_off():
    """The motivating case: beside another CPU-heavy process every SD cell measured below 1.0x, while a quiet
    run measured n-gram at 2.21x (B=1) and 1.16x (B=16). Contended figures must not decide."""
    rows = []
    for b, sp in ((1, 0.85), (16, 0.9)):
        base = row("none", "none", [30.0, 31.0, 29.0], loads=[BUSY] * 3, batch_size=b)
        sd = row("ngram-k3", "ngram", [30.0 * sp, 31.0 * sp, 29.0 * sp], loads=[BUSY] * 3, batch_size=b)
        rows += [base, paired(base, sd)]
    recs = _recs(rows)
    assert all(r["verdict"] == CANNOT_TELL for r in recs.values())
    lines = headline(list(recs.values()))
    assert "cannot tell in 2" in lines[0] and "should be off in 0" in lines[0]
    assert "not supported by the noise" in lines[1]
    # without repeats (one run each, contended): the same
    single = [{k: v for k, v in r.items() if k not in ("runs", "speedup_runs")} for r in rows]
    assert all(r["verdict"] == CANNOT_TELL for r in recommendations(single, None))
    # the same cells measured on a quiet machine decide
    quiet = []
    for b, sp in ((1, 2.21), (16, 1.16)):
        base = row("none", "none", [30.0, 31.0, 29.0], batch_size=b)
        quiet += [
            base,
            paired(base, row("ngram-k3", "ngram", [30.0 * sp, 31.0 * sp, 29.0 * sp], batch_size=b)),
        ]
    assert {k: r["recommend"] for k, r in _recs(quiet).items()} == {
        ("w", 1): "ngram-k3",
        ("w", 16): "ngram-k3",
    }


def test_contention_flag_in_bench_show_and_the_report_summary():
    base = row("none", "none", [10.0, 10.0, 10.0], loads=[QUIET, BUSY, QUIET])
    sd = paired(base, row("ngram-k3", "ngram", [20.0, 21.0, 22.0]))
    rows = [base, sd]
    note = contention_note(rows)
    assert note is not None and note.startswith("1 of 2 cell(s)") and "6.0 on 2 CPUs" in note
    table = format_table(rows)
    assert " n " in table.splitlines()[0] and "2.00-2.20" in table
    html = "".join(
        summary(
            ReportData(
                rows=rows, run_path=None, traces=None, analysis={}, recs=recommendations(rows, None), figs={}
            )
        )
    )
    assert "Contention:" in html and "1 of 2 cell(s)" in html
    assert "measured 3 times, interleaved with its no-SD baseline" in html
    quiet = [row("none", "none", [10.0]), row("ngram-k3", "ngram", [20.0])]
    html = "".join(summary(ReportData(rows=quiet, run_path=None, traces=None, analysis={}, recs=[], figs={})))
    assert "Contention" not in html


def test_repeats_in_sweeps_presets_and_overrides():
    from speclab.bench.api import load_sweep_source
    from speclab.errors import ConfigError

    spec, _ = load_sweep_source(preset="demo-cpu")
    assert spec.repeats == 2 and spec.to_dict()["repeats"] == 2
    assert load_sweep_source(preset="demo-cpu", overrides={"repeats": 3})[0].repeats == 3
    assert load_sweep_source(preset="study-llama3.1-8b")[0].repeats == 1  # the default
    with pytest.raises(ConfigError, match="field repeats: must be >= 1"):
        load_sweep_source(preset="demo-cpu", overrides={"repeats": 0})
    with pytest.raises(ConfigError, match="field repeats: expected an integer"):
        load_sweep_source(preset="demo-cpu", overrides={"repeats": "3"})


def test_gated_job_protocol(tmp_path):
    import threading
    import time

    from speclab.engine.protocol import CellSpec, EngineSpec, Job, PromptSpec, gate_lines, gate_ready_path

    cell = CellSpec("c1", "continuous", 1, 4, [PromptSpec("p", [1, 2])])
    plain = Job(engine=EngineSpec(target="t"), cells=[cell])
    assert "gate" not in plain.to_dict()  # job files of ungated runs are unchanged
    gated = Job.from_dict(dict(plain.to_dict(), gate=str(tmp_path / "gate")))
    assert gated.gate == str(tmp_path / "gate") and gate_ready_path(gated.gate).name == "gate.ready"
    gate = tmp_path / "gate"

    def runner() -> None:  # appends whole lines, one at a time, as the sweep runner does
        for line in ("c1", "c1#r2", "", "done", "never"):
            time.sleep(0.05)
            with open(gate, "a") as fh:
                fh.write(line + "\n")

    t = threading.Thread(target=runner)
    t.start()
    assert list(gate_lines(gate, poll_s=0.01)) == ["c1", "c1#r2"]  # until "done"; blank lines skipped
    t.join()


def test_single_run_with_a_contended_baseline_cannot_decide():
    """Without repeats a speedup is one SD run over one no-SD run: if the baseline ran beside a competing
    process, the ratio is inflated (slow baseline), so it must not back a confident verdict."""
    base = {"cell_id": "none.w.cont.b1.x", "status": "ok", "label": "none", "method": "none", "k": None,
            "target": "t", "dtype": "float32", "workload": "w", "batching": "continuous", "batch_size": 1,
            "throughput_tok_s": 5.0, "speedup": 1.0, "host": {"loadavg_1m": BUSY, "cpus": 2}}  # fmt: skip
    sd = dict(base, cell_id="ngram-k3.w.cont.b1.x", label="ngram-k3", method="ngram", k=3,
              throughput_tok_s=9.0, speedup=1.8, baseline_cell_id=base["cell_id"],
              host={"loadavg_1m": QUIET, "cpus": 2})  # fmt: skip
    assert evidence(sd, noise=CALM)[:2] == ("faster", 1.8)  # alone it looks quiet
    kind, _, why = evidence(sd, base, CALM)
    assert kind == "unsure" and "its no-SD baseline measured while other processes competed" in why
    rec = _recs([base, sd])[("w", 1)]
    assert rec["verdict"] == CANNOT_TELL and "baseline" in rec["why"]
    base["host"] = {"loadavg_1m": QUIET, "cpus": 2}
    assert _recs([base, sd], CALM)[("w", 1)]["verdict"] == "use SD"


def test_compare_recommendations_classifies_each_cell():
    from speclab.report.recommend import compare_recommendations

    def rec(b: int, verdict: str, recommend: str, wl: str = "w") -> dict:
        return {"workload": wl, "batching": "continuous", "batch_size": b, "verdict": verdict,
                "recommend": recommend}  # fmt: skip

    quiet = [rec(1, "use SD", "ngram-k3"), rec(4, "use SD", "ngram-k3"), rec(8, "SD off", "SD off"),
             rec(16, "SD off", "SD off"), rec(32, CANNOT_TELL, CANNOT_TELL), rec(64, "use SD", "ngram-k3"),
             rec(2, "use SD", "ngram-k3")]  # fmt: skip
    other = [rec(1, "use SD", "ngram-k3"), rec(4, CANNOT_TELL, CANNOT_TELL), rec(8, "use SD", "ngram-k3"),
             rec(16, "SD off", "SD off"), rec(32, "use SD", "ngram-k3"), rec(64, "marginal", "ngram-k3"),
             rec(128, "use SD", "x")]  # fmt: skip
    got = {r["batch_size"]: r["outcome"] for r in compare_recommendations(quiet, other)}
    assert got == {1: "same", 2: "missing", 4: "cannot tell", 8: "WRONG", 16: "same", 32: "WRONG",
                   64: "differs", 128: "missing"}  # fmt: skip


def test_contended_repeats_end_in_cannot_tell_not_a_wrong_verdict():
    """The check's expected outcome in miniature: the quiet run's pairs say 'use SD'; the same cells measured
    beside a CPU hog (every pair contended, speedups shifted either way) say 'cannot tell'."""
    from speclab.report.recommend import compare_recommendations

    base_q = row("none", "none", [10.0, 10.0, 10.0])
    quiet = [base_q, paired(base_q, row("ngram-k3", "ngram", [15.0, 16.0, 15.5]))]
    base_c = row("none", "none", [4.0, 7.0, 5.0], loads=[BUSY] * 3)
    busy = [base_c, paired(base_c, row("ngram-k3", "ngram", [3.0, 4.0, 9.0], loads=[BUSY] * 3))]
    cmp = compare_recommendations(recommendations(quiet, None), recommendations(busy, None))
    assert [c["outcome"] for c in cmp] == ["cannot tell"]
    assert cmp[0]["quiet"] == "use SD (ngram-k3)"


def test_where_each_configuration_stops_paying():
    from speclab.report.recommend import stops_paying
    from speclab.report.sections import recommend

    rows = []
    # eagle3 pays at B=1 and 4, is clearly slower at 16; ngram pays everywhere; draft never; suffix straddles
    speed = {
        "eagle3-k3": {1: [20, 21, 22], 4: [12, 12, 13], 16: [8, 8, 9]},
        "ngram-k3": {1: [15, 15, 16], 4: [11, 11, 12], 16: [11, 11, 11]},
        "draft-k3": {1: [9, 9, 9], 4: [8, 8, 8], 16: [5, 5, 5]},
        "suffix-k8": {1: [12, 12, 12], 4: [9, 11, 12], 16: [9, 9, 9]},
    }
    for b in (1, 4, 16):
        base = row("none", "none", [10.0, 10.0, 10.0], batch_size=b)
        rows.append(base)
        for label, by_b in speed.items():
            rows.append(
                paired(base, row(label, label.split("-")[0], [float(x) for x in by_b[b]], batch_size=b))
            )
    got = {r["method"]: r for r in stops_paying(rows)}
    assert (
        got["eagle3-k3"]["stops_at"] == 16
        and got["eagle3-k3"]["says"] == "pays up to B=4; stops paying at B=16"
    )
    assert got["eagle3-k3"]["measured"] == "B=1: 2.10x, B=4: 1.20x, B=16: 0.80x"
    assert (
        got["ngram-k3"]["stops_at"] is None
        and "every batch size measured up to B=16" in got["ngram-k3"]["says"]
    )
    assert got["draft-k3"]["stops_at"] == 1 and got["draft-k3"]["says"].startswith("never supported")
    assert got["suffix-k8"]["says"] == "pays up to B=1; cannot tell from B=4"
    assert "(cannot tell)" in got["suffix-k8"]["measured"]
    html = "".join(
        recommend(
            ReportData(
                rows=rows, run_path=None, traces=None, analysis={}, recs=recommendations(rows, None), figs={}
            )
        )
    )
    assert "Where each configuration stops paying" in html and "stops paying at B=16" in html


def test_memory_check_refuses_resident_engines_that_do_not_fit(tmp_path):
    from speclab.bench.preflight import CPU_ENGINE_RUNTIME_BYTES, check_memory
    from speclab.bench.spec import parse_sweep
    from speclab.errors import ConfigError

    target = tmp_path / "t"
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"\0" * 1000)
    gib = 2**30

    def sweep(repeats: int, kv: float) -> object:
        methods = [{"name": "none"}, {"name": "ngram", "k": 3}, {"name": "ngram", "k": 5, "label": "k5"}]
        return parse_sweep(
            {
                "name": "m",
                "target": "t",
                "workloads": ["offline-math"],
                "batch_sizes": [1],
                "repeats": repeats,
                "engine": {"kv_cache_gib": kv},
                "methods": methods,
            },
            "m.toml",
        )

    need_each = 1000 + 2 * gib + CPU_ENGINE_RUNTIME_BYTES
    # three resident engines (repeats = 3) of ~3.4 GiB do not fit in 8 GiB: a one-line ConfigError that says what to do
    with pytest.raises(ConfigError, match="3 engine\\(s\\) stay resident.*lower \\[engine\\] kv_cache_gib"):
        check_memory(sweep(3, 2.0), str(target), {}, available=8 * gib, cpu_engine=True)
    # one engine at a time (repeats = 1) fits; close to the limit it warns
    assert check_memory(sweep(1, 2.0), str(target), {}, available=8 * gib, cpu_engine=True) is None
    warn = check_memory(sweep(1, 2.0), str(target), {}, available=need_each + 1000, cpu_engine=True)
    assert warn is not None and warn.startswith("warning:")
    # a smaller KV cache makes the same sweep fit; GPU builds are not checked
    assert check_memory(sweep(3, 0.5), str(target), {}, available=8 * gib, cpu_engine=True) is None
    assert check_memory(sweep(3, 2.0), str(target), {}, available=gib, cpu_engine=False) is None


def test_contended_pairs_left_out_of_the_median_when_quiet_ones_exist():
    """A pair measured under contention is biased (a slowed baseline inflates the ratio): where quiet pairs
    exist, the row's speedup and spread are theirs, and `bench show` says how many were left out; where none
    is quiet, all pairs stay (and the evidence says contended)."""
    from speclab.bench.show import _range

    base = row("none", "none", [10.0, 5.0, 10.0], loads=[QUIET, BUSY, QUIET])
    sd = paired(base, row("a", "ngram", [12.0, 12.0, 13.0]))  # pair 2: 2.4x only because no SD was slowed
    assert sd["speedup"] == pytest.approx(1.25) and sd["speedup_spread"]["n"] == 2
    assert sd["speedup_spread"]["contended_left_out"] == 1
    assert _range(sd["speedup_spread"]) == "1.20-1.30 (1 contended left out)"
    assert len(sd["speedup_runs"]) == 3  # every pair is kept in the row, marked
    busy = row("none", "none", [10.0, 5.0], loads=[BUSY, BUSY])
    sd2 = paired(busy, row("a", "ngram", [12.0, 12.0]))
    assert sd2["speedup"] == pytest.approx(1.8) and "contended_left_out" not in sd2["speedup_spread"]


def test_resuming_a_round_of_repeats_renders_its_prompts(tmp_path, monkeypatch):
    """A run stopped between rounds of repeats: every cell has an ok row with repeat 1 (and 2), none with
    repeat 3. Resuming must render the workloads whose cells still miss a repeat (it rendered none and the
    runner died with KeyError before), and a workload asked for later is rendered then, not a crash."""
    import json

    from speclab.bench import api
    from speclab.bench.cells import expand_cells
    from speclab.bench.preflight import PromptSet
    from speclab.bench.spec import parse_sweep

    spec = parse_sweep(
        {"name": "r", "target": "smollm2-135m", "workloads": ["offline-chat", "offline-math"],
         "batch_sizes": [1], "repeats": 3, "methods": [{"name": "none"}, {"name": "ngram", "k": 3}]},
        "t",
    )  # fmt: skip
    rows = [
        {"cell_id": c.cell_id, "status": "ok", "runs": [{"repeat": 1}, {"repeat": 2}]}
        for c in expand_cells(spec)
    ]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rendered: list[str] = []

    def provider(w: str) -> PromptSet:
        rendered.append(w)
        return PromptSet(workload=w, category="chat", prompts=[])

    seen = {}

    def fake_run_sweep(spec, run_dir, prompts, **kw):
        seen["chat"] = prompts("offline-chat")
        seen["other"] = prompts("offline-code-edit")  # not in the sweep's upfront set: rendered on demand
        return "outcome"

    monkeypatch.setattr(api, "run_sweep", fake_run_sweep)
    assert api.run_bench(spec, tmp_path, prompt_provider=provider, echo=lambda s: None) == "outcome"
    assert sorted(rendered[:2]) == ["offline-chat", "offline-math"]  # both still miss repeat 3
    assert rendered[2:] == ["offline-code-edit"] and seen["chat"].prompts == []
