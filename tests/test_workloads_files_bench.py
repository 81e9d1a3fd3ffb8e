"""File workloads in sweeps, the bench (fake engine worker), the CLI (`workloads inspect`, show, demo)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from speclab.bench import preflight as preflight_mod
from speclab.bench.api import default_prompt_provider, load_sweep_source, run_bench
from speclab.bench.show import format_run, load_rows
from speclab.cli import main
from speclab.errors import ConfigError
from speclab.traces import read_store
from test_bench_runner import FAKE_WORKER  # tests/ is on sys.path (pytest prepend mode)
from test_workloads_files import CHAT, LOG, PROMPTS, CharTokenizer, write_lines

SWEEP = """
name = "own-traffic"
target = "fake-target"
batch_sizes = [1, 2]
num_prompts = 3
max_tokens = 8

[workloads.offline-math]
[workloads.my-prompts]
path = "{prompts}"
category = "code-editing"
[workloads.my-chat]
path = "{chat}"
format = "chat"
[workloads.my-log]
path = "{log}"
format = "request-log"
category = "chat"

[[methods]]
name = "none"

[[methods]]
name = "ngram"
k = 2
"""


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run `speclab ARGV` in-process: (exit code, stdout + stderr)."""
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.fixture
def user_files(tmp_path: Path) -> dict[str, Path]:
    return {
        "prompts": write_lines(tmp_path / "prompts.jsonl", PROMPTS),
        "chat": write_lines(tmp_path / "chat.jsonl", CHAT),
        "log": write_lines(tmp_path / "traffic.log", LOG),
    }


def sweep_file(tmp_path: Path, files: dict[str, Path], text: str = SWEEP) -> Path:
    f = tmp_path / "sweep.toml"
    f.write_text(text.format(**{k: str(v) for k, v in files.items()}))
    return f


def test_sweep_tables_name_files_and_built_ins(tmp_path: Path, user_files: dict[str, Path]) -> None:
    spec, _ = load_sweep_source(sweep_file(tmp_path, user_files))
    assert spec.workloads == ["offline-math", "my-prompts", "my-chat", "my-log"]  # the tables' order
    assert spec.workload_files["my-chat"] == {
        "path": str(user_files["chat"].resolve()),
        "format": "chat",
        "category": None,
        "skip_invalid": False,
    }
    assert (
        "offline-math" not in spec.workload_files and spec.to_dict()["workload_files"] == spec.workload_files
    )
    # --workloads keeps the tables of the names it asks for
    sub, _ = load_sweep_source(sweep_file(tmp_path, user_files), overrides={"workloads": ["my-log"]})
    assert sub.workloads == ["my-log"] and list(sub.workload_files) == ["my-log"]
    # file:PATH in a plain list is a workload name like any other
    listed = SWEEP.split("[workloads.offline-math]")[0] + f'workloads = ["file:{user_files["chat"]}"]\n'
    listed += "[[methods]]\nname = 'none'\n"
    spec2, _ = load_sweep_source(sweep_file(tmp_path, user_files, listed))
    assert spec2.workloads == [f"file:{user_files['chat']}"]


@pytest.mark.parametrize(
    "table, words",
    [
        ('[workloads.mine]\nformat = "chat"', "workloads.mine: field path: missing"),
        ('[workloads.mine]\npath = "{chat}"\ncolour = 1', "workloads.mine: unknown field(s): colour"),
        (
            '[workloads.mine]\npath = "{chat}"\nformat = "csv"',
            "workloads.mine: {chat}: format 'csv' is not one of",
        ),
        ('[workloads.mine]\npath = "{chat}"\ncategory = "poems"', "category 'poems' is not one of"),
        ('[workloads.mine]\npath = "{chat}"\nformat = "prompts"', "{chat} line 1: field prompt: missing"),
        (
            '[workloads.mine]\npath = "{chat}"\nskip_invalid = "yes"',
            "field skip_invalid: expected true or false",
        ),
        ('[workloads."my file"]\npath = "{chat}"', "the name may use only letters"),
        ('[workloads.offline-chat]\npath = "{chat}"', "'offline-chat' is a built-in workload"),
        ('[workloads.mine]\npath = "{tmp}/missing.jsonl"', "missing.jsonl: no such file"),
        ("workloads = 3", "field workloads: expected a non-empty list"),
    ],
)
def test_bad_workload_tables_are_refused_in_one_line(
    tmp_path: Path, user_files: dict[str, Path], table: str, words: str
) -> None:
    head = 'target = "fake-target"\nbatch_sizes = [1]\n'
    if table.startswith("workloads ="):
        head, table = head + table + "\n", ""
    f = tmp_path / "bad_sweep.toml"
    chat = str(user_files["chat"])
    f.write_text(
        head
        + table.replace("{chat}", chat).replace("{tmp}", str(tmp_path))
        + '\n[[methods]]\nname = "none"\n'
    )
    with pytest.raises(ConfigError) as exc:
        load_sweep_source(f)
    msg = str(exc.value)
    assert "\n" not in msg and words.format(chat=user_files["chat"].resolve()) in msg, msg


