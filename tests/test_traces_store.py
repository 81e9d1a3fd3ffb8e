import json

import numpy as np
import pytest

from speclab.errors import TraceError
from speclab.traces import MethodTrace, RequestTrace, export_jsonl, read_jsonl, read_store, write_store
from speclab.traces.store import append_to_store


def make_record(rid: str = "r0", n: int = 5, with_ids: bool = True) -> RequestTrace:
    return RequestTrace(
        id=rid,
        workload="toy",
        category="code-editing",
        prompt_len=3,
        output_len=n,
        prompt_token_ids=[1, 2, 3] if with_ids else None,
        output_token_ids=list(range(10, 10 + n)) if with_ids else None,
        methods={
            "ngram": MethodTrace(k_max=4, acc_len=[1, 3, 5, 1, 2][:n], num_proposed=[0, 4, 4, 0, 2][:n]),
            "eagle": MethodTrace(k_max=4, acc_len=[2, 2, 2, 2, 1][:n]),
        },
        meta={"source": "test"},
    )


def assert_same(a: RequestTrace, b: RequestTrace) -> None:
    assert a.to_json_dict() == b.to_json_dict()


@pytest.mark.parametrize("name", ["store_dir", "one.parquet"])
def test_roundtrip_parquet_and_jsonl(tmp_path, name):
    recs = [make_record("a"), make_record("b", with_ids=False)]
    write_store(tmp_path / name, recs)
    back = read_store(tmp_path / name)
    assert len(back) == 2
    for x, y in zip(recs, back, strict=True):
        assert_same(x, y)
    assert back[1].methods["eagle"].num_proposed is None  # unknown stays unknown
    export_jsonl(back, tmp_path / "out.jsonl")
    again = read_jsonl(tmp_path / "out.jsonl")
    for x, y in zip(recs, again, strict=True):
        assert_same(x, y)


def test_append_parts_accumulate(tmp_path):
    append_to_store(tmp_path / "s", [make_record("a")], tag="cell-1")
    append_to_store(tmp_path / "s", [make_record("b")], tag="cell-2")
    assert [r.id for r in read_store(tmp_path / "s")] == ["a", "b"]
    assert not list((tmp_path / "s").glob(".*tmp"))  # no temporary files left behind


def test_bad_values_name_record_and_field(tmp_path):
    rec = make_record()
    rec.methods["ngram"].acc_len = np.array([1, 3, 9, 1, 2])
    with pytest.raises(TraceError, match=r"record 0 \(id='r0'\).*method ngram: field acc_len: value 9"):
        write_store(tmp_path / "x.parquet", [rec])
    assert not (tmp_path / "x.parquet").exists()


def test_ragged_and_unknown_method_in_jsonl(tmp_path):
    d = make_record().to_json_dict()
    d["methods"]["ngram"]["acc_len"] = [1, [2, 3], 1, 1, 1]
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(d) + "\n")
    with pytest.raises(TraceError, match=r"bad.jsonl: line 1: field methods.ngram.acc_len"):
        read_jsonl(p)
    d = make_record().to_json_dict()
    d["methods"]["medusa"] = d["methods"].pop("eagle")
    p.write_text(json.dumps(d) + "\n")
    with pytest.raises(TraceError, match=r"unknown method 'medusa'"):
        read_jsonl(p)


def test_length_mismatch_and_truncated_file(tmp_path):
    d = make_record().to_json_dict()
    d["methods"]["eagle"]["acc_len"] = [1, 1]
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(d) + "\n" + json.dumps(make_record().to_json_dict())[:40])
    with pytest.raises(TraceError, match=r"line 1 .*field acc_len: has 2 entries, expected output_len=5"):
        read_jsonl(p)
    write_store(tmp_path / "ok.parquet", [make_record()])
    data = (tmp_path / "ok.parquet").read_bytes()
    (tmp_path / "trunc.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match=r"trunc.parquet: cannot read as Parquet"):
        read_store(tmp_path / "trunc.parquet")
