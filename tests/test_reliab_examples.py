"""Bad or unusual inputs of the second reliability probe, each run as a user would type it: exit 2 with one
`speclab: error:` line (or the right result where the input is valid), and the user's files byte-identical
before and after (checksums of every file under the test's directory)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from reliab_helpers import NGRAM_MODEL, cli, cli_subprocess, tree, write_study  # tests/ is on sys.path
from speclab.traces import read_store

MODEL = NGRAM_MODEL

SWEEP = """
target = "smollm2-135m"
workloads = ["offline-math"]
batch_sizes = [1, 4]
[[methods]]
name = "ngram"
k = 3
"""


def refused(root: Path, *argv, needle: str = "") -> str:
    """Run the command: exit 2, one error line (containing needle), nothing under root changed."""
    before = tree(root)
    res = cli(*argv)
    assert res.code == 2, (res.code, res.out, res.err)
    line = res.error_line()
    assert needle in line, line
    assert tree(root) == before
    return line


@pytest.fixture
def user(tmp_path: Path) -> Path:
    write_study(tmp_path / "study.jsonl", [f"r{i}" for i in range(6)])
    assert cli("traces", "import", "--format", "specdecode-bench", tmp_path / "study.jsonl", "--out",
               tmp_path / "store.parquet").code == 0  # fmt: skip
    (tmp_path / "model.toml").write_text(MODEL)
    return tmp_path


def test_a_directory_of_hidden_entries_is_never_replaced(user):
    d = user / "notes"
    (d / ".git").mkdir(parents=True)
    (d / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (d / ".notes").write_text("mine\n")
    imp = ("traces", "import", "--format", "specdecode-bench", user / "study.jsonl", "--out", d)
    assert ".git, .notes" in refused(user, *imp)
    assert ".git, .notes" in refused(user, *imp, "--force")
    assert ".git, .notes" in refused(user, *imp[:-2], "--out", d, "--append")


def test_a_symlinked_store_is_written_through(user):
    assert cli("traces", "import", "--format", "specdecode-bench", user / "study.jsonl", "--out",
               user / "real").code == 0  # fmt: skip
    (user / "link").symlink_to("real")
    write_study(user / "other.jsonl", ["x1", "x2"])
    res = cli("traces", "import", "--format", "specdecode-bench", user / "other.jsonl", "--out", user / "link",
              "--force")  # fmt: skip
    assert res.code == 0, res.err
    assert (user / "link").is_symlink() and os.readlink(user / "link") == "real"
    assert sorted(r.id for r in read_store(user / "real")) == ["x1", "x2"]
    assert not [p.name for p in user.iterdir() if p.name.startswith(".link") or ".new-" in p.name]


def test_an_output_is_never_an_input(user):
    refused(user, "traces", "export", user / "store.parquet", "--out", user / "store.parquet", needle="input")
    (user / "t.csv").write_text("kind,batch\n")
    refused(user, "cost-models", "fit", user / "t.csv", "--out", user / "t.csv", needle="input")
    (user / "alias.parquet").symlink_to("store.parquet")
    refused(user, "traces", "export", user / "store.parquet", "--out", user / "alias.parquet", needle="input")
    os.link(user / "study.jsonl", user / "hard.jsonl")
    refused(user, "traces", "import", "--format", "specdecode-bench", user / "study.jsonl", "--out",
            user / "hard.jsonl", "--force", needle="input")  # fmt: skip
    sim = ("simulate", "--traces", user / "store.parquet", "--cost-model", user / "model.toml", "--policy",
           "fixed:ngram:3", "--batch-sizes", "1")  # fmt: skip
    refused(user, *sim, "--csv", user / "model.toml", needle="input")
    refused(user, *sim, "--plot", user / "store.parquet", needle="--plot")


def test_an_existing_output_needs_force(user):
    out = user / "e.jsonl"
    assert cli("traces", "export", user / "store.parquet", "--out", out).code == 0
    refused(user, "traces", "export", user / "store.parquet", "--out", out, needle="--force")
    out.write_text("old\n")
    assert cli("traces", "export", user / "store.parquet", "--out", out, "--force").code == 0
    assert out.read_text().count("\n") == 6
    sim = ("simulate", "--traces", user / "store.parquet", "--cost-model", user / "model.toml", "--policy",
           "fixed:ngram:3", "--batch-sizes", "1", "--csv", user / "model.toml.csv")  # fmt: skip
    (user / "model.toml.csv").write_text("keep\n")
    refused(user, *sim, needle="--force")


def test_unwritable_output_refused_before_the_work_naming_the_users_path(user):
    (user / "file").write_text("x")
    line = refused(user, "simulate", "--traces", user / "store.parquet", "--cost-model", user / "model.toml",
                   "--policy", "fixed:ngram:3", "--batch-sizes", "1", "--csv", user / "file" / "rows.csv")  # fmt: skip
    assert f"--csv {user / 'file' / 'rows.csv'}" in line and ".tmp" not in line


def test_stdin_pipe_is_read_whole_and_a_fifo_without_writer_times_out(tmp_path, monkeypatch):
    rows = "".join(json.dumps({"prompt": f"question {i} " + "x" * 80}) + "\n" for i in range(2000))
    (tmp_path / "many.jsonl").write_text(rows)
    p = cli_subprocess("workloads", "inspect", "/dev/stdin", "--json", stdin=subprocess.PIPE)
    out, err = p.communicate(rows, timeout=120)
    assert p.returncode == 0, err
    assert json.loads(out)["requests"] == 2000  # from the first byte: the stream is opened once
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    monkeypatch.setenv("SPECLAB_PIPE_TIMEOUT", "1")  # the child inherits it
    p = cli_subprocess("workloads", "inspect", fifo)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and err.count("speclab: error:") == 1 and "no writer after 1 s" in err


@pytest.mark.parametrize(
    "row,needle",
    [
        ({"prompt": "a", "max_tokens": 10**300}, "field max_tokens: an integer of 301 digits"),
        ({"prompt": "a", "timestamp": 10**300}, "field timestamp"),
        ({"prompt": "a", "temperature": 10**300}, "field temperature"),
        ({"prompt": "a", "id": 10**300}, "field id"),
        ('{"prompt": "a", "timestamp": 1.8e308}', "field timestamp"),
        ('{"prompt": "a", "timestamp": -1.8e308}', "field timestamp"),
        ({"messages": [{"role": "user", "content": []}]}, "content: an empty list"),
        ("[" * 100_000 + "]" * 100_000, "nested more than"),
    ],
)
def test_bad_numbers_and_shapes_in_a_prompts_file(tmp_path, row, needle):
    f = tmp_path / "p.jsonl"
    f.write_text((row if isinstance(row, str) else json.dumps(row)) + "\n")
    assert f"{f} line 1" in refused(tmp_path, "workloads", "inspect", f, "--json", needle=needle)


def test_json_files_bom_encoding_depth_and_symlink_loops(tmp_path):
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps([{"prompt": "hi"}]).encode())
    res = cli("workloads", "inspect", tmp_path / "bom.json", "--json")
    assert res.code == 0 and json.loads(res.out)["requests"] == 1, res.err  # as a .jsonl with a BOM
    (tmp_path / "bad.json").write_bytes(b'[{"prompt": "\xff"}]')
    refused(
        tmp_path, "workloads", "inspect", tmp_path / "bad.json", needle=f"{tmp_path / 'bad.json'}: not UTF-8"
    )
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    refused(tmp_path, "workloads", "inspect", tmp_path / "deep.json", needle="nested more than")
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    refused(tmp_path, "workloads", "inspect", tmp_path / "a", needle="symlink loop")
    refused(tmp_path, "traces", "info", tmp_path / "a", needle="symlink loop")


def test_sweeps_refuse_out_of_range_numbers_unknown_options_and_deep_nesting(tmp_path):
    def dry(text: str, *extra: str, needle: str) -> None:
        (tmp_path / "s.toml").write_text(text)
        refused(tmp_path, "bench", "run", tmp_path / "s.toml", "--dry-run", "--out", tmp_path / "run", *extra,
                needle=needle)  # fmt: skip

    dry(SWEEP.replace("k = 3", "k = 1000000"), needle="field k: must be <= ")
    dry(SWEEP.replace("[1, 4]", "[1, 1000000000000]"), needle="batch size 1000000000000 is invalid")
    dry(SWEEP + "prompt_lookup_mn = 2\n", needle="'prompt_lookup_mn' (did you mean prompt_lookup_min?)")
    for v in ("nan", "inf"):
        dry(
            SWEEP.replace("[[methods]]", f"[engine]\nkv_cache_gib = {v}\n\n[[methods]]"),
            needle="kv_cache_gib",
        )
    dry(SWEEP + "x = " + "[" * 5000 + "]" * 5000 + "\n", needle="nested more than")
    dry(SWEEP, "--methods", ",", needle="--methods: empty item")


def test_cost_models_refuse_huge_coefficients_nan_tables_and_deep_nesting(user):
    sim = ("simulate", "--traces", user / "store.parquet", "--policy", "fixed:ngram:3", "--batch-sizes", "1")
    bad = user / "bad.toml"
    for text, needle in [
        (MODEL.replace("kv = 4e-8", "kv = 100000000000000000000000"), "target.kv"),
        (
            MODEL.replace(
                "[target]",
                '[target]\nform = "table"\nknee = 64\nbatched_hi = 2e-5\ntable = [[1, nan], [2, 0.02]]',
            ),
            "target.table",
        ),  # fmt: skip
        ("[target]\nkv = " + "[" * 5000 + "]" * 5000 + "\n", "nested more than"),
    ]:
        bad.write_text(text)
        refused(user, *sim, "--cost-model", bad, needle=needle)


def test_trace_record_ids_must_be_strings(tmp_path):
    for rid in ({"a": 1}, None):
        f = tmp_path / "t.jsonl"
        f.write_text(json.dumps({"id": rid, "prompt_len": 0, "output_len": 0}) + "\n")
        refused(tmp_path, "traces", "import", "--format", "speclab-jsonl", f, "--out", tmp_path / "s",
                needle="field id: expected a non-empty string")  # fmt: skip


def test_every_command_resolves_a_cost_model_name_the_same_way(user):
    sim = refused(user, "simulate", "--traces", user / "store.parquet", "--cost-model", "NO-SUCH-MODEL",
                  "--policy", "fixed:ngram:3")  # fmt: skip
    ana = refused(user, "analyze", "--traces", user / "store.parquet", "--cost-model", "NO-SUCH-MODEL")
    rep = refused(user, "report", "--traces", user / "store.parquet", "--cost-model", "NO-SUCH-MODEL", "--out",
                  user / "r")  # fmt: skip
    assert sim == ana == rep and "unknown cost model 'NO-SUCH-MODEL'" in sim


def test_a_chat_template_refusal_names_file_line_and_field(tmp_path):
    jinja2 = pytest.importorskip("jinja2")
    from speclab.workloads.files import parse_file
    from speclab.workloads.render import render_prompt

    class Refusing:
        chat_template = "strict"

        def apply_chat_template(self, messages, **kw):
            raise jinja2.TemplateError("Conversation roles must alternate user/assistant/user/assistant/...")

    f = tmp_path / "chat.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]})
                 + "\n")  # fmt: skip
    from speclab.errors import SpeclabError

    with pytest.raises(SpeclabError) as exc:
        render_prompt(parse_file(f).prompts[0], Refusing())
    assert str(exc.value).startswith(
        f"{f} line 1: field messages: the chat template refused it (TemplateError"
    )
