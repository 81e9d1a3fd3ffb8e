"""Generate target outputs on the spot (greedy, fp32) for replay tracing without a bench run
(`speclab trace --workload`). A bench run's outputs are preferred: they are what an engine really produced.

Two generators give the same tokens in fp32 (tests/test_generate_engine.py checks it on a few prompts):
- "engine" (the default): every prompt at once through the bench's engine path: one vLLM engine worker
  (speclab.engine.worker, in its own subprocess, with the bench's settings: greedy, EOS respected, prefix
  caching off), one continuous-batching cell that admits up to `max_batch` requests at a time;
- "transformers": one request at a time with transformers' `generate` (no vLLM needed; several times slower).

Sampled outputs (`sampling`: temperature > 0, top_p, top_k, seed) come from the engine only: each prompt's
request carries its own seed (derived from the given seed and the prompt's id, `prompt_seed`) so a run is
reproducible, and each record keeps meta["sampling"] = {temperature, top_p, top_k, seed}.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speclab.errors import SpeclabError
from speclab.traces import RequestTrace
from speclab.workloads.base import Prompt

GENERATORS = ("engine", "transformers")
MAX_BATCH = 256  # requests in flight at once on the engine (vLLM queues the rest)


def generate_records(
    workload: str,
    target: str,
    limit: int = 20,
    max_tokens: int = 256,
    threads: int | None = None,
    max_prompt_tokens: int | None = 1024,
    generator: str = "engine",
    max_batch: int = MAX_BATCH,
    echo: Callable[[str], None] | None = None,
    sampling: dict[str, Any] | None = None,
) -> list[RequestTrace]:
    """fp32 outputs of `target` for the first `limit` prompts of `workload`, as records with token ids and no
    method traces: greedy, or sampled with `sampling` (module docstring; engine only). threads: torch
    threads of the transformers generator."""
    from speclab.models.prepare import resolve_model
    from speclab.workloads import load_workload, render_prompt
    from speclab.workloads.render import load_tokenizer

    if generator not in GENERATORS:
        raise SpeclabError(f"generator {generator!r} not one of {', '.join(GENERATORS)}")
    path = resolve_model(target)
    tok = load_tokenizer(str(path))
    prompts = load_workload(workload, limit=limit)
    rendered = [render_prompt(pr, tok, max_prompt_tokens=max_prompt_tokens) for pr in prompts]
    ids = [r[0] for r in rendered]
    if not ids:
        return []
    per = [prompt_sampling(sampling, pr.id) for pr in prompts] if sampling else None
    if generator == "engine":
        outputs = engine_generate(ids, path, max_tokens, max_batch=max_batch, echo=echo, sampling=per)
    elif per:
        raise SpeclabError("sampled outputs (temperature > 0) come from the engine generator only")
    else:
        outputs = transformers_generate(ids, path, max_tokens, eos=tok.eos_token_id, threads=threads)
    return [
        output_record(
            pr,
            p,
            gen,
            {"source": "trace-generate", "target": str(path), "truncated_prompt": truncated}
            | ({"sampling": per[i]} if per else {}),
        )
        for i, (pr, (p, truncated), gen) in enumerate(zip(prompts, rendered, outputs, strict=True))
    ]


def prompt_seed(seed: int, prompt_id: str) -> int:
    """A prompt's own seed, derived from the run's seed and the prompt's id (stable across orders)."""
    h = hashlib.blake2b(f"{int(seed)}|{prompt_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") % (2**31 - 1)


def prompt_sampling(sampling: dict[str, Any], prompt_id: str) -> dict[str, Any] | None:
    """One prompt's sampling settings {temperature, top_p, top_k, seed}; None for greedy (temperature 0)."""
    if float(sampling.get("temperature") or 0.0) <= 0.0:
        return None
    return {
        "temperature": float(sampling["temperature"]),
        "top_p": float(sampling.get("top_p") or 1.0),
        "top_k": int(sampling.get("top_k") or 0),
        "seed": prompt_seed(int(sampling.get("seed") or 0), prompt_id),
    }


