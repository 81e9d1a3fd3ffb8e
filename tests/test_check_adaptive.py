"""benchmarks/check_adaptive.py: the issue-12 verdict table, per run and pooled over several runs' pairs."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "check_adaptive.py"
_spec = importlib.util.spec_from_file_location("check_adaptive", _PATH)
assert _spec is not None and _spec.loader is not None
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)


def _row(label: str, pairs: list[tuple[float, bool]], b: int = 1, lossless: bool = True) -> dict[str, Any]:
    import statistics

    used = [s for s, c in pairs if not c] or [s for s, _ in pairs]
    return {
        "cell_id": f"{label}.w.b{b}",
        "status": "ok",
        "method": "ngram" if label != "adaptive" else "custom_class",
        "label": label,
        "workload": "w",
        "batch_size": b,
        "lossless": lossless,
        "speedup": statistics.median(used),
        "speedup_spread": {"min": min(used), "max": max(used), "n": len(used)},
        "speedup_runs": [{"repeat": i + 1, "speedup": s, "contended": c} for i, (s, c) in enumerate(pairs)],
    }


def _run(*rows: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["cell_id"]: r for r in rows}


def test_pooled_medians_take_every_runs_chosen_pairs() -> None:
    run_a = _run(
        _row("adaptive", [(1.10, False), (0.90, False), (1.00, False)]), _row("ngram-k3", [(1.05, False)] * 3)
    )
    # run b: one contended pair, left out as the bench leaves it out
    run_b = _run(
        _row("adaptive", [(1.20, False), (1.30, False), (5.0, True)]), _row("ngram-k3", [(1.05, False)] * 3)
    )
    lines, ok = check.judge(run_a)
    assert not ok and "| w | 1 | 1.000x [0.90-1.10] | ngram-k3 1.050x" in lines[2]
    pooled = check.pooled([run_a, run_b])
    ad = pooled["w.1.adaptive"]
    assert ad["speedup"] == pytest.approx(1.10) and ad["speedup_spread"] == {"min": 0.9, "max": 1.3, "n": 5}
    lines, ok = check.judge(pooled)
    assert ok and "| yes | n/a | yes | yes |" in lines[2]  # no schedule entry in this run: n/a
    # token-exact only if every run's cell was
    run_b["adaptive.w.b1"]["lossless"] = False
    assert check.pooled([run_a, run_b])["w.1.adaptive"]["lossless"] is False


def test_a_cell_without_static_entries_is_not_judged_met() -> None:
    rows = {"w.1.adaptive": {"workload": "w", "batch_size": 1, "label": "adaptive", "method": "custom_class",
                             "status": "ok", "speedup": 1.5, "lossless": True}}  # fmt: skip
    lines, ok = check.judge(rows)
    assert not ok and "| n/a | n/a | yes | yes |" in lines[2]
