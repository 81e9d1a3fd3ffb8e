"""Suffix speculation: a frequency trie over the request's own text and earlier outputs of the workload.

In the spirit of SuffixDecoding (Oliaro et al., arXiv 2411.04975), written from the idea, not from
arctic-inference's code. How it works here:

- A `CountTrie` holds every substring (up to `max_depth` tokens) of the text inserted into it, with a count
  per node. Text is appended token by token: a "frontier" of the nodes for the current suffixes (lengths
  1..max_depth-1) is advanced by one token, so appending costs O(max_depth) and nothing is ever rebuilt.
  Each node keeps its most frequent child and the total count of its children, so a greedy walk is O(1)
  per token.
- Two tries per request: the local one (the request's prompt plus its output so far) and the global one
  (outputs of the requests that finished earlier, in workload order). The global trie is read-only while a
  request runs; the request's output is added when it finishes.
- To speculate after a context: in each trie take the longest suffix of the context (at most `max_match`
  tokens) whose node has a continuation, then walk the most frequent child while the product of the
  branch probabilities (child count / all children's count) stays >= `min_prob`, for at most
  min(k, ceil(spec_factor * match length)) tokens. Of the two chains, keep the one with the larger
  expected accepted length (sum of the running products); the local one on ties.

Differences from arctic-inference's SuffixDecodingCache: a depth-limited count trie with an incremental
frontier instead of a compressed suffix tree; a chain (not a tree) is proposed, which is also all vLLM
verifies; match length and speculation depth are capped separately (`max_match`, `max_depth`); the
global trie keeps every earlier output (no eviction) and holds outputs only, not prompts.

The replay (`replay`) drives exactly the same object the live vLLM adapter drives, one token at a time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from speclab.errors import ConfigError

_STRIDE = 1 << 24  # child key = node * _STRIDE + token (token ids are < 2**24)


class CountTrie:
    """Depth-limited trie of all substrings of the appended text, with counts."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.child: dict[int, int] = {}
        self.count: list[int] = [0]
        self.depth: list[int] = [0]
        self.token: list[int] = [-1]
        self.best: list[int] = [-1]  # most frequent child (first seen wins ties)
        self.child_total: list[int] = [0]

    def __len__(self) -> int:
        return len(self.count)

    def append(self, frontier: list[int], tok: int) -> list[int]:
        """Insert one more token of a stream whose current suffix nodes are `frontier` (depth ascending,
        root excluded); return the new frontier."""
        # hot loop: node creation is inlined (most suffixes of fresh text are new nodes)
        child, count, best, child_total, depth = (
            self.child,
            self.count,
            self.best,
            self.child_total,
            self.depth,
        )
        token = self.token
        max_depth = self.max_depth
        new: list[int] = []
        # frontier depths are 1, 2, 3, ...: the child of the d-th visited node (root first) has depth d
        for d, node in enumerate((0, *frontier), start=1):
            key = node * _STRIDE + tok
            c = child.get(key)
            if c is None:
                c = len(count)
                child[key] = c
                count.append(1)
                depth.append(d)
                token.append(tok)
                best.append(-1)
                child_total.append(0)
            else:
                count[c] += 1
            child_total[node] += 1
            b = best[node]
            if b < 0 or (b != c and count[c] > count[b]):
                best[node] = c
            if d < max_depth:
                new.append(c)
        return new

    def follow(self, frontier: list[int], tok: int, max_len: int) -> list[int]:
        """Advance a read-only match frontier (nodes of suffixes present in the trie) by one token."""
        child, depth = self.child, self.depth
        new: list[int] = []
        for node in (0, *frontier):
            c = child.get(node * _STRIDE + tok)
            if c is not None and depth[c] <= max_len:
                new.append(c)
        return new

    def speculate(
        self, frontier: Sequence[int], max_match: int, k: int, min_prob: float, spec_factor: float
    ) -> tuple[list[int], float, int]:
        """Chain from the deepest frontier node (depth <= max_match) that has a continuation.
        Returns (tokens, score, match_len)."""
        depth, child_total = self.depth, self.child_total
        node = -1
        for cand in reversed(frontier):
            if depth[cand] <= max_match and child_total[cand] > 0:
                node = cand
                break
        if node < 0:
            return [], 0.0, 0
        m = depth[node]
        limit = min(k, math.ceil(spec_factor * m))
        out: list[int] = []
        prob = 1.0
        score = 0.0
        best, count, token = self.best, self.count, self.token
        while len(out) < limit:
            b = best[node]
            if b < 0:
                break
            prob *= count[b] / child_total[node]
            if prob < min_prob:
                break
            out.append(token[b])
            score += prob
            node = b
        return out, score, m


