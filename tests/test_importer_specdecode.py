"""Importer for the study's JSON Lines traces."""

import json

import numpy as np
import pytest

from speclab.errors import TraceError
from speclab.traces.importers import import_specdecode_bench


def line(rid="a", gen=4, ngram=None, eagle=None, **extra):
    d = {
        "id": rid,
        "prompt_token_ids": [1, 2, 3],
        "generated_token_ids": list(range(gen)),
        "acc_ngram": {"acc_len": ngram if ngram is not None else [1] * gen},
        "acc_eagle": {"acc_len": eagle if eagle is not None else [2] * gen},
    }
    d.update(extra)
    return json.dumps(d)


def test_import_records(tmp_path):
    f = tmp_path / "instructcoder.jsonl"
    f.write_text(
        line("a", ngram=[1, 21, 3, 1]) + "\n\n" + line("b", acc_eagle_three={"acc_len": [3] * 4}) + "\n"
    )
    recs, notes = import_specdecode_bench([f])
    assert [r.id for r in recs] == ["a", "b"] and notes == []
    a, b = recs
    assert a.workload == "instructcoder" and a.category == "code-editing"
    assert a.prompt_len == 3 and a.output_len == 4
    assert a.methods["ngram"].k_max == 20 and a.methods["ngram"].acc_len.tolist() == [1, 21, 3, 1]
    assert a.methods["ngram"].num_proposed is None  # unknown, never invented
    assert set(b.methods) == {"ngram", "eagle", "eagle3"}
    recs, _ = import_specdecode_bench([f], workload="ic", category="other")
    assert recs[0].workload == "ic" and recs[0].category == "other"


@pytest.mark.parametrize(
    "bad,match",
    [
        ("{not json", r"line 1: not valid JSON"),
        ('{"prompt_token_ids": []}', r"line 1: field id: missing"),
        (line("a", gen=4, ngram=[1, 2]), r"line 1 \(id='a'\): field acc_ngram.acc_len: has 2 entries"),
        (line("a", ngram=[1, 0, 1, 1]), r"field acc_ngram.acc_len: value 0 at position 1 out of range 1..21"),
        (line("a", eagle=[1, 22, 1, 1]), r"field acc_eagle.acc_len: value 22"),
        (line("a", ngram=[1, "x", 1, 1]), r"field acc_ngram.acc_len: expected integers"),
        (json.dumps({"id": "a", "prompt_token_ids": [], "generated_token_ids": []}), r"no acc_\* field"),
        (json.dumps({"id": "a", "prompt_token_ids": [1], "generated_token_ids": [1], "acc_eagle": [1]}),
         r"field acc_eagle: expected an object with acc_len"),
    ],
)  # fmt: skip
def test_bad_input_names_file_line_field(tmp_path, bad, match):
    f = tmp_path / "x.jsonl"
    f.write_text(bad + "\n")
    with pytest.raises(TraceError, match=match) as ei:
        import_specdecode_bench([f])
    assert str(f) in str(ei.value)


def test_duplicate_and_second_line(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text(line("a") + "\n" + line("a") + "\n")
    with pytest.raises(TraceError, match=r"line 2 \(id='a'\): field id: duplicate \(first at .*line 1\)"):
        import_specdecode_bench([f])


def test_lenient_lengths(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text(line("a", gen=4, ngram=[3, 2], eagle=[1, 2, 3, 4, 5]) + "\n")
    recs, notes = import_specdecode_bench([f], lenient_lengths=True)
    assert recs[0].methods["ngram"].acc_len.tolist() == [3, 2, 1, 1]
    assert recs[0].methods["eagle"].acc_len.tolist() == [1, 2, 3, 4]
    assert len(recs[0].meta["lenient_length_fixes"]) == 2 and "truncated/padded" in notes[0]


def test_roundtrip_through_store(tmp_path):
    from speclab.traces import read_store, write_store

    f = tmp_path / "gsm8k.jsonl"
    f.write_text("\n".join(line(f"r{i}", gen=5 + i) for i in range(3)) + "\n")
    recs, _ = import_specdecode_bench([f])
    write_store(tmp_path / "store", recs)
    back = read_store(tmp_path / "store")
    assert [r.to_json_dict() for r in back] == [r.to_json_dict() for r in recs]
    assert back[0].category == "math"
    assert np.all(back[2].methods["eagle"].acc_len == 2)


def test_each_method_keeps_its_own_length(tmp_path):
    # acc_eagle comes from the EAGLE run: its own length (here 6 vs 4 generated tokens) is kept as is
    f = tmp_path / "instructcoder.jsonl"
    f.write_text(line("a", gen=4, eagle=[2, 1, 3, 1, 1, 2]) + "\n" + line("b", gen=4, eagle=[1, 1]) + "\n")
    recs, notes = import_specdecode_bench([f])
    assert [r.methods["eagle"].acc_len.tolist() for r in recs] == [[2, 1, 3, 1, 1, 2], [1, 1]]
    assert [r.methods["eagle"].output_len for r in recs] == [6, 2]
    assert all(r.output_len == 4 and r.methods["ngram"].output_len == 4 for r in recs)
    assert recs[0].methods["eagle"].output_token_ids is None  # the EAGLE run's tokens are not in the file
    assert "lenient_length_fixes" not in recs[0].meta
    assert any("acc_eagle: 2 record(s) with their own length" in n for n in notes)
