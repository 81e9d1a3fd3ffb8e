"""Cells (method x workload x batching x batch size) and engines (one per engine configuration).

A cell id is readable and stable: the same sweep settings give the same id on every run, so a rerun skips
what is done; changing anything that affects a cell's result (target, dtype, k, options, prompt count, max
tokens, seed, engine settings, a sampling setting other than greedy) changes the short hash at its end; a
sampled cell's id also names its setting (`....b4.t0.7.<hash>`, `....b4.logged.<hash>`). The largest batch size an engine serves is
not part of a cell id: adding a batch size to a sweep keeps the ids of the cells already run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from typing import Any

from speclab.bench.sampling import Setting, sweep_settings
from speclab.bench.spec import MethodEntry, SweepSpec
from speclab.engine.protocol import EngineSpec
from speclab.workloads.file_workloads import file_fingerprint

_BATCHING_SHORT = {"replicate": "rep", "continuous": "cont"}


def digest(obj: Any, n: int = 8) -> str:
    """A short stable hash of JSON-able settings: the engine keys, cell ids and baseline keys of cells."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:n]


@dataclass
class Cell:
    cell_id: str
    engine_key: str  # cells with the same key share one engine
    method: MethodEntry
    target: str
    dtype: str
    workload: str
    batching: str
    batch_size: int
    num_prompts: int
    max_tokens: int
    seed: int
    baseline_key: str  # equal for a cell and its matching no-SD cell
    setting: Setting = field(default_factory=Setting)  # sampling (bench/sampling.py); default: greedy
    setting_rank: int = 0  # the setting's place in the sweep (orders a cell's baseline right before it)

    @property
    def is_baseline(self) -> bool:
        return self.method.name == "none"

    @property
    def sampled(self) -> bool:
        return not self.setting.greedy

    def describe(self) -> dict[str, Any]:
        """The cell's settings as they appear in a results row."""
        return {
            "cell_id": self.cell_id,
            "target": self.target,
            "dtype": self.dtype,
            "method": self.method.name,
            "label": self.method.label,
            "k": self.method.k,
            "method_options": self.method.options,
            "workload": self.workload,
            "batching": self.batching,
            "batch_size": self.batch_size,
            "num_prompts": self.num_prompts,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            **self.setting.row_fields(),
        }


@dataclass
class EngineGroup:
    engine_id: str  # readable: "<label>-<hash>"
    engine: EngineSpec
    cells: list[Cell] = field(default_factory=list)


def engine_spec(spec: SweepSpec, m: MethodEntry) -> EngineSpec:
    """The engine a method entry of the sweep runs on (max_num_seqs is set later, from its cells)."""
    return EngineSpec(
        target=spec.target,
        dtype=spec.dtype,
        method=m.name,
        k=m.k,
        options=dict(m.options),
        max_model_len=spec.max_model_len,
        max_num_seqs=1,
        enforce_eager=spec.enforce_eager,
        kv_cache_gib=spec.kv_cache_gib,
        seed=spec.seed,
        llm_kwargs=dict(spec.llm_kwargs),
    )


# EngineSpec fields hashed into engine and cell ids whatever their value (all of them when ids were made);
# a field added later is hashed only when it differs from its default, so that existing run directories keep
# their ids (and resume) until a sweep uses the new setting.
_ID_FIELDS = (
    "target",
    "dtype",
    "method",
    "k",
    "options",
    "max_model_len",
    "enforce_eager",
    "kv_cache_gib",
    "seed",
    "llm_kwargs",
)
_NOT_IN_ID = ("max_num_seqs",)  # follows from the engine's cells: adding a batch size keeps the ids
_DEFAULT_ENGINE = EngineSpec(target="")


def engine_settings(eng: EngineSpec) -> dict[str, Any]:
    """What defines an engine, for its id: every EngineSpec field but max_num_seqs (see _ID_FIELDS)."""
    out = {}
    for f in fields(EngineSpec):
        if f.name in _NOT_IN_ID:
            continue
        value = getattr(eng, f.name)
        if f.name in _ID_FIELDS or value != getattr(_DEFAULT_ENGINE, f.name):
            out[f.name] = value
    return out


