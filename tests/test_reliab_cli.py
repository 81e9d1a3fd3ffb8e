"""Known bad inputs, each run through the CLI: one `speclab: error:` line and exit 2 for bad input,
or a sensible exit 0 -- never a traceback, a NaN, a wrapped number or a lost store."""

from __future__ import annotations

import json
import os
import time

import pytest

from reliab_helpers import (  # tests/ is on sys.path
    NGRAM_MODEL,
    cli,
    simulate_rows_finite,
    study_line,
    write_study,
)
from speclab.traces import read_store
from speclab.traces.store import SCHEMA

GOOD_MODEL = (
    NGRAM_MODEL
    + """[draft.eagle]
form = "linear"
kv = 2e-9
num_spec = 8e-7
const = 2e-3
"""
)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("reliab")
    write_study(d / "study.jsonl", [f"r{i}" for i in range(12)])
    res = cli("traces", "import", "--format", "specdecode-bench", d / "study.jsonl", "--out", d / "store")
    assert res.code == 0, res.err
    (d / "model.toml").write_text(GOOD_MODEL)
    (d / "binary.bin").write_bytes(bytes(range(256)) * 8)
    (d / "plain").write_text("not a store\n")
    return d


def error(res, code: int = 2) -> str:
    assert res.code == code, (res.code, res.out, res.err)
    return res.error_line()


# --- 3. cost models -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "edit, needle",
    [
        (("kv = 4e-8", "kv = -4e-8"), "target.kv: -4e-08 out of range"),
        (("batched = 2e-5\nconst = 6e-3", "batched = 0.0\nconst = 0.0"), "batched and const are both 0"),
        (("fraction = 0.006", "fraction = -0.5"), "draft.ngram.fraction: -0.5 out of range"),
        (("per_step = 1.2e-3", "per_step = nan"), "overhead.per_step: expected a number, got nan"),
        (("[overhead]\nper_step = 1.2e-3\n", ""), "section [overhead] missing"),
        (("const = 6e-3", "const = 6e-3\nconts = 1"), "unknown key(s) conts"),
        (("[draft.ngram]", "[drafts.ngram]"), "top level: unknown key(s) drafts"),
    ],
)
def test_bad_cost_models_refused_by_simulate_and_analyze(data, tmp_path, edit, needle):
    assert edit[0] in GOOD_MODEL
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD_MODEL.replace(*edit))
    sim = ["simulate", "--traces", data / "store", "--policy", "fixed:ngram:3", "--batch-sizes", "1,8"]
    assert needle in error(cli(*sim, "--cost-model", bad))
    # analyze keeps going without the oracle section and says why (no crash, no NaN)
    res = cli("analyze", "--traces", data / "store", "--cost-model", bad, "--json")
    assert res.code == 0 and needle in res.out and "NaN" not in res.out
    res = cli(*sim, "--cost-model", data / "model.toml", "--json")
    assert res.code == 0 and simulate_rows_finite(res.out)


@pytest.mark.parametrize("value", ["-0.001", "nan", "inf"])
def test_switch_overhead_negative_or_nan(data, value):
    res = cli("simulate", "--traces", data / "store", "--policy", "oracle:ngram", "--switch-overhead", value)
    assert "--switch-overhead" in error(res)


# --- 4. numbers must not wrap on storage ------------------------------------------------------------------------
def test_large_acceptance_length_stored_exactly(tmp_path):
    src = tmp_path / "big.jsonl"
    src.write_text(
        json.dumps(
            {
                "id": "a",
                "prompt_token_ids": [1],
                "generated_token_ids": [5, 6],
                "acc_ngram": {"acc_len": [33000, 1]},
            }
        )
        + "\n"
    )
    res = cli(
        "traces", "import", "--format", "specdecode-bench", src, "--k-max", "40000", "--out", tmp_path / "s"
    )
    assert res.code == 0, res.err
    assert cli("traces", "validate", tmp_path / "s").code == 0
    assert read_store(tmp_path / "s")[0].methods["ngram"].acc_len.tolist() == [33000, 1]
    assert SCHEMA.field("methods").type.value_type.field("acc_len").type.value_type.bit_width == 32


