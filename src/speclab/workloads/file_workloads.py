"""A sweep's [workloads.NAME] tables: each names a registered workload or registers a user's file under NAME.
Parsing and the file workload itself are in files.py, registration in registry.py; the names below are
re-exported for the modules that import them from here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from speclab.errors import ConfigError, SpeclabError
from speclab.validation import unknown_fields
from speclab.workloads.files import FileWorkload, bench_notes, file_fingerprint
from speclab.workloads.registry import register_file_workload, resolve_file_name

__all__ = [
    "FileWorkload",
    "bench_notes",
    "file_fingerprint",
    "mix_tables",
    "register_file_workload",
    "resolve_file_name",
    "workload_tables",
]

TABLE_KEYS = ("path", "format", "category", "skip_invalid", "mix")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.+\-]+$")  # a workload name goes into cell ids


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
        unknown_fields(t, TABLE_KEYS, where)
        if "mix" in t:  # a mixed workload: registered by mix_tables once every file table is
            if len(t) > 1:
                raise ConfigError(f"{where}: a mix table takes only mix = {{ workload = share, ... }}")
            if not _NAME_RE.match(name):
                raise ConfigError(f"{where}: the name may use only letters, digits and . _ + -")
        elif t:
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


def mix_tables(
    v: dict[str, Any], src: str, known: set[str], top: Any = None
) -> tuple[list[str], dict[str, dict[str, float]]]:
    """The sweep's mixed workloads (workloads/mix.py), checked and registered: each [workloads.NAME] table
    with `mix`, and a top-level `mix` table (registered as "mix"). `known`: the sweep's file workloads, which
    a mix may name. Returns the names of top-level mixes to add to the workloads, and NAME -> shares."""
    from speclab.workloads.mix import parse_mix, register_mix

    tables = {n: t["mix"] for n, t in v.items() if isinstance(t, dict) and "mix" in t}
    added = []
    if top is not None:
        if "mix" in tables:
            raise ConfigError(f"{src}: a top-level mix and [workloads.mix] both name the workload mix")
        tables["mix"] = top
        added.append("mix")
    mixes: dict[str, dict[str, float]] = {}
    for name, table in tables.items():
        where = f"{src}: workloads.{name}" if name not in added else src
        try:
            mixes[name] = parse_mix(table, where, known)
            register_mix(name, mixes[name])
        except SpeclabError as exc:
            raise ConfigError(str(exc)) from None
    return added, mixes