def expand_cells(spec: SweepSpec) -> list[Cell]:
    """All cells of a sweep, baseline (none) cells first, then in method order, workload, batching, batch."""
    cells: list[Cell] = []
    fingerprints = {w: file_fingerprint(w, spec.workload_files) for w in spec.workloads}
    settings = sweep_settings(spec)
    for m in spec.methods:
        eng = engine_settings(engine_spec(spec, m))
        ekey = digest(eng)
        for w in spec.workloads:
            if m.workloads is not None and w not in m.workloads:
                continue
            for batching in spec.batching:
                for b in spec.batch_sizes:
                    if m.batch_sizes is not None and b not in m.batch_sizes:
                        continue
                    for rank, st in enumerate(settings):
                        cells.append(_cell(spec, m, w, batching, b, st, rank, eng, ekey, fingerprints[w]))
    cells.sort(key=lambda c: 0 if c.is_baseline else 1)  # stable: keeps method order otherwise
    return cells


def mix_fingerprint(spec: SweepSpec, w: str) -> dict[str, Any]:
    """What a mixed workload's cell ids hash: its parts, their shares and each file part's bytes."""
    return {p: [s, file_fingerprint(p, spec.workload_files)] for p, s in spec.workload_mixes[w].items()}


def _cell(
    spec: SweepSpec,
    m: MethodEntry,
    w: str,
    batching: str,
    b: int,
    st: Setting,
    rank: int,
    eng: dict[str, Any],
    ekey: str,
    fingerprint: str | None,
) -> Cell:
    """One cell; its id and baseline key hash everything it measures (see the module docstring)."""
    common: dict[str, Any] = {
        "target": spec.target,
        "dtype": spec.dtype,
        "workload": w,
        "source": spec.workload_sources.get(w),
        "batching": batching,
        "batch_size": b,
        "num_prompts": spec.num_prompts,
        "max_tokens": spec.max_tokens,
        "max_prompt_tokens": spec.prompt_budget,
        "seed": spec.seed,
        # engine settings other than the method: a baseline must match them too
        "engine": {k: v for k, v in eng.items() if k not in ("method", "k", "options")},
    }
    if fingerprint is not None:  # only for file workloads: built-in cells keep their ids
        common["file_sha256"] = fingerprint
    if w in spec.workload_mixes:  # only for mixed workloads: other cells keep their ids
        common["mix"] = mix_fingerprint(spec, w)
    if not st.is_default:  # only for sampled cells: greedy cells keep the ids they always had
        common["sampling"] = st.key()
    bkey = digest(common)
    h = digest({"common": common, "method": m.name, "k": m.k, "options": m.options})
    tag = f".{st.tag()}" if st.tag() else ""
    return Cell(
        cell_id=f"{m.label}.{w}.{_BATCHING_SHORT[batching]}.b{b}{tag}.{h}",
        engine_key=ekey,
        method=m,
        target=spec.target,
        dtype=spec.dtype,
        workload=w,
        batching=batching,
        batch_size=b,
        num_prompts=spec.num_prompts,
        max_tokens=spec.max_tokens,
        seed=spec.seed,
        baseline_key=bkey,
        setting=st,
        setting_rank=rank,
    )


def group_engines(spec: SweepSpec, cells: list[Cell]) -> list[EngineGroup]:
    """One engine per engine configuration, holding all of its cells; baseline engines first so that every
    SD cell finds its no-SD cell (speedup, token-exactness) already done."""
    groups: dict[str, EngineGroup] = {}
    for c in cells:
        g = groups.get(c.engine_key)
        if g is None:
            eng = engine_spec(spec, c.method)
            g = groups[c.engine_key] = EngineGroup(engine_id=f"{c.method.label}-{c.engine_key}", engine=eng)
        g.cells.append(c)
    out = sorted(groups.values(), key=lambda g: 0 if g.engine.method == "none" else 1)
    for g in out:
        need = max(c.batch_size for c in g.cells)
        g.engine.max_num_seqs = spec.max_num_seqs or need
    return out
