"""What `speclab profile` measures: one engine per configuration (no SD, then each method at each k), each
running a sparse grid of shapes as replicate cells of one synthetic prompt.

A replicate cell of batch B with one prompt of L tokens and T output tokens gives one prefill forward of
B * L batched tokens (KV 0), then T - 1 decode (or verify) steps of B requests with KV growing from B * L.
So the grid spans batched tokens 1..512 (prefills of B * L up to 512, decodes of B, verifies of B * (k+1))
and KV tokens up to ~1,500 per request, with a few cells per decade instead of a full product: on 2 CPU
cores an engine start (~70-90 s) costs more than its whole grid. Every fourth cell is held out of the fit.

The prompts are random token ids (the target's forward time does not depend on which tokens); the drafter
cells repeat a block of the prompt so that lookup proposers (n-gram, suffix) find matches and draft.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from speclab.catalog import ENGINE_METHODS
from speclab.costmodel.holdout import HOLDOUT_EVERY
from speclab.engine.protocol import CellSpec, EngineSpec, Job, PromptSpec
from speclab.errors import ConfigError

# (batch size, prompt tokens): prefills of 16..512 tokens at every batch size, long contexts at small batch
TARGET_SHAPES: tuple[tuple[int, int], ...] = (
    (1, 16), (1, 128), (1, 512), (1, 1400),
    (2, 64), (2, 256), (4, 32), (4, 128),
    (8, 16), (8, 64), (16, 32), (32, 16),
)  # fmt: skip
TARGET_MAX_TOKENS = 12
DRAFT_SHAPES: tuple[tuple[int, int], ...] = ((1, 64), (1, 512), (4, 64), (8, 128), (16, 32))
DRAFT_MAX_TOKENS = 24
VOCAB_LOW, VOCAB_HIGH = 100, 30_000  # token ids valid in any Llama-family vocabulary
DEFAULT_OPTIONS: dict[str, dict[str, object]] = {
    "ngram": {"prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "suffix": {"suffix_decoding_max_cached_requests": 0},
    "draft_model": {"model": "smollm2-135m-draft-l8"},
}


@dataclass
class ProfileCell:
    cell_id: str
    batch_size: int
    prompt_len: int
    max_tokens: int
    holdout: bool


@dataclass
class ProfileEngine:
    label: str  # "none" or "<method>-k<k>"
    spec: EngineSpec
    cells: list[ProfileCell] = field(default_factory=list)
    prompts: dict[str, list[int]] = field(default_factory=dict)  # cell id -> prompt token ids

    def job(self, timings_csv: str) -> Job:
        cells = [
            CellSpec(
                c.cell_id, "replicate", c.batch_size, c.max_tokens, [PromptSpec("p", self.prompts[c.cell_id])]
            )
            for c in self.cells
        ]
        return Job(self.spec, cells, timings_csv=timings_csv)


def parse_methods(methods: str | None, ks: str | None) -> list[tuple[str, int]]:
    """`--methods ngram,suffix --ks 1,3` -> [(ngram, 1), (ngram, 3), (suffix, 1), (suffix, 3)];
    `METHOD:K` fixes one method's k (`ngram:3,suffix:8`)."""

    def ints(text: str, what: str) -> list[int]:
        try:
            out = [int(x) for x in text.split("/" if what != "--ks" else ",") if x.strip()]
        except ValueError:
            raise ConfigError(f"{what} {text!r}: expected integers") from None
        if not out or min(out) < 1:
            raise ConfigError(f"{what} {text!r}: need integers >= 1")
        return out

    default_ks = ints(ks or "3", "--ks")
    out: list[tuple[str, int]] = []
    for item in (methods or "").split(","):
        name, _, kk = item.strip().partition(":")
        if not name or name == "none":
            continue
        if name not in ENGINE_METHODS:
            raise ConfigError(f"--methods: unknown method {name!r} (known: {', '.join(ENGINE_METHODS)})")
        out += [(name, k) for k in (ints(kk, f"--methods {name}:") if kk else default_ks)]
    return out


def _prompt(rng: np.random.Generator, n: int, repeat: bool) -> list[int]:
    if not repeat:
        return rng.integers(VOCAB_LOW, VOCAB_HIGH, size=n).tolist()
    block = rng.integers(VOCAB_LOW, VOCAB_HIGH, size=min(16, n)).tolist()
    return (block * (n // len(block) + 1))[:n]


def plan_profile(
    target: str,
    methods: list[tuple[str, int]],
    dtype: str = "float32",
    options: dict[str, dict[str, object]] | None = None,
    enforce_eager: bool = False,
    kv_cache_gib: float = 2.0,
    seed: int = 0,
    max_batched: int = 512,
) -> list[ProfileEngine]:
    """The engines and their cells; shapes whose prefill exceeds max_batched tokens are left out."""
    rng = np.random.default_rng(seed)
    opts = {**DEFAULT_OPTIONS, **(options or {})}
    engines = []
    for method, k in [("none", 0), *methods]:
        shapes = TARGET_SHAPES if method == "none" else DRAFT_SHAPES
        shapes = tuple((b, L) for b, L in shapes if b * L <= max(max_batched, L))
        max_tokens = TARGET_MAX_TOKENS if method == "none" else DRAFT_MAX_TOKENS
        label = "none" if method == "none" else f"{method}-k{k}"
        eng = ProfileEngine(
            label=label,
            spec=EngineSpec(
                target=target,
                dtype=dtype,
                method=method,
                k=None if method == "none" else k,
                options=dict(opts.get(method, {})) if method != "none" else {},
                max_model_len=max(L for _, L in shapes) + max_tokens + 16,
                max_num_seqs=max(b for b, _ in shapes),
                enforce_eager=enforce_eager,
                kv_cache_gib=kv_cache_gib,
            ),
        )
        for i, (b, L) in enumerate(shapes):
            cid = f"{label}.b{b}.L{L}"
            eng.cells.append(
                ProfileCell(cid, b, L, max_tokens, holdout=i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1)
            )
            eng.prompts[cid] = _prompt(rng, L, repeat=method != "none")
        engines.append(eng)
    return engines
