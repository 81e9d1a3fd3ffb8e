"""Server cells: method x workload x load (a request rate or a concurrency level), one server per engine.

Ids follow the offline cells' pattern, `<label>.<workload>.srv-r<rate>.<hash>` or `...srv-c<N>.<hash>`; the
hash covers everything the cell measures (target, dtype, prompts, max tokens, seed, engine settings, the load,
burstiness, ignore_eos, the SLO and a sampling setting other than greedy), so a rerun skips finished cells and a changed setting makes a new cell.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speclab.bench.cells import digest, engine_settings, engine_spec, mix_fingerprint
from speclab.bench.sampling import Setting, sweep_settings
from speclab.bench.spec import MethodEntry, SweepSpec
from speclab.engine.protocol import EngineSpec
from speclab.errors import ConfigError
from speclab.workloads.file_workloads import file_fingerprint

MAX_SEQS_FOR_RATES = (
    256  # an open-loop cell may have every request in flight; vLLM's usual GPU default caps it
)


@dataclass
class ServerCell:
    cell_id: str
    engine_key: str
    method: MethodEntry
    workload: str
    request_rate: float | None  # open loop (Poisson at this rate), or
    concurrency: int | None  # closed loop (all queued at once, at most N in flight)
    num_prompts: int
    baseline_key: str  # equal for a cell and its no-SD cell at the same load (and sampling setting)
    setting: Setting = field(default_factory=Setting)  # sampling (bench/sampling.py); default: greedy
    arrivals: str | None = None  # "logged[:SPEED]": the log's own arrival times (no rate, no concurrency)

    @property
    def is_baseline(self) -> bool:
        return self.method.name == "none"

    @property
    def load_text(self) -> str:
        if self.arrivals:
            return f"arrivals {self.arrivals}"
        return f"{self.request_rate:g} req/s" if self.request_rate is not None else f"conc {self.concurrency}"

    def describe(self, spec: SweepSpec) -> dict[str, Any]:
        """The cell's settings as they appear in its results row."""
        sv = spec.server
        assert sv is not None
        return {
            "cell_id": self.cell_id,
            "mode": "server",
            "target": spec.target,
            "dtype": spec.dtype,
            "method": self.method.name,
            "label": self.method.label,
            "k": self.method.k,
            "method_options": self.method.options,
            "workload": self.workload,
            "batching": "server",
            "batch_size": None,
            "load": {
                "request_rate": self.request_rate,
                "max_concurrency": self.concurrency,
                "burstiness": sv.burstiness,
                **({"arrivals": self.arrivals} if self.arrivals else {}),
            },
            "num_prompts": self.num_prompts,
            "max_tokens": spec.max_tokens,
            "ignore_eos": sv.ignore_eos,
            "slo_ms": dict(sv.slo),
            "seed": spec.seed,
            **self.setting.row_fields(),
        }


@dataclass
class ServerGroup:
    engine_id: str
    engine: EngineSpec
    cells: list[ServerCell] = field(default_factory=list)


def server_loads(sv: Any) -> list[tuple[float | None, int | None, str | None]]:
    """A [server] table's loads as (request rate, concurrency, logged arrivals), one set per load."""
    loads: list[tuple[float | None, int | None, str | None]] = [(r, None, None) for r in sv.request_rates]
    loads += [(None, c, None) for c in sv.concurrency]
    if sv.arrivals:
        loads.append((None, None, sv.arrivals))
    return loads


def load_name(prefix: str, rate: float | None, conc: int | None, arr: str | None, st: Any) -> str:
    """A load's part of a cell id: PREFIX-rR, PREFIX-cN or PREFIX-loggedS, then the sampling setting's tag."""
    load = f"{prefix}-r{rate:g}" if rate is not None else f"{prefix}-c{conc}"
    if arr:
        load = f"{prefix}-" + arr.replace(":", "")
    return load + (f".{st.tag()}" if st.tag() else "")


def expand_server_cells(spec: SweepSpec) -> list[ServerCell]:
    """All server cells of a sweep (its [server] table), baseline cells first."""
    sv = spec.server
    if sv is None:
        raise ConfigError(f"{spec.source}: --server needs a [server] table (request_rates / concurrency)")
    n = sv.num_prompts or spec.num_prompts
    loads = server_loads(sv)
    cells: list[ServerCell] = []
    for m in spec.methods:
        eng = engine_settings(engine_spec(spec, m))
        ekey = digest({"server": True, **eng})
        for w in spec.workloads:
            if m.workloads is not None and w not in m.workloads:
                continue
            fp = file_fingerprint(w, spec.workload_files)
            for (rate, conc, arr), st in ((ld, st) for ld in loads for st in sweep_settings(spec)):
                common: dict[str, Any] = {
                    "mode": "server",
                    "target": spec.target,
                    "dtype": spec.dtype,
                    "workload": w,
                    "source": spec.workload_sources.get(w),
                    "num_prompts": n,
                    "max_tokens": spec.max_tokens,
                    "max_prompt_tokens": spec.prompt_budget,
                    "seed": spec.seed,
                    "engine": {k: v for k, v in eng.items() if k not in ("method", "k", "options")},
                    "load": {"request_rate": rate, "concurrency": conc, "burstiness": sv.burstiness},
                    **({"arrivals": arr} if arr else {}),
                    "ignore_eos": sv.ignore_eos,
                    "slo": sv.slo,
                }
                if fp is not None:
                    common["file_sha256"] = fp
                if w in spec.workload_mixes:
                    common["mix"] = mix_fingerprint(spec, w)
                if not st.is_default:  # sampled cells only: greedy cells keep their ids
                    common["sampling"] = st.key()
                h = digest({"common": common, "method": m.name, "k": m.k, "options": m.options})
                load = load_name("srv", rate, conc, arr, st)
                cells.append(
                    ServerCell(
                        cell_id=f"{m.label}.{w}.{load}.{h}",
                        engine_key=ekey,
                        method=m,
                        workload=w,
                        request_rate=rate,
                        concurrency=conc,
                        num_prompts=n,
                        baseline_key=digest(common),
                        setting=st,
                        arrivals=arr,
                    )
                )
    cells.sort(key=lambda c: 0 if c.is_baseline else 1)
    return cells


def group_server_engines(spec: SweepSpec, cells: list[ServerCell]) -> list[ServerGroup]:
    """One server per engine configuration, no-SD first; max_num_seqs covers every cell's load."""
    groups: dict[str, ServerGroup] = {}
    for c in cells:
        g = groups.get(c.engine_key)
        if g is None:
            g = groups[c.engine_key] = ServerGroup(
                engine_id=f"{c.method.label}-srv-{c.engine_key}", engine=engine_spec(spec, c.method)
            )
        g.cells.append(c)
    out = sorted(groups.values(), key=lambda g: 0 if g.engine.method == "none" else 1)
    for g in out:
        need = [c.concurrency or min(c.num_prompts, MAX_SEQS_FOR_RATES) for c in g.cells]
        g.engine.max_num_seqs = spec.max_num_seqs or max(need)
    return out
