"""A small real check of the offline stand-ins on vLLM: prompt/output overlap and n-gram acceptance.

    python -m speclab.workloads.enginecheck --model ~/.cache/speclab/models/smollm2-135m/float32 \\
        --workloads offline-code-edit,offline-math --n 24 --max-tokens 160

Runs one engine with built-in n-gram speculation (greedy), all prompts at once, and prints per workload:
mean BLEU-4 overlap of output vs prompt (text and token ids), drafted/accepted tokens, acceptance rate,
mean accepted length per drafting step (accepted + 1) and accepted tokens per output token. On CPU set
VLLM_ENABLE_V1_MULTIPROCESSING=0 and LD_PRELOAD=<venv>/lib/libiomp5.so (see docs). vLLM is imported only here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def run(
    model: str,
    workloads: list[str],
    n: int,
    max_tokens: int,
    k: int = 4,
    lookup_min: int = 2,
    lookup_max: int = 4,
    seed: int = 0,
    enforce_eager: bool = True,
) -> dict[str, Any]:
    from vllm import LLM, SamplingParams

    from speclab.workloads import load_workload, ngram_overlap, render_prompt
    from speclab.workloads.render import load_tokenizer

    tok = load_tokenizer(model)
    batch = []
    for name in workloads:
        for p in load_workload(name, limit=n, seed=seed):
            ids, _ = render_prompt(p, tok, max_prompt_tokens=1024)
            batch.append((name, p, ids))
    kwargs: dict[str, Any] = {}
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
        kwargs["distributed_executor_backend"] = "uni"
    t0 = time.time()
    llm = LLM(
        model=model,
        dtype="float32",
        enforce_eager=enforce_eager,
        max_model_len=2048,
        seed=seed,
        max_num_seqs=16,
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": lookup_min,
            "prompt_lookup_max": lookup_max,
        },
        per_request_spec_decode_metrics="detailed",
        disable_log_stats=False,
        **kwargs,
    )
    start_s = time.time() - t0
    outs = llm.generate(
        [{"prompt_token_ids": ids} for _, _, ids in batch],
        SamplingParams(temperature=0.0, max_tokens=max_tokens),
    )
    gen_s = time.time() - t0 - start_s
    summary: dict[str, Any] = {
        "model": model,
        "k": k,
        "prompt_lookup": [lookup_min, lookup_max],
        "max_tokens": max_tokens,
        "seed": seed,
        "engine_start_s": round(start_s, 1),
        "generate_s": round(gen_s, 1),
        "workloads": {},
    }
    rows = []
    for (name, p, ids), o in zip(batch, outs, strict=True):
        c = o.outputs[0]
        m = c.spec_decode_metrics.to_dict() if getattr(c, "spec_decode_metrics", None) else {}
        acc, drafted = m.get("per_step_accepted", []), m.get("per_step_drafted", [])
        rows.append(
            {
                "workload": name,
                "id": p.id,
                "out_len": len(c.token_ids),
                "bleu4_text": ngram_overlap(p.messages[-1]["content"], c.text),
                "bleu4_ids": ngram_overlap(ids, list(c.token_ids)),
                "draft_steps": len(acc),
                "accepted": sum(acc),
                "drafted": sum(drafted),
            }
        )
    for name in workloads:
        rs = [r for r in rows if r["workload"] == name]
        out = sum(r["out_len"] for r in rs)
        acc = sum(r["accepted"] for r in rs)
        dr = sum(r["drafted"] for r in rs)
        steps = sum(r["draft_steps"] for r in rs)
        summary["workloads"][name] = {
            "prompts": len(rs),
            "output_tokens": out,
            "mean_bleu4_text": round(sum(r["bleu4_text"] for r in rs) / max(len(rs), 1), 4),
            "mean_bleu4_ids": round(sum(r["bleu4_ids"] for r in rs) / max(len(rs), 1), 4),
            "draft_steps": steps,
            "drafted_tokens": dr,
            "accepted_tokens": acc,
            "acceptance_rate": round(acc / dr, 4) if dr else 0.0,
            "mean_accepted_len_per_draft_step": round(acc / steps + 1, 4) if steps else 1.0,
            "accepted_per_output_token": round(acc / out, 4) if out else 0.0,
        }
    summary["requests"] = rows
    return summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="target checkpoint directory")
    ap.add_argument("--workloads", default="offline-code-edit,offline-math")
    ap.add_argument("--n", type=int, default=24, help="prompts per workload")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="also write the JSON summary here")
    a = ap.parse_args(argv)
    res = run(os.path.expanduser(a.model), a.workloads.split(","), a.n, a.max_tokens, k=a.k, seed=a.seed)
    text = json.dumps(res, indent=1)
    if a.out:
        from speclab.atomic import atomic_write_text

        atomic_write_text(a.out, text + "\n")
    json.dump({k: v for k, v in res.items() if k != "requests"}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
