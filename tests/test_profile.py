"""speclab profile against a fake engine worker whose step times follow a known piecewise surface."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from speclab.costmodel import get_cost_model
from speclab.costmodel.forms import PiecewiseTargetCost
from speclab.costmodel.model import CostModel
from speclab.errors import ConfigError
from speclab.profile import plan_profile, profile, resolve_out
from speclab.profile.plan import parse_methods
from speclab.profile.run import cell_timings

# one forward: flat (weights-bound) up to 16 batched tokens, then 1 ms per token; 2 us per KV token
TRUE = PiecewiseTargetCost(kv=2e-6, batched=2e-4, const=0.02, knee=16.0, batched_hi=1e-3)

FAKE_WORKER = r"""
import sys
import numpy as np
from speclab.costmodel.forms import PiecewiseTargetCost
from speclab.engine.protocol import CellResult, RequestResult, append_result, read_job
from speclab.timings import append_timings

args = sys.argv[1:]
job = read_job(args[args.index("--job") + 1])
out = args[args.index("--out") + 1]
TRUE = PiecewiseTargetCost(kv=2e-6, batched=2e-4, const=0.02, knee=16.0, batched_hi=1e-3)
rng = np.random.default_rng(0)
k = job.engine.k or 0
m = job.engine.method
for cell in job.cells:
    B, L, T = cell.batch_size, len(cell.prompts[0].prompt_token_ids), cell.max_tokens
    rows = []
    shapes = [(0, B * L, 0)] + [(B * (L + i), B * (1 + k), B * k) for i in range(T - 1)]
    for kv, bt, ns in shapes:
        t = float(TRUE.time(kv, bt)) * float(rng.normal(1, 0.01))
        rows.append(("target", kv, bt, ns, B, f"{t:.6e}"))
        if m != "none":
            rows.append((f"draft:{m}", kv + bt, bt, B * k, B, f"{2e-4 + 1e-7 * (kv + bt):.6e}"))
        rows.append(("overhead", kv, bt, ns, B, "1.000000e-03"))
    res = CellResult(cell_id=cell.cell_id, status="ok", output_tokens=B * T, elapsed_s=0.1, steps=T,
                     requests=[RequestResult(id="p", copy=c, prompt_len=L, output_token_ids=[1] * T)
                               for c in range(B)],
                     engine_info={"profiled_steps": len(shapes)})
    append_result(out, res)
    append_timings(job.timings_csv, rows)