@pytest.fixture
def fake_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    log = tmp_path / "worker.log"
    monkeypatch.setenv("SPECLAB_WORKER_CMD", f"{sys.executable} {script}")
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setitem(preflight_mod._TOKENIZERS, "fake-target", CharTokenizer())
    return log


def test_sweep_on_user_files_runs_end_to_end_like_a_built_in(
    tmp_path: Path, user_files: dict[str, Path], fake_worker: Path
) -> None:
    spec, text = load_sweep_source(sweep_file(tmp_path, user_files))
    provider = default_prompt_provider(spec, check_models=False)
    said: list[str] = []
    out = run_bench(
        spec, tmp_path / "run", spec_text=text, prompt_provider=provider, progress=False, echo=said.append
    )
    assert out.failed == 0 and out.ok == 4 * 2 * 2
    assert any("my-log: 1 of 3 requests asked for temperature > 0" in s for s in said), said
    assert any("my-log: 2 of 3 requests asked for max_tokens other than the sweep's 8" in s for s in said), (
        said
    )
    rows = load_rows(tmp_path / "run")
    by_w = {w: [r for r in rows if r["workload"] == w] for w in spec.workloads}
    builtin_keys = set(by_w["offline-math"][0])
    for w in ("my-prompts", "my-chat", "my-log"):
        assert len(by_w[w]) == 4 and all(r["status"] == "ok" for r in by_w[w])
        # results identical in shape; a file whose lines name several categories adds the breakdown
        extra = {"per_category"} if w == "my-prompts" else set()
        assert all(set(r) == builtin_keys | extra for r in by_w[w]), w
        assert all(r["lossless"] is True for r in by_w[w] if r["method"] != "none")
    cats = {w: by_w[w][0]["category"] for w in by_w}
    assert cats == {
        "offline-math": "math",
        "my-prompts": "code-editing",
        "my-chat": "other",
        "my-log": "chat",
    }
    for r in by_w["my-prompts"]:  # one line says math, the others take the table's code-editing
        split = {c: v["num_requests"] for c, v in r["per_category"].items()}
        assert split == {"code-editing": 2, "math": 1}
    recs = read_store(tmp_path / "run" / "traces")
    assert {r.workload for r in recs} == set(spec.workloads)
    assert {r.category for r in recs if r.workload == "my-prompts"} == {"code-editing", "math"}
    table = format_run(tmp_path / "run")
    assert all(w in table for w in spec.workloads)
    assert "per category" in table and " math " in table
    # the completions request went to the engine as raw text, the chat ones through the template
    job = json.loads(next((tmp_path / "run" / "engines").glob("*/attempt-1/job.json")).read_text())
    texts = {
        "".join(map(chr, p["prompt_token_ids"]))
        for c in job["cells"]
        if ".my-log." in c["cell_id"]
        for p in c["prompts"]
    }
    assert "Once upon a time" in texts and "<user>Hello</user><assistant>" in texts


def test_bad_file_is_refused_before_any_engine_starts(
    tmp_path: Path, user_files: dict[str, Path], fake_worker: Path, capsys
) -> None:
    bad = write_lines(tmp_path / "bad.jsonl", [{"prompt": "ok"}, {"prompt": "ok", "temperature": -1}])
    listed = f'target = "fake-target"\nbatch_sizes = [1]\nworkloads = ["offline-math", "file:{bad}"]\n'
    listed += "[[methods]]\nname = 'none'\n"
    spec, text = load_sweep_source(sweep_file(tmp_path, user_files, listed))
    with pytest.raises(ConfigError, match=r"bad.jsonl line 2: field temperature: expected a number >= 0"):
        run_bench(spec, tmp_path / "run", spec_text=text, progress=False, echo=lambda s: None)
    assert not fake_worker.exists()  # no engine was started
    # the CLI says it in one line
    f = sweep_file(tmp_path, user_files, listed)
    code, output = cli(["bench", "run", str(f), "--out", str(tmp_path / "run2"), "--dry-run"], capsys)
    assert code != 0 and "bad.jsonl line 2: field temperature" in output
    assert not fake_worker.exists()


