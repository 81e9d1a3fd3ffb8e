"""speclab validate: observed acceptance back into a per-position trace, and a whole run checked against
"measurements" computed by an independent step loop (no engine, no simulator in the loop)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from speclab.bench.results import write_trace_part
from speclab.costmodel import CostModel, DraftCost, TargetCost
from speclab.simulate import simulate
from speclab.traces import RequestTrace
from speclab.validate import format_table, observed_trace, validate_run

CM = CostModel(
    name="test-cpu",
    target=TargetCost(kv=2e-6, batched=1.5e-3, const=0.02),
    draft={"ngram": DraftCost("verify_fraction", fraction=0.01)},
    overhead_per_step=1e-3,
)


def _record(rid: str, prompt_len: int, steps: list[tuple[int, int]], misses: int, k: int) -> RequestTrace:
    n = 1 + sum(a + 1 for a, _ in steps) + misses
    meta: dict = {"prompt_id": rid}
    if steps or misses:
        meta["observed"] = {
            "method": "ngram",
            "k": k,
            "per_step_accepted": [a for a, _ in steps],
            "per_step_drafted": [d for _, d in steps],
        }
    return RequestTrace(
        id=rid, workload="w", category="other", prompt_len=prompt_len, output_len=n,
        prompt_token_ids=np.arange(prompt_len) + 10, output_token_ids=np.arange(n) + 10, methods={}, meta=meta,
    )  # fmt: skip


def test_observed_trace_walks_back_into_the_engine_steps() -> None:
    steps = [(3, 3), (0, 3), (2, 2), (3, 3), (1, 3)]
    rec = _record("a", 20, steps, misses=4, k=3)
    mt = observed_trace(rec, 3)
    assert mt is not None and mt.output_len == rec.output_len
    # walk it like a fixed-k policy: the recorded (accepted, drafted) come back in order, plus 4 misses
    p, seen, misses = 1, [], 0
    while p < rec.output_len:
        d = min(3, int(mt.num_proposed[p]))
        if d == 0:
            misses, p = misses + 1, p + 1
            continue
        a = min(int(mt.acc_len[p]) - 1, d)
        seen.append((a, d))
        p += a + 1
    assert seen == steps and misses == 4
    # and the simulator takes exactly those steps: prefill + 5 SD steps + 4 plain steps
    sim = RequestTrace(id="a", workload="w", category="other", prompt_len=20, output_len=rec.output_len,
                       methods={"ngram": mt})  # fmt: skip
    r = simulate([sim], CM, ["fixed:ngram:3"], "replicate", [1])[0]
    assert r.steps == 1 + 5 + 4
    assert observed_trace(_record("b", 5, [], 0, 3), 3) is None  # nothing observed (a 1-token output)


def _independent_time(recs: list[RequestTrace], batch: int, k: int | None) -> tuple[float, int]:
    """Replicate batching by hand: per prompt, one prefill of B copies, then its steps in lockstep."""
    total, steps = 0.0, 0
    tc, ov = CM.target, CM.overhead_per_step
    for r in recs:
        total += tc.time(0, batch * r.prompt_len) + ov
        steps += 1
        obs = r.meta.get("observed")
        pos = 1
        if k is None or obs is None:
            for p in range(1, r.output_len):
                total += tc.time(batch * (r.prompt_len + p - 1), batch) + ov
                steps += 1
            continue
        mt = observed_trace(r, k)
        while pos < r.output_len:
            d = int(mt.num_proposed[pos])
            verify = tc.time(batch * (r.prompt_len + pos - 1), batch * (d + 1))
            draft = CM.draft["ngram"].fraction * verify if d > 0 else 0.0
            total += verify + draft + ov
            steps += 1
            pos += min(int(mt.acc_len[pos]), d + 1)
    return total, steps


def _write_run(run: Path, time_scale: dict[int, float] | None = None) -> None:
    """A bench-shaped run: none and ngram k=3 at B=1 and B=4 (replicate), measured = the hand loop."""
    rng = np.random.default_rng(1)
    base = [_record(f"p{i}", int(rng.integers(20, 200)), [], int(rng.integers(20, 60)), 3) for i in range(5)]
    sd = []
    for b in base:
        steps = [(int(a), 3) for a in rng.integers(0, 4, size=12)]
        misses = b.output_len - 1 - sum(a + 1 for a, _ in steps)
        sd.append(_record(b.id, b.prompt_len, steps, max(misses, 0), 3))
    rows = []
    for batch in (1, 4):
        for method, k, recs in (("none", None, base), ("ngram", 3, sd)):
            cid = f"{method}.w.rep.b{batch}"
            for r in recs:
                r.meta = dict(r.meta, cell_id=cid)
            part = write_trace_part(
                run, cid, [RequestTrace(**{**vars(r), "id": f"{cid}:{r.id}"}) for r in recs]
            )
            t, steps = _independent_time(recs, batch, k)
            t *= (time_scale or {}).get(batch, 1.0) if method != "none" else 1.0
            tokens = batch * sum(r.output_len for r in recs)
            rows.append({
                "cell_id": cid, "status": "ok", "target": "t", "dtype": "float32", "method": method, "k": k,
                "label": "none" if k is None else "ngram-k3", "method_options": {}, "workload": "w",
                "batching": "replicate", "batch_size": batch, "num_prompts": 5, "max_tokens": 64, "seed": 42,
                "output_tokens": tokens, "elapsed_s": t, "throughput_tok_s": tokens / t, "steps": steps,
                "trace_part": part, "host": {"loadavg_1m": 1.0, "cpus": 2},
            })  # fmt: skip
    for r in rows:
        if r["method"] != "none":
            b = next(x for x in rows if x["method"] == "none" and x["batch_size"] == r["batch_size"])
            r["speedup"], r["baseline_cell_id"] = r["throughput_tok_s"] / b["throughput_tok_s"], b["cell_id"]
        else:
            r["speedup"] = 1.0
    rows.append(
        {"cell_id": "ngram.w.rep.b16", "status": "failed", "method": "ngram", "k": 3, "batch_size": 16}
    )
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_validate_reproduces_an_exactly_known_run(tmp_path: Path) -> None:
    _write_run(tmp_path)
    val = validate_run(tmp_path, CM)
    cells = {c.cell_id: c for c in val.cells}
    assert set(cells) == {"none.w.rep.b1", "ngram.w.rep.b1", "none.w.rep.b4", "ngram.w.rep.b4"}
    for c in val.cells:
        assert c.predicted_tok_s == pytest.approx(c.measured_tok_s, rel=1e-9)
        assert c.predicted_steps == c.measured_steps
    sd = cells["ngram.w.rep.b4"]
    assert sd.baseline_cell_id == "none.w.rep.b4" and sd.speedup_err == pytest.approx(0.0, abs=1e-9)
    s = val.summary()
    assert s["sd_cells"] == 2 and s["mean_abs_speedup_err"] == pytest.approx(0.0, abs=1e-9)
    assert any("1 failed cell" in n for n in val.notes)


def test_validate_reports_the_error_of_a_disturbed_cell(tmp_path: Path) -> None:
    # the B=4 SD cell "ran" 20% slower than the cost model says (a contended machine): its speedup error is
    # -1/6 (1/1.2 - 1 measured the other way round), the B=1 cell stays exact; MAE is their mean
    _write_run(tmp_path, time_scale={4: 1.2})
    val = validate_run(tmp_path, CM)
    c = next(c for c in val.cells if c.cell_id == "ngram.w.rep.b4")
    assert c.speedup_err == pytest.approx(0.2, rel=1e-6)  # predicted / measured - 1 = 1.2 - 1
    assert val.summary()["mean_abs_speedup_err"] == pytest.approx(0.1, rel=1e-6)
    assert val.summary()["cells_over_10pct"] == 1
    text = "\n".join(format_table(val))
    assert "+20.0%" in text and "mean absolute error of the predicted speedup: 10.0%" in text
    assert "competed for the CPUs" not in text  # load 1.0 on 2 cores
    val.cells[0].loadavg_1m = 7.5
    assert val.summary()["contended_cells"] == 1 and "1 of 4 cell(s)" in "\n".join(format_table(val))


def test_cli_validate_writes_json_and_fits_from_timings(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from speclab.cli import main
    from speclab.timings import append_timings

    _write_run(tmp_path)
    # timings that follow CM exactly: the default fit recovers it, so the run validates exactly
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(60):
        kv, bt = int(rng.integers(0, 3000)), int(rng.integers(1, 200))
        t = CM.target.time(kv, bt)
        rows += [
            ("target", kv, bt, 0, 1, t),
            ("overhead", kv, bt, 0, 1, 1e-3),
            ("draft:ngram", kv, bt, 3, 1, 0.01 * t),
        ]
    append_timings(tmp_path / "timings.csv", rows)
    main(["validate", str(tmp_path)])
    out = capsys.readouterr().out
    assert "mean absolute error of the predicted speedup: 0.0%" in out
    data = json.loads((tmp_path / "validation.json").read_text())
    assert data["summary"]["sd_cells"] == 2 and len(data["cells"]) == 4
    assert data["cost_model"].startswith("fitted from")


def test_report_section_shows_the_comparison(tmp_path: Path) -> None:
    from speclab.report.sections import ReportData, validation

    def data(run: Path | None) -> ReportData:
        return ReportData(rows=[], run_path=run, traces=None, analysis={}, recs=[], figs={})

    assert "Missing input" in "".join(validation(data(None)))
    _write_run(tmp_path, time_scale={4: 1.2})
    # no validation.json and no timings.csv: says why instead of a table
    assert "no timings.csv" in "".join(validation(data(tmp_path)))
    (tmp_path / "validation.json").write_text(json.dumps(validate_run(tmp_path, CM).to_dict()))
    html = "".join(validation(data(tmp_path)))
    assert "<b>10.0%</b> over 2 SD cell(s), 1 above 10%" in html and "+20.0%" in html and "test-cpu" in html


def test_cli_validate_errors_and_stdout_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from speclab.cli import main

    _write_run(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["validate", str(tmp_path)])  # no timings.csv and no --cost-model: a one-line error
    assert exc.value.code == 2 and "no timings.csv" in capsys.readouterr().err
    (tmp_path / "cm.toml").write_text(CM.to_toml())
    main(["validate", str(tmp_path), "--cost-model", str(tmp_path / "cm.toml"), "--json", "-"])
    data = json.loads(capsys.readouterr().out)
    assert data["cost_model"] == f"test-cpu ({tmp_path / 'cm.toml'})" and data["summary"][
        "mean_abs_speedup_err"
    ] == pytest.approx(0, abs=1e-9)
    assert not (tmp_path / "validation.json").exists()
