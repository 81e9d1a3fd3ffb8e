"""Replay speed: N requests x T output tokens x k_max, per method (default 100 x 256 x 20, ngram + suffix).

    .venv/bin/python benchmarks/bench_replay.py                       # synthetic requests
    .venv/bin/python benchmarks/bench_replay.py --from RUN_OR_STORE   # real token ids (first N records)
    .venv/bin/python benchmarks/bench_replay.py --methods draft_model --draft-model smollm2-135m-draft-l8 -n 4

Synthetic requests imitate code editing: a 256-token prompt over a 32k vocabulary (Zipf-distributed) and an
output that copies prompt spans of 5-60 tokens between short novel stretches, so lookups both hit and miss.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from speclab.replay.replay import load_records, replay_records
from speclab.traces import RequestTrace


def synthetic(n: int, out_len: int, prompt_len: int, seed: int = 0) -> list[RequestTrace]:
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n):
        prompt = (rng.zipf(1.3, size=prompt_len) % 32000).astype(np.int32)
        out: list[int] = []
        while len(out) < out_len:
            if rng.random() < 0.6:
                s = int(rng.integers(0, prompt_len - 5))
                out.extend(prompt[s : s + int(rng.integers(5, 60))].tolist())
            else:
                out.extend((rng.zipf(1.3, size=int(rng.integers(1, 20))) % 32000).tolist())
        out_arr = np.asarray(out[:out_len], dtype=np.int32)
        recs.append(RequestTrace(f"syn-{i}", "synthetic", "code-editing", prompt_len, out_len,
                                 prompt_token_ids=prompt, output_token_ids=out_arr))  # fmt: skip
    return recs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--requests", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per synthetic request")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--k-max", type=int, default=20)
    ap.add_argument("--methods", default="ngram,suffix")
    ap.add_argument("--from", dest="source", default=None)
    ap.add_argument("--draft-model", default=None)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.source:
        recs = [r for r in load_records(a.source) if r.output_token_ids is not None][: a.requests]
        what = f"{len(recs)} records from {a.source}"
    else:
        recs = synthetic(a.requests, a.tokens, a.prompt_tokens)
        what = f"{a.requests} synthetic requests x {a.tokens} output tokens (prompt {a.prompt_tokens})"
    positions = sum(r.output_len for r in recs)
    print(f"{what}; {positions} positions; k_max {a.k_max}")
    options: dict = {}
    if a.draft_model:
        from speclab.models.prepare import resolve_model

        options["draft_model"] = {"model": str(resolve_model(a.draft_model)), "threads": a.threads}
    for m in [x.strip() for x in a.methods.split(",") if x.strip()]:
        fresh = [RequestTrace(r.id, r.workload, r.category, r.prompt_len, r.output_len,
                              prompt_token_ids=r.prompt_token_ids, output_token_ids=r.output_token_ids)
                 for r in recs]  # fmt: skip
        t0 = time.perf_counter()
        out = replay_records(fresh, [m], a.k_max, options)
        dt = time.perf_counter() - t0
        acc = np.concatenate([r.methods[m].acc_len[1:] for r in out])
        prop = np.concatenate([r.methods[m].num_proposed[1:] > 0 for r in out])
        print(
            f"{m:12s} {dt:8.2f} s  ({1e6 * dt / positions:7.1f} us/position)  "
            f"mean acc_len {acc.mean():.2f}  proposal rate {prop.mean():.2f}"
        )


if __name__ == "__main__":
    main()