def test_inspect_summarises_a_file(tmp_path: Path, user_files: dict[str, Path], monkeypatch, capsys) -> None:
    rows = [
        {
            "messages": [
                {"role": "user", "content": "Fix the bug in: def add(a, b): return a - b"},
                {"role": "assistant", "content": "def add(a, b): return a + b"},
                {"role": "user", "content": "Now the same for: def sub(a, b): return a + b"},
            ],
            "reference": "def sub(a, b): return a - b",
            "timestamp": 100.0 + i,
            "max_tokens": 128,
            "temperature": 0.0 if i else 1.0,
            "model": "m",
        }
        for i in range(4)
    ]
    for i in range(1, 4):  # not repeats
        rows[i]["messages"][0]["content"] += f" (v{i})"
    rows.append(rows[3])  # a repeat: dropped
    path = write_lines(tmp_path / "log.jsonl", rows)
    code, output = cli(["workloads", "inspect", str(path)], capsys)
    assert code == 0, output
    out = output
    assert "format request-log, 5 requests -> 4 prompts (1 repeated, dropped)" in out
    assert "words and punctuation marks, approximate: no --tokenizer given" in out
    assert "max_tokens asked by 4 (128-128, median 128)" in out and "temperature > 0 in 1" in out
    assert "arrival times: 4 over 3.0 s, 1 req/s" in out and "models asked for: m (4)" in out
    assert "reference outputs vs prompt (4): mean" in out and "earlier assistant turns vs context (4)" in out
    assert "-> high: n-gram and suffix drafting have a good chance" in out
    # with the target's tokenizer: tokens, chat template applied, and the prompts over a budget counted
    monkeypatch.setattr("speclab.workloads.render.load_tokenizer", lambda name: CharTokenizer())
    code, output = cli(
        ["workloads", "inspect", str(path), "--tokenizer", "fake", "--max-prompt-tokens", "150", "--json"],
        capsys,
    )
    assert code == 0, output
    s = json.loads(output)
    assert s["length_unit"] == "tokens" and s["prompts"] == 4 and s["over_budget"] == 4
    assert s["prompt_length"]["min"] > 150
    assert s["requests_asked"]["arrival"]["rate_per_s"] == pytest.approx(1.0)
    # a sample as a sweep would draw it, and a bad file in one line
    code, output = cli(["workloads", "inspect", f"file:{user_files['prompts']}", "--limit", "2"], capsys)
    assert code == 0 and "inspected a seeded sample of 2" in output
    bad = write_lines(tmp_path / "bad.jsonl", [{"messages": [{"role": "user"}]}])
    code, output = cli(["workloads", "inspect", str(bad)], capsys)
    assert code != 0 and f"{bad} line 1: field messages[0].content: missing" in output
    assert len(output.strip().splitlines()) == 1


def test_show_export_and_demo_accept_file_names(
    tmp_path: Path, user_files: dict[str, Path], monkeypatch, capsys
) -> None:
    name = f"file:{user_files['log']}"
    code, output = cli(["workloads", "show", name, "--json"], capsys)
    assert code == 0, output
    shown = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert [p["id"] for p in shown][1] == "traffic-r2" and shown[0]["meta"]["arrival_s"] == 1767225600.0
    out = tmp_path / "exported.jsonl"
    code, output = cli(
        ["workloads", "export", name, "--limit", "2", "--seed", "3", "--out", str(out)], capsys
    )
    assert code == 0 and len(out.read_text().splitlines()) == 2
    seen = {}

    def fake_demo(out: str, overrides: dict, **kw):
        seen.update(overrides)
        raise ConfigError("stop here")

    monkeypatch.setattr("speclab.demo.run_demo", fake_demo)
    code, output = cli(["demo", "--workloads", f"offline-math,{name}", "--out", str(tmp_path / "d")], capsys)
    assert seen["workloads"] == ["offline-math", name] and "stop here" in output


def test_a_file_name_in_the_list_runs_too(
    tmp_path: Path, user_files: dict[str, Path], fake_worker: Path
) -> None:
    name = f"file:{user_files['chat']}"  # slashes and a colon end up in cell ids: traces and results cope
    listed = f'target = "fake-target"\nbatch_sizes = [1]\nmax_tokens = 8\nworkloads = ["{name}"]\n'
    listed += "[[methods]]\nname = 'none'\n[[methods]]\nname = 'ngram'\nk = 2\n"
    spec, text = load_sweep_source(sweep_file(tmp_path, user_files, listed))
    provider = default_prompt_provider(spec, check_models=False)
    out = run_bench(
        spec, tmp_path / "run", spec_text=text, prompt_provider=provider, progress=False, echo=print
    )
    assert out.ok == 2 and out.failed == 0
    rows = load_rows(tmp_path / "run")
    assert {r["workload"] for r in rows} == {name} and all(r["category"] == "other" for r in rows)
    assert all((tmp_path / "run" / r["trace_part"]).exists() for r in rows)
    assert {r.workload for r in read_store(tmp_path / "run" / "traces")} == {name}


def test_cell_ids_follow_the_file_content(tmp_path: Path, user_files: dict[str, Path]) -> None:
    """Editing a file workload changes its cells' ids (a rerun runs the new prompts); other cells keep theirs."""
    from speclab.bench.cells import expand_cells

    def ids() -> dict[str, set[str]]:
        spec, _ = load_sweep_source(sweep_file(tmp_path, user_files))
        out: dict[str, set[str]] = {}
        for c in expand_cells(spec):
            out.setdefault(c.workload, set()).add(c.cell_id)
        return out

    before = ids()
    with user_files["chat"].open("a") as fh:
        fh.write(json.dumps({"messages": [{"role": "user", "content": "one more question"}]}) + "\n")
    after = ids()
    assert before["my-chat"].isdisjoint(after["my-chat"])
    for w in ("offline-math", "my-prompts", "my-log"):
        assert before[w] == after[w]
