"""Offline stand-ins: deterministic, distinct, light (no network, no heavy imports)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from speclab.cli import main
from speclab.workloads import WorkloadError, list_workloads, load_workload, ngram_overlap
from speclab.workloads.offline.code_edit import MAX_LINES, MIN_LINES

OFFLINE = [i.name for i in list_workloads() if i.kind == "offline"]


def test_contract_names_present() -> None:
    names = {i.name for i in list_workloads()}
    assert {"offline-code-edit", "offline-math"} <= names


@pytest.mark.parametrize("name", OFFLINE)
def test_offline_deterministic_and_distinct(name: str) -> None:
    a = load_workload(name, limit=40, seed=3)
    b = load_workload(name, limit=40, seed=3)
    c = load_workload(name, limit=40, seed=4)
    assert [p.to_dict() for p in a] == [p.to_dict() for p in b]
    assert [p.id for p in a] != [p.id for p in c]
    assert len(a) == 40 and len({p.id for p in a}) == 40
    assert len({json.dumps(p.messages) for p in a}) == 40
    for p in a:
        assert p.workload == name and p.messages and p.messages[-1]["role"] == "user"
        assert p.meta.get("stands_in_for")


def test_offline_light_and_no_network() -> None:
    code = (
        "import socket, sys\n"
        "def no(*a, **k): raise AssertionError('network used')\n"
        "socket.socket.connect = no; socket.create_connection = no; socket.getaddrinfo = no\n"
        "from speclab.workloads import list_workloads, load_workload\n"
        "for i in list_workloads():\n"
        "    if i.kind == 'offline': assert len(load_workload(i.name, limit=20)) == 20\n"
        "heavy = [m for m in ('torch', 'vllm', 'transformers', 'datasets') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_code_edit_reference_repeats_prompt() -> None:
    prompts = [p for p in load_workload("offline-code-edit", limit=60, seed=0) if p.reference]
    assert prompts
    scores = [ngram_overlap(p.messages[0]["content"], p.reference) for p in prompts]
    assert min(scores) > 0.6
    math = load_workload("offline-math", limit=20)
    assert all(p.reference is not None and p.reference.lstrip("-").isdigit() for p in math)


def test_offline_pool_sizes_and_build_time() -> None:
    # The bar: every stand-in builds in seconds with at least 200 distinct prompts.
    import time

    for name in OFFLINE:
        t0 = time.perf_counter()
        prompts = load_workload(name, limit=200, seed=0)
        elapsed = time.perf_counter() - t0
        assert len({p.id for p in prompts}) == 200, name
        assert elapsed < 30, (name, elapsed)


def test_offline_sources(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    body = "\n".join(f"    total = total + {i} * x" for i in range(2, 10))
    (code / "mod.py").write_text(f"def accumulate(x, y):\n    total = 0\n{body}\n    return total + y\n")
    prompts = load_workload("offline-code-edit", source=str(code))
    assert len(prompts) == 1 and prompts[0].meta["source_file"] == "mod.py"
    docs = tmp_path / "docs"
    docs.mkdir()
    para = " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 12)
    (docs / "README.txt").write_text(f"{para}\n\n{para}\n")
    s = load_workload("offline-summarization", source=str(docs))
    assert len(s) == 1 and s[0].meta["origin"].endswith("README.txt")
    with pytest.raises(WorkloadError, match="no prose passages"):
        load_workload("offline-summarization", source=str(code))
    with pytest.raises(WorkloadError, match="takes no --source"):
        load_workload("offline-math", source=str(docs))


def test_code_edit_exact_edits_apply() -> None:
    prompts = load_workload("offline-code-edit", limit=150, seed=1)
    kinds = {p.meta["edit"] for p in prompts}
    assert {"rename_function", "rename_parameter", "add_type_hints"} <= kinds
    for p in prompts:
        code = p.messages[0]["content"].split("```python\n", 1)[1].split("\n```", 1)[0]
        assert MIN_LINES <= code.count("\n") + 1 <= MAX_LINES
        ast.parse(code)
        if p.reference:
            new = p.reference.split("```python\n", 1)[1].split("\n```", 1)[0]
            ast.parse(new)  # the exact answer is valid Python
            assert new != code


def test_registry_plugin_file(tmp_path: Path) -> None:
    plugin = tmp_path / "my_workload.py"
    plugin.write_text(
        "from speclab.workloads import Prompt, WorkloadInfo, register_workload\n"
        "def build(limit, seed, source):\n"
        "    return [Prompt(f'p{i}', 'my-wl', 'other', [{'role': 'user', 'content': f'hi {i}'}]) for i in range(3)]\n"
        "register_workload(WorkloadInfo('my-wl', 'other', 'offline', 'a plugin'), build)\n"
    )
    code = (
        "from speclab.workloads import load_workload, list_workloads\n"
        "assert 'my-wl' in [i.name for i in list_workloads()]\n"
        "assert [p.id for p in load_workload('my-wl', limit=2)] == ['p0', 'p1']\n"
    )
    env = {**os.environ, "SPECLAB_WORKLOADS": str(plugin)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_cli_list_and_show(capsys: pytest.CaptureFixture) -> None:
    main(["workloads", "list", "--json"])
    infos = json.loads(capsys.readouterr().out)
    names = [i["name"] for i in infos]
    assert names[:5] == [
        "offline-code-edit",
        "offline-summarization",
        "offline-math",
        "offline-chat",
        "offline-reasoning",
    ]
    assert {"instructcoder", "cnn-dailymail", "gsm8k", "sharegpt", "aime", "gpqa"} <= set(names)
    main(["workloads", "show", "offline-math", "--limit", "2", "--json"])
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 and rows[0]["category"] == "math"
    with pytest.raises(SystemExit):
        main(["workloads", "show", "no-such-workload"])
    assert "unknown workload" in capsys.readouterr().err


def test_categories_match_traces() -> None:
    from speclab.traces import CATEGORIES as TRACE_CATEGORIES
    from speclab.workloads import CATEGORIES

    assert CATEGORIES == TRACE_CATEGORIES
    assert {i.category for i in list_workloads()} <= set(CATEGORIES)


def test_generated_answers_consistent() -> None:
    for p in load_workload("offline-math", limit=2000, seed=9):
        assert p.reference == str(p.meta["answer"]) and p.meta["answer"] >= 0
    for p in load_workload("offline-reasoning", limit=300, seed=9):
        if p.meta["style"] == "multiple-choice":
            letter = p.reference
            assert f"{letter}) {p.meta['answer']}\n" in p.messages[0]["content"]
        else:
            assert p.reference == str(p.meta["answer"])
