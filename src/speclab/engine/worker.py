"""The engine worker: `python -m speclab.engine.worker --job JOB.json --out CELLS.jsonl`.

Starts one vLLM engine for the job's configuration, runs every cell and appends one CellResult JSON line
per cell to CELLS.jsonl (flushed), plus profiled step timings to job.timings_csv. Launch it through
`speclab.engine.launch.launch_worker` so it gets the right environment and its own process.

Engine settings (as the study, adapted to CPU): temperature 0 (greedy) unless a request carries its own
sampling settings (PromptSpec.sampling), EOS respected, prefix caching off,
async scheduling off, the engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, executor "uni"),
per-request detailed spec-decode metrics on, stats logging on (for llm.get_metrics()).

Exit status: 0 when every cell ran (individual cells may still have status "failed"), 1 when the engine
could not start (every cell is then written as failed with the reason), 2 for an invalid job file.

It is one process's life (build the engine, warm up, drive cells step by step, the gate loop for repeats).
The engine's settings (paths, vLLM arguments) are in engine/settings.py; measuring functions in
engine/measure.py and engine/instrument.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any

from speclab.catalog import MODEL_BASED, trace_method_name
from speclab.engine import cpu_sampling
from speclab.engine.launch import kv_cache_env
from speclab.engine.measure import (
    checkpoint_num_params,
    counters_delta,
    flatten_tensors,
    loadavg,
    peak_rss_bytes,
    spec_metrics,
    unique_bytes,
)
from speclab.engine.protocol import (
    CellResult,
    CellSpec,
    EngineSpec,
    Job,
    MemoryInfo,
    RequestResult,
    TimeSplit,
    append_result,
    gate_lines,
    gate_ready_path,
    read_job,
)
from speclab.engine.settings import adaptive_model_drafter, llm_kwargs, resolve_paths
from speclab.errors import SpeclabError
from speclab.timings import append_timings, cell_temperature

# engine steps in a row without a new token or a finished request before drive() gives up
MAX_IDLE_STEPS = 10_000


# --- the engine ----------------------------------------------------------------------------------------


class Engine:
    """One vLLM engine, driven step by step, with the step profiler installed."""

    def __init__(self, spec: EngineSpec, seeded: bool = False) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        for key, value in kv_cache_env(spec.kv_cache_gib).items():
            os.environ.setdefault(key, value)
        self.spec = spec
        t0 = time.perf_counter()
        self.target, self.drafter = resolve_paths(spec)
        import torch
        import vllm
        from vllm import LLM, SamplingParams

        from speclab.engine.instrument import StepProfiler

        self._SamplingParams = SamplingParams
        if spec.method == "custom_class" and spec.options.get("proposer_options") is not None:
            # speclab's custom_class adapters read their options from the environment (vLLM passes no
            # extra keys to the class): speclab.methods.vllm_custom.OPTIONS_ENV
            os.environ["SPECLAB_PROPOSER_OPTIONS"] = json.dumps(spec.options["proposer_options"])
        self.kwargs = llm_kwargs(spec, self.target, self.drafter)
        # seeded requests on the CPU build: whole prefills only (speclab.engine.cpu_sampling)
        self.kwargs.update(cpu_sampling.whole_prefill_kwargs(seeded, spec.max_model_len, spec.llm_kwargs))
        t1 = time.perf_counter()
        self.llm = LLM(**self.kwargs)
        self.adaptive = adaptive_model_drafter(spec)
        if self.adaptive:  # the live adaptive proposer over the model drafter: speclab.live.vllm_eagle
            self.llm.collective_rpc("speclab_adaptive_install", args=(spec.options["proposer_options"],))
        self.startup_s = time.perf_counter() - t1
        self.resolve_s = t1 - t0
        self.engine = self.llm.llm_engine
        self._req_counter = 0
        self.runner = self._find_runner()
        on_gpu = torch.cuda.is_available() and str(getattr(self.runner, "device", "cpu")).startswith("cuda")
        self.profiler = StepProfiler(
            method=trace_method_name(spec.method, spec.options),
            sync=torch.cuda.synchronize if on_gpu else None,
        )
        if self.runner is not None:
            self.profiler.install(self.runner)
        self.memory = self._static_memory()
        self.info: dict[str, Any] = {
            "startup_s": round(self.startup_s, 3),
            "resolve_s": round(self.resolve_s, 3),
            "vllm_version": getattr(vllm, "__version__", "?"),
            "torch_version": torch.__version__,
            "device": "cuda" if on_gpu else "cpu",
            "torch_threads": torch.get_num_threads(),
            "target_path": self.target,
            "drafter_path": self.drafter,
            "method": spec.method,
            "k": spec.k,
            "dtype": spec.dtype,
            "enforce_eager": spec.enforce_eager,
            "max_num_seqs": spec.max_num_seqs,
            "ld_preload_iomp": "libiomp5" in os.environ.get("LD_PRELOAD", ""),
            # VLLM_USE_AOT_COMPILE=0 starts CPU engines 4x faster but measured slower engines (docs/bench.md)
            "vllm_aot_compile": os.environ.get("VLLM_USE_AOT_COMPILE"),
            "profiled": self.runner is not None,
            "speculative_config": self.kwargs.get("speculative_config"),
        }

    def _adaptive_counts(self) -> dict[str, int]:
        """Decisions per row so far of the live adaptive proposer over the model drafter (first worker)."""
        return dict(self.llm.collective_rpc("speclab_adaptive_counts")[0]) if self.adaptive else {}

    def _find_runner(self) -> Any:
        try:
            return self.engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
        except AttributeError:
            return None  # multiprocess engine (e.g. tensor parallel): no time split

    def _static_memory(self) -> MemoryInfo:
        mem = MemoryInfo()
        r = self.runner
        if r is None:
            return mem
        # vLLM's CPU backend repacks linear weights (oneDNN) and drops the Parameters, so weight bytes
        # come from the checkpoints (parameter count x element size of the run dtype) when local.
        esize = 4 if self.spec.dtype == "float32" else 2
        n_target = checkpoint_num_params(self.target)
        try:
            wbytes, wptrs = unique_bytes(r.model.parameters())
            mem.weights_bytes = n_target * esize if n_target is not None else wbytes
            if self.spec.method not in MODEL_BASED:
                mem.draft_weights_bytes = 0
            else:
                n_draft = checkpoint_num_params(self.drafter)
                drafter_model = getattr(getattr(r, "drafter", None), "model", None)
                if n_draft is not None:
                    mem.draft_weights_bytes = n_draft * esize
                elif drafter_model is not None and hasattr(drafter_model, "parameters"):
                    mem.draft_weights_bytes, _ = unique_bytes(drafter_model.parameters(), exclude=wptrs)
            mem.kv_cache_bytes, _ = unique_bytes(flatten_tensors(getattr(r, "kv_caches", [])))
        except Exception:
            pass
        return mem

    # --- driving ---------------------------------------------------------------------------------------
    def _params(self, max_tokens: int, sampling: dict[str, Any] | None = None, copy: int = 0) -> Any:
        """vLLM's SamplingParams for one request: greedy unless its sampling settings say otherwise; copy c
        of a replicated request draws with seed + c."""
        s = sampling or {}
        seed = s.get("seed")
        return self._SamplingParams(
            temperature=float(s.get("temperature", 0.0)),
            top_p=float(s.get("top_p", 1.0)),
            top_k=int(s.get("top_k", 0)) or -1,
            seed=None if seed is None else int(seed) + copy,
            max_tokens=int(s.get("max_tokens") or max_tokens),
            ignore_eos=False,
            detokenize=False,
        )

    def drive(
        self, requests: list[tuple[Any, list[int], Any]], max_running: int
    ) -> tuple[dict[Any, Any], int]:
        """Run requests (key, prompt token ids, SamplingParams) with at most max_running in flight, admitting
        a new one whenever one finishes. Returns {key: RequestOutput} and the number of engine steps."""
        pending = deque(requests)
        running: dict[str, Any] = {}  # request id (internal and external) -> key
        in_flight = 0
        done: dict[Any, Any] = {}
        steps = 0
        idle = 0  # steps in a row in which no request got a token or finished
        prof = self.profiler
        try:
            while pending or in_flight:
                while pending and in_flight < max_running:
                    key, ids, params = pending.popleft()
                    self._req_counter += 1
                    ext = f"speclab-{self._req_counter}"
                    internal = self.engine.add_request(ext, {"prompt_token_ids": ids}, params)
                    running[ext] = key
                    running[internal] = key
                    in_flight += 1
                prof.begin_step()
                t0 = time.perf_counter()
                outs = self.engine.step()
                prof.end_step(time.perf_counter() - t0)
                steps += 1
                # vLLM returns an output only for a request that got new tokens or finished; a step without
                # any (a chunk of a long prefill) is legitimate, but not thousands of them in a row
                idle = 0 if outs else idle + 1
                for o in outs:
                    if o.finished and o.request_id in running:
                        key = running[o.request_id]
                        done[key] = o
                        for rid in [rid for rid, k in running.items() if k == key]:
                            del running[rid]
                        in_flight -= 1
                if idle > MAX_IDLE_STEPS:
                    raise RuntimeError(f"engine made no progress in {idle} steps in a row")
        except BaseException:
            ids = [rid for rid in running if rid.startswith("speclab-") and "-" not in rid[len("speclab-") :]]
            if ids:
                try:
                    self.engine.abort_request(ids)
                    while self.engine.has_unfinished_requests():
                        self.engine.step()
                except Exception:
                    pass
            raise
        return done, steps

    def warmup(self, cell: CellSpec) -> None:
        ids = cell.prompts[0].prompt_token_ids[:32]
        self.profiler.enabled = False
        done, _ = self.drive([("warmup", ids, self._params(8))], 1)
        # recorded because a stateful proposer (suffix: the global tree) remembers the warmup's answer,
        # so replaying the engine's proposals (speclab.replay.engine_sim) must feed it too
        comp = done["warmup"].outputs[0]
        m = getattr(comp, "spec_decode_metrics", None)
        self.info["warmup"] = {
            "prompt_token_ids": [int(t) for t in ids],
            "output_token_ids": [int(t) for t in comp.token_ids],
            "max_tokens": 8,
            "per_step_accepted": list(m.per_step_accepted) if m is not None else None,
            "per_step_drafted": list(m.per_step_drafted) if m is not None else None,
        }

    def run_cell(self, cell: CellSpec) -> CellResult:
        spec = self.spec
        sd = spec.method != "none"
        before = spec_metrics(self.llm) if sd else None
        counts0 = self._adaptive_counts()
        self.profiler.reset()
        self.profiler.enabled = True
        load0 = loadavg()
        stall0 = cpu_stall_us()
        t0 = time.perf_counter()
        outputs: dict[Any, Any] = {}
        steps = 0
        if cell.batching == "replicate":
            for p in cell.prompts:
                reqs = [
                    ((p.id, c), p.prompt_token_ids, self._params(cell.max_tokens, p.sampling, c))
                    for c in range(cell.batch_size)
                ]
                done, n = self.drive(reqs, cell.batch_size)
                outputs.update(done)
                steps += n
        else:
            reqs = [
                ((p.id, 0), p.prompt_token_ids, self._params(cell.max_tokens, p.sampling))
                for p in cell.prompts
            ]
            outputs, steps = self.drive(reqs, cell.batch_size)
        elapsed = time.perf_counter() - t0
        stall1 = cpu_stall_us()
        self.profiler.enabled = False
        requests: list[RequestResult] = []
        plen = {p.id: len(p.prompt_token_ids) for p in cell.prompts}
        copies = cell.batch_size if cell.batching == "replicate" else 1
        for p in cell.prompts:
            for c in range(copies):
                o = outputs[(p.id, c)]
                comp = o.outputs[0]
                m = getattr(comp, "spec_decode_metrics", None)
                requests.append(
                    RequestResult(
                        id=p.id,
                        copy=c,
                        prompt_len=plen[p.id],
                        output_token_ids=[int(t) for t in comp.token_ids],
                        finish_reason=comp.finish_reason,
                        per_step_accepted=list(m.per_step_accepted) if m is not None else None,
                        per_step_drafted=list(m.per_step_drafted) if m is not None else None,
                    )
                )
        # the live adaptive proposer over the model drafter: rows per decision in this cell
        counts = {m: n - counts0.get(m, 0) for m, n in self._adaptive_counts().items()}
        mem = MemoryInfo(**vars(self.memory))
        mem.peak_rss_bytes = peak_rss_bytes()
        prof = self.profiler
        result = CellResult(
            cell_id=cell.cell_id,
            status="ok",
            output_tokens=sum(len(r.output_token_ids) for r in requests),
            elapsed_s=elapsed,
            steps=steps,
            requests=requests,
            time_split_s=TimeSplit(propose=prof.propose_s, verify=prof.verify_s, other=prof.other_s),
            memory=mem,
            spec_counters=counters_delta(spec_metrics(self.llm), before)
            if sd and before is not None
            else None,
            # the 1-minute load average around the cell: on a shared machine, a value above the core count
            # means other processes competed for the CPU and the timings are inflated
            engine_info=dict(
                self.info,
                profiled_steps=prof.steps,
                **({"adaptive_counts": counts} if self.adaptive else {}),
                loadavg_start=load0,
                loadavg_end=loadavg(),
                cpus=os.cpu_count(),
                # share of the cell's wall time in which some task waited for a CPU (Linux PSI): unlike the
                # load average (a 1-minute mean) it covers exactly this cell
                cpu_pressure=round((stall1 - stall0) / 1e6 / elapsed, 3)
                if stall0 is not None and stall1 is not None and elapsed > 0
                else None,
            ),
        )
        return result


def cpu_stall_us() -> int | None:
    """Microseconds in which some task waited for a CPU since boot (/proc/pressure/cpu "some" total)."""
    try:
        for line in Path("/proc/pressure/cpu").read_text().splitlines():
            if line.startswith("some "):
                return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _failed(cell: CellSpec, error: str, info: dict[str, Any] | None = None) -> CellResult:
    return CellResult(cell_id=cell.cell_id, status="failed", error=error, engine_info=info or {})


def _short(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[-1] if msg else ''}"[:2000]


def job_is_seeded(job: Job) -> bool:
    """Whether any request of the job samples under a seed (vLLM then keeps a generator for it)."""
    return any(p.sampling and p.sampling.get("seed") is not None for c in job.cells for p in c.prompts)


def run_job(job: Job, out: str) -> int:
    try:
        engine = Engine(job.engine, seeded=job_is_seeded(job))
    except SpeclabError as exc:
        for c in job.cells:
            append_result(out, _failed(c, f"engine setup: {exc}"))
        print(f"speclab worker: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        traceback.print_exc()
        for c in job.cells:
            append_result(out, _failed(c, f"engine start failed: {_short(exc)}"))
        return 1
    print(f"speclab worker: engine started in {engine.startup_s:.1f} s", file=sys.stderr, flush=True)
    if job.warmup:
        try:
            engine.warmup(job.cells[0])
        except Exception:
            traceback.print_exc()
    if job.gate:
        # gated (repeats interleaved across engines): say we are warm, then run what the runner asks for
        by_id = {c.cell_id: c for c in job.cells}
        gate_ready_path(job.gate).touch()
        for cell_id in gate_lines(job.gate):
            if cell_id in by_id:
                _run_one(engine, by_id[cell_id], job, out)
        return 0
    for cell in job.cells:
        _run_one(engine, cell, job, out)
    return 0


def _run_one(engine: Engine, cell: CellSpec, job: Job, out: str) -> None:
    # SPECLAB_CPROFILE=DIR: a cProfile of each cell to DIR/CELL_ID.prof (where the time outside the model
    # goes; it slows the cell, so its speed means nothing)
    prof_dir = os.environ.get("SPECLAB_CPROFILE")
    profile = None
    if prof_dir:
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    try:
        res = engine.run_cell(cell)
    except Exception as exc:
        traceback.print_exc()
        res = _failed(cell, _short(exc), engine.info)
    if profile is not None:
        profile.disable()
        Path(prof_dir).mkdir(parents=True, exist_ok=True)
        profile.dump_stats(str(Path(prof_dir) / f"{cell.cell_id}.prof"))
    append_result(out, res)
    if res.status == "ok" and job.timings_csv:
        try:
            temp = f"{cell_temperature(p.sampling for p in cell.prompts):g}"  # the timings' last column
            append_timings(job.timings_csv, ([*r.as_list(), temp] for r in engine.profiler.rows))
        except OSError as exc:
            print(f"speclab worker: cannot append timings: {exc}", file=sys.stderr)
    print(
        f"speclab worker: cell {cell.cell_id}: {res.status}"
        + (
            f" {res.output_tokens} tokens in {res.elapsed_s:.2f} s"
            if res.status == "ok"
            else f" ({res.error})"
        ),
        file=sys.stderr,
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m speclab.engine.worker", description=__doc__.splitlines()[0])
    ap.add_argument("--job", required=True, help="JOB.json (speclab.engine.protocol.Job)")
    ap.add_argument("--out", required=True, help="CELLS.jsonl to append one result line per cell to")
    args = ap.parse_args(argv)
    try:
        job = read_job(args.job)
    except SpeclabError as exc:
        print(f"speclab worker: {exc}", file=sys.stderr)
        return 2
    return run_job(job, args.out)


if __name__ == "__main__":
    sys.exit(main())
