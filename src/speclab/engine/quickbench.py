"""A quick engine measurement on the built-in smoke prompts, without a sweep file.

    python -m speclab.engine.quickbench --methods none,ngram --batch 1,16 --prompts 4 --max-tokens 64

One worker (one engine) per method, all batch sizes as cells of that engine; prints throughput, speedup vs
`none`, acceptance, the time split and whether outputs equal the `none` outputs token for token. Use
`speclab bench` for real sweeps (workloads, resume, traces); this is for checking an install or a machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from speclab.engine.launch import launch_worker
from speclab.engine.protocol import CellResult, CellSpec, EngineSpec, Job, PromptSpec, read_results, write_job
from speclab.engine.smoke import SMOKE_PROMPTS, render_chat
from speclab.models import resolve_model

DEFAULT_OPTIONS = {
    "ngram": {"prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "draft_model": {"model": "smollm2-135m-draft-l8"},
    "suffix": {"suffix_decoding_max_cached_requests": 0},  # no global tree: no cross-request memory
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m speclab.engine.quickbench", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--methods", default="none,ngram", help="comma list: none,ngram,suffix,draft_model")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batch", default="1,16", help="comma list of batch sizes")
    ap.add_argument("--batching", default="replicate", choices=["replicate", "continuous"])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--eager", action="store_true", help="enforce_eager (fast start, slower steps)")
    ap.add_argument("--kv-cache-gib", type=float, default=2.0)
    ap.add_argument(
        "--repeat", type=int, default=1, help="run each batch size N times in the engine; report the fastest"
    )
    ap.add_argument("--draft", default=None, help="drafter for draft_model (default smollm2-135m-draft-l8)")
    ap.add_argument("--out", default=None, help="directory for jobs, results, logs and timings.csv")
    args = ap.parse_args(argv)

    out = Path(args.out or tempfile.mkdtemp(prefix="speclab-quickbench-"))
    out.mkdir(parents=True, exist_ok=True)
    target = resolve_model(args.target, args.dtype)
    ids = render_chat(target, SMOKE_PROMPTS[: args.prompts])
    prompts = [PromptSpec(f"p{i}", x) for i, x in enumerate(ids)]
    batches = [int(b) for b in args.batch.split(",")]
    results: dict[str, list[CellResult]] = {}
    for method in args.methods.split(","):
        k = None if method == "none" else args.k
        spec = EngineSpec(
            target=args.target,
            dtype=args.dtype,
            method=method,
            k=k,
            options=dict(
                DEFAULT_OPTIONS.get(method, {}),
                **({"model": args.draft} if args.draft and method == "draft_model" else {}),
            ),
            max_model_len=max(len(x) for x in ids) + args.max_tokens + 16,
            max_num_seqs=max(batches),
            enforce_eager=args.eager,
            kv_cache_gib=args.kv_cache_gib,
        )
        # repeats interleave the batch sizes (b1, b16, b1, b16, ...) so slow phases of a shared machine
        # hit every batch size; the table keeps the fastest repeat (least disturbed)
        cells = [
            CellSpec(f"{method}-b{b}-r{i}", args.batching, b, args.max_tokens, prompts)
            for i in range(args.repeat)
            for b in batches
        ]
        job = Job(spec, cells, timings_csv=str(out / "timings.csv"))
        write_job(job, out / f"job-{method}.json")
        cells_path = out / f"cells-{method}.jsonl"
        if cells_path.exists():
            cells_path.unlink()
        t0 = time.perf_counter()
        with open(out / f"worker-{method}.log", "w") as log:
            rc = launch_worker(out / f"job-{method}.json", cells_path, log=log).wait()
        wall = time.perf_counter() - t0
        results[method] = read_results(cells_path)
        print(
            f"# {method}: worker rc={rc}, wall {wall:.1f} s, log {out / f'worker-{method}.log'}", flush=True
        )
    _print_table(results)
    print(f"# results in {out}")
    return 0


def _best(rs: list[CellResult]) -> tuple[dict[str, CellResult], dict[str, list[float]]]:
    """Per batch size: the fastest ok repeat, and all repeats' elapsed seconds."""
    best: dict[str, CellResult] = {}
    times: dict[str, list[float]] = {}
    for r in rs:
        b = r.cell_id.split("-b", 1)[1].split("-r", 1)[0]
        if r.status != "ok":
            best.setdefault(b, r)
            continue
        times.setdefault(b, []).append(r.elapsed_s)
        if best.get(b) is None or best[b].status != "ok" or r.elapsed_s < best[b].elapsed_s:
            best[b] = r
    return best, times


def _print_table(results: dict[str, list[CellResult]]) -> None:
    base, _ = _best(results.get("none", []))
    print(
        "method       batch  startup_s  tokens  elapsed_s (all repeats)     tok/s   speedup  mean_acc_len  "
        "propose%  verify%  other%  ms/step  lossless  load(1m)"
    )
    for method, rs in results.items():
        best, times = _best(rs)
        for b, r in best.items():
            if r.status != "ok":
                print(f"{method:12s} {b:>5s}  FAILED: {r.error}")
                continue
            tps = r.output_tokens / r.elapsed_s if r.elapsed_s else 0.0
            ref = base.get(b)
            speed = lossless = "-"
            if ref is not None and ref.status == "ok" and method != "none":
                speed = f"{tps / (ref.output_tokens / ref.elapsed_s):.2f}x"
                same = [
                    q.output_token_ids == p.output_token_ids
                    for q, p in zip(r.requests, ref.requests, strict=True)
                ]
                lossless = f"{sum(same)}/{len(same)}"
            acc = "-"
            sc = r.spec_counters
            if sc is not None and sc.num_drafts:
                acc = f"{1 + sc.num_accepted_tokens / sc.num_drafts:.2f}"
            ts = r.time_split_s
            tot = (ts.propose + ts.verify + ts.other) or 1.0
            ms = 1000 * tot / r.steps if r.steps else 0.0
            allt = ",".join(f"{t:.1f}" for t in times.get(b, []))
            print(
                f"{method:12s} {b:>5s}  {r.engine_info.get('startup_s', 0):9.1f}  {r.output_tokens:6d}  "
                f"{r.elapsed_s:9.2f} ({allt:14s})  {tps:6.1f}  {speed:>7s}  {acc:>12s}  "
                f"{100 * ts.propose / tot:8.1f}  {100 * ts.verify / tot:7.1f}  {100 * ts.other / tot:6.1f}  "
                f"{ms:7.1f}  {lossless:>8s}  {r.engine_info.get('loadavg_start')}->{r.engine_info.get('loadavg_end')}"
            )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
