"""speclab.drafters' training sources: the standard-library corpus (deterministic, split by content),
deduplication against evaluation prompts, the nearest-prompt similarity, the user's file split by content,
and the held-out figures keyed by source with the left-out flag. The corpus tests read a small library made
here (the real standard library is read once, briefly)."""

from __future__ import annotations

import difflib
import json
import random
import textwrap
from pathlib import Path

import pytest

import speclab.drafters.corpus as corpus
import speclab.drafters.data as data
from speclab.drafters.corpus import SOURCES, corpus_prompts, stdlib_files
from speclab.drafters.similarity import Deduper, nearest, prompt_text, similarity_report
from speclab.drafters.sources import file_split, source_kind
from speclab.workloads.base import Prompt, user

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "record",
    "stream",
    "key",
    "value",
    "order",
    "cache",
    "buffer",
    "socket",
    "parser",
    "token",
    "line",
]


class _Doc:
    """A paragraph of its own words per name (so no two paragraphs are near duplicates)."""

    @staticmethod
    def format(w: str) -> str:
        rng = random.Random(w)
        words = [rng.choice(WORDS) + str(rng.randrange(1000)) for _ in range(40)]
        return f"The {w} helper returns them grouped by key. " + " ".join(words) + "."


DOC = _Doc()


def _module(i: int) -> str:
    funcs = []
    for j in range(6):
        w = f"w{i}x{j}"
        funcs.append(
            f'def f_{w}(items, limit={100 + j}, step={7 + i}):\n    """{DOC.format(w=w)}\n\n'
            f'    It stops after {40 + j} records and pads to {16 + i} columns.\n    """\n'
            f"    out = []\n    for n, item in enumerate(items):\n        if n >= limit:\n"
            f"            break\n        out.append((item, n * step + {j}))\n    return out\n"
        )
    head = (
        f'"""Module m{i}: {DOC.format(w=f"mod{i}")}\n\nMore text about module {i}: {DOC.format(w="z")}"""\n\n'
    )
    return head + "\n\n".join(funcs)


@pytest.fixture()
def lib(tmp_path: Path) -> Path:
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "test").mkdir()
    for i in range(12):
        (root / f"m{i}.py").write_text(_module(i))
    (root / "pkg" / "__init__.py").write_text(_module(12))
    (root / "test" / "test_x.py").write_text(_module(13))  # tests are not material
    return root


def _texts(ps: list[Prompt]) -> list[str]:
    return [prompt_text(p) for p in ps]


@pytest.mark.parametrize("source", list(SOURCES))
def test_corpus_is_deterministic_under_the_seed_and_grows_by_prefix(lib: Path, source: str) -> None:
    a = corpus_prompts(source, 8, seed=3, root=lib)
    assert a and _texts(a) == _texts(corpus_prompts(source, 8, seed=3, root=lib))
    big = corpus_prompts(source, 20, seed=3, root=lib)
    assert _texts(big[: len(a)]) == _texts(a)  # a larger draw starts with the smaller one
    assert all(p.workload == source and p.meta["source"] == source for p in big)
    assert len({p.id for p in big}) == len(big)
    assert all("m13" not in p.meta["module"] and "test" not in p.meta["module"] for p in big)
    if source != "stdlib-summarize":  # one module docstring per file: too few to reorder
        assert _texts(corpus_prompts(source, 8, seed=4, root=lib)) != _texts(a)


def test_corpus_kinds_say_what_they_ask(lib: Path) -> None:
    explain = corpus_prompts("stdlib-explain", 3, 0, root=lib)[0].messages[0]["content"]
    assert "```python\ndef f_" in explain and "grouped by key" not in explain  # docstring removed
    complete = corpus_prompts("stdlib-complete", 3, 0, root=lib)[0].messages[0]["content"]
    assert "grouped by key" in complete and "out.append" not in complete  # signature + docstring only
    math = corpus_prompts("stdlib-math", 3, 0, root=lib)[0].messages[0]["content"]
    assert "This line appears in" in math and "Explain each step." in math


