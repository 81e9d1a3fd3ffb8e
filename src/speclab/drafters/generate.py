"""How a drafter's data stage decodes with the target: its greedy answers to the training prompts (and, in
speclab.drafters.selfgen, the requests it samples for the self sources), on one of two engines:

- `vllm`: a vLLM engine worker (speclab.replay.generate.engine_generate) runs a whole batch of prompts at
  once, continuously batched. On 2 CPU cores it decodes about three times the tokens per second of the
  transformers loop (151 against 47 tokens/s on 256 standard-library prompts of ~120 tokens, start-up of
  ~18 s included: docs/drafters.md, "Data engine"), so a fixed budget buys about twice the data.
- `transformers`: the target in this process, batches of DATA_CHUNK prompts with left padding. No engine to
  start; what the shipped presets' cached data was made with, and the fallback where vLLM is not installed.

Either way the target's features, argmax and top-k logits come afterwards from one teacher-forced forward of
the transformers model over each finished sequence (speclab.drafters.data.features_of), so only the choice
of tokens depends on the engine: both decode greedily in fp32 and agree up to float ties.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from speclab.errors import SpeclabError

ENGINES = ("vllm", "transformers")


def default_engine() -> str:
    """`vllm` where it is installed, else `transformers`."""
    return "vllm" if importlib.util.find_spec("vllm") is not None else "transformers"


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise SpeclabError(f"drafters: data engine {engine!r} is not one of {', '.join(ENGINES)}")
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise SpeclabError(
            "drafters: data engine vllm needs vLLM installed (or use --data-engine transformers)"
        )
    return engine


def cut_at_stop(out: list[int], stop: set[int]) -> tuple[list[int], bool]:
    """`out` up to and including its first stop id; whether it had one."""
    end = next((i for i, t in enumerate(out) if t in stop), None)
    return (list(out), False) if end is None else (list(out[: end + 1]), True)


def engine_sequences(
    prompts: list[list[int]], max_new_tokens: int, stop: set[int], target_dir: Path, say: Any = None
) -> list[list[int]]:
    """Each prompt followed by its greedy output, which ends at its first stop id or after max_new_tokens,
    every prompt decoded in one vLLM engine run (target_dir: the target's checkpoint). The `transformers`
    engine decodes chunk by chunk in speclab.drafters.data.build_sequences instead."""
    from speclab.replay.generate import engine_generate

    if not prompts:
        return []
    outs = engine_generate(prompts, target_dir, max_new_tokens, echo=say)
    return [list(p) + cut_at_stop(o, stop)[0] for p, o in zip(prompts, outs, strict=True)]
