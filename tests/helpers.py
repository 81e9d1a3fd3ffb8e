"""Test utilities shared by several test modules (tests/ is on sys.path: pytest's rootdir-relative prepend mode)."""

from __future__ import annotations

import types

import numpy as np


def fake_simulator(monkeypatch):
    """A stand-in for speclab.simulate: speedup = mean acc of the policy's method / (1 + bs/16)."""

    def simulate(traces, cost_model, policies, batching, batch_sizes, seed=42, **_):
        out = []
        for bs in batch_sizes:
            for p in policies:
                if p == "none":
                    sp = 1.0
                else:
                    methods = p.split(":")[1].split(",")
                    acc = max(np.mean([t.methods[m].acc_len[1:].mean() for t in traces]) for m in methods)
                    boost = (
                        1.3 if p.startswith("oracle-combine") else (1.1 if p.startswith("oracle") else 1.0)
                    )
                    sp = boost * acc / (1 + bs / 16)
                out.append(
                    types.SimpleNamespace(
                        to_dict=lambda bs=bs, p=p, sp=sp: {
                            "batch_size": bs,
                            "policy": p,
                            "speedup": sp,
                            "throughput_tok_s": 100 * sp,
                        }
                    )
                )
        return out

    monkeypatch.setattr("speclab.analyze.oracle.simulate", simulate)


def tiny_llama(seed: int, vocab: int, max_positions: int = 512):
    """A randomly initialised 2-layer Llama (hidden 32) for logic/shape tests of model proposers."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
    )
    return transformers.LlamaForCausalLM(cfg).float().eval()


def assert_replay_equals_naive_chains(prop, prompt: np.ndarray, out: np.ndarray, acc: np.ndarray, k_max: int):
    """acc[p] must be 1 + the number of leading tokens of prop.propose(prompt + out[:p], k_max) that match out[p:]."""
    x = np.concatenate([prompt, out])
    for p in range(len(out)):
        d = prop.propose(x[: len(prompt) + p], k_max)
        a = 0
        while a < len(d) and p + a < len(out) and d[a] == out[p + a]:
            a += 1
        assert acc[p] == a + 1, (p, acc[p], a + 1)


def report_with_rows(tmp, rows_for, title: str, n_per_workload: int):
    """A report built (with the stand-in simulator) over a synthetic run whose results rows are replaced by
    rows_for(the synthetic rows); returns the report's path and the rows written."""
    import json

    import pytest

    from speclab.analyze.synthetic import write_synthetic_run
    from speclab.report import build_report

    mp = pytest.MonkeyPatch()
    fake_simulator(mp)
    try:
        run = write_synthetic_run(tmp / "run", n_per_workload=n_per_workload)
        rows = rows_for([json.loads(ln) for ln in (run / "results.jsonl").read_text().splitlines()])
        (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        path = build_report(tmp / "report", run=run, title=title)
    finally:
        mp.undo()
    return path, rows


# the [[methods]] of the tiny engine sweeps: no SD and n-gram k = 3 (a lookup that accepts on code edits)
NONE_AND_NGRAM = """
[[methods]]
name = "none"

[[methods]]
name = "ngram"
k = 3
prompt_lookup_min = 2
prompt_lookup_max = 4
"""


def run_engine_sweep(tmp_path, sweep: str) -> tuple:
    """Run a tiny sweep (TOML text) through `speclab bench` on the real SmolLM2-135M fp32 engine; returns the
    run directory and its rows (results.jsonl). What the command printed stays with the caller's capsys."""
    import json

    from speclab.cli import main
    from speclab.models import prepare_model

    prepare_model("smollm2-135m", "float32")
    path = tmp_path / "sweep.toml"
    path.write_text(sweep)
    run = tmp_path / "run"
    main(["bench", str(path), "--out", str(run), "--no-progress"])
    return run, [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
