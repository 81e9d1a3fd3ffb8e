"""Cost models by name (presets shipped as TOML data files) or by path to a TOML file."""

from __future__ import annotations

from pathlib import Path

from speclab.costmodel.model import CostModel
from speclab.errors import ConfigError
from speclab.models.prepare import cache_root
from speclab.outputs import check_no_loop

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets" / "cost_models"


def list_cost_models() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def user_dir() -> Path:
    """Where `speclab profile` saves named cost models (SPECLAB_CACHE or ~/.cache/speclab, /cost_models);
    get_cost_model finds them by name after the presets."""
    return cache_root() / "cost_models"


def preset_path(name: str) -> Path:
    return PRESET_DIR / f"{name}.toml"


def resolve_cost_model(name_or_path: str | Path) -> Path:
    """The file a cost-model name or path stands for; ConfigError (the same line from every command) when
    there is none. Reads nothing."""
    s = str(name_or_path)
    p = Path(s)
    if s in list_cost_models():
        p = preset_path(s)
    elif "/" not in s and (user_dir() / f"{s}.toml").is_file():
        p = user_dir() / f"{s}.toml"
    elif not (p.suffix == ".toml" or p.exists() or "/" in s):
        raise ConfigError(
            f"unknown cost model {s!r} (presets: {', '.join(list_cost_models())}; or a .toml path)"
        )
    check_no_loop(p, "cost model file ")
    if not p.is_file():
        raise ConfigError(f"cost model file {s}: not found")
    return p


def get_cost_model(name_or_path: str | Path | CostModel) -> CostModel:
    """A preset name (see list_cost_models) or a path to a cost-model TOML file."""
    if isinstance(name_or_path, CostModel):
        return name_or_path.validate()
    s = str(name_or_path)
    p = resolve_cost_model(s)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cost model file {s}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"cost model file {s}: cannot read ({exc.strerror})") from None
    model = CostModel.from_toml(text, str(p))
    model.path = str(p)
    return model
