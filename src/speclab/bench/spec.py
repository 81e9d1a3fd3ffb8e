"""Sweep files: a TOML description of a benchmark sweep, parsed and checked without loading any model.

A sweep names one target (and dtype), the SD methods to try (each with k and its options), the workloads,
the batch sizes and how a batch is formed, the prompt count, max tokens and seed. Example:

    name = "my-sweep"
    target = "smollm2-135m"          # preset name, checkpoint dir or hub id
    dtype = "float32"
    workloads = ["offline-code-edit", "offline-math"]   # or "file:PATH" (a prompts file / request log),
                                     # or [workloads.NAME] tables instead of this list (below)
    mix = { offline-code-edit = 0.5, offline-math = 0.5 }   # optional: a mixed workload named "mix"
                                     # (workloads/mix.py); workloads may then be left out
    batch_sizes = [1, 4, 16]
    batching = "continuous"          # or "replicate", or ["replicate", "continuous"]
    num_prompts = 16
    max_tokens = 64
    seed = 42
    repeats = 1                      # measure each cell N times, interleaved with its baseline (bench.md)
    restart_each_repeat = false      # start every engine anew for each round of repeats (bench.md)

    [engine]                         # optional engine settings
    max_model_len = 2048
    enforce_eager = false
    kv_cache_gib = 2.0
    llm_kwargs = { enable_prefix_caching = false }

    [[methods]]
    name = "none"                    # the baseline; added automatically when missing

    [[methods]]
    name = "ngram"
    k = 3
    prompt_lookup_min = 2            # any other key is a method option (speculative_config)
    prompt_lookup_max = 4

    [[methods]]
    name = "draft_model"
    k = 3
    model = "smollm2-135m-draft-l8"
    # label = "draft-l8", workloads = [...], batch_sizes = [...] restrict or rename an entry

Server mode (`speclab bench SWEEP --server`) reads a `[server]` table: request rates, concurrency levels,
SLO (speclab/bench/server_spec.py).

Workloads as tables (instead of the list; in this order): an empty table names a registered workload, one
with `path` is the user's own prompts file or request log (docs/workloads.md):

    [workloads.offline-math]
    [workloads.my-traffic]
    path = "traffic.jsonl"           # relative to the current directory
    format = "auto"                  # or "prompts", "chat", "request-log"
    category = "chat"                # optional (default: the category every line gives, else "other")

A bad sweep is refused in one pass before anything starts. The [[methods]] entries are checked in
bench/spec_methods.py, file workloads' tables in workloads/file_workloads.py, numbers by speclab.validation.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from speclab.bench.sampling import SAMPLING_KEYS, parse_sampling
from speclab.bench.server_spec import ServerSpec, parse_server
from speclab.bench.spec_methods import (
    METHOD_KEYS,
    MethodEntry,
    batch_sizes,
    bounded_int,
    method_entry,
    str_item,
    str_list,
)
from speclab.engine.protocol import BATCHING, DTYPES
from speclab.errors import ConfigError
from speclab.validation import MAX_BATCH_SIZE, MAX_PROMPTS, MAX_SEED, loads_toml, number, unknown_fields

__all__ = [
    "METHOD_KEYS",
    "MethodEntry",
    "SweepSpec",
    "load_preset",
    "load_sweep",
    "parse_sweep",
    "parse_sweep_text",
]

TOP_KEYS = {
    "name",
    "description",
    "target",
    "dtype",
    "workloads",
    "batch_sizes",
    "batching",
    "num_prompts",
    "max_tokens",
    "max_prompt_tokens",
    "seed",
    "engine",
    "methods",
    "workload_sources",
    "repeats",
    "restart_each_repeat",
    "server",
    "mix",
    *SAMPLING_KEYS,
}
ENGINE_KEYS = {"max_model_len", "enforce_eager", "kv_cache_gib", "llm_kwargs", "max_num_seqs"}


@dataclass
class SweepSpec:
    name: str
    target: str
    dtype: str
    workloads: list[str]
    batch_sizes: list[int]
    batching: list[str]
    num_prompts: int
    max_tokens: int
    seed: int
    methods: list[MethodEntry]
    max_model_len: int = 2048
    max_prompt_tokens: int | None = None  # default: max_model_len - max_tokens
    enforce_eager: bool = False
    kv_cache_gib: float = 2.0
    llm_kwargs: dict[str, Any] = field(default_factory=dict)
    max_num_seqs: int | None = None  # default: the largest batch size an engine serves
    workload_sources: dict[str, str] = field(default_factory=dict)  # workload -> local data path
    workload_files: dict[str, dict[str, Any]] = field(default_factory=dict)  # [workloads.NAME] with a path
    workload_mixes: dict[str, dict[str, float]] = field(default_factory=dict)  # mixed workload -> its shares
    description: str = ""
    source: str = ""  # where the spec came from (file path or preset:NAME), for messages
    # times each cell is measured, interleaved with its baseline; not part of cell ids (adding repeats to a
    # run measures only the missing ones)
    repeats: int = 1
    # with repeats > 1: every engine is stopped after each round of repeats and started anew for the next,
    # so a persistent per-engine speed offset (5-30% between start-ups on the CPU) varies across repeats
    # instead of biasing one entry
    restart_each_repeat: bool = False
    # server mode (`speclab bench SWEEP --server`): the loads each engine is served at (bench/server_spec.py)
    server: ServerSpec | None = None
    # sampling, a cell axis (bench/sampling.py): each temperature is its own cell; "as-logged" runs each
    # request of a request log with its own logged settings
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    top_p: float = 1.0
    top_k: int = 0
    sampling: str = "fixed"

    @property
    def prompt_budget(self) -> int:
        return (
            self.max_prompt_tokens
            if self.max_prompt_tokens is not None
            else self.max_model_len - self.max_tokens
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "target": self.target,
            "dtype": self.dtype,
            "workloads": self.workloads,
            "batch_sizes": self.batch_sizes,
            "batching": self.batching,
            "num_prompts": self.num_prompts,
            "max_tokens": self.max_tokens,
            "max_prompt_tokens": self.max_prompt_tokens,
            "seed": self.seed,
            "repeats": self.repeats,
            "restart_each_repeat": self.restart_each_repeat,
            "sampling": self.sampling,
            "temperatures": self.temperatures,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "engine": {
                "max_model_len": self.max_model_len,
                "enforce_eager": self.enforce_eager,
                "kv_cache_gib": self.kv_cache_gib,
                "llm_kwargs": self.llm_kwargs,
                "max_num_seqs": self.max_num_seqs,
            },
            "workload_sources": self.workload_sources,
            "workload_files": self.workload_files,
            "workload_mixes": self.workload_mixes,
            "methods": [m.to_dict() for m in self.methods],
            **({"server": self.server.to_dict()} if self.server is not None else {}),
        }


# --- parsing ----------------------------------------------------------------------------------------------


# (kept as names: callers and tests use them)
_int = bounded_int
_str = str_item
_str_list = str_list
_batch_sizes = batch_sizes
_method = method_entry


# bounds of the sweep's numbers: far beyond any real sweep, small enough that nothing overflows
MAX_MODEL_LEN = 1 << 24
MAX_REPEATS = 1000
MAX_KV_CACHE_GIB = 1 << 20


def _engine(data: dict[str, Any], src: str, sizes: list[int], max_tokens: int) -> dict[str, Any]:
    """The [engine] table (and max_prompt_tokens, bounded by its max_model_len), checked."""
    engine = data.get("engine", {})
    if not isinstance(engine, dict):
        raise ConfigError(f"{src}: field engine: expected a table ([engine])")
    unknown_fields(engine, sorted(ENGINE_KEYS), f"{src}: engine")
    max_model_len = _int(engine.get("max_model_len", 2048), f"{src}: engine.max_model_len", 16, MAX_MODEL_LEN)
    enforce_eager = engine.get("enforce_eager", False)
    if not isinstance(enforce_eager, bool):
        raise ConfigError(f"{src}: engine.enforce_eager: expected true or false, got {enforce_eager!r}")
    kv = engine.get("kv_cache_gib", 2.0)
    kv = number(kv, f"{src}: engine.kv_cache_gib", 0.0, MAX_KV_CACHE_GIB)
    if kv <= 0:
        raise ConfigError(f"{src}: engine.kv_cache_gib: must be a number > 0, got {kv!r}")
    llm_kwargs = engine.get("llm_kwargs", {})
    if not isinstance(llm_kwargs, dict):
        raise ConfigError(f"{src}: engine.llm_kwargs: expected a table")
    max_num_seqs = engine.get("max_num_seqs")
    if max_num_seqs is not None:
        max_num_seqs = _int(max_num_seqs, f"{src}: engine.max_num_seqs", 1, MAX_BATCH_SIZE)
        if max_num_seqs < max(sizes):
            raise ConfigError(
                f"{src}: engine.max_num_seqs ({max_num_seqs}) is below the largest batch size ({max(sizes)})"
            )
    if max_tokens >= max_model_len:
        raise ConfigError(
            f"{src}: max_tokens ({max_tokens}) must be below engine.max_model_len ({max_model_len})"
        )
    max_prompt_tokens = data.get("max_prompt_tokens")
    if max_prompt_tokens is not None:
        max_prompt_tokens = _int(max_prompt_tokens, f"{src}: field max_prompt_tokens", 1, MAX_MODEL_LEN)
        if max_prompt_tokens + max_tokens > max_model_len:
            raise ConfigError(
                f"{src}: max_prompt_tokens ({max_prompt_tokens}) + max_tokens ({max_tokens}) exceeds "
                f"engine.max_model_len ({max_model_len})"
            )
    return {
        "max_model_len": max_model_len,
        "max_prompt_tokens": max_prompt_tokens,
        "enforce_eager": enforce_eager,
        "kv_cache_gib": kv,
        "llm_kwargs": dict(llm_kwargs),
        "max_num_seqs": max_num_seqs,
    }


def _methods(data: dict[str, Any], src: str, workloads: list[str], sizes: list[int], max_len: int) -> list:
    """The [[methods]] entries, checked against the sweep's workloads and batch sizes; the baseline added."""
    raw_methods = data.get("methods")
    if raw_methods is None:
        raise ConfigError(f"{src}: no [[methods]] given")
    if not isinstance(raw_methods, list) or not raw_methods:
        raise ConfigError(f"{src}: field methods: expected one or more [[methods]] tables")
    methods = [_method(m, i, src) for i, m in enumerate(raw_methods)]
    labels = [m.label for m in methods]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ConfigError(
            f"{src}: methods: duplicate label(s) {', '.join(dup)}; give each entry a distinct label"
        )
    for m in methods:
        if m.k is not None and m.k >= max_len:
            raise ConfigError(
                f"{src}: methods ({m.label}): k ({m.k}) must be below engine.max_model_len ({max_len})"
            )
        for w in m.workloads or []:
            if w not in workloads:
                raise ConfigError(
                    f"{src}: methods ({m.label}): workload {w!r} is not in the sweep's workloads"
                )
        for b in m.batch_sizes or []:
            if b not in sizes:
                raise ConfigError(
                    f"{src}: methods ({m.label}): batch size {b} is not in the sweep's batch_sizes"
                )
    if not any(m.name == "none" for m in methods):
        # speedups need the no-SD baseline at every (workload, batch size)
        methods.insert(0, MethodEntry(name="none", k=None))
    else:
        nones = [m for m in methods if m.name == "none"]
        if len(nones) > 1:
            raise ConfigError(f"{src}: methods: give method none once")
        if nones[0].workloads or nones[0].batch_sizes:
            raise ConfigError(f"{src}: methods (none): the baseline cannot be restricted (speedups need it)")
    return methods


