"""Study loaders on small data written in each dataset's real schema (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from speclab.cli import main
from speclab.workloads import WorkloadError, load_workload, read_prompts
from speclab.workloads import sources as sources_mod


def _jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


CODER = [
    {"instruction": f"Rename x to y in f{i}.", "input": f"def f{i}(x):\n    return x + {i}", "output": "..."}
    for i in range(6)
]
GSM = [{"question": f"Tom has {i} apples and buys 2 more. How many?", "answer": f"{i}+2={i + 2}\n#### {i + 2}"} for i in range(8)]  # fmt: skip


def test_instructcoder_parquet_hub_layout(tmp_path: Path) -> None:
    _parquet(tmp_path / "data" / "train-00000-of-00001.parquet", CODER)
    ps = load_workload("instructcoder", source=str(tmp_path))
    assert len(ps) == 6 and ps[0].category == "code-editing"
    c = ps[0].messages[0]["content"]
    assert c.startswith("def f0(x):") and c.endswith(
        "Rename x to y in f0. Just output the code, do not include any explanation."
    )
    assert ps[0].reference == "..." and ps[0].meta["truncate"]["end"] == len(CODER[0]["input"])


def test_cnn_snapshot_dir_picks_config_and_split(tmp_path: Path) -> None:
    rows = [{"article": f"Article {i}. " * 30, "highlights": f"H{i}", "id": f"abc{i}"} for i in range(5)]
    _parquet(tmp_path / "3.0.0" / "test-00000-of-00001.parquet", rows)
    _parquet(
        tmp_path / "3.0.0" / "train-00000-of-00001.parquet", [{"article": "x", "highlights": "y", "id": "t"}]
    )
    ps = load_workload("cnn-dailymail", source=str(tmp_path))
    assert [p.id for p in ps] == [f"cnn-dailymail-abc{i}" for i in range(5)]
    assert ps[0].messages[0]["content"].startswith("Summarize the following article")
    assert ps[0].reference == "H0"


def test_gsm8k_jsonl_limit_seed(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "test.jsonl", GSM)
    a = load_workload("gsm8k", limit=4, seed=1, source=str(f))
    b = load_workload("gsm8k", limit=4, seed=1, source=str(f))
    c = load_workload("gsm8k", limit=4, seed=2, source=str(f))
    assert [p.id for p in a] == [p.id for p in b] != [p.id for p in c]
    assert len(a) == 4 and all(p.meta["answer"] == str(int(p.meta["row"]) + 2) for p in a)
    assert "####" in a[0].messages[0]["content"]
    assert len(load_workload("gsm8k", limit=100, source=str(f))) == 8  # fewer rows than asked: all of them


def test_sharegpt_json_skips_short_conversations(tmp_path: Path) -> None:
    data = [
        {"id": "a", "conversations": [{"from": "human", "value": "Hi, explain DNS."}, {"from": "gpt", "value": "DNS is ..."}]},
        {"id": "b", "conversations": [{"from": "human", "value": "only one turn"}]},
        {"id": "c", "conversations": [{"from": "human", "value": "Write a poem."}, {"from": "gpt", "value": "Roses"}, {"from": "human", "value": "More"}]},
    ]  # fmt: skip
    f = tmp_path / "ShareGPT_V3_unfiltered_cleaned_split.json"
    f.write_text(json.dumps(data))
    ps = load_workload("sharegpt", source=str(f))
    assert [p.id for p in ps] == ["sharegpt-a", "sharegpt-c"]
    assert (
        ps[0].messages == [{"role": "user", "content": "Hi, explain DNS."}]
        and ps[0].reference == "DNS is ..."
    )
    assert ps[0].meta["skipped_rows"] == 1


def test_aime_and_gpqa(tmp_path: Path) -> None:
    aime = [
        {"id": i, "problem": f"Find {i}+1.", "solution": "...", "answer": str(i + 1), "url": "u"}
        for i in range(3)
    ]
    ps = load_workload("aime", source=str(_parquet(tmp_path / "aime.parquet", aime)))
    assert ps[1].reference == "2" and "\\boxed{}" in ps[1].messages[0]["content"]
    cols = ["Pre-Revision Question", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
            "Incorrect Answer 3", "Record ID", "High-level domain"]  # fmt: skip
    lines = [",".join(cols)] + [f"q{i},What is {i}?,right{i},w1,w2,w3,rec{i},Physics" for i in range(4)]
    csv = tmp_path / "gpqa_main.csv"
    csv.write_text("\n".join(lines) + "\n")
    a = load_workload("gpqa", seed=5, source=str(csv))
    b = load_workload("gpqa", seed=5, source=str(csv))
    assert [p.to_dict() for p in a] == [p.to_dict() for p in b]
    for p in a:
        content = p.messages[0]["content"]
        i = p.id.removeprefix("gpqa-rec")
        assert f"{p.reference}) right{i}" in content and "Answer: X" in content


def test_save_to_disk_directory(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    d = tmp_path / "gsm"
    datasets.DatasetDict({"test": datasets.Dataset.from_list(GSM[:3])}).save_to_disk(str(d))
    assert len(load_workload("gsm8k", source=str(d))) == 3


@pytest.mark.parametrize(
    ("rows", "expect"),
    [
        ([GSM[0], {"question": "no answer here"}, GSM[1]], "line 2: missing field 'answer'"),
        ([GSM[0], GSM[1], {"question": 3, "answer": "x"}], "line 3: field 'question' should be str"),
        ([GSM[0], ["not", "an", "object"]], "line 2: expected an object"),
    ],
)
def test_malformed_row_named(tmp_path: Path, rows: list, expect: str) -> None:
    f = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(WorkloadError, match=expect):
        load_workload("gsm8k", source=str(f))


def test_malformed_json_and_sharegpt_turn(tmp_path: Path) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps(GSM[0]) + "\n{not json\n")
    with pytest.raises(WorkloadError, match="line 2: not valid JSON"):
        load_workload("gsm8k", source=str(f))
    g = tmp_path / "sg.json"
    g.write_text(
        json.dumps([{"id": "x", "conversations": [{"from": "human"}, {"from": "gpt", "value": "v"}]}])
    )
    with pytest.raises(WorkloadError, match=r"row 0: conversations\[0\]"):
        load_workload("sharegpt", source=str(g))


def test_empty_dataset(tmp_path: Path) -> None:
    f = tmp_path / "empty.jsonl"
    f.write_text("")
    with pytest.raises(WorkloadError, match="no rows"):
        load_workload("gsm8k", source=str(f))
    _parquet(tmp_path / "e" / "test.parquet", [])  # an empty table has no columns to write
    with pytest.raises(WorkloadError, match="no rows"):
        load_workload("instructcoder", source=str(tmp_path / "e"))


def test_hub_unreachable_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("datasets")
    monkeypatch.setattr(sources_mod, "_hub_reachable", lambda timeout=3.0: False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    with pytest.raises(SystemExit):
        main(["workloads", "show", "gpqa"])
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--source" in err and "gated" in err
    with pytest.raises(WorkloadError, match="AIME is small"):
        load_workload("aime")


def test_cli_export_source(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    f = _jsonl(tmp_path / "test.jsonl", GSM)
    out = tmp_path / "out.jsonl"
    main(
        ["workloads", "export", "gsm8k", "--source", str(f), "--limit", "3", "--seed", "7", "--out", str(out)]
    )
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 3 and {r["workload"] for r in rows} == {"gsm8k"}
    assert [r["id"] for r in rows] == [p.id for p in load_workload("gsm8k", limit=3, seed=7, source=str(f))]
    assert [p.to_dict() for p in read_prompts(str(out))] == rows
