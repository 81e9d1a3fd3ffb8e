"""Real engine check (slow, marked engine): code editing copies far more of its prompt than math, and n-gram
speculation accepts more there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.engine
def test_code_edit_beats_math_on_overlap_and_ngram_acceptance(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    root = Path(os.environ.get("SPECLAB_CACHE", Path.home() / ".cache" / "speclab")).expanduser()
    model = root / "models" / "smollm2-135m" / "float32"
    if not (model / "config.json").exists():
        pytest.skip("prepare the model first: speclab models prepare smollm2-135m")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if iomp.exists():
        env["LD_PRELOAD"] = str(iomp)
    out = tmp_path / "check.json"
    cmd = [sys.executable, "-m", "speclab.workloads.enginecheck", "--model", str(model), "--n", "8",
           "--max-tokens", "96", "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, timeout=900, stdout=subprocess.DEVNULL)
    w = json.loads(out.read_text())["workloads"]
    code, math = w["offline-code-edit"], w["offline-math"]
    assert code["mean_bleu4_text"] > 0.4 > math["mean_bleu4_text"]
    assert code["acceptance_rate"] > math["acceptance_rate"]
    assert code["accepted_per_output_token"] > math["accepted_per_output_token"]
