"""Workload data types: one prompt, and what the registry knows about a workload."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from speclab.errors import SpeclabError

# Study categories (mirrors speclab.traces.model.CATEGORIES; kept here so importing workloads stays light).
CATEGORIES: tuple[str, ...] = ("code-editing", "summarization", "math", "chat", "reasoning", "other")
KINDS: tuple[str, ...] = ("study", "offline", "file", "mix")  # file: a user's prompts file or request log;
# mix: several workloads in given proportions (workloads/mix.py)
OWN_CATEGORIES: tuple[str, ...] = ("file", "mix")  # kinds whose prompts each keep their own category


class WorkloadError(SpeclabError):
    """A workload cannot be built: unknown name, unreachable hub, malformed or empty data."""


@dataclass
class Prompt:
    id: str  # stable, unique within the workload
    workload: str
    category: str  # one of CATEGORIES
    messages: list[dict]  # chat messages; the target's chat template is applied later (render_prompt)
    reference: str | None = None  # known answer / reference output if the dataset has one
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Prompt:
        return cls(
            id=str(d["id"]),
            workload=str(d["workload"]),
            category=str(d["category"]),
            messages=list(d["messages"]),
            reference=d.get("reference"),
            meta=dict(d.get("meta") or {}),
        )

    @property
    def text(self) -> str:
        """All message contents joined (for overlap statistics and display)."""
        return "\n\n".join(str(m.get("content", "")) for m in self.messages)


@dataclass(frozen=True)
class WorkloadInfo:
    name: str
    category: str
    kind: str  # one of KINDS
    description: str
    hf_id: str | None = None
    hf_config: str | None = None
    split: str | None = None
    notes: str = ""  # caveats: gated, small, ...

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def content_id(workload: str, messages: list[dict], extra: str = "") -> str:
    """A stable id from the prompt content (same content -> same id on every machine and run)."""
    blob = json.dumps(messages, sort_keys=True, ensure_ascii=False) + extra
    return f"{workload}-{hashlib.sha1(blob.encode('utf-8')).hexdigest()[:12]}"


def seeded_sample(items: Sequence, limit: int | None, seed: int) -> list:
    """Like the study: a seeded random sample (random.sample) in sampled order when limit < len(items);
    otherwise every item in its original order."""
    if limit is not None and limit < len(items):
        return random.Random(seed).sample(list(items), limit)
    return list(items)


def user(content: str) -> dict[str, str]:
    return {"role": "user", "content": content}


def assistant(content: str) -> dict[str, str]:
    return {"role": "assistant", "content": content}


def read_prompts(path: str) -> list[Prompt]:
    """Prompts written by `speclab workloads export` (JSON Lines), e.g. to rerun exactly the same prompts."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                out.append(Prompt.from_dict(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise WorkloadError(f"{path} line {n}: not an exported prompt ({exc})") from exc
    return out


def take_distinct(
    candidates: Iterable[Prompt], want: int, key: Callable[[Prompt], str] = lambda p: p.id
) -> list[Prompt]:
    """The first `want` candidates with distinct keys (default: ids; a repeated prompt is skipped).

    Candidates are drawn lazily, so a generator driven by a seeded rng draws no more than it needs.
    """
    prompts: list[Prompt] = []
    seen: set[str] = set()
    if want <= 0:
        return prompts
    for p in candidates:
        k = key(p)
        if k in seen:
            continue
        seen.add(k)
        prompts.append(p)
        if len(prompts) >= want:
            break
    return prompts
