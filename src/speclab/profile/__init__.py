"""`speclab profile`: measure the real engine's step-time surface and save a fitted, named cost model.

plan.py: the engines and the sparse grid of shapes; run.py: the workers and the timings cut per cell;
the forms fitted on most cells and scored on the held-out ones: speclab.costmodel.holdout. docs/validate.md has the details.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from speclab.atomic import atomic_write_text
from speclab.costmodel.holdout import ProfileFit, fit_profile
from speclab.costmodel.registry import user_dir
from speclab.errors import ConfigError
from speclab.profile.plan import ProfileEngine, parse_methods, plan_profile
from speclab.profile.run import cell_timings, run_engine

__all__ = [
    "ProfileFit",
    "error_lines",
    "fit_profile",
    "parse_methods",
    "plan_profile",
    "profile",
    "resolve_out",
    "save_fit",
]


def resolve_out(out: str) -> tuple[str, Path]:
    """`--out NAME` (saved where `--cost-model NAME` finds it) or a path to a .toml file: (name, path)."""
    if out.endswith(".toml") or "/" in out:
        p = Path(out)
        if p.suffix != ".toml":
            raise ConfigError(f"--out {out!r}: give a NAME or a path ending in .toml")
        return p.stem, p
    if not out or not all(c.isalnum() or c in "-_." for c in out):
        raise ConfigError(f"--out {out!r}: a name may hold letters, digits, '-', '_' and '.'")
    return out, user_dir() / f"{out}.toml"


def error_lines(fit: ProfileFit) -> list[str]:
    """The held-out errors per kind and form, as text."""
    out = [f"{'kind':<30} {'form':<16} {'per step':>8} {'per cell':>8} {'all':>7}"]
    for e in fit.errors:

        def pct(v: float | None, sign: str = "") -> str:
            return "-" if v is None else f"{100 * v:{sign}.1f}%"

        out.append(
            f"{e.kind:<30} {e.form:<16} {pct(e.mean_abs_rel_err):>8} {pct(e.cell_abs_err):>8} "
            f"{pct(e.total_rel_err, '+'):>7}{'  chosen' if e.chosen else ''}"
        )
    return out


def save_fit(fit: ProfileFit, path: Path, work: Path) -> None:
    lines = [
        "# written by `speclab profile`; error on held-out profile cells: mean |relative error| per step,",
        "# mean |relative error| of a cell's summed time (the choice), relative error of the whole sum:",
    ]
    lines += [f"#   {ln}" for ln in error_lines(fit)]
    lines.append(f"# raw data: {work}")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, fit.model.to_toml("\n".join(lines)))
    atomic_write_text(work / "fit.json", json.dumps(fit.to_dict(), indent=1) + "\n")


def profile(
    engines: list[ProfileEngine],
    name: str,
    path: Path,
    work: Path,
    echo: Callable[[str], None] = print,
) -> ProfileFit:
    """Run every engine (reusing complete earlier ones), fit, save the model TOML at `path`."""
    cells = []
    for i, eng in enumerate(engines, 1):
        run_engine(eng, work, echo=echo, prefix=f"[engine {i}/{len(engines)}] ")
        cells += cell_timings(eng, work)
    desc = f"profiled by `speclab profile`: target {engines[0].spec.target} ({engines[0].spec.dtype}), " + (
        ", ".join(e.label for e in engines)
    )
    fit = fit_profile(cells, name, desc)
    save_fit(fit, path, work)
    return fit
