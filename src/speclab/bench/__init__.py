"""Benchmark speculative decoding on a real vLLM engine: sweeps, cells, engines, results (CONTRACTS.md 4)."""

from speclab.bench.api import default_prompt_provider, load_sweep_source, run_bench
from speclab.bench.cells import Cell, EngineGroup, expand_cells, group_engines
from speclab.bench.runner import SweepOutcome, run_sweep
from speclab.bench.show import format_run, load_rows
from speclab.bench.spec import MethodEntry, SweepSpec, list_presets, load_preset, load_sweep, parse_sweep_text

__all__ = [
    "Cell",
    "EngineGroup",
    "MethodEntry",
    "SweepOutcome",
    "SweepSpec",
    "default_prompt_provider",
    "expand_cells",
    "format_run",
    "group_engines",
    "list_presets",
    "load_preset",
    "load_rows",
    "load_sweep",
    "load_sweep_source",
    "parse_sweep_text",
    "run_bench",
    "run_sweep",
]