def parse_sweep(data: dict[str, Any], source: str = "sweep") -> SweepSpec:
    """Check a parsed TOML document and build the sweep. Raises ConfigError (one line) on bad input."""
    src = source
    unknown_fields(data, sorted(TOP_KEYS), src)
    if "target" not in data:
        raise ConfigError(f"{src}: field target: missing (preset name, checkpoint dir or hub id)")
    target = _str(data["target"], f"{src}: field target")
    dtype = data.get("dtype", "float32")
    if dtype not in DTYPES:
        raise ConfigError(f"{src}: field dtype: {dtype!r} not one of {', '.join(DTYPES)}")
    if "workloads" not in data and "mix" not in data:
        raise ConfigError(f"{src}: field workloads: missing")
    files: dict[str, dict[str, Any]] = {}
    if "workloads" not in data:  # a top-level mix alone
        workloads = []
    elif isinstance(data["workloads"], dict):
        from speclab.workloads.file_workloads import workload_tables

        workloads, files = workload_tables(data["workloads"], src)
    else:
        workloads = _str_list(data["workloads"], f"{src}: field workloads")
    mixes: dict[str, dict[str, float]] = {}
    tables = data["workloads"] if isinstance(data.get("workloads"), dict) else {}
    if "mix" in data or any(isinstance(t, dict) and "mix" in t for t in tables.values()):
        from speclab.workloads.file_workloads import mix_tables

        added, mixes = mix_tables(tables, src, set(files), data.get("mix"))
        workloads = [*workloads, *(w for w in added if w not in workloads)]
    if "batch_sizes" not in data:
        raise ConfigError(f"{src}: field batch_sizes: missing")
    sizes = _batch_sizes(data["batch_sizes"], f"{src}: field batch_sizes")
    batching = _str_list(data.get("batching", "continuous"), f"{src}: field batching")
    for b in batching:
        if b not in BATCHING:
            raise ConfigError(f"{src}: field batching: {b!r} not one of {', '.join(BATCHING)}")
    num_prompts = _int(data.get("num_prompts", 16), f"{src}: field num_prompts", 1, MAX_PROMPTS)
    max_tokens = _int(data.get("max_tokens", 128), f"{src}: field max_tokens", 1, MAX_MODEL_LEN)
    seed = _int(data.get("seed", 42), f"{src}: field seed", 0, MAX_SEED)
    repeats = _int(data.get("repeats", 1), f"{src}: field repeats", 1, MAX_REPEATS)
    restart_each_repeat = data.get("restart_each_repeat", False)
    if not isinstance(restart_each_repeat, bool):
        raise ConfigError(f"{src}: field restart_each_repeat: expected true or false")
    engine = _engine(data, src, sizes, max_tokens)
    from speclab.workloads.files import FILE_PREFIX

    on_file = {w for w in workloads if w in files or w.startswith(FILE_PREFIX)}
    sampling = parse_sampling(data, src, workloads, on_file)
    server = parse_server(data["server"], src) if "server" in data else None
    sources = data.get("workload_sources", {})
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise ConfigError(f'{src}: field workload_sources: expected a table of workload = "path"')
    return SweepSpec(
        name=str(data.get("name") or Path(source).stem),
        description=str(data.get("description", "")),
        target=target,
        dtype=dtype,
        workloads=workloads,
        batch_sizes=sizes,
        batching=batching,
        num_prompts=num_prompts,
        max_tokens=max_tokens,
        seed=seed,
        repeats=repeats,
        restart_each_repeat=restart_each_repeat,
        methods=_methods(data, src, workloads, sizes, engine["max_model_len"]),
        **engine,
        workload_sources=dict(sources),
        workload_files=files,
        workload_mixes=mixes,
        source=source,
        server=server,
        **sampling,
    )


