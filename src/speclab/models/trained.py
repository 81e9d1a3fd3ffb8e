"""Trained drafters by preset name (`source = "distill"` or `"train-eagle3"`), resolved through a resolver
that the package which trains them registers: speclab.drafters registers itself when it is imported, and the
package root imports it, so the resolver is there in every process that loads speclab (the CLI, the engine
worker, a library caller). models/ never imports the training code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from speclab.errors import SpeclabError


class TrainedResolver(Protocol):
    def resolve_trained(self, preset: Any, train: bool = True, force: bool = False, log: Any = None) -> Path:
        """The preset's trained drafter directory; trains it first when allowed (`train`) and not cached."""
        ...

    def trained_dir(self, preset: Any) -> Path | None:
        """The trained drafter's directory if it is cached; never trains or prepares anything."""
        ...


_resolver: TrainedResolver | None = None


def register_trained_resolver(resolver: TrainedResolver) -> None:
    """Install the resolver of trained-drafter presets (the last one registered wins)."""
    global _resolver
    _resolver = resolver


def trained_resolver(preset: Any) -> TrainedResolver:
    if _resolver is None:
        raise SpeclabError(f"model {preset.name}: no trainer of drafters is loaded (import speclab.drafters)")
    return _resolver
