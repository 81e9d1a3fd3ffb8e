"""Where a speculative engine's step time goes outside the target's forward, against a no-SD engine.

    python benchmarks/sd_path_split.py [--batch 16] [--tokens 48] [--rounds 2] [--eager]

Runs, one engine at a time (a child process each, rounds interleaved): `none`; `ngram-never` (vLLM's n-gram
with a 48-token match window, which never matches on these prompts: the speculative path with no drafts,
what every SD engine pays at a step where it drafts nothing); `ngram-never-plain` (the same, with the
hybrid's plain sampling of draft-free steps, speclab.methods.hybrid_live); `eagle3-off` and
`eagle3-off-noplain` (the hybrid's EAGLE-3 engine, its proposal replaced by "no drafts": the engine path
the hybrid pays where it is off, with and without plain sampling). Each engine generates `--tokens`
tokens for `--batch` copies of the smoke prompts (replicated batch), with timers around the runner's and
scheduler's pieces (instance attributes, as speclab's step profiler wraps them). Prints the median
milliseconds per engine step of each piece per variant, the difference to `none`, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

HEAD = "smollm2-135m-eagle3-chat16x"  # a cached head (docs/drafters.md); untouched: it never drafts here
PIECES = {
    "runner": ["_prepare_inputs", "_model_forward", "_sample", "_bookkeeping_sync", "propose_draft_token_ids",
               "execute_model", "sample_tokens"],
    "scheduler": ["schedule", "update_from_output"],
}  # fmt: skip


def child(variant: str, batch: int, tokens: int, eager: bool) -> dict[str, float]:
    from speclab.engine.protocol import EngineSpec
    from speclab.engine.smoke import SMOKE_PROMPTS, render_chat
    from speclab.engine.worker import Engine

    if variant == "none":
        spec = EngineSpec("smollm2-135m", "float32", "none", None, {}, 1024, batch, eager, 1.0)
    elif variant.startswith("eagle3-off"):
        plain = not variant.endswith("-noplain")
        opts = {"model": HEAD, "proposer_options": {"kmax_model": 3, "plain_sampling": plain}}
        spec = EngineSpec("smollm2-135m", "float32", "eagle3", 8, opts, 1024, batch, eager, 1.0)
    else:
        opts = {"prompt_lookup_min": 48, "prompt_lookup_max": 48}
        spec = EngineSpec("smollm2-135m", "float32", "ngram", 5, opts, 1024, batch, eager, 1.0)
    eng = Engine(spec)
    runner = eng.runner
    if variant.endswith("-plain"):
        from speclab.methods.hybrid_live import _sample_plainly_without_drafts

        class _Count:
            plain_steps = 0

        _sample_plainly_without_drafts(runner, _Count())
    if variant.startswith("eagle3-off"):
        # the hybrid's engine with its driver answering "no drafts" for free: the EAGLE-3 engine path alone
        def no_drafts(scheduler_output: Any, sampled_token_ids: Any, *a: Any, **k: Any) -> list[list[int]]:
            return [[] for _ in sampled_token_ids]

        runner.propose_draft_token_ids = no_drafts
    sched = eng.engine.engine_core.engine_core.scheduler
    times: dict[str, list[float]] = defaultdict(list)

    def wrap(obj: Any, name: str) -> None:
        fn = getattr(obj, name)

        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                times[name].append(time.perf_counter() - t0)

        setattr(obj, name, timed)

    for name in PIECES["runner"]:
        if hasattr(runner, name):
            wrap(runner, name)
    for name in PIECES["scheduler"]:
        wrap(sched, name)
    ids = render_chat(eng.target, SMOKE_PROMPTS[:1])[0]
    eng.drive([("warm", ids)], 1, 8)
    for v in times.values():
        v.clear()
    reqs = [(i, ids) for i in range(batch)]
    t0 = time.perf_counter()
    _, steps = eng.drive(reqs, batch, tokens)
    wall = time.perf_counter() - t0
    out = {name: 1e3 * statistics.median(v) for name, v in times.items() if v}
    out["step (wall / steps)"] = 1e3 * wall / steps
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--variants", default="none,ngram-never,ngram-never-plain")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.batch, args.tokens, args.eager)), flush=True)
        return 0
    from speclab.engine.launch import worker_env

    variants = args.variants.split(",")
    res: dict[str, list[dict[str, float]]] = defaultdict(list)
    print(f"# load average at start: {os.getloadavg()}", flush=True)
    for r in range(args.rounds):
        for v in variants:  # interleaved: a slow phase of the machine hits every variant
            cmd = [
                sys.executable,
                __file__,
                "--child",
                v,
                "--batch",
                str(args.batch),
                "--tokens",
                str(args.tokens),
            ]
            cmd += ["--eager"] if args.eager else []
            p = subprocess.run(cmd, env=worker_env(1.0), capture_output=True, text=True, timeout=1200)
            line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(p.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{v}: no result")
            res[v].append(json.loads(line[7:]))
            print(f"# round {r + 1} {v}: step {res[v][-1]['step (wall / steps)']:.2f} ms", flush=True)
    names = list(res[variants[0]][0])
    print(
        f"\nmedian ms per call over {args.rounds} rounds (each round's value: the median call), B = {args.batch}"
    )
    print(f"{'piece':28s}" + "".join(f"{v:>22s}" for v in variants))
    for n in names:
        row = []
        for v in variants:
            vals = [x[n] for x in res[v] if n in x]
            row.append(statistics.median(vals) if vals else float("nan"))
        base = row[0]
        cells = "".join(f"{x:12.3f} ({x - base:+6.3f})" if x == x else f"{'-':>22s}" for x in row)
        print(f"{n:28s}{cells}")
    print(f"# load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