def test_held_out_side_shares_no_material_with_training(lib: Path) -> None:
    for source in SOURCES:
        train = corpus_prompts(source, 500, 0, root=lib)
        held = corpus_prompts(source, 500, 42, held=True, root=lib)
        assert not set(_texts(train)) & set(_texts(held))
        assert not {p.id for p in train} & {p.id for p in held}
    paras = corpus_prompts("stdlib-docqa", 500, 0, root=lib) + corpus_prompts(
        "stdlib-docqa", 500, 1, root=lib
    )
    held = corpus_prompts("stdlib-docqa", 500, 42, held=True, root=lib)
    # the same paragraph with another question is still on its own side
    body = {t.split("\n\n")[1] for t in _texts(paras)}
    assert not body & {t.split("\n\n")[1] for t in _texts(held)}


def test_real_standard_library_files_are_found() -> None:
    files = stdlib_files()
    names = {f.name for f in files}
    assert "textwrap.py" in names and not any(f.name.startswith("test_") for f in files)
    ps = corpus_prompts("stdlib-docqa", 4, 0)
    assert len(ps) == 4 and ps == corpus_prompts("stdlib-docqa", 4, 0)


def test_dedup_drops_an_evaluation_prompt_planted_in_the_corpus(lib: Path, monkeypatch) -> None:
    monkeypatch.setattr(corpus, "stdlib_root", lambda: lib)
    evals = [
        Prompt("e1", "offline-chat", "chat", [user("Tell me about the weather in Paris in May, please.")])
    ]
    monkeypatch.setattr(data, "heldout_prompts", lambda workloads=(): evals)
    before: dict[str, int] = {}
    base = data.training_prompts({"stdlib-docqa": 6}, seed=0, report=before)
    planted = base[2]
    eval_twin = Prompt("e2", "x", "qa", [user("  " + prompt_text(planted).upper() + " ")])
    near = Prompt("e3", "x", "qa", [user(prompt_text(base[4]) + " Thanks!")])
    monkeypatch.setattr(data, "heldout_prompts", lambda workloads=(): evals + [eval_twin, near])
    dropped: dict[str, int] = {}
    again = data.training_prompts({"stdlib-docqa": 6}, seed=0, report=dropped)
    ids = {p.id for p in again}
    assert planted.id not in ids and base[4].id not in ids and len(again) == 6
    assert dropped["stdlib-docqa"] == before["stdlib-docqa"] + 2
    d = Deduper([eval_twin])
    assert d.duplicate(planted) and not d.duplicate(base[0])
    assert Deduper([near]).duplicate(base[4]) and not Deduper([near]).duplicate(base[4], near=False)


def test_nearest_similarity_is_difflibs_best_ratio() -> None:
    train = ["the cat sat on the mat", "a dog ran in the park", "completely different text here!"]
    held = ["the cat sat on a mat", "dogs run in parks", "zzz"]
    brute = [max(difflib.SequenceMatcher(None, h, t).ratio() for t in train) for h in held]
    assert nearest(held, train) == [round(b, 4) for b in brute]
    assert nearest(["x"], []) == [0.0]
    hp = [Prompt(f"h{i}", "w" if i else "v", "chat", [user(t)]) for i, t in enumerate(held)]
    rep = similarity_report(hp, [Prompt(f"t{i}", "t", "chat", [user(t)]) for i, t in enumerate(train)])
    assert set(rep) == {"v", "w"} and rep["v"]["prompts"] == 1 and rep["w"]["prompts"] == 2
    assert rep["v"]["twins"] == 1 and rep["w"]["max"] == max(rep["w"]["nearest"])


