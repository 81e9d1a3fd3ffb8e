"""Offline stand-ins: deterministic, distinct, light (no network, no heavy imports)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from speclab.workloads import list_workloads, load_workload, ngram_overlap

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
