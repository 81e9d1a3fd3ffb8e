"""The bench's Python API: load a sweep (file or preset, with overrides), check it, run it.

from speclab.bench import load_sweep_source, run_bench
spec, text = load_sweep_source(preset="demo-cpu", overrides={"num_prompts": 4})
outcome = run_bench(spec, "runs/demo", spec_text=text)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from speclab.bench.preflight import PromptSet, check_memory, preflight, render_workload
from speclab.bench.runner import PromptProvider, SweepOutcome, run_sweep
from speclab.bench.spec import SweepSpec, parse_sweep, preset_text, read_sweep_file, sweep_toml
from speclab.errors import ConfigError

# Overrides a command line may apply on top of a sweep file (top-level keys, or engine.<key>).
OVERRIDABLE = {
    "num_prompts",
    "max_tokens",
    "batch_sizes",
    "temperatures",
    "workloads",
    "batching",
    "seed",
    "repeats",
    "dtype",
    "target",
    "engine.enforce_eager",
    "engine.max_model_len",
    "engine.kv_cache_gib",
}


def load_sweep_source(
    path: str | Path | None = None,
    preset: str | None = None,
    overrides: dict[str, Any] | None = None,
    methods: list[str] | None = None,
) -> tuple[SweepSpec, str]:
    """Parse a sweep file or preset, apply overrides, validate. Returns the spec and the source text.

    methods: keep only the [[methods]] entries with these labels or names (the baseline is always kept)."""
    if (path is None) == (preset is None):
        raise ConfigError("give a sweep file or --preset NAME (one of them)")
    if preset is not None:
        text, source = preset_text(preset), f"preset:{preset}"
    else:
        p = Path(path)  # type: ignore[arg-type]
        source = str(p)
        text = read_sweep_file(p)
    data = sweep_toml(text, source)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in OVERRIDABLE:
            raise ConfigError(f"cannot override {key!r} (can: {', '.join(sorted(OVERRIDABLE))})")
        if key.startswith("engine."):
            eng = data.setdefault("engine", {})
            if not isinstance(eng, dict):
                raise ConfigError(f"{source}: field engine: expected a table")
            eng[key.split(".", 1)[1]] = value
        elif key == "workloads" and isinstance(data.get("workloads"), dict):
            # a sweep of [workloads.NAME] tables: keep the tables of the names asked for
            data[key] = {w: data["workloads"].get(w, {}) for w in value}
        else:
            data[key] = value
    if methods:
        raw = data.get("methods")
        if isinstance(raw, list):
            known = {str(m.get("label") or _default_label(m)) for m in raw if isinstance(m, dict)}
            names = {str(m.get("name", m.get("method"))) for m in raw if isinstance(m, dict)}
            bad = [m for m in methods if m not in known and m not in names]
            if bad:
                raise ConfigError(
                    f"--methods: {', '.join(bad)} not in the sweep (it has: {', '.join(sorted(known))})"
                )
            data["methods"] = [
                m
                for m in raw
                if isinstance(m, dict)
                and (
                    m.get("name", m.get("method")) == "none"
                    or str(m.get("label") or _default_label(m)) in methods
                    or str(m.get("name", m.get("method"))) in methods
                )
            ]
    return parse_sweep(data, source), text


def _default_label(m: dict[str, Any]) -> str:
    name = m.get("name", m.get("method"))
    return "none" if name == "none" else f"{name}-k{m.get('k')}"


def default_prompt_provider(
    spec: SweepSpec, check_models: bool = True, echo: Callable[[str], None] | None = None
) -> PromptProvider:
    """Check the sweep against the machine (workloads, models, drafter tokenizers, and with `echo` the memory
    its resident engines need), then return a provider that renders each workload's prompts with the
    target's tokenizer. Loads no model."""
    pf = preflight(spec, check_models=check_models)
    if echo is not None and check_models:
        warning = check_memory(spec, pf.target_path, pf.drafter_paths)
        if warning:
            echo(warning)
    tokenizer = pf.target_path or spec.target

    def provider(workload: str) -> PromptSet:
        return render_workload(spec, workload, tokenizer, pf.categories[workload])

    return provider


def run_bench(
    spec: SweepSpec,
    run_dir: str | Path,
    *,
    spec_text: str | None = None,
    prompt_provider: PromptProvider | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = print,
    command_line: str | None = None,
    cell_timeout_s: float | None = None,
    redo: list[str] | None = None,
    ray_address: str | None = None,
) -> SweepOutcome:
    """Validate against the machine (before any model loads), render all prompts, then run the sweep.
    ray_address: run each engine as a Ray task on that cluster ("auto": the running one or a local one)."""
    from speclab.bench.cells import expand_cells
    from speclab.bench.results import ResultsStore

    # (`speclab bench` builds its provider with the memory check of the engines kept on this machine)
    provider = prompt_provider or default_prompt_provider(spec)
    # render every workload that still has cells to run up front: a bad prompt fails here, not after an
    # engine has started
    import fnmatch

    from speclab.bench.repeats import runs_done

    store = ResultsStore(run_dir) if Path(run_dir).exists() else None
    every = set(range(1, int(spec.repeats or 1) + 1))
    todo = {
        c.workload
        for c in expand_cells(spec)
        if store is None
        or not every <= runs_done(store.rows.get(c.cell_id))  # a repeat still to run (a resumed round)
        or any(fnmatch.fnmatch(c.cell_id, g) for g in redo or [])
    }
    cache = {w: provider(w) for w in spec.workloads if w in todo}
    for ps in cache.values():
        for note in ps.notes:  # what a request log asked for that the bench does differently
            echo(note)

    def prompts(workload: str) -> PromptSet:
        # rendered above for every workload with work left; should the runner still ask for another, render
        # it then rather than fail the run
        if workload not in cache:
            cache[workload] = provider(workload)
        return cache[workload]

    return run_sweep(
        spec,
        run_dir,
        prompts,
        progress=progress,
        echo=echo,
        spec_text=spec_text,
        command_line=command_line,
        cell_timeout_s=cell_timeout_s,
        redo=redo,
        ray_address=ray_address,
    )