@pytest.mark.parametrize(
    "ids, needle",
    [
        ([1, 2**40], "value 1099511627776 at position 1 out of range"),
        ([1, -5], "negative token id -5"),
        ([1, 2**70], "out of range (must fit in 32 bits)"),  # beyond 64 bits: no OverflowError
    ],
)
def test_token_ids_range_checked(tmp_path, ids, needle):
    src = tmp_path / "t.jsonl"
    line = {
        "id": "a",
        "prompt_token_ids": ids,
        "generated_token_ids": [3, 4],
        "acc_ngram": {"acc_len": [2, 1]},
    }
    src.write_text(json.dumps(line) + "\n")
    assert needle in error(
        cli("traces", "import", "--format", "specdecode-bench", src, "--out", tmp_path / "s")
    )
    assert not (tmp_path / "s").exists()
    # the same through speclab's own lossless format
    d = {
        "id": "a",
        "workload": "w",
        "category": "other",
        "prompt_len": 2,
        "output_len": 2,
        "prompt_token_ids": ids,
        "output_token_ids": [3, 4],
        "methods": {"ngram": {"k_max": 4, "acc_len": [2, 1], "num_proposed": None}},
        "meta": {},
    }
    src.write_text(json.dumps(d) + "\n")
    res = cli("traces", "import", "--format", "speclab-jsonl", src, "--out", tmp_path / "s")
    assert "prompt_token_ids" in error(res)


def test_lossless_export_equals_input(data, tmp_path):
    assert cli("traces", "export", data / "store", "--out", tmp_path / "a.jsonl").code == 0
    assert (
        cli(
            "traces", "import", "--format", "speclab-jsonl", tmp_path / "a.jsonl", "--out", tmp_path / "b"
        ).code
        == 0
    )
    assert cli("traces", "export", tmp_path / "b", "--out", tmp_path / "b.jsonl").code == 0
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()


def test_integers_beyond_64_bits_in_speclab_jsonl(tmp_path):
    src = tmp_path / "x.jsonl"
    src.write_text(f'{{"id":"a","prompt_len":{2**70},"output_len":0,"methods":{{}}}}\n')
    assert "prompt_len" in error(
        cli("traces", "import", "--format", "speclab-jsonl", src, "--out", tmp_path / "s")
    )


# --- 5. duplicates ----------------------------------------------------------------------------------------------
def test_speclab_jsonl_duplicates_and_empty(data, tmp_path):
    assert cli("traces", "export", data / "store", "--out", tmp_path / "a.jsonl").code == 0
    dup = tmp_path / "dup.jsonl"
    dup.write_text((tmp_path / "a.jsonl").read_text() * 2)
    assert "duplicate" in error(
        cli("traces", "import", "--format", "speclab-jsonl", dup, "--out", tmp_path / "d")
    )
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert "no records" in error(
        cli("traces", "import", "--format", "speclab-jsonl", empty, "--out", tmp_path / "e")
    )
    assert not (tmp_path / "d").exists() and not (tmp_path / "e").exists()


def test_same_store_twice_is_read_once(data):
    base = ["simulate", "--policy", "oracle:ngram", "--batch-sizes", "4", "--json"]
    once = cli(*base, "--traces", data / "store")
    twice = cli(*base, "--traces", data / "store", "--traces", f"{data / 'store'}/")
    assert once.code == twice.code == 0
    assert json.loads(once.out) == json.loads(twice.out)
    assert "same store" in twice.err


# --- 6. tracebacks -> one line ------------------------------------------------------------------------------------
def test_binary_inputs_one_line(data, tmp_path):
    b = data / "binary.bin"
    for fmt in ("specdecode-bench", "speclab-jsonl"):
        assert "not UTF-8" in error(cli("traces", "import", "--format", fmt, b, "--out", tmp_path / fmt))
    assert "not UTF-8" in error(cli("cost-models", "fit", b, "--out", tmp_path / "m.toml"))
    assert "not UTF-8" in error(
        cli("simulate", "--traces", data / "store", "--policy", "none", "--cost-model", b)
    )
    assert "not UTF-8" in error(
        cli("report", "--traces", data / "store", "--analysis", b, "--out", tmp_path / "r")
    )
    src = tmp_path / "gsm.jsonl"
    src.write_bytes(bytes(range(255, -1, -1)) * 8)  # the first line starts with 0xff: not UTF-8
    res = cli("workloads", "export", "gsm8k", "--source", src, "--out", tmp_path / "w.jsonl", "--limit", "2")
    assert "UTF-8" in error(res)
    bad = tmp_path / "store-bin"
    bad.mkdir()
    (bad / "part-0.parquet").write_bytes(bytes(range(256)))
    assert "cannot read as Parquet" in error(cli("traces", "validate", bad))