def output_record(
    prompt: Prompt, prompt_ids: list[int], output_ids: list[int], meta: dict[str, Any], rid: str | None = None
) -> RequestTrace:
    """The record of one generated request, ready for replay: the prompt's workload and category, its token ids
    and the output's, no method traces. rid: the record's id (default: the prompt's)."""
    return RequestTrace(
        id=prompt.id if rid is None else rid,
        workload=prompt.workload,
        category=prompt.category,
        prompt_len=len(prompt_ids),
        output_len=len(output_ids),
        prompt_token_ids=prompt_ids,
        output_token_ids=output_ids,
        meta=meta,
    )


def engine_generate(
    prompts: list[list[int]],
    target: str | Path,
    max_tokens: int,
    max_batch: int = MAX_BATCH,
    dtype: str = "float32",
    echo: Callable[[str], None] | None = None,
    work_dir: str | Path | None = None,
    sampling: list[dict[str, Any] | None] | None = None,
) -> list[list[int]]:
    """Outputs of every prompt (token ids, EOS included where reached) from one vLLM engine worker running
    them as one continuous-batching cell, as the bench runs a cell: greedy, or with sampling[i] (PromptSpec
    sampling settings) for prompt i."""
    from speclab.engine.protocol import CellSpec, EngineSpec, Job, PromptSpec, write_job

    batch = max(1, min(len(prompts), max_batch))
    spec = EngineSpec(
        target=str(target),
        dtype=dtype,
        max_model_len=max(len(p) for p in prompts) + max_tokens,
        max_num_seqs=batch,
        # eager: the engine starts in seconds, where compiling takes over a minute for each new prompt set
        # (max_model_len changes); greedy fp32 tokens are the same (docs/results/2026-12-03-trace-generation.md)
        enforce_eager=True,
    )
    per = sampling or [None] * len(prompts)
    specs = [PromptSpec(f"p{i}", p, sampling=per[i]) for i, p in enumerate(prompts)]
    cell = CellSpec("generate", "continuous", batch, max_tokens, specs)
    job = Job(spec, [cell], warmup=False)
    job.validate()
    say = echo or (lambda s: print(s, file=sys.stderr, flush=True))
    say(
        f"generating {len(prompts)} request(s) x up to {max_tokens} tokens on a vLLM engine ({dtype}, "
        f"{'sampled' if any(per) else 'greedy'}, "
        f"up to {batch} at once)"
    )
    with tempfile.TemporaryDirectory(prefix="speclab-generate-", dir=work_dir) as tmp:
        d = Path(tmp)
        write_job(job, d / "job.json")
        result = _run_worker(d)
    by_id = {r.id: r.output_token_ids for r in result.requests}
    return [list(by_id[f"p{i}"]) for i in range(len(prompts))]


def _run_worker(d: Path) -> Any:
    """Run the job in d/job.json on an engine worker; its one cell's result (SpeclabError if it failed)."""
    from speclab.engine.launch import describe_exit, launch_worker, log_tail, stop_worker
    from speclab.engine.protocol import read_results

    with open(d / "worker.log", "wb") as log:
        proc = launch_worker(d / "job.json", d / "cells.jsonl", log=log)
        try:
            rc = proc.wait()
        except BaseException:
            stop_worker(proc)
            raise
    results = read_results(d / "cells.jsonl") if (d / "cells.jsonl").exists() else []
    if not results:
        raise SpeclabError(f"generation engine {describe_exit(rc)}: {log_tail(d / 'worker.log')}")
    if results[0].status != "ok":
        raise SpeclabError(f"generation failed on the engine: {results[0].error}")
    return results[0]


def transformers_generate(
    prompts: list[list[int]], target: str | Path, max_tokens: int, eos: int | None, threads: int | None = None
) -> list[list[int]]:
    """Greedy fp32 outputs with transformers, one request at a time (EOS included where reached)."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    if threads:
        torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    outputs = []
    for ids in tqdm(prompts, desc="generate", unit="req", file=sys.stderr):
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=max_tokens,
                eos_token_id=eos,
                pad_token_id=eos,
            )
        outputs.append(out[0, len(ids) :].tolist())
    return outputs
