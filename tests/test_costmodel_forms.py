"""The 'forwards' drafting form and the overhead linear in requests and draft tokens: synthetic timings from a
known surface are recovered by the fits, the TOML loader checks them, old TOMLs still load, and the fast and
reference simulators charge them alike (a model drafter also pays at a step of prefills only)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from speclab.costmodel import CostModel, get_cost_model
from speclab.costmodel.fit import fit_cost_model_report, fit_forwards, fit_overhead_linear
from speclab.costmodel.forms import PiecewiseTargetCost
from speclab.costmodel.holdout import fit_timings_csv
from speclab.costmodel.model import DraftCost
from speclab.errors import ConfigError
from speclab.simulate import simulate
from speclab.timings import append_timings
from test_simulate_reference import assert_same, random_traces  # tests/ is on sys.path (pytest prepend mode)

TARGET = PiecewiseTargetCost(kv=3e-6, batched=1e-4, const=0.023, knee=4.0, batched_hi=1.2e-3)
DRAFT = DraftCost(form="forwards", kv=2e-6, batched=3e-4, const=0.009)
OVH = (2e-3, 5e-5, 1e-4)  # per step, per request, per verified draft token


def synthetic_rows(seed: int, steps: int = 600, noise: float = 0.01) -> list[tuple]:
    """Steps of an engine with a draft model at k = 3: prefills of 1..16 prompts, then verify steps, timed
    by the known surfaces above (the draft row holds the KV after the step and the drafts proposed)."""
    rng = np.random.default_rng(seed)
    rows: list[tuple] = []
    k = 3
    for _ in range(steps):
        nr = int(rng.choice([1, 2, 4, 8, 16]))
        if rng.random() < 0.1:
            kv, bt, ns = 0, nr * int(rng.integers(20, 300)), 0
        else:
            kv, bt, ns = nr * int(rng.integers(20, 600)), nr * (k + 1), nr * k
        jit = lambda: float(rng.normal(1.0, noise))  # noqa: E731
        passes = k
        d = passes * (DRAFT.kv * kv + DRAFT.const) + DRAFT.batched * (bt + (passes - 1) * nr)
        o = OVH[0] + OVH[1] * nr + OVH[2] * ns
        rows += [
            ("target", kv, bt, ns, nr, float(TARGET.time(kv, bt)) * jit()),
            ("draft:draft_model", kv + bt, bt, nr * k, nr, d * jit()),
            ("overhead", kv, bt, ns, nr, o * jit()),
        ]
    return rows


def test_forwards_and_overhead_fits_recover_a_known_surface(tmp_path: Path) -> None:
    rows = synthetic_rows(0, noise=0.0)
    a = np.array([r[1:] for r in rows if r[0] == "draft:draft_model"], dtype=float)
    d = fit_forwards(a)
    assert (d.kv, d.batched, d.const) == pytest.approx((DRAFT.kv, DRAFT.batched, DRAFT.const), rel=1e-6)
    o = np.array([r[1:] for r in rows if r[0] == "overhead"], dtype=float)
    assert fit_overhead_linear(o) == pytest.approx(OVH, rel=1e-6)
    # through `speclab cost-models fit`'s function, and the profile's held-out choice on noisy timings
    append_timings(tmp_path / "t.csv", synthetic_rows(1))
    m, _ = fit_cost_model_report(tmp_path / "t.csv", draft_form="forwards", overhead_form="linear")
    assert m.draft["draft_model"].form == "forwards"
    assert m.draft["draft_model"].batched == pytest.approx(DRAFT.batched, rel=0.05)
    assert m.overhead_per_spec_token == pytest.approx(OVH[2], rel=0.1)
    fit = fit_timings_csv(tmp_path / "t.csv", "run")
    chosen = {e.kind: e.form for e in fit.errors if e.chosen}
    assert chosen["draft:draft_model"] == "forwards" and chosen["overhead"] == "linear"
    err = {(e.kind, e.form): e for e in fit.errors}
    assert err[("draft:draft_model", "forwards")].test_rows > 0  # scored on held-out chunks
    assert (
        err[("draft:draft_model", "forwards")].cell_abs_err
        < err[("draft:draft_model", "linear")].cell_abs_err
    )
    assert err[("overhead", "linear")].cell_abs_err < err[("overhead", "mean")].cell_abs_err
    with pytest.raises(ConfigError, match="overhead form"):
        fit_cost_model_report(tmp_path / "t.csv", overhead_form="quadratic")


def test_toml_loader_new_fields_and_old_files(tmp_path: Path) -> None:
    m = CostModel(
        name="x", target=TARGET, draft={"draft_model": DRAFT}, overhead_per_step=OVH[0],
        overhead_per_request=OVH[1], overhead_per_spec_token=OVH[2],
    )  # fmt: skip
    p = tmp_path / "x.toml"
    p.write_text(m.to_toml())
    back = get_cost_model(str(p))
    assert back.draft == m.draft and back.target == m.target
    assert (back.overhead_per_step, back.overhead_per_request, back.overhead_per_spec_token) == OVH
    # an old file (no new keys) loads as a constant overhead, and writes back without them
    old = get_cost_model("llama3.1-8b-h100")
    assert old.overhead_per_request == 0.0 and old.overhead_per_spec_token == 0.0
    assert "per_request" not in old.to_toml()
    assert old.overhead_time(np.array([1, 64]), np.array([0, 192])) == pytest.approx(old.overhead_per_step)
    text = p.read_text()
    bad = {
        "const missing": (text.replace("const = 0.009\n", ""), "draft.draft_model.const: missing"),
        "unknown key": (text.replace("batched = 0.0003", "num_spec = 0.0003"), "unknown key"),
        "negative": (text.replace("per_request = 5e-05", "per_request = -1.0"), "out of range"),
    }
    for what, (t, msg) in bad.items():
        p.write_text(t)
        with pytest.raises(ConfigError, match=msg):
            get_cost_model(str(p))
        assert what


@pytest.mark.parametrize("batching", ["replicate", "static", "continuous"])
def test_fast_equals_reference_with_forwards_and_linear_overhead(batching: str) -> None:
    base = get_cost_model("llama3.1-8b-h100")
    cm = CostModel(
        name="fw", target=base.target, draft={"ngram": base.draft["ngram"], "eagle": DRAFT},
        overhead_per_step=1e-3, overhead_per_request=2e-4, overhead_per_spec_token=3e-4,
    )  # fmt: skip
    tr = random_traces(2, 9, nprop=True)
    pols = ["none", "fixed:eagle:3", "fixed:ngram:2", "oracle:eagle", "adaptive-k:eagle:4"]
    fast = simulate(tr, cm, pols, batching, [1, 3, 7])
    ref = simulate(tr, cm, pols, batching, [1, 3, 7], engine="reference")
    assert_same(fast, ref)


def test_forwards_drafter_pays_at_prefill_steps() -> None:
    """One request of 2 tokens at B=1: a prefill step then one SD step; the drafter runs k forwards in both
    (the first pass over the prefill's tokens), and the overhead grows with the verified drafts."""
    from speclab.traces import MethodTrace, RequestTrace

    cm = CostModel(
        name="fw", target=TARGET, draft={"draft_model": DRAFT}, overhead_per_step=1e-3,
        overhead_per_spec_token=1e-4,
    )  # fmt: skip
    tr = [
        RequestTrace(
            id="a",
            workload="w",
            category="code-editing",
            prompt_len=100,
            output_len=2,
            methods={"draft_model": MethodTrace(k_max=3, acc_len=np.array([1, 1]))},
        )  # fmt: skip
    ]
    r = simulate(tr, cm, ["fixed:draft_model:3"], "continuous", [1])[0]
    k = 3
    prefill = k * DRAFT.const + DRAFT.batched * (100 + (k - 1))
    step = k * (DRAFT.kv * 100 + DRAFT.const) + DRAFT.batched * ((k + 1) + (k - 1))
    assert r.time_split_s["propose"] == pytest.approx(prefill + step)
    assert r.time_split_s["overhead"] == pytest.approx(2e-3 + k * 1e-4)


def test_piecewise_sampled_term_recovered_and_loaded(tmp_path: Path) -> None:
    """The piecewise target's per-sampled-position term (lm_head at every verified position): recovered
    from timings generated with it, charged only where the caller passes sampled positions, saved only when
    non-zero (older piecewise TOMLs load as sampled = 0)."""
    from speclab.costmodel.holdout import fit_piecewise

    true = PiecewiseTargetCost(kv=4e-6, batched=0.0, const=0.023, knee=8.0, batched_hi=1.25e-3, sampled=3e-4)
    rng = np.random.default_rng(5)
    nr = rng.choice([1, 4, 16], 400).astype(float)
    verify = rng.random(400) < 0.7
    ns = np.where(verify, 3 * nr, 0.0)
    bt = np.where(verify, 4 * nr, np.where(rng.random(400) < 0.2, nr * rng.integers(20, 300, 400), nr))
    kv = rng.integers(0, 4000, 400).astype(float)
    sec = np.asarray(true.time(kv, bt, nr + ns))
    fit = fit_piecewise(kv, bt, sec, nr + ns)
    assert fit.knee == 8.0 and fit.sampled == pytest.approx(3e-4, rel=1e-6)
    assert float(true.time(100, 64)) < float(true.time(100, 64, 64))  # not charged without positions
    m = CostModel(name="s", target=fit, overhead_per_step=0.0)
    p = tmp_path / "s.toml"
    p.write_text(m.to_toml())
    assert get_cost_model(str(p)).target == fit
    p.write_text(CostModel(name="o", target=replace(fit, sampled=0.0), overhead_per_step=0.0).to_toml())
    assert "sampled" not in p.read_text() and get_cost_model(str(p)).target.sampled == 0.0


def test_fit_cli_piecewise_target_on_decode_rows(tmp_path: Path) -> None:
    """`speclab cost-models fit --target-form piecewise`: the knee and both slopes recovered from decode and
    verify rows generated with them, prefill rows (batched > requests + drafts) left out of the fit even
    though they follow another law; lookups' verify fraction taken against the piecewise verify time."""
    from click.testing import CliRunner

    from speclab.cli.cost_models import command

    true = PiecewiseTargetCost(kv=2e-6, batched=1e-4, const=0.03, knee=8.0, batched_hi=2e-3)
    rng = np.random.default_rng(11)
    rows = []
    for _ in range(600):
        nr = int(rng.choice([1, 2, 4, 8, 16]))
        ns = int(rng.integers(0, 8)) * nr
        kv = float(rng.integers(100, 5000))
        sec = float(true.time(kv, nr + ns)) * (1 + 0.01 * rng.standard_normal())
        rows.append(("target", kv, nr + ns, ns, nr, sec))
        rows.append(("overhead", kv, nr + ns, ns, nr, 2e-3 + 1e-4 * ns))
        if ns:
            rows.append(("draft:ngram", kv, nr + ns, ns, nr, 0.01 * sec))
    for _ in range(40):  # prefills: quadratic in the prompt, not the decode law
        bt = float(rng.integers(100, 600))
        rows.append(("target", 0.0, bt, 0, 1, 1e-6 * bt * bt))
    csv = tmp_path / "t.csv"
    append_timings(csv, rows)
    out = tmp_path / "pw.toml"
    args = ["fit", str(csv), "--out", str(out), "--target-form", "piecewise", "--overhead-form", "linear"]
    res = CliRunner().invoke(command, args)
    assert res.exit_code == 0, res.output
    m = get_cost_model(str(out))
    assert isinstance(m.target, PiecewiseTargetCost) and m.target.knee == 8.0
    assert m.target.batched_hi == pytest.approx(2e-3, rel=0.05)
    assert m.target.const == pytest.approx(0.03, rel=0.05)
    assert m.draft["ngram"].fraction == pytest.approx(0.01, rel=0.05)
    assert m.overhead_per_spec_token == pytest.approx(1e-4, rel=1e-3)
    lin, _ = fit_cost_model_report(csv)  # the linear form on the same rows is pulled by the prefills
    assert abs(lin.target.batched - 2e-3) > 0.2 * 2e-3
    with pytest.raises(ConfigError, match="target form"):
        fit_cost_model_report(csv, target_form="cubic")
    binned = tmp_path / "tb.toml"
    res = CliRunner().invoke(command, [*args[:3], str(binned), "--target-form", "table", "--table-bins"])
    assert res.exit_code == 0, res.output
    assert get_cost_model(str(binned)).target.interpolate
    res = CliRunner().invoke(command, [*args, "--table-bins"])  # bins without the table form
    assert res.exit_code != 0 and "--table-bins needs --target-form table" in res.output


def test_table_form_fit_load_and_lookup(tmp_path: Path) -> None:
    """The table form: counts seen often get their own (median) time, others fall back to the piecewise
    terms; the TOML round-trips; malformed tables are refused with the field named."""
    from speclab.costmodel.fit import fit_table

    smooth = PiecewiseTargetCost(kv=1e-6, batched=0.0, const=0.03, knee=8.0, batched_hi=2e-3)
    shape = {1: 0.030, 2: 0.035, 4: 0.027}  # not monotone, as on CPU
    rng = np.random.default_rng(3)
    bt = rng.choice([1, 2, 4, 7], 400).astype(float)
    kv = rng.integers(0, 3000, 400).astype(float)
    sec = np.array([shape.get(int(b), float(smooth.time(0, b))) for b in bt]) + 1e-6 * kv
    sec[::50] *= 5  # a few preempted steps: the median ignores them
    tab = fit_table(smooth, kv, bt, sec)
    assert [c for c, _ in tab.table] == [1, 2, 4, 7]
    assert tab.time(1000, 2) == pytest.approx(0.035 + 1e-3)
    assert tab.time(0, 4) < tab.time(0, 1) < tab.time(0, 2)
    assert tab.time(0, 30) == pytest.approx(float(smooth.time(0, 30)))  # not in the table: piecewise
    np.testing.assert_allclose(
        tab.time(np.zeros(3), np.array([1.0, 4.0, 30.0])), [0.030, 0.027, smooth.time(0, 30)]
    )
    p = tmp_path / "t.toml"
    p.write_text(CostModel(name="t", target=tab, overhead_per_step=0.0).to_toml())
    assert get_cost_model(str(p)).target == tab
    good = p.read_text()
    for bad in (
        "table = [[2, 0.03], [1, 0.03]]",
        "table = [[0, 0.03]]",
        "table = [[1.5, 0.03]]",
        "table = []",
    ):
        p.write_text("\n".join(bad if ln.startswith("table =") else ln for ln in good.splitlines()))
        with pytest.raises(ConfigError, match="target.table"):
            get_cost_model(str(p))
    p.write_text(good.replace('form = "table"', 'form = "piecewise"'))
    with pytest.raises(ConfigError, match="only with form"):
        get_cost_model(str(p))


def test_table_bins_tabulate_sparse_wide_forwards_and_interpolate(tmp_path: Path) -> None:
    """Wide verifies are spread thin over many token counts (none reaches 20 rows); with bins they are
    tabulated in runs of 20 rows and read by interpolation, so a concave cost (cheaper per token when wide,
    as this CPU's forward at batch 16) is followed where the piecewise slope fitted on the many narrow
    forwards overprices it. Counts with their own entries keep them; beyond the last entry the piecewise
    slope continues from it; below the first the piecewise terms; `interpolate` round-trips in TOML."""
    from speclab.costmodel.fit import fit_table

    def truth(b):  # seconds at kv = 0: 2 ms per token to 32 tokens, then 1 ms, then 0.5 ms beyond 96
        b = np.asarray(b, dtype=np.float64)
        return 0.03 + 2e-3 * np.minimum(b, 32) + 1e-3 * np.clip(b - 32, 0, 64) + 5e-4 * np.maximum(b - 96, 0)

    rng = np.random.default_rng(5)
    narrow = rng.integers(1, 33, 3000).astype(float)  # dense: every count has its own entry
    wide = rng.integers(33, 150, 400).astype(float)  # ~3.4 rows per count: none reaches 20
    bt = np.concatenate([narrow, wide])
    kv = rng.integers(0, 3000, len(bt)).astype(float)
    sec = truth(bt) * (1 + 0.01 * rng.standard_normal(len(bt))) + 1e-6 * kv
    smooth = PiecewiseTargetCost(kv=1e-6, batched=0.0, const=0.03, knee=8.0, batched_hi=2e-3)
    plain = fit_table(smooth, kv, bt, sec)
    binned = fit_table(smooth, kv, bt, sec, bins=True)
    assert not plain.interpolate and binned.interpolate
    assert [c for c, _ in plain.table] == list(range(1, 33))
    keys = [c for c, _ in binned.table]
    assert keys[:32] == list(range(1, 33)) and len(keys) == 32 + len(wide) // 20 and keys == sorted(keys)
    probe = np.array([40.0, 64.0, 100.0, 140.0])
    err_binned = np.abs(np.asarray(binned.time(0.0, probe)) - truth(probe)) / truth(probe)
    err_plain = np.abs(np.asarray(plain.time(0.0, probe)) - truth(probe)) / truth(probe)
    assert err_binned.max() < 0.05 and err_plain.max() > 0.25, (err_binned, err_plain)
    # own entries are hits; beyond the last key: its time plus the piecewise slope; below the first: smooth
    c7 = dict(binned.table)[7]
    assert binned.time(500.0, 7) == pytest.approx(c7 + 5e-4)
    last_c, last_v = binned.table[-1]
    assert binned.time(0.0, last_c + 10) == pytest.approx(last_v + 10 * 2e-3)
    assert binned.time(0.0, 0.5) == pytest.approx(float(smooth.time(0.0, 0.5)))
    p = tmp_path / "b.toml"
    p.write_text(CostModel(name="b", target=binned, overhead_per_step=0.0).to_toml())
    assert "interpolate = true" in p.read_text() and get_cost_model(str(p)).target == binned
    p.write_text(p.read_text().replace("interpolate = true", 'interpolate = "yes"'))
    with pytest.raises(ConfigError, match="target.interpolate"):
        get_cost_model(str(p))


def test_engine_offsets_divided_out_of_a_run_directory(tmp_path: Path) -> None:
    """Two engine processes of one run, the second 25% slower at everything; only the first ran the wide
    verify shape. Pooled, the table's 1-token entry mixes both engines and the 4-token step looks cheaper
    than it is relative to decode; with the offsets divided out, the table keeps the first engine's shape."""
    rng = np.random.default_rng(0)
    shape = {1: 0.030, 4: 0.029, 16: 0.048}  # the CPU's non-monotone forward (seconds at kv = 0)

    def rows(factor: float, counts: dict[int, int]) -> list[tuple]:
        out = []
        for bt, n in counts.items():
            for _ in range(n):
                t = shape[bt] * factor * float(rng.normal(1.0, 0.003))
                out += [("target", 0, bt, bt - 1, 1, t), ("overhead", 0, bt, bt - 1, 1, 1e-3 * factor)]
        return out

    run = tmp_path / "run"
    fast, slow = (run / "engines" / e / "attempt-1" for e in ("spec-a", "none-b"))
    fast.mkdir(parents=True)
    slow.mkdir(parents=True)
    append_timings(fast / "timings.csv", rows(1.0, {1: 40, 4: 60, 16: 30}))
    append_timings(slow / "timings.csv", rows(1.25, {1: 200, 16: 30}))
    m, rep = fit_cost_model_report(run, target_form="table")
    f = rep.engine_factors
    assert len(f) == 2 and "engine offsets divided out" in " ".join(rep.notes)
    assert f[str(slow / "timings.csv")] / f[str(fast / "timings.csv")] == pytest.approx(1.25, rel=0.01)
    table = dict(m.target.table)
    assert table[4] / table[1] == pytest.approx(0.029 / 0.030, rel=0.01)
    assert table[16] / table[1] == pytest.approx(0.048 / 0.030, rel=0.01)
    # pooled (offsets kept), the 1-token entry is the slow engine's: the 4-token step looks 20% cheaper
    pooled, rep2 = fit_cost_model_report(run, target_form="table", engine_offsets=False)
    assert not rep2.engine_factors
    assert dict(pooled.target.table)[4] / dict(pooled.target.table)[1] < 0.8
    # several sources, and a directory without timings refused with its name
    both, _ = fit_cost_model_report([fast / "timings.csv", slow / "timings.csv"], target_form="table")
    assert dict(both.target.table)[4] == pytest.approx(table[4], rel=1e-9)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="empty"):
        fit_cost_model_report(tmp_path / "empty")


