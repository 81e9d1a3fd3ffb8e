"""Options several commands share, defined once so that the same option has the same type, bounds and
--help convention everywhere: a choice shows its default, a prompt count and a seed have the bounds every
command accepts (speclab.validation)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click

from speclab.validation import MAX_PROMPTS, MAX_SEED

INT32_MAX = (1 << 31) - 1
PROMPT_COUNT = click.IntRange(1, MAX_PROMPTS)
SEED = click.IntRange(0, MAX_SEED)

Decorator = Callable[[Any], Any]


def choice_option(*decls: str, choices: Sequence[str], default: str, help: str | None = None) -> Decorator:
    """An option that takes one of `choices`; --help shows its default."""
    return click.option(
        *decls, type=click.Choice(list(choices)), default=default, show_default=True, help=help
    )


def limit_option(help: str, default: int | None = None) -> Decorator:
    """--limit: how many prompts of a workload (its seeded sample, as a sweep draws it)."""
    return click.option("--limit", type=PROMPT_COUNT, default=default, show_default=True, help=help)


def seed_option(help: str, default: int) -> Decorator:
    """--seed: a sampling or generation seed, in the range every command and sweep accepts."""
    return click.option("--seed", type=SEED, default=default, show_default=True, help=help)
