"""Code shared by the offline stand-ins."""

from __future__ import annotations

import random
import sysconfig
from collections.abc import Callable, Iterable
from pathlib import Path

from speclab.workloads.base import Prompt, WorkloadError, take_distinct

DEFAULT_SIZE = 500  # prompts built when no --limit is given

# Parts of the standard library that are tests, demos or GUI code rather than ordinary library code.
STDLIB_SKIP = {
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "turtledemo",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "ensurepip",
    "config-3.11-x86_64-linux-gnu",
}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def python_files(root: Path) -> list[Path]:
    """Sorted .py files under root (or root itself), skipping test/demo directories."""
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise WorkloadError(f"source {root} is neither a file nor a directory")
    out = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root).parts
        if any(part in STDLIB_SKIP or part.startswith("config-") for part in rel[:-1]):
            continue
        if p.name.startswith("test_"):
            continue
        out.append(p)
    return sorted(out)


def target_size(limit: int | None) -> int:
    return DEFAULT_SIZE if limit is None else limit


def generated_build(
    name: str, generate: Callable[[random.Random, int], Iterable[Prompt]]
) -> Callable[[int | None, int, str | None], list[Prompt]]:
    """The build function of a generated workload: generate(rng, attempts) yields candidate prompts from a
    seeded rng; the first N distinct are kept (N = limit or the default), giving up after 50 * N attempts."""

    def build(limit: int | None, seed: int, source: str | None) -> list[Prompt]:
        if source:
            raise WorkloadError(f"{name} is generated and takes no --source")
        want = target_size(limit)
        return take_distinct(generate(random.Random(seed), want * 50), want)

    return build
