"""File-backed workloads: a user's own prompts file or request log, benched like any built-in workload.

Two ways to name one: `file:PATH` wherever a workload name is accepted (the format is detected from the
file, the category is the one every line agrees on, else "other"), or a sweep's `[workloads.NAME]` table with
`path`, `format` and `category` (registered here under NAME by the sweep parser).

Formats, one JSON object per line (`.json`/`.parquet`/`.csv`/`.arrow` files with the same fields are read
too; any other suffix is read as JSON Lines):
  prompts      {"prompt": "..."}                         one user turn, rendered with the target's chat template
  chat         {"messages": [{"role", "content"}, ...]}  OpenAI chat format, rendered with the chat template
  request-log  one OpenAI-style request body per line, bare or wrapped as {"body": {...}} (the Batch API's
               input) or {"request": {...}}: `messages` (a chat request) or `prompt` (a completions request:
               sent as raw text, no chat template, as the server did)
Optional on every line: `id` (or `custom_id`), `reference` (a known output), `category`; and the request
fields `max_tokens`/`max_completion_tokens`, `temperature`, `top_p`, `top_k`, `model` and an arrival time
(`timestamp`, `arrival_time`, `created_at` or `created`: seconds, milliseconds above 1e11, or ISO 8601). They
are kept in Prompt.meta: the bench generates the sweep's max_tokens at the sweep's temperatures for every
prompt and says how many requests asked otherwise, unless the sweep says `sampling = "as-logged"` (each
request then runs with its own temperature, top_p, top_k and max_tokens: docs/bench.md); arrival times
(meta["arrival_s"]) are for a server-mode replay of the real arrival pattern.
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from speclab.errors import ConfigError
from speclab.outputs import check_no_loop
from speclab.validation import integer, is_finite_number, number, show
from speclab.workloads.base import (
    CATEGORIES,
    Prompt,
    WorkloadError,
    WorkloadInfo,
    content_id,
    seeded_sample,
    take_distinct,
    user,
)
from speclab.workloads.sources import SUFFIXES, jsonl_rows, read_local

FILE_PREFIX = "file:"
FORMATS = ("auto", "prompts", "chat", "request-log")
ROLES = ("system", "developer", "user", "assistant", "tool")
WRAPPERS = ("body", "request")
ARRIVAL_FIELDS = ("timestamp", "arrival_time", "created_at", "created")
# fields that only a request body carries: their presence makes `auto` read the file as a request log
REQUEST_FIELDS = (
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "model",
    "stream",
    "top_p",
    "n",
    "stop",
)
_MS_THRESHOLD = 1e11  # a larger number is an epoch time in milliseconds
# bounds of a request's numbers: beyond any real request, small enough that no sum or span overflows
MAX_TOKENS = 2**31 - 1
MAX_TEMPERATURE = 1e6
MAX_ARRIVAL_S = 1e12  # about 31,000 years either side of 1970
MAX_ID_CHARS = 1000


@dataclass
class ParsedFile:
    path: Path
    format: str  # as detected or given (never "auto")
    prompts: list[Prompt]  # in file order, repeated prompts dropped
    rows: int  # requests read (blank lines not counted, invalid ones not either)
    duplicates: int  # requests dropped as repeats of an earlier one
    category: str  # the workload's category
    invalid: list[str] = field(default_factory=list)  # errors of the lines skipped (skip_invalid only)


def _bad(loc: str, fld: str, problem: str) -> WorkloadError:
    return WorkloadError(f"{loc}: field {fld}: {problem}")


def _tname(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def detect_format(loc: str, row: Any) -> str:
    """The format of a file from its first request."""
    if not isinstance(row, dict):
        raise WorkloadError(f"{loc}: expected a JSON object, got {_tname(row)}")
    if any(isinstance(row.get(w), dict) for w in WRAPPERS) or any(
        k in row for k in REQUEST_FIELDS + ARRIVAL_FIELDS
    ):
        return "request-log"
    if "messages" in row:
        return "chat"
    if "prompt" in row:
        return "prompts"
    have = ", ".join(map(str, list(row)[:12])) or "nothing"
    raise WorkloadError(
        f"{loc}: cannot tell the format: no field prompt or messages (has: {have}); "
        f"give format = one of {', '.join(FORMATS[1:])}"
    )


def _content(loc: str, c: Any, fld: str) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # OpenAI content parts: only text can be benched
        if not c:
            raise _bad(loc, fld, "an empty list of parts (give text, or a list of text parts)")
        texts = []
        for j, part in enumerate(c):
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else _tname(part)
                raise _bad(loc, f"{fld}[{j}]", f"only text parts can be benched, got {kind!r}")
        return "\n".join(texts)
    if c is None:
        raise _bad(loc, fld, "missing (a turn without text, e.g. only tool calls, cannot be benched)")
    raise _bad(loc, fld, f"expected text, got {_tname(c)}")


def _messages(loc: str, v: Any, fld: str) -> list[dict]:
    if not isinstance(v, list) or not v:
        raise _bad(loc, fld, f"expected a non-empty list of {{role, content}} objects, got {_tname(v)}")
    out = []
    for i, m in enumerate(v):
        f = f"{fld}[{i}]"
        if not isinstance(m, dict):
            raise _bad(loc, f, f"expected an object with role and content, got {_tname(m)}")
        role = m.get("role")
        if role not in ROLES:
            problem = "missing" if role is None else f"{role!r} is not one of {', '.join(ROLES)}"
            raise _bad(loc, f"{f}.role", problem)
        out.append({"role": role, "content": _content(loc, m.get("content"), f"{f}.content")})
    if not any(m["role"] == "user" for m in out):
        raise _bad(loc, fld, "has no user turn")
    return out


def _prompt_text(loc: str, v: Any, fld: str) -> str:
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
        v = v[0]  # the completions API's list form, with one prompt
    if isinstance(v, list):
        if v and all(isinstance(t, int) for t in v):
            raise _bad(loc, fld, "token-id prompts are not supported; give the text")
        raise _bad(loc, fld, f"expected one prompt (text), got a list of {len(v)}")
    if not isinstance(v, str):
        raise _bad(loc, fld, f"expected text, got {_tname(v)}")
    return v


def _arrival(loc: str, fld: str, v: Any) -> float:
    if is_finite_number(v):
        if abs(v) > MAX_ARRIVAL_S * 1000:
            raise _bad(
                loc,
                fld,
                f"{show(v)} out of range (seconds or milliseconds since 1970, within +-{MAX_ARRIVAL_S:g} s)",
            )
        return v / 1000.0 if v > _MS_THRESHOLD else float(v)
    if isinstance(v, str):
        try:
            t = datetime.fromisoformat(v.strip())
        except ValueError:
            pass
        else:
            return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()
    raise _bad(loc, fld, f"expected seconds (a number) or an ISO 8601 time, got {v!r}")


def _request_fields(loc: str, outer: dict, body: dict, fp: str) -> dict[str, Any]:
    """max_tokens, temperature, top_p, top_k, model and the arrival time, where the line has them (meta)."""
    meta: dict[str, Any] = {}
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise _bad(loc, fp + key, f"expected an integer >= 1, got {show(v)}")
        integer(v, f"{loc}: field {fp}{key}", 1, MAX_TOKENS, WorkloadError)
        meta.setdefault("max_tokens", v)
    t = body.get("temperature")
    if t is not None:
        if isinstance(t, bool) or not isinstance(t, int | float) or not (0 <= t < math.inf):
            raise _bad(loc, fp + "temperature", f"expected a number >= 0, got {show(t)}")
        meta["temperature"] = number(t, f"{loc}: field {fp}temperature", 0.0, MAX_TEMPERATURE, WorkloadError)
    tp = body.get("top_p")
    if tp is not None:
        if isinstance(tp, bool) or not isinstance(tp, int | float) or not 0 < tp <= 1:
            raise _bad(loc, fp + "top_p", f"expected a number in (0, 1], got {show(tp)}")
        meta["top_p"] = float(tp)
    tk = body.get("top_k")
    if tk is not None and tk != -1:  # -1: off, as vLLM's API takes it
        if isinstance(tk, bool) or not isinstance(tk, int) or tk < 0:
            raise _bad(loc, fp + "top_k", f"expected an integer >= 0 (0 or -1: off), got {show(tk)}")
        meta["top_k"] = integer(tk, f"{loc}: field {fp}top_k", 0, MAX_TOKENS, WorkloadError)
    model = body.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise _bad(loc, fp + "model", f"expected text, got {_tname(model)}")
        meta["model"] = model
    for key in ARRIVAL_FIELDS:
        for where, d in (("", outer), (fp, body)):
            if d.get(key) is not None:
                meta["arrival_s"] = _arrival(loc, where + key, d[key])
                meta["arrival_field"] = where + key
                return meta
    return meta


def _to_prompt(loc: str, row: Any, fmt: str, workload: str, prefix: str) -> Prompt:
    if not isinstance(row, dict):
        raise WorkloadError(f"{loc}: expected a JSON object, got {_tname(row)}")
    body, fp = row, ""
    if fmt == "request-log":
        for w in WRAPPERS:
            if isinstance(row.get(w), dict):
                body, fp = row[w], f"{w}."
                break
    has_p, has_m = "prompt" in body, "messages" in body
    if has_p and has_m:
        raise _bad(loc, fp + "prompt", "give prompt or messages, not both")
    if fmt == "prompts" and not has_p:
        raise _bad(loc, "prompt", 'missing (format prompts: {"prompt": "..."} per line)')
    if fmt == "chat" and not has_m:
        raise _bad(loc, "messages", 'missing (format chat: {"messages": [...]} per line)')
    if not (has_p or has_m):
        raise _bad(loc, fp + "messages", "missing (a request body has messages or prompt)")
    meta: dict[str, Any] = {"source": loc, "format": fmt}
    if has_m:
        messages = _messages(loc, body["messages"], fp + "messages")
    else:
        messages = [user(_prompt_text(loc, body["prompt"], fp + "prompt"))]
        if fmt == "request-log":
            meta["chat_template"] = False  # a completions request: the server sent the text as it is
    if not any(m["content"].strip() for m in messages):
        raise _bad(loc, fp + ("messages" if has_m else "prompt"), "the prompt is empty")
    reference = row.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise _bad(loc, "reference", f"expected text, got {_tname(reference)}")
    category = row.get("category")
    if category is not None and category not in CATEGORIES:
        raise _bad(loc, "category", f"{category!r} is not one of {', '.join(CATEGORIES)}")
    meta.update(_request_fields(loc, row, body, fp))
    key = row.get("id", row.get("custom_id"))
    if isinstance(key, bool) or not isinstance(key, str | int | type(None)):
        raise _bad(loc, "id", f"expected text or an integer, got {_tname(key)}")
    if isinstance(key, int):
        integer(key, f"{loc}: field id", -(2**63), 2**63 - 1, WorkloadError)
    elif isinstance(key, str) and len(key) > MAX_ID_CHARS:
        raise _bad(loc, "id", f"longer than {MAX_ID_CHARS} characters")
    if key not in (None, ""):
        pid = f"{prefix}-{key}"
    else:
        pid = content_id(prefix, messages, "" if meta.get("chat_template", True) else "raw")
    return Prompt(pid, workload, category or "", messages, reference, meta)  # "": the workload's


def _content_key(p: Prompt) -> str:
    return content_id("", p.messages, "" if p.meta.get("chat_template", True) else "raw")


def _rows(path: Path, skipped: list[str] | None) -> list[tuple[str, Any]]:
    if path.suffix.lower() in SUFFIXES and path.suffix.lower() != ".jsonl":
        return read_local(path)
    try:
        return list(jsonl_rows(path, skipped))
    except (OSError, EOFError) as exc:  # EOFError: a truncated gzip file
        raise WorkloadError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from exc


def parse_file(
    path: str | os.PathLike[str],
    fmt: str = "auto",
    workload: str | None = None,
    category: str | None = None,
    skip_invalid: bool = False,
) -> ParsedFile:
    """Read and check every line of a prompts file or request log. Raises WorkloadError (one line naming the
    file, line and field) on the first malformed line, or, with skip_invalid, leaves such lines out and
    refuses the file only when no line is usable."""
    p = Path(path).expanduser()
    if fmt not in FORMATS:
        raise WorkloadError(f"{p}: format {fmt!r} is not one of {', '.join(FORMATS)}")
    if category is not None and category not in CATEGORIES:
        raise WorkloadError(f"{p}: category {category!r} is not one of {', '.join(CATEGORIES)}")
    check_no_loop(p)
    if not p.exists():
        raise WorkloadError(f"{p}: no such file")
    if p.is_dir():
        raise WorkloadError(f"{p}: is a directory; give a prompts file or request log")
    invalid: list[str] = []
    rows = _rows(p, invalid if skip_invalid else None)
    workload = workload or f"{FILE_PREFIX}{path}"
    prefix = workload if not workload.startswith(FILE_PREFIX) else p.stem
    prompts: list[Prompt] = []
    seen: dict[str, tuple[str, str]] = {}  # id -> (where first seen, content key)
    for loc, row in rows:
        try:
            if fmt == "auto":
                fmt = detect_format(loc, row)
            pr = _to_prompt(loc, row, fmt, workload, prefix)
            ck = _content_key(pr)
            first = seen.setdefault(pr.id, (loc, ck))
            if first[1] != ck:
                given = pr.id.removeprefix(prefix + "-")
                raise _bad(loc, "id", f"{given!r} is used at {first[0]} for another prompt")
        except WorkloadError as exc:
            if not skip_invalid:
                raise
            invalid.append(str(exc))
            continue
        prompts.append(pr)
    if not prompts:
        if invalid:
            raise WorkloadError(f"{p}: none of its {len(invalid)} lines is usable (first: {invalid[0]})")
        raise WorkloadError(f"{p}: no requests (the file is empty)")
    distinct = take_distinct(prompts, len(prompts), key=_content_key)
    if category is None:  # the category every line gives, else "other"
        line_cats = {q.category for q in distinct}
        category = line_cats.pop() if len(line_cats) == 1 and "" not in line_cats else "other"
    dups = len(prompts) - len(distinct)
    for q in distinct:
        q.category = q.category or category
        q.meta.update({"file_rows": len(prompts), "duplicates_dropped": dups})
    return ParsedFile(p, fmt, distinct, len(prompts), dups, category, invalid)


# --- a parsed file as a workload (registered by speclab.workloads.registry) ----------------------------

_CACHE: dict[tuple, ParsedFile] = {}


@dataclass(frozen=True)
class FileWorkload:
    name: str
    path: str
    format: str = "auto"
    category: str | None = None
    skip_invalid: bool = False

    def parsed(self) -> ParsedFile:
        """parse_file, read once per version of the file (its size and modification time) in this process."""
        p = Path(self.path).expanduser()
        try:
            st = p.stat()
            key = (self, str(p.resolve()), st.st_mtime_ns, st.st_size)
        except OSError:  # parse_file says what is wrong
            return parse_file(p, self.format, self.name, self.category, self.skip_invalid)
        if key not in _CACHE:
            _CACHE[key] = parse_file(p, self.format, self.name, self.category, self.skip_invalid)
        return _CACHE[key]

    def info(self) -> WorkloadInfo:
        pf = self.parsed()
        desc = f"{pf.format} file {self.path}: {len(pf.prompts)} prompts"
        notes = f"{pf.duplicates} repeated prompts dropped" if pf.duplicates else ""
        if pf.invalid:
            notes = "; ".join(filter(None, [notes, f"{len(pf.invalid)} invalid lines skipped"]))
        return WorkloadInfo(self.name, pf.category, "file", desc, notes=notes)

    def build(self, limit: int | None, seed: int, source: str | None) -> list[Prompt]:
        if source:
            raise WorkloadError(f"{self.name}: a file workload takes no source (its file is {self.path})")
        # copies: a caller may change a prompt, the parsed file is shared
        return [
            Prompt.from_dict(copy.deepcopy(q.to_dict()))
            for q in seeded_sample(self.parsed().prompts, limit, seed)
        ]


def bench_notes(workload: str, prompts: list[Prompt], max_tokens: int, as_logged: bool = False) -> list[str]:
    """What a request log asked for that the bench does differently (said before the run, not hidden).
    With `sampling = "as-logged"` every request runs with its own settings: nothing to say."""
    notes: list[str] = []
    if as_logged:
        return notes
    n = len(prompts)
    hot = sum(1 for p in prompts if p.meta.get("temperature", 0.0) > 0)
    if hot:
        notes.append(
            f"note: {workload}: {hot} of {n} requests asked for temperature > 0; the bench decodes greedily "
            '(temperature 0) unless the sweep gives temperatures; sampling = "as-logged" runs each request '
            "with its own settings"
        )
    asked = [p.meta["max_tokens"] for p in prompts if "max_tokens" in p.meta]
    other = [m for m in asked if m != max_tokens]
    if other:
        notes.append(
            f"note: {workload}: {len(other)} of {n} requests asked for max_tokens other than the sweep's "
            f"{max_tokens} ({min(asked)}-{max(asked)}); every request generates up to the sweep's {max_tokens}"
        )
    return notes


def file_fingerprint(workload: str, files: dict[str, dict[str, Any]]) -> str | None:
    """A digest of a file workload's bytes (None for any other workload). Cell ids include it, so that a rerun
    into the same run directory after the file changed runs the new prompts instead of reusing old cells."""
    if workload in files:
        path = Path(files[workload]["path"])
    elif workload.startswith(FILE_PREFIX):
        path = Path(workload[len(FILE_PREFIX) :].strip()).expanduser()
    else:
        return None
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError as exc:
        raise ConfigError(f"workload {workload}: cannot read {path} ({exc.strerror})") from None
