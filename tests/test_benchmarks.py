"""Smoke tests of the maintained tools in benchmarks/: each imports as a module of the `benchmarks` package
(the repository root is on pytest's pythonpath) and its command line parses; the small pure parts run."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
# module -> an option its --help must list
ARGPARSE_TOOLS = {
    "bench_online_policy": "--repeats",
    "bench_replay": "--methods",
    "bench_simulator": "--requests",
    "bench_simulate_ray": "--positions",
    "contention_check": "--hogs",
    "draft_step_costs": "run",
    "heldout_similarity": "--workload",
    "host_noise": "--units",
    "live_arms": "--reference",
}


@pytest.mark.parametrize("name", sorted(ARGPARSE_TOOLS))
def test_tool_imports_and_its_command_line_parses(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = importlib.import_module(f"benchmarks.{name}")
    assert callable(mod.main)
    monkeypatch.setattr("sys.argv", [f"{name}.py", "--help"])
    with pytest.raises(SystemExit) as exc:
        mod.main(["--help"]) if name in ("heldout_similarity", "host_noise", "live_arms") else mod.main()
    assert exc.value.code == 0
    assert ARGPARSE_TOOLS[name] in capsys.readouterr().out


def test_every_tool_is_covered() -> None:
    """A script added to benchmarks/ gets a smoke test here."""
    tools = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - {"__init__"}
    assert tools == set(ARGPARSE_TOOLS) | {"validate_holdout"}
    assert {p.name for p in (ROOT / "benchmarks").glob("*.sh")} == {"ray_bench_check.sh"}


def test_simulator_benchmark_traces_are_study_shaped() -> None:
    from benchmarks.bench_simulator import synthetic_traces

    tr = synthetic_traces(5, 40, seed=0)
    assert len(tr) == 5 and all(set(t.methods) == {"ngram", "eagle"} for t in tr)
    assert all(m.k_max == 20 for t in tr for m in t.methods.values())


def test_validate_holdout_imports_and_needs_a_run(tmp_path: Path) -> None:
    from benchmarks import validate_holdout

    from speclab.errors import ConfigError

    with pytest.raises(ConfigError, match="run directory not found"):
        validate_holdout.main(str(tmp_path / "missing"))


def test_ray_check_script_is_valid_bash() -> None:
    res = subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "ray_bench_check.sh")], capture_output=True)
    assert res.returncode == 0, res.stderr


def test_online_policy_benchmark_prints_the_ratio_and_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.bench_online_policy import main

    out = main(["--requests", "6", "--batch-sizes", "1,2", "--repeats", "1"])
    assert out["ratio"] > 0 and 0 < out["fraction_of_oracle"] <= 1.0
    text = capsys.readouterr().out
    assert "adaptive-gated / fixed:ngram:3" in text and "of the bound" in text
