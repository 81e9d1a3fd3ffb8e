"""Cells and engines: one source for the engine a sweep builds and the settings hashed into its ids."""

import dataclasses

import pytest

from speclab.bench import cells as cells_mod
from speclab.bench.cells import engine_settings, engine_spec, expand_cells, group_engines
from speclab.bench.spec import parse_sweep_text
from speclab.engine.protocol import EngineSpec

SWEEP = """
target = "smollm2-135m"
workloads = ["offline-code-edit"]
batch_sizes = [1, 4]
batching = ["replicate", "continuous"]
num_prompts = 2
max_tokens = 16
engine = { kv_cache_gib = 1.5, llm_kwargs = { enable_prefix_caching = false } }
methods = [
  { name = "ngram", k = 3, prompt_lookup_min = 2, prompt_lookup_max = 4 },
  { name = "draft_model", k = 2, model = "smollm2-135m-draft-l8", batch_sizes = [1] },
]
"""


def test_ids_of_existing_sweeps_are_kept() -> None:
    # the ids this sweep had before engine settings came from one source: run directories made then resume
    spec = parse_sweep_text(SWEEP, "s")
    cells = expand_cells(spec)
    assert [c.cell_id for c in cells] == [
        "none.offline-code-edit.rep.b1.78834979",
        "none.offline-code-edit.rep.b4.23feef9b",
        "none.offline-code-edit.cont.b1.0799516a",
        "none.offline-code-edit.cont.b4.22279c4d",
        "ngram-k3.offline-code-edit.rep.b1.997c64eb",
        "ngram-k3.offline-code-edit.rep.b4.4c3d4d95",
        "ngram-k3.offline-code-edit.cont.b1.fe9ef437",
        "ngram-k3.offline-code-edit.cont.b4.6c579ed0",
        "draft_model-k2.offline-code-edit.rep.b1.0e2c2eb7",
        "draft_model-k2.offline-code-edit.cont.b1.4e486652",
    ]
    assert [g.engine_id for g in group_engines(spec, cells)] == [
        "none-2ece2b85",
        "ngram-k3-d017af2a",
        "draft_model-k2-e31b8a09",
    ]


def test_the_built_engine_is_the_hashed_one() -> None:
    spec = parse_sweep_text(SWEEP, "s")
    cells = expand_cells(spec)
    for g in group_engines(spec, cells):
        hashed = engine_settings(g.engine)  # what the id was made from, read back from the engine built
        assert cells_mod.digest(hashed) == g.cells[0].engine_key
        built = dataclasses.replace(engine_spec(spec, g.cells[0].method), max_num_seqs=g.engine.max_num_seqs)
        assert built == g.engine
    # every EngineSpec field but max_num_seqs goes into the id
    names = {f.name for f in dataclasses.fields(EngineSpec)} - {"max_num_seqs"}
    assert set(engine_settings(group_engines(spec, cells)[1].engine)) == names


def test_a_field_added_later_changes_ids_only_when_used(monkeypatch: pytest.MonkeyPatch) -> None:
    # pretend "seed" were a field added after ids were first made
    monkeypatch.setattr(cells_mod, "_ID_FIELDS", tuple(f for f in cells_mod._ID_FIELDS if f != "seed"))
    default = EngineSpec(target="t", method="ngram", k=3)
    assert "seed" not in engine_settings(default)
    used = dataclasses.replace(default, seed=7)
    assert engine_settings(used)["seed"] == 7
    assert cells_mod.digest(engine_settings(used)) != cells_mod.digest(engine_settings(default))
    assert "max_num_seqs" not in engine_settings(dataclasses.replace(default, max_num_seqs=16))
