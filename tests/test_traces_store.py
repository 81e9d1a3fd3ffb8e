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


def test_method_lengths_and_truncated_file(tmp_path):
    # a method's trace may have its own length (its own run): accepted; the truncated line 2 is not
    d = make_record().to_json_dict()
    d["methods"]["eagle"]["acc_len"] = [1, 1]
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(d) + "\n" + json.dumps(make_record().to_json_dict())[:40])
    with pytest.raises(TraceError, match=r"line 2: not valid JSON"):
        read_jsonl(p)
    p.write_text(json.dumps(d) + "\n")
    assert read_jsonl(p)[0].methods["eagle"].output_len == 2
    # but within one method, every per-position array has one entry per position of that method's output
    d["methods"]["ngram"]["num_proposed"] = [0, 4]
    p.write_text(json.dumps(d) + "\n")
    with pytest.raises(
        TraceError, match=r"line 1 .*method ngram: field num_proposed: has 2 entries, acc_len has 5"
    ):
        read_jsonl(p)
    d = make_record().to_json_dict()
    d["methods"]["eagle"]["output_token_ids"] = [7, 8]
    p.write_text(json.dumps(d) + "\n")
    with pytest.raises(
        TraceError, match=r"method eagle: field output_token_ids: has 2 tokens, acc_len has 5"
    ):
        read_jsonl(p)
    write_store(tmp_path / "ok.parquet", [make_record()])
    data = (tmp_path / "ok.parquet").read_bytes()
    (tmp_path / "trunc.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match=r"trunc.parquet: cannot read as Parquet"):
        read_store(tmp_path / "trunc.parquet")


@pytest.mark.parametrize("name", ["store_dir", "one.parquet"])
def test_own_lengths_and_own_tokens_roundtrip(tmp_path, name):
    rec = make_record("a")
    rec.methods["eagle"] = MethodTrace(
        k_max=4, acc_len=[2, 1, 3, 1, 1, 2, 1], output_token_ids=[5, 6, 7, 8, 9, 1, 2]
    )
    rec.methods["ngram"] = MethodTrace(k_max=4, acc_len=[1, 2, 1], num_proposed=[0, 2, 1])
    write_store(tmp_path / name, [rec])
    [back] = read_store(tmp_path / name)
    assert_same(rec, back)
    assert (
        back.output_len == 5
        and back.methods["eagle"].output_len == 7
        and back.methods["ngram"].output_len == 3
    )
    assert back.methods["eagle"].output_token_ids.tolist() == [5, 6, 7, 8, 9, 1, 2]
    assert back.methods["ngram"].output_token_ids is None
    export_jsonl([back], tmp_path / "x.jsonl")
    assert_same(rec, read_jsonl(tmp_path / "x.jsonl")[0])


def test_store_written_before_per_method_tokens_still_reads(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from speclab.traces import store

    old_method = pa.struct([f for f in store.METHOD_TYPE if f.name != "output_token_ids"])
    old_schema = pa.schema(
        [pa.field("methods", pa.list_(old_method)) if f.name == "methods" else f for f in store.SCHEMA]
    )
    cols = store.records_to_table([make_record("a")]).to_pydict()
    for ms in cols["methods"]:
        for m in ms:
            m.pop("output_token_ids")
    pq.write_table(pa.Table.from_pydict(cols, schema=old_schema), tmp_path / "old.parquet")
    [back] = read_store(tmp_path / "old.parquet")
    assert_same(make_record("a"), back)