def test_huge_batch_size_missing_file_bins(data, tmp_path):
    res = cli(
        "simulate", "--traces", data / "store", "--policy", "oracle:ngram", "--batching", "replicate",
        "--batch-sizes", "10000000000000000000",
    )  # fmt: skip
    assert "out of range" in error(res)
    res = cli(
        "traces", "import", "--format", "speclab-jsonl", tmp_path / "missing.jsonl", "--out", tmp_path / "m"
    )
    assert "missing.jsonl: cannot read (No such file or directory)" in error(res)
    assert "--bins" in error(cli("analyze", "--traces", data / "store", "--bins", "0"))


def test_unwritable_output_and_force_onto_file(data, tmp_path):
    study = data / "study.jsonl"
    # a parent that is a file: unwritable for root too
    res = cli("traces", "import", "--format", "specdecode-bench", study, "--out", data / "plain" / "s")
    assert "cannot write the store here" in error(res)
    res = cli("simulate", "--traces", data / "store", "--policy", "none", "--csv", data / "plain" / "x.csv")
    assert "is a file, not a directory" in error(res)
    res = cli("traces", "import", "--format", "specdecode-bench", study, "--out", data / "plain", "--force")
    assert "is a file, not a store directory" in error(res)
    assert (data / "plain").read_text() == "not a store\n"
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        res = cli("traces", "import", "--format", "specdecode-bench", study, "--out", ro / "s")
        assert "Permission denied" in error(res)


