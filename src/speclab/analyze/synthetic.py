"""A small synthetic bench run (results.jsonl, traces/, timings.csv) for tests and report previews.

Everything here is made up: two workloads ("synthetic-code": high prompt-output overlap where n-gram
bursts; "synthetic-chat": little overlap where a model drafter wins), methods ngram and eagle. Rows carry
meta "synthetic": true and the target name says so, so no one mistakes them for measurements.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from speclab.atomic import atomic_path, atomic_write_text
from speclab.timings import COLUMNS as TIMINGS_COLUMNS
from speclab.traces import MethodTrace, RequestTrace, write_store

# (workload, category, share of output copied from the prompt)
WORKLOADS = (("synthetic-code", "code-editing", 0.75), ("synthetic-chat", "chat", 0.1))
# speedups for (workload, method) at batch 1, falling with batch size
SPEEDUP_B1 = {
    ("synthetic-code", "ngram"): 2.1,
    ("synthetic-code", "eagle"): 1.7,
    ("synthetic-chat", "ngram"): 1.1,
    ("synthetic-chat", "eagle"): 1.6,
}
BATCH_SIZES = (1, 8, 32)


def synthetic_records(n_per_workload: int = 24, k_max: int = 7, seed: int = 0) -> list[RequestTrace]:
    rng = np.random.default_rng(seed)
    out = []
    for workload, category, copy_share in WORKLOADS:
        for i in range(n_per_workload):
            prompt = rng.integers(100, 5000, size=int(rng.integers(40, 120)))
            n_out = int(rng.integers(30, 200)) if i % 6 else 600  # a few long outputs
            share = float(np.clip(copy_share + rng.normal(0, 0.15), 0.0, 1.0))
            output = []
            copied = []
            while len(output) < n_out:
                span = int(rng.integers(3, 25))
                if rng.random() < share:
                    start = int(rng.integers(0, max(1, len(prompt) - span)))
                    seg = prompt[start : start + span].tolist()
                    copied += [True] * len(seg)
                else:
                    seg = rng.integers(5000, 9000, size=span).tolist()
                    copied += [False] * span
                output += seg
            output, copied = output[:n_out], np.array(copied[:n_out])
            # n-gram: long bursts inside copied spans, mostly misses elsewhere
            ng = np.where(copied, rng.integers(3, k_max + 2, size=n_out), 1 + (rng.random(n_out) < 0.1))
            ng_prop = np.where(copied | (ng > 1), k_max, 0)
            # eagle: a model drafter, acceptance rising slowly along the output
            ramp = 0.5 + 0.2 * np.arange(n_out) / n_out
            ea = 1 + np.minimum(rng.geometric(1 - ramp) - 1, k_max)
            out.append(
                RequestTrace(
                    id=f"{workload}-{i}",
                    workload=workload,
                    category=category,
                    prompt_len=len(prompt),
                    output_len=n_out,
                    prompt_token_ids=prompt,
                    output_token_ids=np.array(output),
                    methods={
                        "ngram": MethodTrace(k_max=k_max, acc_len=ng, num_proposed=ng_prop),
                        "eagle": MethodTrace(k_max=k_max, acc_len=ea),
                    },
                    meta={
                        "synthetic": True,
                        "observed": {
                            "method": "eagle",
                            "k": 3,
                            "per_step_accepted": np.minimum(ea[1::2] - 1, 3).tolist(),
                            "per_step_drafted": [3] * len(ea[1::2]),
                        },
                    },
                )
            )
    return out


def synthetic_results(target: str = "synthetic-target (made-up numbers)") -> list[dict]:
    rows = []
    for workload, category, _ in WORKLOADS:
        for bs in BATCH_SIZES:
            base_tp = 40.0 * bs**0.8
            for method, k in (("none", None), ("ngram", 3), ("eagle", 3)):
                sp = (
                    1.0
                    if method == "none"
                    else SPEEDUP_B1[(workload, method)] * (1 - 0.12 * np.log2(bs)) ** 1.3
                )
                sp = float(round(sp, 3))
                elapsed = 10.0 / sp
                propose = 0.0 if method == "none" else elapsed * (0.02 if method == "ngram" else 0.25)
                verify = elapsed * 0.7
                rows.append(
                    {
                        "cell_id": f"{workload}-{method}-k{k}-bs{bs}",
                        "status": "ok",
                        "error": None,
                        "target": target,
                        "dtype": "float32",
                        "method": method,
                        "k": k,
                        "method_options": {"prompt_lookup_min": 3, "prompt_lookup_max": 7}
                        if method == "ngram"
                        else {},
                        "workload": workload,
                        "category": category,
                        "batching": "replicate",
                        "batch_size": bs,
                        "num_prompts": 8,
                        "max_tokens": 256,
                        "seed": 42,
                        "output_tokens": int(base_tp * sp * elapsed),
                        "elapsed_s": round(elapsed, 3),
                        "throughput_tok_s": round(base_tp * sp, 2),
                        "speedup": None if method == "none" else sp,
                        "mean_acceptance_length": None if method == "none" else round(1 + 1.5 * sp / 2, 3),
                        "acceptance_rate_per_pos": [] if method == "none" else [0.7, 0.5, 0.35],
                        "time_split_s": {
                            "propose": round(propose, 3),
                            "verify": round(verify, 3),
                            "other": round(elapsed - propose - verify, 3),
                        },
                        "memory": {
                            "peak_rss_bytes": int(3.0e9 + (0.4e9 if method == "eagle" else 0) + bs * 2e7),
                            "weights_bytes": int(2.0e9),
                            "kv_cache_bytes": int(0.8e9),
                            "draft_weights_bytes": int(0.3e9) if method == "eagle" else 0,
                        },
                        "lossless": None if method == "none" else True,
                        "lossless_detail": None,
                        "trace_part": None,
                        "meta": {"synthetic": True},
                    }
                )
    # one failed cell, as real runs have them
    rows.append(
        {
            "cell_id": "synthetic-chat-eagle-k3-bs64",
            "status": "failed",
            "error": "synthetic: out of memory",
            "method": "eagle",
            "k": 3,
            "workload": "synthetic-chat",
            "batching": "replicate",
            "batch_size": 64,
        }
    )
    return rows


def synthetic_timings(rng_seed: int = 0) -> list[dict]:
    """Step timings following the study's fitted Llama-3.1-8B/H100 cost model, with noise."""
    rng = np.random.default_rng(rng_seed)
    rows = []

    def step(kind: str, kv: int, bt: int, ns: int, sec: float) -> dict:
        return {
            "kind": kind,
            "kv_tokens": kv,
            "batched_tokens": bt,
            "num_spec_tokens": ns,
            "num_requests": max(1, bt // 4),
            "seconds": sec * float(rng.normal(1, 0.01)),
        }

    for _ in range(200):
        kv = int(rng.integers(100, 200000))
        bt = int(rng.integers(1, 512))
        rows.append(step("target", kv, bt, 0, 3.92645679e-08 * kv + 2.10103129e-05 * bt + 5.88590713e-03))
        ns = int(rng.integers(1, 64))
        rows.append(
            step("draft:eagle", kv, bt, ns, 2.37768493e-09 * kv + 8.41429603e-07 * ns + 2.13526175e-03)
        )
        rows.append(step("draft:ngram", kv, bt, ns, 1e-4))
        rows.append(step("overhead", kv, bt, 0, 1.2e-3))
    return rows


def write_synthetic_run(run: str | Path, n_per_workload: int = 24) -> Path:
    """Write RUN/results.jsonl, RUN/traces/, RUN/timings.csv and RUN/command.txt; returns RUN."""
    run = Path(run)
    run.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run / "results.jsonl", "".join(json.dumps(r) + "\n" for r in synthetic_results()))
    write_store(run / "traces", synthetic_records(n_per_workload))
    with atomic_path(run / "timings.csv") as tmp, open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=TIMINGS_COLUMNS)
        w.writeheader()
        w.writerows(synthetic_timings())
    atomic_write_text(
        run / "command.txt",
        "# SYNTHETIC: written by speclab.analyze.synthetic.write_synthetic_run (no engine was run)\n",
    )
    return run
