"""Roofline cost models from model configurations and datasheet figures (speclab.costmodel.roofline)."""

import numpy as np
import pytest

from speclab.costmodel import get_cost_model
from speclab.costmodel.roofline import PRESET_DIR, compare, forward_times, load_data, roofline_cost_model
from speclab.errors import ConfigError
from speclab.simulate import simulate
from speclab.traces import MethodTrace, RequestTrace


def test_architectures_match_their_published_sizes():
    _, arch, _ = load_data()
    a = arch["llama3.1-8b"]
    # 8.03B parameters in all: the matmul weights plus the input embedding
    assert a.matmul_params + a.vocab * a.hidden == pytest.approx(8.03e9, rel=0.002)
    assert a.kv_bytes_per_token == 131072  # 2 (K, V) * 32 layers * 8 heads * 128 * 2 bytes
    assert arch["llama3-70b"].matmul_params + arch["llama3-70b"].vocab * 8192 == pytest.approx(
        70.55e9, rel=0.002
    )
    assert arch["qwen3-8b"].matmul_params + 151936 * 4096 == pytest.approx(8.19e9, rel=0.002)
    # tied embeddings: the output layer is the input embedding, counted once
    assert arch["qwen3-0.6b"].matmul_params == pytest.approx(0.596e9, rel=0.01)


def test_roofline_physics_and_the_studys_fitted_constants():
    hw, arch, _ = load_data()
    a, h = arch["llama3.1-8b"], hw["h100"]
    mem, comp = forward_times(a, h, np.array([0, 4096]), np.array([1, 512]))
    assert mem[0] > comp[0] and comp[1] > mem[1] * 0.9  # decode memory-bound; 512 tokens near the ridge
    cm = roofline_cost_model("llama3.1-8b", "h100")
    study = get_cost_model("llama3.1-8b-h100").target
    # the study's KV term is the KV cache read at the datasheet bandwidth, within 1%
    assert cm.target.kv / study.kv == pytest.approx(1.0, abs=0.02)
    # its constant and per-token terms are the roofline's at 70-80% of peak
    assert 0.7 < cm.target.const / study.const < 0.8 and 0.65 < cm.target.batched / study.batched < 0.8
    rows = compare()
    assert [r["batch"] for r in rows] == [1, 2, 4, 8, 16, 32, 64, 128]
    assert all(r["roofline_s"] <= r["additive_s"] < r["reference_s"] for r in rows)


def test_presets_are_the_generated_files_and_simulate():
    _, _, presets = load_data()
    for target in presets:
        for hw in ("h100", "h200", "a100"):
            cm = roofline_cost_model(target, hw)
            committed = get_cost_model(f"roofline-{target}-{hw}")
            assert (PRESET_DIR / f"{cm.name}.toml").is_file()
            assert committed.target == cm.target and committed.draft == cm.draft
    # faster memory, faster decode
    assert (
        get_cost_model("roofline-llama3.1-8b-h200").target.const
        < get_cost_model("roofline-llama3.1-8b-h100").target.const
    )
    tr = [RequestTrace(id="a", workload="w", category="other", prompt_len=50, output_len=20,
                       methods={"eagle": MethodTrace(5, np.full(20, 3))})]  # fmt: skip
    res = simulate(tr, "roofline-llama3.1-8b-h100", ["oracle:eagle"], "replicate", [1, 8])
    assert all(r.speedup > 1 for r in res)
    with pytest.raises(ConfigError, match="unknown hardware"):
        roofline_cost_model("llama3.1-8b", "tpu")