def test_force_refuses_a_directory_that_is_not_a_store(data, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.jsonl").write_text("{}\n")
    res = cli(
        "traces", "import", "--format", "specdecode-bench", data / "study.jsonl", "--out", run, "--force"
    )
    assert "not trace parts (results.jsonl)" in error(res)
    assert (run / "results.jsonl").exists()


# --- 7. policy arguments up front --------------------------------------------------------------------------------
def test_policy_arguments(data):
    sim = ["simulate", "--traces", data / "store", "--batch-sizes", "1,4", "--json"]
    assert "KSTART 9 exceeds KMAX 4" in error(cli(*sim, "--policy", "adaptive-k:ngram:4:9"))
    assert "only up to k_max=20" in error(cli(*sim, "--policy", "fixed:ngram:50"))
    assert "only up to k_max=20" in error(cli(*sim, "--policy", "select-ema:ngram,eagle:21"))
    assert "must be in 1..65536" in error(cli(*sim, "--policy", "fixed:ngram:99999999999999999999"))
    # an adaptive ceiling above the traces' k_max is capped (the same on any data), with a note
    capped = cli(*sim, "--policy", "adaptive-k:ngram:50")
    at20 = cli(*sim, "--policy", "adaptive-k:ngram:20")
    assert capped.code == at20.code == 0 and "KMAX 50 capped at the traces' k_max 20" in capped.err
    strip = [{k: v for k, v in r.items() if k not in ("policy", "notes")} for r in json.loads(capped.out)]
    assert strip == [
        {k: v for k, v in r.items() if k not in ("policy", "notes")} for r in json.loads(at20.out)
    ]


# --- 8. bench options checked before anything is created ---------------------------------------------------------
SWEEP = """
target = "/nonexistent/target"
workloads = ["offline-math"]
batch_sizes = [1]
num_prompts = 2
max_tokens = 8

[[methods]]
name = "ngram"
k = 3
"""


def test_bench_redo_and_cell_timeout_before_any_write(tmp_path):
    sweep = tmp_path / "s.toml"
    sweep.write_text(SWEEP)
    run = tmp_path / "run"
    assert "matches no cell" in error(cli("bench", sweep, "--out", run, "--redo", "nothing.*"))
    assert not run.exists()
    assert "--cell-timeout" in error(cli("bench", sweep, "--out", run, "--cell-timeout", "-1", "--dry-run"))
    # an existing run of another sweep keeps its sweep.toml
    run.mkdir()
    (run / "sweep.toml").write_text(SWEEP.replace("max_tokens = 8", "max_tokens = 9"))
    before = (run / "sweep.toml").read_text()
    assert "different sweep" in error(cli("bench", sweep, "--out", run))
    assert "matches no cell" in error(cli("bench", sweep, "--out", run, "--redo", "x*"))
    assert (run / "sweep.toml").read_text() == before


# --- 9. also ------------------------------------------------------------------------------------------------------
def test_stale_hidden_part_does_not_block_next_import(data, tmp_path):
    store = tmp_path / "s"
    store.mkdir()
    stale = store / ".part-00000.parquet.abc123.tmp"
    stale.write_bytes(b"half a parquet file")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    res = cli("traces", "import", "--format", "specdecode-bench", data / "study.jsonl", "--out", store)
    assert res.code == 0, res.err
    assert len(read_store(store)) == 12 and not stale.exists()


@pytest.mark.parametrize(
    "sizes, needle", [("8,8", "given twice"), ("1,,8", "empty item"), ("0,4", "out of range")]
)
def test_batch_size_lists(data, sizes, needle):
    for cmd in (["simulate", "--policy", "oracle:ngram"], ["analyze"]):
        assert needle in error(cli(*cmd, "--traces", data / "store", "--batch-sizes", sizes))


def test_plot_suffix(data, tmp_path):
    base = ["simulate", "--traces", data / "store", "--policy", "oracle:ngram", "--batch-sizes", "1,4"]
    assert ".png, .svg, .pdf" in error(cli(*base, "--plot", tmp_path / "out.xyz"))
    assert not (tmp_path / "out.xyz").exists()
    assert cli(*base, "--plot", tmp_path / "out.svg").code == 0
    assert (tmp_path / "out.svg").read_text().lstrip().startswith("<?xml")


# --- the boundary itself ------------------------------------------------------------------------------------------
def test_usage_errors_and_unexpected_errors_are_one_line(data, monkeypatch):
    assert "No such option" in error(cli("simulate", "--bogus"))
    import speclab.simulate

    def boom(*a, **k):
        raise RuntimeError("a bug")

    monkeypatch.setattr(speclab.simulate, "simulate", boom)
    args = ("simulate", "--traces", data / "store", "--policy", "none")
    line = error(cli(*args), code=1)
    assert "internal error: RuntimeError: a bug" in line and "--debug" in line and "SPECLAB_DEBUG=1" in line
    monkeypatch.delenv("SPECLAB_DEBUG", raising=False)
    res = cli("--debug", *args)
    assert (
        res.code == 1 and "Traceback" in res.err and res.err_lines[-1].startswith("speclab: error: internal")
    )
    assert study_line("x", 2)  # importable (used by the kill tests too)


def test_wrong_contents_in_a_parquet_part_and_run_dir_as_store(data, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "weird"
    bad.mkdir()
    cols = {n: pa.array([None], pa.string()) for n in SCHEMA.names}
    cols["id"] = pa.array(["a"])
    cols["prompt_len"] = pa.array([None], pa.int32())  # right name, no value
    pq.write_table(pa.table(cols), bad / "part-1.parquet")
    assert "not a valid speclab trace part" in error(cli("traces", "validate", bad))
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    assert "its store is" in error(cli("simulate", "--traces", run, "--policy", "none"))


def test_replay_k_max_bounded(tmp_path):
    res = cli(
        "trace", "--from", tmp_path, "--methods", "ngram", "--k-max", "100000000000", "--out", tmp_path / "x"
    )
    assert "--k-max must be in 1..65536" in error(res)


def test_special_files_are_written_through_not_replaced(data):
    import stat

    res = cli("traces", "export", data / "store", "--out", os.devnull)
    assert res.code == 0, res.err
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)  # still the device, not a file renamed onto it


def test_fit_refuses_absurd_timings(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text(
        "kind,kv_tokens,batched_tokens,num_spec_tokens,num_requests,seconds\n"
        + "".join(f"target,1e308,{i},0,1,1e308\n" for i in range(1, 5))
    )
    assert "0..1e+12" in error(cli("cost-models", "fit", csv, "--out", tmp_path / "m.toml"))
    assert not (tmp_path / "m.toml").exists()


def test_no_command_prints_the_help():
    for argv in ((), ("traces",)):
        res = cli(*argv)
        assert res.code == 2 and res.err.startswith("Usage: ") and "speclab: error" not in res.err


def test_bench_temperatures_override(tmp_path):
    sweep = tmp_path / "s.toml"
    sweep.write_text(SWEEP.replace('"/nonexistent/target"', '"smollm2-135m"'))
    res = cli("bench", sweep, "--out", tmp_path / "run", "--temperatures", "0,0.7", "--dry-run")
    assert res.code == 0, (res.out, res.err)
    assert "4 cells on 2 engines" in res.out and ".b1.t0.7." in res.out
    assert "need numbers" in error(cli("bench", sweep, "--temperatures", "0,hot", "--dry-run"))
    assert "out of range" in error(cli("bench", sweep, "--temperatures", "-1", "--dry-run"))
    assert not (tmp_path / "run").exists()
