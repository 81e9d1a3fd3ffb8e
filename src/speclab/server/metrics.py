"""vLLM's Prometheus text (`GET /metrics`) -> the counters a server cell records.

A counter family appears as `vllm:spec_decode_num_drafts_total{engine="0",model_name="..."} 12.0` (one line
per label set; `_created` lines carry a timestamp, not a count). Values are summed over label sets (engines),
except the per-position family, which is keyed by its `position` label. A cell's counters are the difference
of two scrapes taken right before and right after its load (`ServerCounters.minus`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from speclab.engine.protocol import SpecCounters
from speclab.errors import SpeclabError

# counter family (without the _total suffix) -> ServerCounters field
_FAMILIES = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
    "vllm:generation_tokens": "generation_tokens",
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:request_success": "requests_finished",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"

# name{labels} value [timestamp]; label values may hold escaped quotes
_LINE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)(?:\s+\S+)?$')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class ServerCounters:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: dict[int, int] = field(default_factory=dict)
    generation_tokens: int = 0
    prompt_tokens: int = 0
    requests_finished: int = 0
    spec_decode: bool = False  # the server exports spec-decode counters (SD is on)

    def minus(self, before: ServerCounters) -> ServerCounters:
        """The counts between two scrapes (self taken after `before`)."""
        keys = set(self.accepted_per_pos) | set(before.accepted_per_pos)
        return ServerCounters(
            num_drafts=self.num_drafts - before.num_drafts,
            num_draft_tokens=self.num_draft_tokens - before.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens - before.num_accepted_tokens,
            accepted_per_pos={
                k: self.accepted_per_pos.get(k, 0) - before.accepted_per_pos.get(k, 0) for k in sorted(keys)
            },
            generation_tokens=self.generation_tokens - before.generation_tokens,
            prompt_tokens=self.prompt_tokens - before.prompt_tokens,
            requests_finished=self.requests_finished - before.requests_finished,
            spec_decode=self.spec_decode,
        )

    def spec_counters(self) -> SpecCounters | None:
        """The offline worker's record of the same counters (None when the server runs no SD)."""
        if not self.spec_decode:
            return None
        n = max(self.accepted_per_pos, default=-1) + 1
        return SpecCounters(
            num_drafts=self.num_drafts,
            num_draft_tokens=self.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens,
            accepted_per_pos=[self.accepted_per_pos.get(i, 0) for i in range(n)],
        )


def _count(value: str, line_no: int) -> int:
    try:
        v = float(value)
    except ValueError:
        raise SpeclabError(f"/metrics line {line_no}: not a number: {value!r}") from None
    if not math.isfinite(v) or v < 0:
        raise SpeclabError(f"/metrics line {line_no}: a counter must be finite and >= 0, got {value}")
    return int(round(v))


def parse_metrics(text: str) -> ServerCounters:
    """The counters in one /metrics scrape. Lines of other families are ignored; a malformed line of a
    family read here is an error (a wrong count would pass silently into a results row)."""
    c = ServerCounters()
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        name = m.group(1) if m else line.split("{", 1)[0].split(None, 1)[0]
        if not name.endswith("_total"):
            continue  # _created, gauges, histograms, other families
        family = name[: -len("_total")]
        if family != PER_POS and family not in _FAMILIES:
            continue
        if m is None:
            raise SpeclabError(f"/metrics line {i}: cannot parse {line[:120]!r}")
        value = _count(m.group(3), i)
        if family == PER_POS:
            labels = dict(_LABEL.findall(m.group(2) or ""))
            if "position" not in labels or not labels["position"].isdigit():
                raise SpeclabError(f"/metrics line {i}: {PER_POS} without a numeric position label")
            pos = int(labels["position"])
            c.accepted_per_pos[pos] = c.accepted_per_pos.get(pos, 0) + value
            c.spec_decode = True
        else:
            attr = _FAMILIES[family]
            setattr(c, attr, getattr(c, attr) + value)
            if family.startswith("vllm:spec_decode"):
                c.spec_decode = True
    return c


def parse_gauges(text: str, families: tuple[str, ...]) -> dict[str, float]:
    """The values of gauge families (e.g. vllm:num_requests_running), summed over label sets (engines);
    a family absent from the scrape is absent from the result."""
    out: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None or m.group(1) not in families:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        if math.isfinite(v):
            out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out