def test_engine_factors_compare_steps_at_like_kv() -> None:
    """Two equally fast engines meet the same (tokens, requests) shape at different KV (one on long prompts,
    one on short): compared within KV bins they get the same factor; a third, 20% slower engine that meets
    both is still found."""
    from speclab.costmodel.fit import engine_factors, step_shape

    rng = np.random.default_rng(1)
    kv_lo, kv_hi = rng.integers(1000, 1200, 60), rng.integers(3500, 4000, 60)

    def t(kv: np.ndarray, f: float) -> np.ndarray:
        return f * (0.045 + 3e-6 * kv) * rng.normal(1.0, 0.002, len(kv))

    kv = np.concatenate([kv_lo, kv_hi, kv_lo, kv_hi])
    sec = np.concatenate([t(kv_lo, 1.0), t(kv_hi, 1.0), t(kv_lo, 1.2), t(kv_hi, 1.2)])
    group = np.repeat([0, 1, 2, 2], 60)
    bt = np.full(len(kv), 16.0)
    f = engine_factors(group, step_shape(kv.astype(float), bt, bt), sec, 3)
    assert f[0] == pytest.approx(f[1], rel=0.01)
    assert f[2] / f[0] == pytest.approx(1.2, rel=0.01)
    # the shape alone would call the long-prompt engine ~17% slower
    naive = engine_factors(group, bt * 1000 + bt, sec, 3)
    assert naive[1] / naive[0] > 1.1