def _log(tmp_path: Path, n: int = 60) -> Path:
    rows = []
    for i in range(n):
        rows.append(
            {"custom_id": f"r{i}", "body": {"messages": [user(f"request number {i} about topic {i % 7}")]}}
        )
        if i % 5 == 0:  # the same request again, under another id and spacing
            rows.append(
                {
                    "custom_id": f"d{i}",
                    "body": {"messages": [user(f"request  number {i} about topic {i % 7} ")]},
                }
            )
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_file_split_is_by_content_and_deterministic(tmp_path: Path) -> None:
    name = f"file:{_log(tmp_path)}"
    assert source_kind(name) == "file"
    train, held = file_split(name, False, 0), file_split(name, True, 42)
    norm = [" ".join(prompt_text(p).lower().split()) for p in train + held]
    assert len(set(norm)) == len(norm) == 60  # each distinct request once, on one side only
    assert 3 <= len(held) <= 25
    assert [p.id for p in file_split(name, False, 0)] == [p.id for p in train]
    assert [p.id for p in file_split(name, False, 1)] != [p.id for p in train]
    assert {p.id for p in file_split(name, True, 7)} == {p.id for p in held}  # the seed only reorders


def test_workload_prompts_take_a_file_and_it_is_evaluated(tmp_path: Path, monkeypatch) -> None:
    from speclab.cli.drafters import apply_corpus, scaled_workloads
    from speclab.drafters.train import EagleRecipe
    from speclab.errors import ConfigError

    path = _log(tmp_path)
    monkeypatch.chdir(tmp_path)
    r = EagleRecipe()
    apply_corpus(r, "offline", 1.0, ("file:log.jsonl=20,offline-math=0",))
    name = f"file:{path.resolve()}"
    assert r.workloads[name] == 20 and "offline-math" not in r.workloads
    assert r.eval_workloads == ["offline-math", "offline-chat", name]
    assert scaled_workloads({}, 1.0, ("stdlib-math=3",)) == {"stdlib-math": 3}
    with pytest.raises(ConfigError, match="no such file"):
        scaled_workloads({}, 1.0, ("file:missing.jsonl=3",))
    monkeypatch.setattr(data, "heldout_prompts", lambda workloads=(): [])
    train = data.training_prompts({name: 20}, seed=0)
    held = data.eval_prompts([name], 100, seed=42)
    assert len(train) == 20 and held and {p.workload for p in train + held} == {name}
    assert not {prompt_text(p) for p in train} & {prompt_text(p) for p in held}
    with pytest.raises(ConfigError, match="only"):
        data.training_prompts({name: 100}, seed=0)


def test_corpus_recipe_keys_name_the_python_version(monkeypatch) -> None:
    import hashlib
    from dataclasses import asdict

    from speclab.drafters.distill import RECIPE_VERSION as DRAFT_VERSION
    from speclab.drafters.distill import DraftRecipe
    from speclab.drafters.train import CORPORA, RECIPE_VERSION, EagleRecipe

    plain = EagleRecipe()
    fields = {
        k: v for k, v in asdict(plain).items() if k not in ("head_layers", "soft_weight", "data_engine")
    }
    before = hashlib.sha256(json.dumps([RECIPE_VERSION, fields, "t"], sort_keys=True).encode()).hexdigest()
    assert plain.key("t") == before[:12]  # the offline recipe keeps the key it had: cached heads stay found
    draft = json.dumps([DRAFT_VERSION, asdict(DraftRecipe()), "t"], sort_keys=True)
    assert DraftRecipe().key("t") == hashlib.sha256(draft.encode()).hexdigest()[:12]
    w, e = CORPORA["stdlib"]
    r = EagleRecipe(workloads=dict(w), eval_workloads=list(e))
    k = r.key("t")
    monkeypatch.setattr("speclab.drafters.sources.python_version", lambda: "0.0.0")
    assert r.key("t") != k and plain.key("t") == EagleRecipe().key("t")


