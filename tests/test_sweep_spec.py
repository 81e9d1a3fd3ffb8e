"""Sweep files: parsing, one-line errors for bad input, cell expansion and engine grouping."""

from __future__ import annotations

import json

import pytest

from speclab.bench.api import load_sweep_source
from speclab.bench.cells import expand_cells, group_engines
from speclab.bench.preflight import check_drafter_tokenizer, preflight, resolve_model
from speclab.bench.spec import list_presets, load_preset, parse_sweep_text
from speclab.cli import main
from speclab.errors import ConfigError

BASE = """
target = "/nonexistent/target"
workloads = ["offline-code-edit", "offline-math"]
batch_sizes = [1, 4, 16]
num_prompts = 4
max_tokens = 16

[[methods]]
name = "ngram"
k = 3

[[methods]]
name = "draft_model"
k = 3
model = "/nonexistent/drafter"
"""


def parse(text: str):
    return parse_sweep_text(text, "s.toml")


def err(text: str) -> str:
    with pytest.raises(ConfigError) as ei:
        parse(text)
    msg = str(ei.value)
    assert "\n" not in msg
    return msg


def test_parse_defaults_and_baseline_added():
    s = parse(BASE)
    assert [m.label for m in s.methods] == ["none", "ngram-k3", "draft_model-k3"]
    assert s.dtype == "float32" and s.batching == ["continuous"] and s.seed == 42
    assert s.prompt_budget == 2048 - 16


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (('name = "ngram"', 'name = "medusa"'), "unknown method 'medusa'"),
        (("k = 3\n\n[[methods]]", "k = 0\n\n[[methods]]"), "field k: must be >= 1, got 0"),
        (("k = 3\n\n[[methods]]", "\n[[methods]]"), "field k: missing"),
        (("[1, 4, 16]", "[0, 4]"), "batch size 0 is invalid"),
        (("[1, 4, 16]", "[1, -2]"), "batch size -2 is invalid"),
        (("[1, 4, 16]", '["x"]'), "batch size 'x' is not an integer"),
        (('model = "/nonexistent/drafter"', ""), "method draft_model needs a drafter"),
        (("num_prompts = 4", "num_prompts = 0"), "num_prompts: must be >= 1"),
        (("num_prompts = 4", "num_promts = 4"), "unknown field(s): num_promts"),
        (("max_tokens = 16", 'max_tokens = 16\ndtype = "fp8"'), "field dtype: 'fp8'"),
        (("max_tokens = 16", 'max_tokens = 16\nbatching = "static"'), "field batching: 'static'"),
        (
            ("k = 3\n\n[[methods]]", "k = 3\nprompt_lookup_min = 5\nprompt_lookup_max = 2\n\n[[methods]]"),
            "prompt_lookup_min (5) > prompt_lookup_max (2)",
        ),
    ],
)
def test_bad_input_one_line(edit, needle):
    old, new = edit
    assert old in BASE
    msg = err(BASE.replace(old, new, 1))
    assert needle in msg and msg.startswith("s.toml")


def test_malformed_toml_names_file_and_line():
    msg = err(BASE.replace("num_prompts = 4", "num_prompts = = 4"))
    assert msg.startswith("s.toml: malformed TOML") and "(at line 5, column 15)" in msg


def test_duplicate_labels_and_restrictions():
    dup = BASE + '\n[[methods]]\nname = "ngram"\nk = 3\n'
    assert "duplicate label(s) ngram-k3" in err(dup)
    ok = (
        BASE
        + '\n[[methods]]\nname = "ngram"\nlabel = "ngram-k5"\nk = 5\nworkloads = ["offline-math"]\nbatch_sizes = [1]\n'
    )
    s = parse(ok)
    cells = expand_cells(s)
    assert sum(1 for c in cells if c.method.label == "ngram-k5") == 1
    bad = BASE + '\n[[methods]]\nname = "ngram"\nlabel = "x"\nk = 5\nworkloads = ["gsm8k"]\n'
    assert "workload 'gsm8k' is not in the sweep's workloads" in err(bad)


def test_cell_expansion_ids_stable_and_sensitive():
    s = parse(BASE)
    cells = expand_cells(s)
    assert len(cells) == 3 * 2 * 3
    assert all(c.is_baseline for c in cells[:6]) and not any(c.is_baseline for c in cells[6:])
    ids = [c.cell_id for c in cells]
    assert len(set(ids)) == len(ids)
    assert ids == [c.cell_id for c in expand_cells(parse(BASE))]  # stable
    assert ids[0].startswith("none.offline-code-edit.cont.b1.")
    # changing what a cell measures changes its id; adding a batch size keeps the others'
    changed = {c.cell_id for c in expand_cells(parse(BASE.replace("max_tokens = 16", "max_tokens = 17")))}
    assert not changed & set(ids)
    more = {c.cell_id for c in expand_cells(parse(BASE.replace("[1, 4, 16]", "[1, 4, 16, 32]")))}
    assert set(ids) < more
    # an SD cell and its baseline share the baseline key; different batch sizes do not
    by = {(c.method.label, c.workload, c.batch_size): c for c in cells}
    assert by[("ngram-k3", "offline-math", 4)].baseline_key == by[("none", "offline-math", 4)].baseline_key
    assert by[("ngram-k3", "offline-math", 4)].baseline_key != by[("none", "offline-math", 16)].baseline_key
    both = parse(BASE.replace("max_tokens = 16", 'max_tokens = 16\nbatching = ["replicate", "continuous"]'))
    assert len(expand_cells(both)) == 36