def test_bench_show_reports_engine_startup_factors(tmp_path: Path) -> None:
    from speclab.bench.show import startup_note

    rng = np.random.default_rng(2)
    run = tmp_path / "run"
    for name, f in (("none-aa/attempt-1", 1.0), ("none-aa/attempt-2", 1.1), ("ngram-k3-bb/attempt-1", 1.0)):
        d = run / "engines" / name
        d.mkdir(parents=True)
        rows = [("target", 500, 1, 0, 1, f * 0.03 * float(rng.normal(1, 0.001))) for _ in range(30)]
        append_timings(d / "timings.csv", rows)
    note = startup_note(run)
    assert note is not None and note.startswith("3;") and "at 1.00-1.10x the median" in note
    assert "widest within one entry: none 1.00 / 1.10" in note
    assert startup_note(tmp_path) is None  # no engines: nothing to say


def test_startup_adjusted_speedups_divide_out_each_pairs_engines(tmp_path: Path) -> None:
    """Per (engine, repeat) factors come from each attempt's own forwards and cells; a pair's ratio is
    multiplied by its SD engine's factor over its no-SD engine's, on the pairs the bench's median used."""
    import json

    from speclab.bench.show import startup_adjusted_speedup, startup_factors

    rng = np.random.default_rng(3)
    run = tmp_path / "run"
    slow = {("none-aa", 1): 1.2, ("none-aa", 2): 1.0, ("sd-bb", 1): 1.0, ("sd-bb", 2): 1.0}
    for (engine, rep), f in slow.items():
        d = run / "engines" / engine / f"attempt-{rep}"
        d.mkdir(parents=True)
        rows = [("target", 500, 1, 0, 1, f * 0.03 * float(rng.normal(1, 0.001))) for _ in range(30)]
        append_timings(d / "timings.csv", rows)
        cid = f"{engine}.w.b1" + ("" if rep == 1 else f"#r{rep}")  # the first repeat's id has no tag
        (d / "cells.jsonl").write_text(json.dumps({"cell_id": cid, "status": "ok"}) + "\n")
    fac = startup_factors(run)
    assert fac[("none-aa", None)] / fac[("sd-bb", None)] == pytest.approx(1.2, rel=0.01)
    assert fac[("none-aa", 2)] == pytest.approx(fac[("sd-bb", 2)], rel=0.01)
    row = {
        "engine_id": "sd-bb",
        "speedup_runs": [
            {"repeat": 1, "speedup": 1.5, "contended": False},  # measured against a 1.2x slower no-SD engine
            {"repeat": 2, "speedup": 1.25, "contended": False},
            {"repeat": 3, "speedup": 9.0, "contended": True},  # left out, as in the bench's median
        ],
    }
    adj = startup_adjusted_speedup(row, {"engine_id": "none-aa"}, fac)
    assert adj is not None and adj["n"] == 2
    assert adj["min"] == pytest.approx(1.25, rel=0.01) and adj["max"] == pytest.approx(1.25, rel=0.01)
    assert startup_adjusted_speedup(row, {"engine_id": "other"}, fac) is None  # no factor: no figure