def test_figures_are_keyed_by_source_with_the_left_out_flag() -> None:
    from speclab.drafters.evaluate import (
        LEFT_OUT,
        TRAINING_SOURCES,
        add_steps,
        evaluation_by_source,
        summarize_steps,
    )
    from speclab.drafters.train import EagleRecipe

    r = EagleRecipe(workloads={"stdlib-docqa": 4}, eval_workloads=["stdlib-docqa", "offline-chat"])
    by: dict[str, list[int]] = {}
    from collections import defaultdict

    by = defaultdict(list)
    add_steps(by, "stdlib-docqa", [3, 3], frozenset({"offline-chat"}))
    add_steps(by, "offline-chat", [0, 1], frozenset({"offline-chat"}))
    final = summarize_steps(by, 3)
    assert final[TRAINING_SOURCES]["tokens_per_step"] == 4.0 and final[LEFT_OUT]["tokens_per_step"] == 1.5
    ev = evaluation_by_source(final, r)
    assert ev["sources"]["stdlib-docqa"]["left_out"] is False
    assert ev["sources"]["offline-chat"]["left_out"] is True
    assert ev["sources"]["offline-chat"]["per_position"] == [0.5, 0.0, 0.0]
    assert ev[LEFT_OUT] == final[LEFT_OUT]
    assert (
        evaluation_by_source(final, {"workloads": {"offline-chat": 1}, "eval_workloads": ["offline-chat"]})[
            "sources"
        ]["offline-chat"]["left_out"]
        is False
    )
    plain = defaultdict(list)
    add_steps(plain, "offline-chat", [1], frozenset())
    assert set(plain) == {"offline-chat", "all"}  # nothing left out: no pooled groups


def test_module_docstring_names_the_sources() -> None:
    doc = textwrap.dedent(corpus.__doc__ or "")
    assert all(s in doc for s in SOURCES)


