"""File-backed workloads: a user's prompts file, chat file or request log as a workload (no engine, seconds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from speclab.workloads import Prompt, WorkloadError, get_workload, load_workload, render_prompt
from speclab.workloads.base import seeded_sample
from speclab.workloads.file_workloads import bench_notes, register_file_workload
from speclab.workloads.files import parse_file


class CharTokenizer:
    """One token per character; a chat template with visible markers."""

    chat_template = "fake"

    def apply_chat_template(
        self, messages: list[dict], tokenize: bool, add_generation_prompt: bool, **kw: Any
    ):
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + "<assistant>"

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(map(chr, ids))


def write_lines(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


PROMPTS = [
    {"prompt": "Rename foo to bar in: def foo(x): return x", "reference": "def bar(x): return x"},
    {"prompt": "What is 2 + 2?", "category": "math"},
    {"prompt": "Tell me a joke."},
]
CHAT = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]},
    {
        "messages": [
            {"role": "user", "content": "Say the word apple."},
            {"role": "assistant", "content": "apple"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Again,"}, {"type": "text", "text": "twice."}],
            },
        ],
        "id": 7,
    },
]
LOG = [
    {
        "timestamp": "2026-01-01T00:00:00Z",
        "model": "my-model",
        "messages": [{"role": "user", "content": "Summarise: the cat sat on the mat."}],
        "max_tokens": 64,
        "temperature": 0.7,
    },
    {"custom_id": "r2", "timestamp": 1767225602.5, "body": {"prompt": "Once upon a time", "max_tokens": 16}},
    {
        "request": {"messages": [{"role": "user", "content": "Hello"}], "temperature": 0},
        "arrival_time": 1767225603500,
    },
]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "prompts": write_lines(tmp_path / "prompts.jsonl", PROMPTS),
        "chat": write_lines(tmp_path / "chat.jsonl", CHAT),
        "request-log": write_lines(tmp_path / "traffic.log", LOG),
    }


def test_each_format_is_detected_and_read(files: dict[str, Path]) -> None:
    for fmt, path in files.items():
        pf = parse_file(path)
        assert pf.format == fmt and pf.rows == len(pf.prompts) and pf.duplicates == 0
    p = parse_file(files["prompts"]).prompts
    assert p[0].messages == [{"role": "user", "content": PROMPTS[0]["prompt"]}]
    assert p[0].reference == "def bar(x): return x" and p[1].category == "math" and p[2].category == "other"
    assert p[0].meta["source"] == f"{files['prompts']} line 1"
    c = parse_file(files["chat"]).prompts
    assert c[0].messages[0] == {"role": "system", "content": "Be brief."}
    assert c[1].id == "chat-7" and c[1].messages[2]["content"] == "Again,\ntwice."  # text parts joined
    r = parse_file(files["request-log"]).prompts
    assert (
        r[0].meta["max_tokens"] == 64 and r[0].meta["temperature"] == 0.7 and r[0].meta["model"] == "my-model"
    )
    assert r[0].meta["arrival_s"] == 1767225600.0 and r[0].meta["arrival_field"] == "timestamp"
    # Batch-API wrapper: custom_id is the id, a completions prompt is sent as raw text (no chat template)
    assert (
        r[1].id == "traffic-r2"
        and r[1].meta["chat_template"] is False
        and r[1].meta["arrival_s"] == 1767225602.5
    )
    assert r[2].meta["arrival_s"] == pytest.approx(1767225603.5)  # epoch milliseconds
    assert "chat_template" not in r[0].meta and r[2].meta["temperature"] == 0.0


def test_forced_format_and_category(tmp_path: Path, files: dict[str, Path]) -> None:
    # a prompts file read as chat: the first line is refused, naming the field it lacks
    with pytest.raises(WorkloadError, match=r"prompts.jsonl line 1: field messages: missing"):
        parse_file(files["prompts"], "chat")
    # a request log with a completions prompt read as `prompts`: templated like the built-ins
    pf = parse_file(write_lines(tmp_path / "x.jsonl", [{"prompt": "hi", "max_tokens": 5}]), "prompts")
    assert pf.format == "prompts" and "chat_template" not in pf.prompts[0].meta
    assert pf.prompts[0].meta["max_tokens"] == 5
    # category: given, else the one every line names, else "other"
    assert parse_file(files["prompts"]).category == "other"
    assert parse_file(files["prompts"], category="code-editing").category == "code-editing"
    same = write_lines(
        tmp_path / "m.jsonl", [{"prompt": "a", "category": "math"}, {"prompt": "b", "category": "math"}]
    )
    assert parse_file(same).category == "math"


@pytest.mark.parametrize(
    "line, where, words",
    [
        ("{not json", "line 2", "not valid JSON"),
        ("[1, 2]", "line 2", "expected a JSON object, got list"),
        ({"text": "hi"}, "line 2", "field prompt: missing"),
        ({"prompt": 3}, "line 2", "field prompt: expected text, got int"),
        ({"prompt": "  "}, "line 2", "field prompt: the prompt is empty"),
        ({"prompt": "a", "messages": []}, "line 2", "field prompt: give prompt or messages, not both"),
        ({"prompt": "a", "category": "poetry"}, "line 2", "field category: 'poetry' is not one of"),
        ({"prompt": "a", "reference": 5}, "line 2", "field reference: expected text"),
        ({"prompt": "a", "id": [1]}, "line 2", "field id: expected text or an integer"),
        ({"prompt": "x", "id": "a"}, "line 2", "field id: 'a' is used at"),
    ],
)
def test_malformed_prompts_line_names_file_line_and_field(
    tmp_path: Path, line: Any, where: str, words: str
) -> None:
    path = write_lines(tmp_path / "bad.jsonl", [{"prompt": "fine", "id": "a"}, line])
    with pytest.raises(WorkloadError) as exc:
        parse_file(path, "prompts")
    msg = str(exc.value)
    assert "\n" not in msg and f"{path} {where}" in msg and words in msg, msg


@pytest.mark.parametrize(
    "body, words",
    [
        ({"messages": "hi"}, "field messages: expected a non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "field messages[0].role: 'robot' is not one of"),
        ({"messages": [{"content": "x"}]}, "field messages[0].role: missing"),
        ({"messages": [{"role": "system", "content": "x"}]}, "field messages: has no user turn"),
        ({"messages": [{"role": "user", "content": None}]}, "field messages[0].content: missing"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "field messages[0].content[0]: only text parts can be benched, got 'image_url'",
        ),
        ({"body": {"prompt": [1, 2, 3]}}, "field body.prompt: token-id prompts are not supported"),
        ({"body": {"prompt": ["a", "b"]}}, "field body.prompt: expected one prompt (text), got a list of 2"),
        ({"body": {"model": "m"}}, "field body.messages: missing"),
        ({"prompt": "a", "max_tokens": 0}, "field max_tokens: expected an integer >= 1, got 0"),
        ({"prompt": "a", "temperature": "hot"}, "field temperature: expected a number >= 0"),
        ('{"prompt": "a", "temperature": Infinity}', "field temperature: expected a number >= 0"),
        (
            {"prompt": "a", "timestamp": "yesterday"},
            "field timestamp: expected seconds (a number) or an ISO 8601",
        ),
        ({"body": {"prompt": "a", "created": True}}, "field body.created: expected seconds"),
    ],
)
def test_malformed_request_log_line(tmp_path: Path, body: dict | str, words: str) -> None:
    path = write_lines(tmp_path / "log.jsonl", [LOG[0], body])
    with pytest.raises(WorkloadError) as exc:
        parse_file(path)
    msg = str(exc.value)
    assert "\n" not in msg and f"{path} line 2: {words}" in msg, msg


def test_empty_missing_and_all_invalid_files_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    for name in ("empty.jsonl", "blank.jsonl"):
        with pytest.raises(WorkloadError, match="no requests \\(the file is empty\\)"):
            parse_file(tmp_path / name)
    with pytest.raises(WorkloadError, match="no such file"):
        parse_file(tmp_path / "nope.jsonl")
    with pytest.raises(WorkloadError, match="is a directory"):
        parse_file(tmp_path)
    with pytest.raises(WorkloadError, match="cannot tell the format: no field prompt or messages"):
        parse_file(write_lines(tmp_path / "q.jsonl", [{"question": "?"}]))
    with pytest.raises(WorkloadError, match="format 'csv' is not one of"):
        parse_file(tmp_path / "q.jsonl", "csv")
    (tmp_path / "bin.jsonl").write_bytes(b'{"prompt": "a"}\n\xff\xfe\n')
    with pytest.raises(WorkloadError, match="bin.jsonl line 2: not UTF-8 text"):
        parse_file(tmp_path / "bin.jsonl")
    # skip_invalid leaves bad lines out (counted) but still refuses a file with none usable
    mixed = write_lines(tmp_path / "mixed.jsonl", [{"prompt": "a"}, "{oops", {"prompt": 1}, {"prompt": "b"}])
    pf = parse_file(mixed, skip_invalid=True)
    assert [p.text for p in pf.prompts] == ["a", "b"] and len(pf.invalid) == 2 and "line 2" in pf.invalid[0]
    bad = write_lines(tmp_path / "allbad.jsonl", ["{oops", {"prompt": 1}])
    with pytest.raises(WorkloadError, match="none of its 2 lines is usable \\(first: .*line 1"):
        parse_file(bad, skip_invalid=True)


def test_dedupe_sampling_and_ids_like_the_built_ins(tmp_path: Path) -> None:
    rows = [{"prompt": f"question {i}"} for i in range(12)] + [
        {"prompt": "question 3"},
        {"prompt": "question 5"},
    ]
    path = write_lines(tmp_path / "qs.jsonl", rows)
    name = f"file:{path}"
    info = get_workload(name)
    assert info.kind == "file" and info.category == "other" and "2 repeated prompts dropped" in info.notes
    everything = load_workload(name)
    assert [p.text for p in everything] == [f"question {i}" for i in range(12)]  # file order, repeats dropped
    assert all(p.id.startswith("qs-") for p in everything) and len({p.id for p in everything}) == 12
    assert everything[0].meta["file_rows"] == 14 and everything[0].meta["duplicates_dropped"] == 2
    a, b = load_workload(name, limit=5, seed=1), load_workload(name, limit=5, seed=1)
    assert [p.id for p in a] == [p.id for p in b] == [p.id for p in seeded_sample(everything, 5, 1)]
    assert [p.id for p in load_workload(name, limit=5, seed=2)] != [p.id for p in a]
    # ids are content-based: the same prompt keeps its id when lines are added or moved
    write_lines(path, [{"prompt": "new first"}] + rows)
    again = {p.text: p.id for p in load_workload(name)}
    assert all(again[p.text] == p.id for p in everything)
    # a file workload takes no --source; a built-in's name cannot be taken
    with pytest.raises(WorkloadError, match="takes no source"):
        load_workload(name, source=str(path))
    with pytest.raises(WorkloadError, match="'offline-math' is a built-in workload"):
        register_file_workload("offline-math", str(path))
    with pytest.raises(WorkloadError, match="give a path after file:"):
        get_workload("file:")


def test_render_templates_chat_and_keeps_completions_raw(files: dict[str, Path]) -> None:
    tok = CharTokenizer()
    log = load_workload(f"file:{files['request-log']}")
    chat_ids, _ = render_prompt(log[0], tok)
    assert tok.decode(chat_ids).startswith("<user>Summarise") and tok.decode(chat_ids).endswith("<assistant>")
    raw_ids, _ = render_prompt(log[1], tok)
    assert tok.decode(raw_ids) == "Once upon a time"
    # truncation is the built-ins' one: the body cut at its end, with a marker, and flagged
    ids, cut = render_prompt(log[0], tok, max_prompt_tokens=len(chat_ids) - 10)
    assert cut and len(ids) <= len(chat_ids) - 10 and "[... truncated]" in tok.decode(ids)
    ids, cut = render_prompt(log[1], tok, max_prompt_tokens=30)
    assert not cut and tok.decode(ids) == "Once upon a time"


def test_bench_notes_say_what_the_log_asked_for(files: dict[str, Path]) -> None:
    log = load_workload(f"file:{files['request-log']}")
    notes = bench_notes("traffic", log, max_tokens=32)
    assert len(notes) == 2
    assert "1 of 3 requests asked for temperature > 0" in notes[0] and "greedily" in notes[0]
    assert "2 of 3 requests asked for max_tokens other than the sweep's 32 (16-64)" in notes[1]
    assert bench_notes("p", [Prompt("a", "p", "chat", [{"role": "user", "content": "x"}])], 32) == []


def test_other_shapes_of_file(tmp_path: Path) -> None:
    import gzip

    # a gzip-compressed log, whatever its name
    gz = tmp_path / "traffic.jsonl.gz"
    gz.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in LOG).encode()))
    assert [p.id for p in parse_file(gz).prompts][1] == "traffic.jsonl-r2"
    (tmp_path / "cut.gz").write_bytes(gz.read_bytes()[:40])
    with pytest.raises(WorkloadError, match="cut.gz: cannot read"):
        parse_file(tmp_path / "cut.gz")
    # a JSON list of request objects, and a CSV with a prompt column
    (tmp_path / "list.json").write_text(json.dumps(PROMPTS))
    assert len(parse_file(tmp_path / "list.json").prompts) == 3
    (tmp_path / "p.csv").write_text('prompt,category\n"Hello, there",chat\nWhy?,chat\n')
    pf = parse_file(tmp_path / "p.csv")
    assert pf.format == "prompts" and pf.category == "chat" and pf.prompts[0].text == "Hello, there"
    # lines that are JSON but not a request
    for line, words in (("null", "expected a JSON object, got null"), ("{}", "has: nothing")):
        with pytest.raises(WorkloadError, match=words):
            parse_file(write_lines(tmp_path / "odd.jsonl", [line]))
