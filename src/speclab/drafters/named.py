"""Trained drafters by preset name: `model = "smollm2-135m-distilled"` (or `"smollm2-135m-eagle3"`) in a sweep
resolves to the cached directory of that preset's recipe, trained on first use with a message saying so.

A preset with `source = "distill"` is a DraftRecipe, `source = "train-eagle3"` an EagleRecipe, for the target
named by `base`, with the preset's optional `[train]` table as recipe fields. The cache key is computed from
the target's manifest and config alone (no model is loaded to find a trained drafter).

This module is speclab.models' resolver of trained presets and loads with `import speclab`; the trainers
(torch, transformers) are imported inside its functions, when a trained preset is actually resolved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from speclab.errors import ConfigError, SpeclabError

# Training on first use stops after this many minutes of training (the data stage comes first); a capped
# run is recorded in its manifest. Keeps the demo's first run within its budget on a slow machine.
FIRST_USE_TRAIN_MINUTES = 16.0
# Budgets differ by preset (about 3 minutes of training for smollm2-135m-eagle3 and -distilled on 2 cores, once
# their shared data set is made, about 5 minutes; the longer presets up to an hour): docs/drafters.md.
FIRST_USE_NOTE = "once, then cached; minutes to an hour on 2 CPU cores by recipe: docs/drafters.md"


def recipe_for(preset: Any) -> Any:
    """The recipe a trained-drafter preset names."""
    if preset.source == "distill":
        from speclab.drafters.distill import DraftRecipe as cls
    elif preset.source == "train-eagle3":
        from speclab.drafters.train import EagleRecipe as cls
    else:
        raise ConfigError(f"model preset {preset.name} is not a trained drafter (source {preset.source})")
    fields = set(cls.__dataclass_fields__)
    bad = sorted(set(preset.train) - fields)
    if bad:
        raise ConfigError(f"model preset {preset.name}: [train] has unknown recipe field(s) {', '.join(bad)}")
    return cls(**{**preset.train, "target": preset.base})


def _locate(preset: Any, prepare: bool = True) -> tuple[Any, Path]:
    """(recipe, cache directory) of a preset; resolves the target checkpoint (preparing it if allowed)."""
    from speclab.drafters.train import drafters_dir

    recipe = recipe_for(preset)
    if preset.source == "distill":
        from speclab.drafters.distill import draft_key

        _, key = draft_key(recipe, prepare)
        return recipe, drafters_dir(recipe.target) / f"draft-{key}"
    from speclab.drafters.train import eagle_key

    _, _, key = eagle_key(recipe, prepare)
    return recipe, drafters_dir(recipe.target) / f"eagle3-{key}"


def _ready(preset: Any, d: Path) -> bool:
    from speclab.drafters.train import RECIPE_VERSION as EAGLE_VERSION
    from speclab.drafters.train import is_trained

    if preset.source == "distill":
        from speclab.drafters.distill import RECIPE_VERSION

        return is_trained(d, verify_files=False, version=RECIPE_VERSION)
    return is_trained(d, verify_files=False, version=EAGLE_VERSION)


def train_command(preset: Any) -> str:
    """The command that trains a preset's drafter (the trainer's own command only where the preset sets no
    recipe field: otherwise that command would train another recipe)."""
    kind = "draft" if preset.source == "distill" else "eagle"
    if preset.train:
        return f"speclab models prepare {preset.name}"
    return f"speclab models prepare {preset.name} (or: speclab drafters train {kind} --target {preset.base})"


def trained_dir(preset: Any) -> Path | None:
    """The trained drafter's directory if it is in the cache; never trains or prepares anything."""
    try:
        _, d = _locate(preset, prepare=False)
    except SpeclabError:
        return None
    return d if _ready(preset, d) else None


def resolve_trained(preset: Any, train: bool = True, force: bool = False, log: Any = None) -> Path:
    """The preset's trained drafter directory; trains it first when it is not cached and `train` is set,
    else raises SpeclabError naming the command that trains it."""
    say = log or (lambda msg: None)
    recipe, d = _locate(preset, prepare=train)
    if not force and _ready(preset, d):
        return d
    if not train:
        raise SpeclabError(
            f"model {preset.name} is a drafter speclab trains on first use and it is not trained yet: "
            f"{train_command(preset)}; {FIRST_USE_NOTE}"
        )
    say(
        f"{preset.name}: not trained yet; training it now for {preset.base} ({FIRST_USE_NOTE}; "
        f"progress below, cached at {d})"
    )
    if preset.source == "distill":
        from speclab.drafters.distill import train_draft

        return train_draft(recipe, force=force, log=say, max_minutes=FIRST_USE_TRAIN_MINUTES)
    from speclab.drafters.train import train_eagle

    return train_eagle(recipe, force=force, log=say, max_minutes=FIRST_USE_TRAIN_MINUTES)
