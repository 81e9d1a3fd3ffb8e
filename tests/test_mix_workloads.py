"""Mixed workloads: the mix table's checks, the counts and interleaving, stable cell ids, and the
per-category breakdown of a cell's requests."""

from __future__ import annotations

import json

import pytest

from speclab.bench.categories import category_breakdown, prompt_categories
from speclab.bench.cells import expand_cells
from speclab.bench.spec import parse_sweep_text
from speclab.engine.protocol import CellResult, RequestResult
from speclab.errors import ConfigError
from speclab.workloads import load_workload
from speclab.workloads.mix import interleave, mix_counts

MIX = "{ offline-code-edit = 0.4, offline-chat = 0.4, offline-math = 0.2 }"
SWEEP = """
target = "smollm2-135m"
workloads = ["offline-math"]
batch_sizes = [1, 4]
num_prompts = 10
seed = 7
mix = MIX

[[methods]]
name = "ngram"
k = 3
"""


def _sweep(mix: str = MIX, **repl: str) -> str:
    text = SWEEP.replace("MIX", mix)
    for a, b in repl.items():
        text = text.replace(a, b)
    return text


def test_a_top_level_mix_is_a_workload_with_its_shares():
    s = parse_sweep_text(_sweep())
    assert s.workloads == ["offline-math", "mix"]
    assert s.workload_mixes == {"mix": {"offline-code-edit": 0.4, "offline-chat": 0.4, "offline-math": 0.2}}
    assert json.loads(json.dumps(s.to_dict()))["workload_mixes"] == s.workload_mixes


@pytest.mark.parametrize(
    ("mix", "says"),
    [
        ("{ offline-code-edit = 0.4, offline-chat = 0.4 }", "the shares sum to 0.8, expected 1"),
        (
            "{ offline-code-edit = 1.5, offline-chat = -0.5 }",
            "mix.offline-code-edit: the share must be in (0, 1]",
        ),
        ('{ offline-code-edit = "half", offline-chat = 0.5 }', "the share must be a number"),
        ("{ offline-code-edit = 0.5, no-such = 0.5 }", "mix.no-such: unknown workload"),
        ("{ offline-chat = 1.0 }", "two or more workload = share entries"),
        ("0.5", "two or more workload = share entries"),
    ],
)
def test_bad_proportions_are_refused_in_one_line(mix, says):
    with pytest.raises(ConfigError) as exc:
        parse_sweep_text(_sweep(mix))
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_a_named_mix_table_and_its_checks():
    text = _sweep().replace('workloads = ["offline-math"]', "").replace(f"mix = {MIX}", "")
    text += f"\n[workloads.traffic]\nmix = {MIX}\n"
    s = parse_sweep_text(text)
    assert s.workloads == ["traffic"] and list(s.workload_mixes) == ["traffic"]
    with pytest.raises(ConfigError, match="only mix ="):
        parse_sweep_text(text.replace("[workloads.traffic]\n", '[workloads.traffic]\npath = "x.jsonl"\n'))


def test_counts_add_up_and_the_interleaving_respects_the_shares():
    shares = {"a": 0.4, "b": 0.4, "c": 0.2}
    assert mix_counts(shares, 10) == {"a": 4, "b": 4, "c": 2}
    assert sum(mix_counts(shares, 7).values()) == 7 and mix_counts(shares, 7) == {"a": 3, "b": 3, "c": 1}
    order = interleave(mix_counts(shares, 50))
    assert order == interleave(mix_counts(shares, 50))  # deterministic
    for i in range(5, 51, 5):  # every prefix within one prompt of its share
        for w, s in shares.items():
            assert abs(order[:i].count(w) - s * i) <= 1, (i, w)
    assert order[:5] == ["a", "b", "c", "a", "b"]


def test_mixed_prompts_are_deterministic_and_keep_their_categories():
    parse_sweep_text(_sweep())  # registers "mix"
    a = load_workload("mix", limit=10, seed=7)
    assert [p.id for p in a] == [p.id for p in load_workload("mix", limit=10, seed=7)]
    cats = [p.category for p in a]
    assert cats.count("code-editing") == 4 and cats.count("chat") == 4 and cats.count("math") == 2
    assert cats[:3] == ["code-editing", "chat", "math"]
    assert {p.workload for p in a} == {"mix"} and a[0].meta["mix_part"] == "offline-code-edit"
    # each part's prompts are the same draw as that workload alone
    alone = [p.id for p in load_workload("offline-math", limit=2, seed=7)]
    assert [p.id for p in a if p.category == "math"] == alone


def test_mixed_cell_ids_are_stable_and_change_with_the_shares():
    ids = [c.cell_id for c in expand_cells(parse_sweep_text(_sweep()))]
    assert ids == [c.cell_id for c in expand_cells(parse_sweep_text(_sweep()))]
    assert any(".mix.cont.b4." in i for i in ids)
    other = "{ offline-code-edit = 0.2, offline-chat = 0.4, offline-math = 0.4 }"
    moved = [c.cell_id for c in expand_cells(parse_sweep_text(_sweep(other)))]
    mix_ids = {i for i in ids if ".mix." in i}
    assert mix_ids and not mix_ids & set(moved)
    assert {i for i in ids if ".mix." not in i} == {i for i in moved if ".mix." not in i}


def test_per_category_breakdown_of_a_cell():
    spec = parse_sweep_text(_sweep())
    cats = prompt_categories(spec, "mix")
    assert len(cats) == 10 and prompt_categories(spec, "offline-math") == {}
    ids = list(cats)
    reqs = [
        RequestResult(id=ids[i], copy=0, prompt_len=5, output_token_ids=[1] * 9, per_step_accepted=[3, 1],
                      per_step_drafted=[3, 3])
        for i in range(3)
    ]  # fmt: skip
    res = CellResult(cell_id="c", status="ok", requests=reqs)
    out = category_breakdown(res, cats, is_baseline=False)
    assert set(out) == {"code-editing", "chat", "math"}
    for v in out.values():
        assert v["num_requests"] == 1 and v["output_tokens"] == 9
        assert v["mean_acceptance_length"] == pytest.approx(3.0)
    assert category_breakdown(res, {}, is_baseline=False) is None
    one = CellResult(cell_id="c", status="ok", requests=reqs[:1])
    assert category_breakdown(one, cats, is_baseline=False) is None  # one category: nothing to break down
