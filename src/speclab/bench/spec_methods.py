"""A sweep's [[methods]] entries: each checked (name, k, options, label, restrictions) before anything starts.

Method options are vLLM's speculative_config keys plus speclab's own (`model`, `proposer_options`). vLLM's
names are read from the fields of its SpeculativeConfig dataclass in the installed vLLM (its source, parsed,
not imported: a sweep is checked without loading torch), so a misspelt option is refused with the nearest
name instead of being passed on; where vLLM is not installed the names cannot be known and are not checked.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from speclab.catalog import ADAPTIVE_DRAFTERS, ENGINE_METHODS, METHODS_NEEDING_MODEL
from speclab.errors import ConfigError
from speclab.validation import MAX_BATCH_SIZE, show, unknown_keys

METHOD_KEYS = {"name", "method", "k", "label", "workloads", "batch_sizes", "options"}
# options speclab reads itself (not vLLM's): the drafter or class, and speclab's proposers' options
SPECLAB_OPTIONS = ("model", "proposer_options")
# the most draft tokens a step may propose (far above any method's useful k; keeps arrays small)
MAX_K = 1024
_LABEL_RE = re.compile(r"^[A-Za-z0-9_.+\-]+$")


@dataclass
class MethodEntry:
    name: str  # an engine method (speclab.catalog.ENGINE_METHODS)
    k: int | None
    options: dict[str, Any] = field(default_factory=dict)
    label: str = ""  # shown in tables and cell ids; default "none" / "<name>-k<k>"
    workloads: list[str] | None = None  # restrict this entry to these workloads
    batch_sizes: list[int] | None = None  # restrict this entry to these batch sizes

    def __post_init__(self) -> None:
        if not self.label:
            self.label = "none" if self.name == "none" else f"{self.name}-k{self.k}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@functools.cache
def vllm_option_names() -> frozenset[str] | None:
    """The field names of vLLM's SpeculativeConfig (its dataclass fields, read from the installed source);
    None when vLLM is not installed or its source cannot be read."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    src = Path(next(iter(spec.submodule_search_locations))) / "config" / "speculative.py"
    try:
        tree = ast.parse(src.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "SpeculativeConfig":
            return frozenset(
                n.target.id
                for n in node.body
                if isinstance(n, ast.AnnAssign)
                and isinstance(n.target, ast.Name)
                and "ClassVar" not in ast.unparse(n.annotation)
            )
    return None


def bounded_int(v: Any, where: str, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{where}: expected an integer, got {show(v)}")
    if minimum is not None and v < minimum:
        raise ConfigError(f"{where}: must be >= {minimum}, got {show(v)}")
    if maximum is not None and v > maximum:
        raise ConfigError(f"{where}: must be <= {maximum}, got {show(v)}")
    return v


def str_item(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(f"{where}: expected a non-empty string, got {v!r}")
    return v.strip()


def str_list(v: Any, where: str) -> list[str]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v:
        raise ConfigError(f"{where}: expected a non-empty list of strings, got {v!r}")
    out = [str_item(x, where) for x in v]
    if len(set(out)) != len(out):
        raise ConfigError(f"{where}: duplicate entries in {out}")
    return out


def batch_sizes(v: Any, where: str) -> list[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, list) or not v:
        raise ConfigError(f"{where}: expected a non-empty list of batch sizes, got {v!r}")
    out = []
    for b in v:
        if isinstance(b, bool) or not isinstance(b, int):
            raise ConfigError(f"{where}: batch size {show(b)} is not an integer")
        if not 1 <= b <= MAX_BATCH_SIZE:
            raise ConfigError(f"{where}: batch size {show(b)} is invalid (must be 1..{MAX_BATCH_SIZE})")
        out.append(b)
    if len(set(out)) != len(out):
        raise ConfigError(f"{where}: duplicate batch sizes in {out}")
    return sorted(out)


def _options(d: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if "options" in d:
        if not isinstance(d["options"], dict):
            raise ConfigError(f"{where}: field options: expected a table")
        options.update(d["options"])
    options.update({key: value for key, value in d.items() if key not in METHOD_KEYS})
    if name == "none" and options:
        raise ConfigError(f"{where}: method none takes no options (got {', '.join(sorted(options))})")
    known = vllm_option_names()
    if known is not None:  # passed on to vLLM's speculative_config: a typo would be silently ignored
        allowed = (known | set(SPECLAB_OPTIONS)) - {"method", "num_speculative_tokens"}
        unknown_keys(options, allowed, f"{where}: method option", list_known=False)
    if name in METHODS_NEEDING_MODEL:
        what = (
            "a dotted class path"
            if name == "custom_class"
            else "a drafter (preset name, checkpoint or hub id)"
        )
        if not isinstance(options.get("model"), str) or not options["model"].strip():
            raise ConfigError(f"{where}: field model: method {name} needs {what}")
    if "proposer_options" in options:
        if name != "custom_class" and name not in ADAPTIVE_DRAFTERS:
            raise ConfigError(
                f"{where}: field proposer_options: only custom_class (speclab's adapters) and "
                f"{', '.join(ADAPTIVE_DRAFTERS)} (the live adaptive proposer over its drafter) take it"
            )
        if not isinstance(options["proposer_options"], dict):
            raise ConfigError(f"{where}: field proposer_options: expected a table")
    if name == "ngram":
        lo = options.get("prompt_lookup_min", 1)
        hi = options.get("prompt_lookup_max", lo)
        for key, val in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
            bounded_int(val, f"{where}: field {key}", 1, 1 << 20)
        if lo > hi:
            raise ConfigError(f"{where}: prompt_lookup_min ({lo}) > prompt_lookup_max ({hi})")
    return options


def method_entry(d: Any, i: int, src: str) -> MethodEntry:
    where = f"{src}: methods[{i}]"
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected a table ([[methods]])")
    if "name" in d and "method" in d:
        raise ConfigError(f"{where}: give either name or method, not both")
    name = d.get("name", d.get("method"))
    if name is None:
        raise ConfigError(f"{where}: field name: missing (one of {', '.join(ENGINE_METHODS)})")
    name = str_item(name, f"{where}: field name")
    if name not in ENGINE_METHODS:
        raise ConfigError(f"{where}: unknown method {name!r} (known: {', '.join(ENGINE_METHODS)})")
    where = f"{where} ({name})"
    k = d.get("k")
    if name == "none":
        if k not in (None, 0):
            raise ConfigError(f"{where}: field k: method none takes no k")
        k = None
    elif k is None:
        raise ConfigError(f"{where}: field k: missing (number of speculative tokens, >= 1)")
    else:
        k = bounded_int(k, f"{where}: field k", 1, MAX_K)
    options = _options(d, name, where)
    label = d.get("label", "")
    if label:
        label = str_item(label, f"{where}: field label")
        if not _LABEL_RE.match(label):
            raise ConfigError(f"{where}: field label: {label!r} may use only letters, digits and . _ + -")
    workloads = str_list(d["workloads"], f"{where}: field workloads") if "workloads" in d else None
    bs = batch_sizes(d["batch_sizes"], f"{where}: field batch_sizes") if "batch_sizes" in d else None
    return MethodEntry(name=name, k=k, options=options, label=label, workloads=workloads, batch_sizes=bs)