def test_engine_grouping_one_engine_per_configuration():
    s = parse(BASE)
    groups = group_engines(s, expand_cells(s))
    assert [g.engine.method for g in groups] == ["none", "ngram", "draft_model"]
    assert all(len(g.cells) == 6 and g.engine.max_num_seqs == 16 for g in groups)
    assert groups[2].engine.options == {"model": "/nonexistent/drafter"}
    for g in groups:
        g.engine.validate()


def test_presets_all_parse():
    names = [n for n, _ in list_presets()]
    assert {
        "demo-cpu",
        "study-llama3.1-8b",
        "study-llama3-70b",
        "study-qwen3-8b",
        "study-glm-4.5-air",
    } <= set(names)
    for n in names:
        s = load_preset(n)
        assert expand_cells(s)
    demo = load_preset("demo-cpu")
    assert demo.dtype == "float32" and demo.batch_sizes == [1, 16]
    assert {m.name for m in demo.methods} == {"none", "ngram", "draft_model", "eagle3"}
    study = load_preset("study-llama3.1-8b")
    assert study.batch_sizes == [1, 16, 64, 128] and study.num_prompts == 500 and study.dtype == "bfloat16"
    assert all(m.k == 3 for m in study.methods if m.name != "none" and m.label != "ngram-k5")
    assert study.batching == ["replicate"]


def test_overrides_and_method_filter(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(BASE)
    s, _ = load_sweep_source(
        f,
        overrides={"num_prompts": 2, "batch_sizes": [1, 2], "engine.enforce_eager": True},
        methods=["ngram"],
    )
    assert s.num_prompts == 2 and s.batch_sizes == [1, 2] and s.enforce_eager
    assert [m.label for m in s.methods] == ["none", "ngram-k3"]
    with pytest.raises(ConfigError, match="batch size 0 is invalid"):
        load_sweep_source(f, overrides={"batch_sizes": [0]})
    with pytest.raises(ConfigError, match="--methods: eagle not in the sweep"):
        load_sweep_source(f, methods=["eagle"])


def test_preflight_unknown_workload_and_missing_model(tmp_path):
    s = parse(BASE.replace('"offline-math"', '"no-such-workload"'))
    with pytest.raises(ConfigError, match="unknown workload 'no-such-workload'"):
        preflight(s)
    with pytest.raises(ConfigError, match="target '/nonexistent/target': no such file or directory"):
        preflight(parse(BASE))
    with pytest.raises(ConfigError, match="not found"):
        resolve_model("definitely-not-a-model", "float32", "target")
    assert resolve_model("some-org/some-model-not-cached", "float32", "target") is None  # left to vLLM
    d = tmp_path / "ckpt"
    d.mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        resolve_model(str(d), "float32", "target")


def _tiny_checkpoint(path, vocab: dict[str, int], vocab_size: int) -> str:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": vocab_size}))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]")), unk_token="[UNK]"
    )
    tok.save_pretrained(str(path))
    return str(path)


def test_drafter_tokenizer_mismatch(tmp_path):
    t = _tiny_checkpoint(tmp_path / "t", {"a": 0, "b": 1, "[UNK]": 2}, 3)
    same = _tiny_checkpoint(tmp_path / "same", {"a": 0, "b": 1, "[UNK]": 2}, 3)
    other = _tiny_checkpoint(tmp_path / "other", {"b": 0, "a": 1, "[UNK]": 2}, 3)
    bigger = _tiny_checkpoint(tmp_path / "bigger", {"a": 0, "b": 1, "[UNK]": 2}, 5)
    check_drafter_tokenizer(t, same, "same")
    with pytest.raises(ConfigError, match="drafter 'other': its tokenizer differs from the target's"):
        check_drafter_tokenizer(t, other, "other")
    with pytest.raises(ConfigError, match="vocabulary size 5 differs from the target's 3"):
        check_drafter_tokenizer(t, bigger, "bigger")
    s = parse(BASE.replace("/nonexistent/target", t).replace("/nonexistent/drafter", other))
    with pytest.raises(ConfigError, match="tokenizer differs"):
        preflight(s)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (BASE.replace('name = "ngram"', 'name = "medusa"'), "unknown method 'medusa'"),
        (BASE.replace("[1, 4, 16]", "[0]"), "batch size 0 is invalid"),
        (BASE.replace("num_prompts = 4", "num_prompts 4"), "malformed TOML"),
        (BASE, "target '/nonexistent/target': no such file or directory"),
    ],
)
def test_cli_prints_one_line_before_any_model_loads(tmp_path, capsys, text, needle):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(SystemExit) as ei:
        main(["bench", str(f), "--out", str(tmp_path / "run")])
    assert ei.value.code == 2
    errout = capsys.readouterr().err.strip().splitlines()
    assert len(errout) == 1 and errout[0].startswith("speclab: error:") and needle in errout[0]
    assert not (tmp_path / "run").exists()


def test_cli_missing_file_and_unknown_preset(tmp_path, capsys):
    for argv, needle in (
        (["bench", str(tmp_path / "nope.toml")], "sweep file not found"),
        (["bench", "--preset", "nope"], "unknown sweep preset 'nope'"),
    ):
        with pytest.raises(SystemExit):
            main(argv)
        assert needle in capsys.readouterr().err


def test_proposer_options_only_where_they_are_read():
    with_opts = BASE.replace(
        'model = "/nonexistent/drafter"', 'model = "/nonexistent/drafter"\nproposer_options = { kmax = 4 }'
    )
    assert "field proposer_options: only custom_class" in err(with_opts)  # on draft_model: nothing reads it
    # on eagle3 the live adaptive proposer over the head reads it (speclab.live.vllm_eagle)
    parse(with_opts.replace('name = "draft_model"', 'name = "eagle3"'))
