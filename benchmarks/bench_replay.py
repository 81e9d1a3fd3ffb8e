"""Replay speed: N requests x T output tokens x k_max, per method (default 100 x 256 x 20, ngram + suffix).

    .venv/bin/python benchmarks/bench_replay.py                       # synthetic requests
    .venv/bin/python benchmarks/bench_replay.py --from RUN_OR_STORE   # real token ids (first N records)
    .venv/bin/python benchmarks/bench_replay.py --methods draft_model --draft-model smollm2-135m-draft-l8 -n 4

Synthetic requests imitate code editing: a 256-token prompt over a 32k vocabulary (Zipf-distributed) and an
output that copies prompt spans of 5-60 tokens between short novel stretches, so lookups both hit and miss.

With `suffix` among the methods it also times, side by side in the same run and on the same requests, the
suffix replay speclab had before (its own Python count trie, kept below only as the baseline being compared
against: it is not speclab's suffix method any more, which is arctic-inference's cache as vLLM runs it), and
prints the ratio. The two do not propose the same tokens (different algorithms); the timing is per position.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field

import numpy as np

from speclab.methods.suffix import acc_len_at
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


# --- baseline only: speclab's former suffix replay (a depth-limited Python count trie) -------------------
_STRIDE = 1 << 24  # child key = node * _STRIDE + token; tokens are checked to be < 2**24 per request


class _OldCountTrie:
    """Depth-limited trie of all substrings of the appended text, with counts (the former implementation)."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.child: dict[int, int] = {}
        self.count, self.depth, self.token, self.best, self.child_total = [0], [0], [-1], [-1], [0]

    def append(self, frontier: list[int], tok: int) -> list[int]:
        child, count, best, child_total, depth = (
            self.child,
            self.count,
            self.best,
            self.child_total,
            self.depth,
        )
        new: list[int] = []
        for d, node in enumerate((0, *frontier), start=1):
            key = node * _STRIDE + tok
            c = child.get(key)
            if c is None:
                c = len(count)
                child[key] = c
                count.append(1)
                depth.append(d)
                self.token.append(tok)
                best.append(-1)
                child_total.append(0)
            else:
                count[c] += 1
            child_total[node] += 1
            b = best[node]
            if b < 0 or (b != c and count[c] > count[b]):
                best[node] = c
            if d < self.max_depth:
                new.append(c)
        return new

    def follow(self, frontier: list[int], tok: int, max_len: int) -> list[int]:
        child, depth = self.child, self.depth
        new: list[int] = []
        for node in (0, *frontier):
            c = child.get(node * _STRIDE + tok)
            if c is not None and depth[c] <= max_len:
                new.append(c)
        return new

    def speculate(self, frontier: list[int], max_match: int, k: int, min_prob: float, spec_factor: float):
        depth, child_total = self.depth, self.child_total
        node = next((c for c in reversed(frontier) if depth[c] <= max_match and child_total[c] > 0), -1)
        if node < 0:
            return [], 0.0
        limit = min(k, math.ceil(spec_factor * depth[node]))
        out: list[int] = []
        prob, score = 1.0, 0.0
        while len(out) < limit:
            b = self.best[node]
            if b < 0:
                break
            prob *= self.count[b] / child_total[node]
            if prob < min_prob:
                break
            out.append(self.token[b])
            score += prob
            node = b
        return out, score


@dataclass
class OldSuffixTrie:
    """The former replay: local trie (prompt + output so far) and a global trie of earlier outputs."""

    max_depth: int = 32
    max_match: int = 12
    min_prob: float = 0.1
    spec_factor: float = 2.0
    global_trie: _OldCountTrie = field(init=False)

    def __post_init__(self) -> None:
        self.global_trie = _OldCountTrie(self.max_depth)

    def replay(
        self, prompt_ids: np.ndarray, output_ids: np.ndarray, k_max: int
    ) -> tuple[np.ndarray, np.ndarray]:
        if len(prompt_ids) and max(int(np.max(prompt_ids)), int(np.max(output_ids, initial=0))) >= _STRIDE:
            raise ValueError("token ids >= 2**24 do not fit the baseline trie's key packing")
        out = [int(t) for t in np.asarray(output_ids).tolist()]
        n = len(out)
        acc, nprop = np.ones(n, dtype=np.int32), np.zeros(n, dtype=np.int32)
        local, g = _OldCountTrie(self.max_depth), self.global_trie
        lfront: list[int] = []
        gfront: list[int] = []
        for t in np.asarray(prompt_ids).tolist():
            lfront = local.append(lfront, int(t))
            gfront = g.follow(gfront, int(t), self.max_match)
        args = (self.max_match, k_max, self.min_prob, self.spec_factor)
        for p in range(n):
            d, score = local.speculate(lfront, *args)
            if gfront:
                gd, gs = g.speculate(gfront, *args)
                if gs > score:
                    d = gd
            nprop[p] = len(d)
            acc[p] = acc_len_at(d, out, p)
            lfront = local.append(lfront, out[p])
            gfront = g.follow(gfront, out[p], self.max_match)
        front: list[int] = []
        for t in out:  # the finished output enters the global trie
            front = g.append(front, t)
        return acc, nprop


def compare_suffix(recs: list[RequestTrace], k_max: int) -> None:
    """Old trie vs arctic-inference's cache, same requests, same loop, one after the other (twice, to
    expose drift on a shared machine)."""
    from speclab.methods.suffix import SuffixSpeculator

    positions = sum(r.output_len for r in recs)
    times: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(2):
        for name, make in (("old", OldSuffixTrie), ("new", SuffixSpeculator)):
            prop = make()
            t0 = time.perf_counter()
            for r in recs:
                prop.replay(r.prompt_token_ids, r.output_token_ids, k_max)
            times[name].append(time.perf_counter() - t0)
    old, new = min(times["old"]), min(times["new"])
    print(f"suffix, former Python trie (baseline) {1e6 * old / positions:7.1f} us/position")
    print(f"suffix, arctic-inference cache (now)  {1e6 * new / positions:7.1f} us/position")
    print(f"suffix replay speed-up: {old / new:.2f}x (best of 2 each, same requests, side by side)")


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
    mlist = [x.strip() for x in a.methods.split(",") if x.strip()]
    if "suffix" in mlist:
        compare_suffix(recs, a.k_max)
    for m in mlist:
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
