"""benchmarks/host_noise.py: the resolution figure is the sign-test interval's half-width, and a tiny run
prints every line."""

from __future__ import annotations

import numpy as np
import pytest
from benchmarks import host_noise


def test_resolution_is_the_sign_test_half_width() -> None:
    rng = np.random.default_rng(0)
    # every A/A ratio is one of two values: any 6-round interval spans at most their gap
    r = host_noise.resolution([0.9, 1.1], 6, 50, rng)
    assert r is not None and 0.0 <= r <= 0.1 + 1e-12
    assert host_noise.resolution([1.0, 1.0], 11, 20, rng) == pytest.approx(0.0)
    assert host_noise.resolution([0.9, 1.1], 5, 5, rng) is None  # no 95% interval for 5 rounds
    # more rounds never widen the median interval of a wide spread of ratios
    wide = list(np.linspace(0.8, 1.2, 41))
    few = host_noise.resolution(wide, 6, 300, np.random.default_rng(1))
    many = host_noise.resolution(wide, 60, 300, np.random.default_rng(1))
    assert few is not None and many is not None and many < few


def test_tiny_run_prints_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert host_noise.main(["--units", "4", "--unit-s", "0.01", "--layers", "1", "--draws", "5"]) == 0
    out = capsys.readouterr().out
    for what in (
        "unit wall time",
        "unit CPU time",
        "A/A ratio of back-to-back units (2 pairs)",
        "100 rounds",
    ):
        assert what in out


def test_save_writes_the_runs_machine_noise(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from speclab.bench.noise import load_noise

    args = ["--units", "4", "--unit-s", "0.01", "--layers", "1", "--draws", "5", "--save", str(tmp_path)]
    assert host_noise.main(args) == 0
    noise = load_noise(tmp_path)
    assert noise is not None and noise["pairs"] == 2 and noise["units"] == 4
    assert "A/A noise" in capsys.readouterr().out
