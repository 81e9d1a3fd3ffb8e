"""Draw sampled outputs with and without speculative decoding for the sampling check (`speclab bench
check-sampling`, docs/sampling.md), one engine at a time through the bench's engine worker.

Each engine gets the same prompts and sampling settings. A prompt's `samples` draws are copies of it under
"replicate" batching (copy c draws with seed + c), split into cells of at most `chunk` copies. The engine
without SD draws seeds seed .. seed + samples - 1, the engine with SD seeds seed + samples .. seed +
2 * samples - 1: the two samples are independent (the same seed would make both engines draw the same first
token, and so correlate the samples the test assumes independent).

Loads no model and imports no vLLM: the engines run in worker processes (speclab.engine.launch).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from speclab.engine.launch import describe_exit, launch_worker, log_tail, stop_worker
from speclab.engine.protocol import CellResult, CellSpec, EngineSpec, Job, PromptSpec, read_results, write_job
from speclab.errors import ConfigError, SpeclabError

#: method options used when none are given (as the quick bench uses)
DEFAULT_OPTIONS: dict[str, dict[str, Any]] = {
    "ngram": {"prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "draft_model": {"model": "smollm2-135m-draft-l8"},
    "suffix": {"suffix_decoding_max_cached_requests": 0},
}


#: the cell that fills the prefix cache before the draws (its outputs are not draws)
PRIME = "prime"


@dataclass
class CheckSettings:
    target: str = "smollm2-135m"
    dtype: str = "float32"
    method: str = "ngram"
    k: int = 3
    options: dict[str, Any] = field(default_factory=dict)  # over the method's DEFAULT_OPTIONS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    samples: int = 200  # draws per prompt and engine
    max_tokens: int = 4
    seed: int = 0
    chunk: int = 64  # copies per cell (the engine's batch)
    enforce_eager: bool = True
    kv_cache_gib: float = 2.0

    def validate(self) -> None:
        if self.method == "none":
            raise ConfigError("--method: the check compares a speculative method with none; name one")
        if not self.temperature > 0:
            raise ConfigError(f"--temperature {self.temperature}: the check is for sampling (T > 0)")
        for name, low in (("samples", 2), ("max_tokens", 1), ("chunk", 1), ("k", 1)):
            if getattr(self, name) < low:
                raise ConfigError(f"--{name.replace('_', '-')}: must be >= {low}")

    def method_options(self) -> dict[str, Any]:
        return dict(DEFAULT_OPTIONS.get(self.method, {}), **self.options)

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), options=self.method_options())


def sampling(settings: CheckSettings, seed: int) -> dict[str, Any]:
    s: dict[str, Any] = {"temperature": settings.temperature, "seed": seed}
    if settings.top_p < 1:
        s["top_p"] = settings.top_p
    if settings.top_k:
        s["top_k"] = settings.top_k
    return s


def prime_cell(prompts: list[PromptSpec], cell_id: str = PRIME) -> CellSpec:
    """The cell that puts each prompt's prefill in vLLM's prefix cache (one greedy token, not a draw)."""
    return CellSpec(cell_id, "replicate", 1, 1, [PromptSpec(p.id, list(p.prompt_token_ids)) for p in prompts])


def is_prime(cell_id: str) -> bool:
    return cell_id == PRIME or cell_id.startswith(PRIME + ":")


def draw_cells(
    settings: CheckSettings, prompts: list[PromptSpec], sd: bool, prefix: str = ""
) -> list[CellSpec]:
    """The prompts' draws as replicate cells of at most `chunk` copies each (ids `<prefix>sd-<j>` or
    `<prefix>base-<j>`): the engine without SD draws seeds seed .., the one with SD seed + samples .."""
    first = settings.seed + (settings.samples if sd else 0)
    size = min(settings.chunk, settings.samples)
    cells = []
    for j, start in enumerate(range(0, settings.samples, size)):
        n = min(size, settings.samples - start)
        ps = [PromptSpec(p.id, list(p.prompt_token_ids), sampling(settings, first + start)) for p in prompts]
        cells.append(
            CellSpec(f"{prefix}{'sd' if sd else 'base'}-{j}", "replicate", n, settings.max_tokens, ps)
        )
    return cells


#: llm_kwargs of every check engine: the copies of a prompt share its prefill (caching it changes no token's
#: distribution); no chunked prefill: vLLM moves a seeded generator back for a partial prefill's discarded
#: token, which a CPU generator refuses ("does not use offset"), so whole prompts are scheduled instead
CHECK_LLM_KWARGS = {"enable_prefix_caching": True, "enable_chunked_prefill": False}


def engine_job(settings: CheckSettings, prompts: list[PromptSpec], sd: bool) -> Job:
    """One engine's job: the prompts' draws as replicate cells of at most `chunk` copies each, after a
    PRIME cell (one greedy token per prompt, not a draw) that puts each prompt's prefill in vLLM's prefix
    cache, so the copies scheduled together share it instead of each computing it."""
    size = min(settings.chunk, settings.samples)
    cells = [prime_cell(prompts), *draw_cells(settings, prompts, sd)]
    longest = max(len(p.prompt_token_ids) for p in prompts)
    engine = EngineSpec(
        target=settings.target,
        dtype=settings.dtype,
        method=settings.method if sd else "none",
        k=settings.k if sd else None,
        options=settings.method_options() if sd else {},
        max_model_len=longest + settings.max_tokens + settings.k + 16,
        max_num_seqs=size,
        enforce_eager=settings.enforce_eager,
        kv_cache_gib=settings.kv_cache_gib,
        seed=settings.seed,
        llm_kwargs=dict(CHECK_LLM_KWARGS),
    )
    return Job(engine, cells, warmup=True)


def run_job(job: Job, work_dir: Path, name: str, env: dict[str, str] | None = None) -> list[CellResult]:
    """Run one engine's job in a worker; its cells' results (SpeclabError naming the cause if any failed)."""
    write_job(job, work_dir / f"job-{name}.json")
    cells_path = work_dir / f"cells-{name}.jsonl"
    cells_path.unlink(missing_ok=True)
    log_path = work_dir / f"worker-{name}.log"
    with open(log_path, "wb") as log:
        proc = launch_worker(work_dir / f"job-{name}.json", cells_path, log=log, env=env)
        try:
            rc = proc.wait()
        except BaseException:
            stop_worker(proc)
            raise
    results = read_results(cells_path)
    bad = [r for r in results if r.status != "ok"]
    if bad:
        raise SpeclabError(f"{name} engine: cell {bad[0].cell_id} failed: {bad[0].error}")
    if len(results) < len(job.cells):
        raise SpeclabError(f"{name} engine: worker {describe_exit(rc)}: {log_tail(log_path)}")
    return results


def outputs_by_prompt(results: list[CellResult]) -> dict[str, list[list[int]]]:
    """prompt id -> every draw's output token ids, in cell and copy order."""
    out: dict[str, list[list[int]]] = {}
    for r in results:
        if is_prime(r.cell_id):
            continue
        for req in sorted(r.requests, key=lambda q: q.copy):
            out.setdefault(req.id, []).append(list(req.output_token_ids))
    return out