def sweep_toml(text: str, source: str) -> dict[str, Any]:
    return loads_toml(text, source)


def parse_sweep_text(text: str, source: str = "sweep") -> SweepSpec:
    return parse_sweep(sweep_toml(text, source), source)


def read_sweep_file(p: Path) -> str:
    try:
        return p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{p}: sweep file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a directory, expected a sweep .toml file") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read sweep file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a text (UTF-8) file") from None


def load_sweep(path: str | Path) -> SweepSpec:
    p = Path(path)
    return parse_sweep_text(read_sweep_file(p), str(p))


# --- presets ----------------------------------------------------------------------------------------------


def _preset_dir() -> Any:
    return resources.files("speclab") / "presets" / "sweeps"


def list_presets() -> list[tuple[str, str]]:
    """(name, description) of every sweep preset shipped with speclab."""
    out = []
    d = _preset_dir()
    if not d.is_dir():
        return out
    for f in sorted(d.iterdir(), key=lambda x: x.name):
        if f.name.endswith(".toml"):
            name = f.name[: -len(".toml")]
            try:
                desc = str(tomllib.loads(f.read_text()).get("description", ""))
            except tomllib.TOMLDecodeError:
                desc = "(malformed)"
            out.append((name, desc))
    return out


def preset_text(name: str) -> str:
    f = _preset_dir() / f"{name}.toml"
    if not f.is_file():
        known = ", ".join(n for n, _ in list_presets())
        raise ConfigError(f"unknown sweep preset {name!r} (known: {known})")
    return f.read_text()


def load_preset(name: str) -> SweepSpec:
    return parse_sweep_text(preset_text(name), f"preset:{name}")
