"""Generate target outputs on the spot (greedy, transformers, fp32 on CPU) for replay tracing without a
bench run. A bench run's outputs (vLLM) are preferred: they are what an engine really produced."""

from __future__ import annotations

import sys

from speclab.traces import RequestTrace


def generate_records(
    workload: str,
    target: str,
    limit: int = 20,
    max_tokens: int = 256,
    threads: int | None = None,
    max_prompt_tokens: int | None = 1024,
) -> list[RequestTrace]:
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from speclab.models.prepare import resolve_model
    from speclab.workloads import load_workload, render_prompt

    if threads:
        torch.set_num_threads(threads)
    path = resolve_model(target)
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    eos = tok.eos_token_id
    records = []
    for pr in tqdm(load_workload(workload, limit=limit), desc="generate", unit="req", file=sys.stderr):
        ids, truncated = render_prompt(pr, tok, max_prompt_tokens=max_prompt_tokens)
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=max_tokens,
                eos_token_id=eos,
                pad_token_id=eos,
            )
        gen = out[0, len(ids) :].tolist()
        records.append(
            RequestTrace(
                id=pr.id,
                workload=pr.workload,
                category=pr.category,
                prompt_len=len(ids),
                output_len=len(gen),
                prompt_token_ids=ids,
                output_token_ids=gen,
                meta={"source": "trace-generate", "target": str(path), "truncated_prompt": truncated},
            )
        )
    return records