def acceptance(results: list[CellResult]) -> dict[str, Any]:
    """vLLM's own spec-decode counters summed over an engine's cells: drafted and accepted tokens, the
    acceptance rate and the rate per draft position."""
    drafts = drafted = accepted = 0
    per_pos: list[int] = []
    for r in results:
        sc = r.spec_counters
        if sc is None or is_prime(r.cell_id):
            continue
        drafts += sc.num_drafts
        drafted += sc.num_draft_tokens
        accepted += sc.num_accepted_tokens
        for i, a in enumerate(sc.accepted_per_pos):
            if i >= len(per_pos):
                per_pos.append(0)
            per_pos[i] += a
    return {
        "num_drafts": drafts,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "acceptance_rate_per_pos": [a / drafts for a in per_pos] if drafts else [],
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
    }


def draw_samples(
    settings: CheckSettings,
    prompts: list[PromptSpec],
    *,
    work_dir: str | os.PathLike[str] | None = None,
    echo: Callable[[str], None] = lambda s: None,
    env: dict[str, str] | None = None,
    base: dict[str, list[list[int]]] | None = None,
) -> dict[str, Any]:
    """Run the engine without SD, then the one with SD (one at a time); returns {"base": outputs, "sd":
    outputs, "acceptance": the SD engine's counters, "engine_info": the SD engine's facts}. `base`: outputs
    of an earlier no-SD run with the same settings, reused instead of running that engine again. `env`:
    the workers' environment (default: this process's)."""
    settings.validate()
    if not prompts:
        raise ConfigError("no prompts to check")
    with tempfile.TemporaryDirectory(prefix="speclab-check-sampling-", dir=work_dir) as tmp:
        d = Path(tmp)
        if base is None:
            echo(f"engine without SD: {len(prompts)} prompt(s) x {settings.samples} draws")
            base = outputs_by_prompt(run_job(engine_job(settings, prompts, sd=False), d, "base", env))
        echo(
            f"engine with {settings.method} k={settings.k}: {len(prompts)} prompt(s) x {settings.samples} draws"
        )
        sd_results = run_job(engine_job(settings, prompts, sd=True), d, "sd", env)
    info = sd_results[-1].engine_info if sd_results else {}
    return {
        "base": base,
        "sd": outputs_by_prompt(sd_results),
        "acceptance": acceptance(sd_results),
        "engine_info": {k: info.get(k) for k in ("vllm_version", "device", "method", "k") if k in info},
    }
