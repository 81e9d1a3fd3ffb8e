"""Sampled traces: accept_prob / accept_source on a method trace (validation, Parquet and JSONL round trips)."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from speclab.errors import TraceError
from speclab.traces import MethodTrace, RequestTrace, export_jsonl, read_jsonl, read_store, write_store
from speclab.traces import store as store_mod

PROBS = [[0.0, 0.0, 0.0], [0.9, 0.5, 0.25], [0.125, 0.0, 0.0], [0.0, 0.0, 0.0]]


def sampled_record(rid: str = "s0") -> RequestTrace:
    return RequestTrace(
        id=rid,
        workload="toy",
        category="chat",
        prompt_len=2,
        output_len=4,
        prompt_token_ids=[1, 2],
        output_token_ids=[5, 6, 7, 8],
        methods={
            "ngram": MethodTrace(
                k_max=3,
                acc_len=[1, 3, 1, 1],
                num_proposed=[0, 3, 1, 0],
                accept_prob=PROBS,
                accept_source="lookup p_T(d) along the no-SD path",
            ),
            "eagle": MethodTrace(k_max=3, acc_len=[1, 2, 2, 1]),  # greedy method beside it
        },
        meta={"sampling": {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "seed": 3}},
    )


@pytest.mark.parametrize("name", ["store_dir", "one.parquet"])
def test_accept_prob_roundtrips_parquet_and_jsonl(tmp_path, name):
    rec = sampled_record()
    write_store(tmp_path / name, [rec])
    (back,) = read_store(tmp_path / name)
    ng = back.methods["ngram"]
    assert ng.accept_prob.dtype == np.float32 and ng.accept_prob.shape == (4, 3)
    np.testing.assert_array_equal(ng.accept_prob, np.asarray(PROBS, np.float32))
    assert ng.accept_source == "lookup p_T(d) along the no-SD path"
    assert back.methods["eagle"].accept_prob is None and back.methods["eagle"].accept_source is None
    assert back.meta["sampling"]["temperature"] == 0.7
    assert back.to_json_dict() == rec.to_json_dict()
    export_jsonl([back], tmp_path / "x.jsonl")
    (again,) = read_jsonl(tmp_path / "x.jsonl")
    np.testing.assert_array_equal(again.methods["ngram"].accept_prob, ng.accept_prob)
    assert again.to_json_dict() == rec.to_json_dict()


def test_greedy_json_has_no_accept_fields():
    d = sampled_record().to_json_dict()
    assert "accept_prob" not in d["methods"]["eagle"] and "accept_source" not in d["methods"]["eagle"]


def test_expected_acc_len():
    mt = sampled_record().methods["ngram"]
    np.testing.assert_allclose(mt.expected_acc_len(), [1.0, 1 + 0.9 + 0.45 + 0.1125, 1.125, 1.0], rtol=1e-6)
    assert sampled_record().methods["eagle"].expected_acc_len() is None


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda m: m.accept_prob.__setitem__((1, 0), 1.5), r"value 1.5 at position 1, draft 1 not in 0..1"),
        (
            lambda m: m.accept_prob.__setitem__((1, 2), np.nan),
            r"value nan at position 1, draft 3 not in 0..1",
        ),
        (lambda m: m.accept_prob.__setitem__((2, 1), 0.5), r"draft 2 at position 2 .* only 1 drafts"),
        (lambda m: setattr(m, "accept_prob", m.accept_prob[:, :2]), r"shape \(4, 2\), expected \(4, 3\)"),
        (lambda m: setattr(m, "accept_source", None), r"needs accept_source"),
    ],
)
def test_bad_accept_prob_named(tmp_path, change, match):
    rec = sampled_record()
    change(rec.methods["ngram"])
    with pytest.raises(TraceError, match=r"method ngram: field accept_prob: " + match):
        write_store(tmp_path / "x.parquet", [rec])
    assert not (tmp_path / "x.parquet").exists()


def test_source_without_probabilities_refused():
    rec = sampled_record()
    rec.methods["eagle"].accept_source = "model sum-min"
    with pytest.raises(TraceError, match="accept_source given without accept_prob"):
        rec.validate()


def test_jsonl_ragged_rows_refused(tmp_path):
    d = sampled_record().to_json_dict()
    d["methods"]["ngram"]["accept_prob"][1] = [0.5]
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(d) + "\n")
    with pytest.raises(TraceError, match=r"line 1: field methods.ngram.accept_prob: rows of different"):
        read_jsonl(p)


def test_empty_output_roundtrips(tmp_path):
    rec = sampled_record()
    rec.output_len, rec.output_token_ids = 0, np.zeros(0, np.int32)
    rec.methods = {
        "ngram": MethodTrace(k_max=3, acc_len=[], num_proposed=[], accept_prob=[], accept_source="x")
    }
    rec.validate()
    write_store(tmp_path / "e.parquet", [rec])
    (back,) = read_store(tmp_path / "e.parquet")
    assert back.methods["ngram"].accept_prob.shape == (0, 3)
    (again,) = [RequestTrace.from_json_dict(json.loads(json.dumps(rec.to_json_dict())), "line 1")]
    assert again.methods["ngram"].accept_prob.shape == (0, 3)


def test_store_written_before_the_fields_still_reads(tmp_path):
    old_method = pa.struct([f for f in store_mod.METHOD_TYPE if not f.name.startswith("accept_")])
    old_schema = pa.schema(
        [pa.field("methods", pa.list_(old_method)) if f.name == "methods" else f for f in store_mod.SCHEMA]
    )
    table = store_mod.records_to_table([sampled_record()]).drop_columns(["methods"])
    methods = [[{"name": "ngram", "output_token_ids": None, "k_max": 3, "acc_len": [1, 3, 1, 1],
                 "num_proposed": [0, 3, 1, 0]}]]  # fmt: skip
    table = table.append_column("methods", pa.array(methods, type=pa.list_(old_method)))
    pq.write_table(table.select(old_schema.names).cast(old_schema), tmp_path / "old.parquet")
    (back,) = read_store(tmp_path / "old.parquet")
    assert back.methods["ngram"].accept_prob is None and back.methods["ngram"].accept_source is None
    assert back.methods["ngram"].acc_len.tolist() == [1, 3, 1, 1]