def test_train_eagle_on_the_corpus_reports_sources_and_left_out_figures(lib, tmp_path, monkeypatch) -> None:
    """The whole trainer on the corpus (a tiny random target; generation replaced by its own greedy
    sequences): the manifest lists the sources, the similarity and the figures keyed by source."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from click.testing import CliRunner

    import speclab.drafters.train as tr
    from helpers import tiny_llama
    from speclab.cli import cli
    from speclab.drafters.data import Sequence, greedy_with_features

    torch.set_num_threads(1)
    target = tiny_llama(0, vocab=50)
    rng = random.Random(0)
    toks = [[rng.randrange(50) for _ in range(rng.randrange(3, 9))] for _ in range(8)]
    seqs = [
        Sequence(str(i), "w", *r) for i, r in enumerate(greedy_with_features(target, toks, [0, 1], 12, {49}))
    ]
    tdir = tmp_path / "target"
    tdir.mkdir()
    (tdir / "config.json").write_text(json.dumps(target.config.to_dict()))

    def fake_build(model, tok, prompts, aux, max_new, max_prompt, batch_size=8, log=None):
        return [
            Sequence(**{**seqs[i % len(seqs)].__dict__, "prompt_id": p.id, "workload": p.workload})
            for i, p in enumerate(prompts)
        ]

    chat = [
        Prompt(f"c{i}", "offline-chat", "chat", [user(f"chat prompt {i} about cooking")]) for i in range(3)
    ]
    monkeypatch.setattr(corpus, "stdlib_root", lambda: lib)
    monkeypatch.setattr(data, "heldout_prompts", lambda workloads=(): chat)
    monkeypatch.setattr(
        tr, "eval_prompts", lambda w, n, seed, pools=None: data.eval_prompts(w[:1], 3, seed) + chat
    )
    monkeypatch.setattr(tr, "load_target", lambda name: (target, None, tdir))
    monkeypatch.setattr(tr, "target_path", lambda name, prepare=True: tdir)
    monkeypatch.setattr(tr, "build_sequences", fake_build)
    workloads, _ = tr.CORPORA["stdlib"]
    recipe = tr.EagleRecipe(
        target="tiny",
        workloads={w: 3 for w in workloads},
        eval_workloads=["stdlib-explain", "offline-chat"],
        draft_vocab=30,
        epochs=1,
        batch_size=4,
        evals=1,
        aux_layers=[0, 1],
        max_new_tokens=8,
    )
    out = tr.train_eagle(recipe, cache_dir=str(tmp_path / "cache"), max_minutes=1.0)
    m = json.loads((out / "speclab-manifest.json").read_text())
    assert m["data"]["sources"]["stdlib-math"] == {
        **corpus.describe_source("stdlib-math"),
        "train_prompts": 3,
        "dropped_as_duplicates": m["data"]["sources"]["stdlib-math"]["dropped_as_duplicates"],
    }
    assert m["data"]["evaluation_sources"]["offline-chat"]["left_out"] is True
    assert m["data"]["evaluation_sources"]["stdlib-explain"]["left_out"] is False
    sim = m["data"]["heldout_similarity"]
    assert set(sim) == {"stdlib-explain", "offline-chat"} and all(0 <= r["max"] <= 1 for r in sim.values())
    ev = m["evaluation"]
    assert ev["sources"]["offline-chat"]["left_out"] and not ev["sources"]["stdlib-explain"]["left_out"]
    assert ev["left-out"]["steps"] > 0 and ev["training-sources"]["steps"] > 0
    shown = CliRunner().invoke(cli, ["drafters", "show", str(out)])
    assert shown.exit_code == 0, shown.output
    assert (
        "offline-chat: first-position acceptance" in shown.output and "left out of training" in shown.output
    )
    assert "held out of a training source" in shown.output and "median similarity" in shown.output


def test_report_shows_which_kind_each_drafter_figure_is(tmp_path: Path) -> None:
    from speclab.report.data import ReportData
    from speclab.report.drafters import section

    def fig(a: float) -> dict:
        return {"steps": 10, "first_acceptance": a, "tokens_per_step": 1 + a, "per_position": [a, a / 2, 0.0]}

    d = tmp_path / "eagle3-abc"
    d.mkdir()
    manifest = {
        "final": {
            "stdlib-docqa": fig(0.5),
            "offline-chat": fig(0.2),
            "training-sources": fig(0.5),
            "left-out": fig(0.2),
            "all": fig(0.3),
        },
        "evaluation": {
            "sources": {"stdlib-docqa": {"left_out": False}, "offline-chat": {"left_out": True}},
        },
        "data": {"heldout_similarity": {"stdlib-docqa": {"median": 0.31}, "offline-chat": {"median": 0.12}}},
    }
    (d / "speclab-manifest.json").write_text(json.dumps(manifest))
    rows = [
        {"method": "eagle3", "method_options": {"model": str(d)}},
        {"method": "eagle3", "method_options": {"model": str(d)}},
        {"method": "ngram", "method_options": {}},
        {"method": "draft_model", "method_options": {"model": "no-such-drafter"}},
    ]
    html = "\n".join(section(ReportData(rows, None, None, {}, [], {})))
    assert "Trained drafters" in html and html.count("eagle3-abc") == 4  # one row per source and pooled group
    chat = next(line for line in html.split("<tr") if "offline-chat" in line)
    assert "left out of training" in chat and "0.12" in chat
    docqa = next(line for line in html.split("<tr") if "stdlib-docqa" in line)
    assert "held out of a training source" in docqa and "0.31" in docqa
    assert "pooled: sources left out of training" in html
    assert section(ReportData(rows[2:], None, None, {}, [], {})) == []


def test_dedup_does_not_count_a_templates_wording() -> None:
    frame = "Read this passage from the documentation of the module and answer the question that follows it:"
    evals = [Prompt(f"e{i}", "x", "qa", [user(f"{frame} passage {i} " + "word " * i)]) for i in range(4)]
    d = Deduper(evals)
    own = Prompt("t", "x", "qa", [user(f"{frame} a paragraph about sockets, buffers and timeouts in detail")])
    assert d.overlap(own) == 0.0 and not d.duplicate(own)  # only the frame is shared
    twin = Prompt("u", "x", "qa", [user(prompt_text(evals[3]) + " now")])
    assert d.duplicate(twin)
