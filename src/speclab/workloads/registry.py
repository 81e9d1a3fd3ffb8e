"""The workload registry. A workload is a small module that calls `register_workload`; the runner never changes.

Where workloads come from:
- built in: every module in the packages speclab.workloads.offline and speclab.workloads.study;
- plugins: the entry-point group "speclab.workloads" (each entry point names a module to import), and the
  environment variable SPECLAB_WORKLOADS: a comma-separated list of module names or paths to .py files.
- files: a name `file:PATH` is a user's prompts file or request log (speclab.workloads.files), registered
  on first use; a sweep's [workloads.NAME] table registers one under NAME.
Modules are imported on first use of list_workloads/load_workload, and must import nothing heavy at import
time (no torch, vllm, transformers or datasets: do those imports inside the builder).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from speclab.workloads.base import CATEGORIES, KINDS, OWN_CATEGORIES, Prompt, WorkloadError, WorkloadInfo
from speclab.workloads.files import FILE_PREFIX, FileWorkload

log = logging.getLogger("speclab.workloads")

# builder(limit, seed, source) -> prompts. limit=None means the workload's full (or default) size.
Builder = Callable[[int | None, int, str | None], list[Prompt]]

_BUILTIN_PACKAGES = ("speclab.workloads.offline", "speclab.workloads.study")


@dataclass(frozen=True)
class _Entry:
    info: WorkloadInfo
    builder: Builder


_REGISTRY: dict[str, _Entry] = {}
_discovered = False


def register_workload(info: WorkloadInfo, builder: Builder, *, replace: bool = False) -> None:
    if info.category not in CATEGORIES:
        raise WorkloadError(f"workload {info.name!r}: category {info.category!r} not one of {CATEGORIES}")
    if info.kind not in KINDS:
        raise WorkloadError(f"workload {info.name!r}: kind {info.kind!r} not one of {KINDS}")
    if info.name in _REGISTRY and not replace and _REGISTRY[info.name].builder is not builder:
        raise WorkloadError(f"workload {info.name!r} registered twice")
    _REGISTRY[info.name] = _Entry(info, builder)


def _import_path(path: str) -> None:
    p = Path(path)
    spec = importlib.util.spec_from_file_location(f"speclab_workload_plugin_{p.stem}", p)
    if spec is None or spec.loader is None:
        raise WorkloadError(f"SPECLAB_WORKLOADS: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def discover() -> None:
    """Import every workload module once (built in, entry points, SPECLAB_WORKLOADS)."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for pkg_name in _BUILTIN_PACKAGES:
        pkg = importlib.import_module(pkg_name)
        for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
            if not mod.name.startswith("_"):
                importlib.import_module(f"{pkg_name}.{mod.name}")
    try:
        from importlib.metadata import entry_points

        for ep in entry_points(group="speclab.workloads"):
            try:
                importlib.import_module(ep.value.split(":")[0])
            except Exception as exc:  # a broken plugin must not hide the built-in workloads
                log.warning("workload plugin %s failed to import: %s", ep.value, exc)
    except Exception:  # pragma: no cover - metadata quirks
        pass
    for item in filter(None, (s.strip() for s in os.environ.get("SPECLAB_WORKLOADS", "").split(","))):
        if item.endswith(".py"):
            _import_path(item)
        else:
            importlib.import_module(item)


def register_file_workload(
    name: str, path: str, fmt: str = "auto", category: str | None = None, skip_invalid: bool = False
) -> WorkloadInfo:
    """Register (or re-register) a file workload under `name`; reads and checks the whole file now."""
    discover()
    old = _REGISTRY.get(name)
    if old is not None and old.info.kind != "file":
        raise WorkloadError(f"{name!r} is a built-in workload; give the file workload another name")
    fw = FileWorkload(name, path, fmt, category, skip_invalid)
    info = fw.info()
    register_workload(info, fw.build, replace=True)
    return info


def resolve_file_name(name: str) -> WorkloadInfo:
    """Register a `file:PATH` workload name (format detected, category from the lines)."""
    path = name[len(FILE_PREFIX) :].strip()
    if not path:
        raise WorkloadError(f"workload {name!r}: give a path after {FILE_PREFIX}")
    return register_file_workload(name, path)


def list_workloads() -> list[WorkloadInfo]:
    """Every registered workload: offline stand-ins first, then study datasets, then files registered in this
    process, each by study category."""
    discover()
    order = {"offline": 0, "study": 1}
    return sorted(
        (e.info for e in _REGISTRY.values()),
        key=lambda i: (order.get(i.kind, len(order)), CATEGORIES.index(i.category), i.name),
    )


def get_workload(name: str) -> WorkloadInfo:
    discover()
    if name.startswith(FILE_PREFIX):
        return resolve_file_name(name)  # reads and checks the file (again if it changed)
    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY))
        raise WorkloadError(f"unknown workload {name!r} (known: {known})")
    return _REGISTRY[name].info


def load_workload(
    name: str, limit: int | None = None, seed: int = 0, source: str | None = None
) -> list[Prompt]:
    """Build the prompts of workload `name`. Deterministic under `seed` (for the same data on disk).

    limit: at most this many prompts (None: the whole dataset, or an offline stand-in's default size).
    source: a local file or directory in the dataset's own schema (study datasets), or local material
    (offline stand-ins that accept it); None = the hub (study) or material found on this machine (offline).
    """
    info = get_workload(name)
    if limit is not None and limit < 0:
        raise WorkloadError(f"{name}: limit must be >= 0, got {limit}")
    prompts = _REGISTRY[name].builder(limit, seed, source)
    if limit is not None:
        prompts = prompts[:limit]
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):  # a builder bug, but cheap to catch here
        raise WorkloadError(f"{name}: prompt ids are not unique")
    for p in prompts:
        if p.category != info.category and info.kind not in OWN_CATEGORIES:  # a file's lines, a mix's parts
            p.category = info.category
    return prompts
