"""File workloads as registered workloads: `file:PATH` names, a sweep's [workloads.NAME] tables, and the notes
the bench prints about what a request log asked for that it does differently. Parsing is in files.py."""

from __future__ import annotations

import copy
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speclab.errors import ConfigError, SpeclabError
from speclab.workloads.base import Prompt, WorkloadError, WorkloadInfo, seeded_sample
from speclab.workloads.files import FILE_PREFIX, ParsedFile, parse_file

TABLE_KEYS = ("path", "format", "category", "skip_invalid")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.+\-]+$")  # a workload name goes into cell ids

_CACHE: dict[tuple, ParsedFile] = {}


def load_file(
    path: str | os.PathLike[str],
    fmt: str = "auto",
    workload: str | None = None,
    category: str | None = None,
    skip_invalid: bool = False,
) -> ParsedFile:
    """parse_file, read once per version of the file (its size and modification time) in this process."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
        stamp: tuple | None = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = None  # parse_file says what is wrong
    key = (stamp, fmt, workload, category, skip_invalid)
    if stamp is None or key not in _CACHE:
        parsed = parse_file(p, fmt, workload, category, skip_invalid)
        if stamp is None:
            return parsed
        _CACHE[key] = parsed
    return _CACHE[key]


@dataclass(frozen=True)
class FileWorkload:
    name: str
    path: str
    format: str = "auto"
    category: str | None = None
    skip_invalid: bool = False

    def parsed(self) -> ParsedFile:
        return load_file(self.path, self.format, self.name, self.category, self.skip_invalid)

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


def register_file_workload(
    name: str, path: str, fmt: str = "auto", category: str | None = None, skip_invalid: bool = False
) -> WorkloadInfo:
    """Register (or re-register) a file workload under `name`; reads and checks the whole file now."""
    from speclab.workloads import registry

    registry._discover()
    old = registry._REGISTRY.get(name)
    if old is not None and old.info.kind != "file":
        raise WorkloadError(f"{name!r} is a built-in workload; give the file workload another name")
    fw = FileWorkload(name, path, fmt, category, skip_invalid)
    info = fw.info()
    registry.register_workload(info, fw.build, replace=True)
    return info


def resolve_file_name(name: str) -> WorkloadInfo:
    """Register a `file:PATH` workload name (format detected, category from the lines)."""
    path = name[len(FILE_PREFIX) :].strip()
    if not path:
        raise WorkloadError(f"workload {name!r}: give a path after {FILE_PREFIX}")
    return register_file_workload(name, path)


def bench_notes(workload: str, prompts: list[Prompt], max_tokens: int) -> list[str]:
    """What a request log asked for that the bench does differently (said before the run, not hidden)."""
    notes = []
    n = len(prompts)
    hot = sum(1 for p in prompts if p.meta.get("temperature", 0.0) > 0)
    if hot:
        notes.append(
            f"note: {workload}: {hot} of {n} requests asked for temperature > 0; the bench decodes greedily "
            "(temperature 0), so every SD output can be checked token for token against no-SD"
        )
    asked = [p.meta["max_tokens"] for p in prompts if "max_tokens" in p.meta]
    other = [m for m in asked if m != max_tokens]
    if other:
        notes.append(
            f"note: {workload}: {len(other)} of {n} requests asked for max_tokens other than the sweep's "
            f"{max_tokens} ({min(asked)}-{max(asked)}); every request generates up to the sweep's {max_tokens}"
        )
    return notes


def workload_tables(v: dict[str, Any], src: str) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """A sweep's [workloads.NAME] tables, in order: an empty one names a registered workload; one with `path`
    registers the user's file under NAME (read and checked now: a bad file is refused before anything starts).
    Returns the names and, for files, NAME -> {path (absolute), format, category, skip_invalid}."""
    if not v:
        raise ConfigError(f"{src}: field workloads: expected a list of names or [workloads.NAME] tables")
    names, files = [], {}
    for name, t in v.items():
        where = f"{src}: workloads.{name}"
        if not isinstance(t, dict):
            raise ConfigError(f"{where}: expected a table ({', '.join(TABLE_KEYS)})")
        bad = sorted(set(t) - set(TABLE_KEYS))
        if bad:
            raise ConfigError(f"{where}: unknown field(s): {', '.join(bad)} (known: {', '.join(TABLE_KEYS)})")
        if t:
            if not isinstance(t.get("path"), str) or not t["path"].strip():
                raise ConfigError(f"{where}: field path: missing (the prompts file or request log)")
            if not _NAME_RE.match(name):
                raise ConfigError(f"{where}: the name may use only letters, digits and . _ + -")
            for key in ("format", "category"):
                if key in t and not isinstance(t[key], str):
                    raise ConfigError(f"{where}: field {key}: expected text, got {t[key]!r}")
            skip = t.get("skip_invalid", False)
            if not isinstance(skip, bool):
                raise ConfigError(f"{where}: field skip_invalid: expected true or false, got {skip!r}")
            path = str(Path(t["path"].strip()).expanduser().resolve())
            fmt, cat = t.get("format", "auto"), t.get("category")
            try:
                register_file_workload(name, path, fmt, cat, skip)
            except SpeclabError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            files[name] = {"path": path, "format": fmt, "category": cat, "skip_invalid": skip}
        names.append(name)
    return names, files


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
