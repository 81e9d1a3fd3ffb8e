"""Cost models: the study preset, TOML round trip, lookup by name or path, least-squares fitting."""

import numpy as np
import pytest

from speclab.costmodel import CostModel, fit_cost_model, get_cost_model, list_cost_models
from speclab.costmodel.fit import fit_cost_model_report
from speclab.errors import ConfigError


def test_study_preset_holds_published_constants():
    assert "llama3.1-8b-h100" in list_cost_models()
    m = get_cost_model("llama3.1-8b-h100")
    assert (m.target.kv, m.target.batched, m.target.const) == (3.92645679e-08, 2.10103129e-05, 5.88590713e-03)
    e = m.draft_for("eagle")
    assert (e.form, e.kv, e.num_spec, e.const) == ("linear", 2.37768493e-09, 8.41429603e-07, 2.13526175e-03)
    assert m.draft_for("ngram").form == "verify_fraction" and m.draft_for("ngram").fraction == 0.005875
    assert m.overhead_per_step == 1.20683946e-03 and m.switch_overhead == 0.0
    with pytest.raises(ConfigError, match="draft_model"):
        m.draft_for("draft_model")


def test_chained_preset_equals_study_at_k3():
    flat, ch = get_cost_model("llama3.1-8b-h100"), get_cost_model("llama3.1-8b-h100-chained")
    e, c = flat.draft["eagle"], ch.draft["eagle"]
    kv = 12345
    assert 3 * (c.kv * kv + c.const) + c.num_spec * 3 == pytest.approx(e.kv * kv + e.num_spec * 3 + e.const)


def test_toml_roundtrip_and_path(tmp_path):
    m = get_cost_model("llama3.1-8b-h100")
    p = tmp_path / "mine.toml"
    p.write_text(m.to_toml("# test"))
    back = get_cost_model(str(p))
    assert back.target == m.target and back.draft == m.draft
    assert back.overhead_per_step == m.overhead_per_step
    with pytest.raises(ConfigError, match="unknown cost model"):
        get_cost_model("no-such-model")
    with pytest.raises(ConfigError, match="not found"):
        get_cost_model(str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text('[target]\nkv = 1\nbatched = "x"\nconst = 1\n')
    with pytest.raises(ConfigError, match=r"field target.batched: expected a number"):
        get_cost_model(str(bad))
    bad.write_text("[target]\nkv = 1\nbatched = 1\nconst = 1\n[draft.eagle]\nform = 'cubic'\n")
    with pytest.raises(ConfigError, match="draft.eagle.form"):
        CostModel.from_toml(bad.read_text(), str(bad))


def write_timings(path, rng, noise=0.0):
    rows = ["kind,kv_tokens,batched_tokens,num_spec_tokens,num_requests,seconds"]
    for _ in range(60):
        kv, bt = rng.integers(0, 200000), rng.integers(1, 2048)
        rows.append(f"target,{kv},{bt},0,{bt},{4e-8 * kv + 2e-5 * bt + 6e-3 + noise * rng.normal():.12g}")
        nr = rng.integers(1, 64)
        k = rng.integers(1, 6)
        ns = nr * k
        rows.append(f"draft:eagle,{kv},{nr},{ns},{nr},{2e-9 * kv + 8e-7 * ns + 2e-3:.12g}")
        v = 4e-8 * kv + 2e-5 * bt + 6e-3
        rows.append(f"draft:ngram,{kv},{bt},{ns},{nr},{0.006 * v:.12g}")
        rows.append(f"overhead,{kv},{bt},0,{nr},{1.2e-3:.12g}")
    path.write_text("\n".join(rows) + "\n")


def test_fit_recovers_coefficients(tmp_path):
    p = tmp_path / "timings.csv"
    write_timings(p, np.random.default_rng(0))
    m = fit_cost_model(p)
    assert m.target.kv == pytest.approx(4e-8, rel=1e-6)
    assert m.target.batched == pytest.approx(2e-5, rel=1e-6)
    assert m.target.const == pytest.approx(6e-3, rel=1e-6)
    e = m.draft["eagle"]
    assert e.form == "linear"
    assert (e.kv, e.num_spec, e.const) == pytest.approx((2e-9, 8e-7, 2e-3), rel=1e-6)
    assert m.draft["ngram"].fraction == pytest.approx(0.006, rel=1e-6)
    assert m.overhead_per_step == pytest.approx(1.2e-3)
    _, rep = fit_cost_model_report(p)
    assert rep.r2["target"] > 0.999999
    # the fitted model loads back from its TOML
    out = tmp_path / "fit.toml"
    out.write_text(m.to_toml())
    assert get_cost_model(str(out)).target == m.target


def test_fit_chained_form(tmp_path):
    rng = np.random.default_rng(1)
    rows = ["kind,kv_tokens,batched_tokens,num_spec_tokens,num_requests,seconds"]
    for _ in range(40):
        kv, nr, k = rng.integers(0, 100000), rng.integers(1, 32), rng.integers(1, 6)
        rows.append(f"target,{kv},{nr},0,{nr},{1e-8 * kv + 1e-5 * nr + 5e-3}")
        rows.append(f"draft:eagle,{kv},{nr},{nr * k},{nr},{k * (1e-9 * kv + 7e-4) + 8e-7 * nr * k}")
    p = tmp_path / "t.csv"
    p.write_text("\n".join(rows) + "\n")
    e = fit_cost_model(p, draft_form="chained").draft["eagle"]
    assert e.form == "chained"
    assert (e.kv, e.num_spec, e.const) == pytest.approx((1e-9, 8e-7, 7e-4), rel=1e-6)


def test_fit_errors_name_line_and_field(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("kind,kv_tokens,batched_tokens,num_spec_tokens,num_requests,seconds\ntarget,1,2,0,1,abc\n")
    with pytest.raises(ConfigError, match=r"line 2: field seconds: not a number"):
        fit_cost_model(p)
    p.write_text("kind,kv_tokens,seconds\n")
    with pytest.raises(ConfigError, match="missing column"):
        fit_cost_model(p)
    p.write_text("kind,kv_tokens,batched_tokens,num_spec_tokens,num_requests,seconds\nweird,1,2,0,1,1\n")
    with pytest.raises(ConfigError, match="line 2: field kind"):
        fit_cost_model(p)
    p.write_text("kind,kv_tokens,batched_tokens,num_spec_tokens,num_requests,seconds\ntarget,1,2,0,1,1\n")
    with pytest.raises(ConfigError, match="need at least 3"):
        fit_cost_model(p)