"""


@pytest.fixture
def fake_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    monkeypatch.setenv("SPECLAB_WORKER_CMD", f"{sys.executable} {script}")
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))


def test_plan_is_sparse_and_holds_cells_out() -> None:
    engines = plan_profile("smollm2-135m", parse_methods("ngram,suffix", "1,3"))
    assert [e.label for e in engines] == ["none", "ngram-k1", "ngram-k3", "suffix-k1", "suffix-k3"]
    target = engines[0]
    prefills = sorted({c.batch_size * c.prompt_len for c in target.cells})
    assert prefills[0] <= 16 and prefills[-1] == 1400  # 1 x 1400: the long-context cell
    assert max(c.batch_size for c in target.cells) == 32 and target.spec.max_num_seqs == 32
    assert sum(c.holdout for c in target.cells) == len(target.cells) // 4
    assert all(len(p) == c.prompt_len for c in target.cells for p in [target.prompts[c.cell_id]])
    assert engines[1].spec.k == 1 and engines[1].spec.options["prompt_lookup_min"] == 2
    with pytest.raises(ConfigError, match="unknown method"):
        parse_methods("ngarm", "3")
    with pytest.raises(ConfigError, match="--ks"):
        parse_methods("ngram", "0")


def test_resolve_out_names_and_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    assert resolve_out("my-cpu") == ("my-cpu", tmp_path / "cost_models" / "my-cpu.toml")
    assert resolve_out(str(tmp_path / "x.toml")) == ("x", tmp_path / "x.toml")
    with pytest.raises(ConfigError):
        resolve_out("a/b")


def test_profile_fits_the_surface_and_saves_a_named_model(tmp_path: Path, fake_worker: None) -> None:
    engines = plan_profile("fake-target", parse_methods("ngram", "3"))
    name, path = resolve_out("fake-cpu")
    lines: list[str] = []
    fit = profile(engines, name, path, tmp_path / "work", echo=lines.append)
    assert any("[############] 12/12" in ln for ln in lines)  # progress bar per cell
    # the timings were cut per cell: each cell's rows hold its own prefill shape
    cuts = cell_timings(engines[0], tmp_path / "work")
    assert [c.cell.cell_id for c in cuts] == [c.cell_id for c in engines[0].cells]
    for c in cuts:
        assert c.rows[0].kind == "target" and c.rows[0].values[1] == c.cell.batch_size * c.cell.prompt_len
    # the piecewise form wins on the held-out cells and recovers the surface; linear is reported beside it
    tgt = {e.form: e for e in fit.errors if e.kind == "target"}
    # (a piecewise fit: on relative error, or on absolute error with the per-sampled-position term, which
    # the surface does not have, so it comes out 0)
    chosen = next(e for e in fit.errors if e.kind == "target" and e.chosen)
    assert chosen.form.startswith("piecewise") and not tgt["linear"].chosen
    assert tgt["piecewise"].mean_abs_rel_err < 0.03 < tgt["linear"].mean_abs_rel_err
    assert chosen.mean_abs_rel_err < 0.03
    assert tgt["piecewise"].test_rows > 0 and tgt["piecewise"].train_rows > tgt["piecewise"].test_rows
    m = fit.model
    assert isinstance(m.target, PiecewiseTargetCost) and m.target.knee == 16.0
    assert m.target.sampled == pytest.approx(0.0, abs=1e-5)
    assert m.target.batched_hi == pytest.approx(1e-3, rel=0.05) and m.target.const == pytest.approx(
        0.02, rel=0.05
    )
    assert m.overhead_per_step == pytest.approx(1e-3)
    draft = {e.form: e for e in fit.errors if e.kind == "draft:ngram"}
    assert draft["linear"].chosen and draft["linear"].mean_abs_rel_err < 0.01
    # saved where --cost-model NAME finds it, with the held-out errors in its header
    loaded = get_cost_model("fake-cpu")
    assert isinstance(loaded, CostModel) and isinstance(loaded.target, PiecewiseTargetCost)
    assert np.allclose(loaded.target_time(np.array([0, 5000]), np.array([8, 300])),
                       TRUE.time(np.array([0, 5000]), np.array([8, 300])), rtol=0.05)  # fmt: skip
    assert "held-out" in path.read_text() and (tmp_path / "work" / "fit.json").is_file()
    # a second call reuses the complete engines instead of measuring again
    lines.clear()
    profile(engines, name, path, tmp_path / "work", echo=lines.append)
    assert sum("reused" in ln for ln in lines) == 2


def test_cli_profile_dry_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from speclab.cli import main

    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    main(["profile", "--methods", "ngram", "--out", "x", "--dry-run"])
    out = capsys.readouterr().out
    assert "none: 12 cells" in out and "ngram-k3: 4 cells" in out and "held out" in out


def test_fit_timings_csv_cuts_a_run_into_held_out_chunks(tmp_path: Path) -> None:
    from speclab.costmodel.holdout import fit_timings_csv
    from speclab.timings import append_timings

    rng = np.random.default_rng(3)
    rows = []
    for _ in range(400):
        kv, bt = int(rng.integers(0, 20000)), int(rng.integers(1, 300))
        rows += [("target", kv, bt, 0, 1, float(TRUE.time(kv, bt))), ("overhead", kv, bt, 0, 1, 1e-3)]
    append_timings(tmp_path / "t.csv", rows)
    fit = fit_timings_csv(tmp_path / "t.csv", "run")
    tgt = {e.form: e for e in fit.errors if e.kind == "target"}
    assert (
        tgt["piecewise"].chosen and tgt["piecewise"].test_rows == 64
    )  # 400 steps: chunks 0..5 of 64 and one of 16; chunk 3 held out
    assert tgt["piecewise"].cell_abs_err < 1e-6 < tgt["linear"].cell_abs_err


def test_parse_methods_with_per_method_k() -> None:
    assert parse_methods("ngram:3,suffix:8,draft_model", "2") == [
        ("ngram", 3),
        ("suffix", 8),
        ("draft_model", 2),
    ]
    assert parse_methods("none,ngram:1/3", None) == [("ngram", 1), ("ngram", 3)]
    with pytest.raises(ConfigError, match="ngram:"):
        parse_methods("ngram:x", None)


def test_piecewise_fit_never_has_negative_coefficients() -> None:
    """Noisy timings whose unconstrained fit bends down below the knee must still give a loadable model (the
    cost-model loader refuses negative coefficients; `validate --fit best` failed on a real run this way)."""
    import numpy as np

    from speclab.costmodel.holdout import fit_piecewise

    rng = np.random.default_rng(3)
    bt = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512] * 3, dtype=np.float64)
    kv = rng.integers(0, 2000, len(bt)).astype(np.float64)
    sec = 0.03 - 0.00002 * np.minimum(bt, 64) + 0.0004 * np.maximum(bt - 64, 0) + rng.normal(0, 1e-4, len(bt))
    fit = fit_piecewise(kv, bt, sec)
    assert min(fit.kv, fit.batched, fit.batched_hi, fit.const) >= 0
    assert fit.batched_hi > 0 and fit.const > 0