@dataclass
class SuffixRequest:
    """Per-request state: the local trie and the two match frontiers."""

    local: CountTrie
    lfront: list[int] = field(default_factory=list)
    gfront: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)


@dataclass
class SuffixSpeculator:
    """Suffix speculation over one workload. Lifecycle per request: `req = start_request(prompt)`,
    then `speculate(req, k)` / `extend(req, new_tokens)` alternately, and `finish_request(req)`."""

    max_depth: int = 32
    max_match: int = 12
    min_prob: float = 0.1
    spec_factor: float = 2.0
    use_global: bool = True
    global_trie: CountTrie = field(init=False)

    name = "suffix"

    def __post_init__(self) -> None:
        if not (1 <= self.max_match < self.max_depth):
            raise ConfigError(
                f"suffix: need 1 <= max_match ({self.max_match}) < max_depth ({self.max_depth})"
            )
        if not (0.0 <= self.min_prob <= 1.0) or self.spec_factor <= 0:
            raise ConfigError("suffix: need 0 <= min_prob <= 1 and spec_factor > 0")
        self.global_trie = CountTrie(self.max_depth)

    # --- request lifecycle ------------------------------------------------------------------------
    def start_request(self, prompt_ids: Iterable[int]) -> SuffixRequest:
        req = SuffixRequest(local=CountTrie(self.max_depth))
        self._feed(req, prompt_ids, is_output=False)
        return req

    def extend(self, req: SuffixRequest, token_ids: Iterable[int]) -> None:
        """Append tokens the target produced (they become part of the request's output)."""
        self._feed(req, token_ids, is_output=True)

    def _feed(self, req: SuffixRequest, token_ids: Iterable[int], is_output: bool) -> None:
        local, g = req.local, self.global_trie
        for t in token_ids:
            t = int(t)
            req.lfront = local.append(req.lfront, t)
            if self.use_global:
                req.gfront = g.follow(req.gfront, t, self.max_match)
            if is_output:
                req.output.append(t)

    def finish_request(self, req: SuffixRequest) -> None:
        """Add the finished request's output to the global trie."""
        if req.output:
            self.remember(req.output)
        req.output = []

    def speculate(self, req: SuffixRequest, k: int) -> list[int]:
        args = (self.max_match, k, self.min_prob, self.spec_factor)
        toks, score, _ = req.local.speculate(req.lfront, *args)
        if self.use_global and req.gfront:
            gt, gs, _ = self.global_trie.speculate(req.gfront, *args)
            if gs > score:
                toks = gt
        return toks

    # --- replay -----------------------------------------------------------------------------------
    def remember(self, output_ids: Iterable[int]) -> None:
        """Add a finished output to the global trie."""
        if self.use_global:
            front: list[int] = []
            for t in output_ids:
                front = self.global_trie.append(front, int(t))

    def replay(
        self, prompt_ids: np.ndarray, output_ids: np.ndarray, k_max: int, remember: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """Replay one request, then (if `remember`) add its output to the global trie, as live serving
        would."""
        out = [int(t) for t in np.asarray(output_ids).tolist()]
        n = len(out)
        acc = np.ones(n, dtype=np.int32)
        nprop = np.zeros(n, dtype=np.int32)
        req = self.start_request(np.asarray(prompt_ids).tolist())
        for p in range(n):
            d = self.speculate(req, k_max)
            nprop[p] = len(d)
            a = 0
            for j, t in enumerate(d):
                if p + j >= n or out[p + j] != t:
                    break
                a += 1
            acc[p] = a + 1
            self.extend(req, (out[p],))
        if remember:
            self.finish_request(req)
        return acc, nprop
