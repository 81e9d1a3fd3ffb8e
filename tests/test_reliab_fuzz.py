"""Property-based tests (hypothesis) over the importers, the cost-model loader and the policy parser.

The property everywhere: the CLI ends with exit 0 and finite figures, or with exit 2 and one
`speclab: error:` line -- never a traceback (exit 1), never a NaN, never a store that does not read back.

CI runs few examples, derandomized; a longer local run (see docs/dev/errors.md):
    SPECLAB_FUZZ_EXAMPLES=2000 pytest -q tests/test_reliab_fuzz.py
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("hypothesis", reason="the fuzz tests need hypothesis: pip install -e '.[dev]'")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from reliab_helpers import cli, simulate_rows_finite  # tests/ is on sys.path
from speclab.costmodel import CostModel
from speclab.errors import SpeclabError
from speclab.policy.core import make_policy
from speclab.simulate import simulate
from speclab.traces import MethodTrace, RequestTrace

_LONG = "SPECLAB_FUZZ_EXAMPLES" in os.environ
FUZZ = settings(
    max_examples=int(os.environ.get("SPECLAB_FUZZ_EXAMPLES", "25")),
    deadline=None,
    database=None,
    derandomize=not _LONG,  # CI: the same examples every run
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- shared strategies ------------------------------------------------------------------------------------------
WILD_INT = st.one_of(
    st.integers(-3, 40),
    st.integers(-(2**80), 2**80),
    st.sampled_from([2**31 - 1, 2**31, 2**63, -(2**63) - 1]),
)
WILD_SCALAR = st.one_of(
    st.none(), st.booleans(), WILD_INT, st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4)
)
JSON = st.recursive(
    WILD_SCALAR,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
    max_leaves=8,
)
SMALL_IDS = st.lists(st.integers(0, 50), max_size=10)
INT_LIST = st.one_of(SMALL_IDS, SMALL_IDS, st.lists(WILD_INT, max_size=6), JSON)


def finish(res, store: Path | None = None) -> None:
    """The property: exit 0 (then the store validates and simulates to finite figures) or one error line."""
    assert res.code in (0, 2), (res.code, res.err)
    if res.code == 2:
        res.error_line()
        return
    assert "Traceback" not in res.err
    if store is None:
        return
    val = cli("traces", "validate", store)
    assert val.code == 0, val.err
    sim = cli("simulate", "--traces", store, "--policy", "none", "--batch-sizes", "1,3", "--json")
    assert sim.code in (0, 2), sim.err
    if sim.code == 0:
        assert simulate_rows_finite(sim.out), sim.out
    else:
        sim.error_line()


def file_with(lines: list[str | bytes]) -> bytes:
    return b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines)


# --- the study's importer ---------------------------------------------------------------------------------------
STUDY_RECORD = st.fixed_dictionaries(
    {
        "id": st.one_of(st.text(min_size=1, max_size=3), st.integers(0, 5), WILD_SCALAR),
        "prompt_token_ids": INT_LIST,
        "generated_token_ids": INT_LIST,
        "acc_ngram": st.one_of(st.fixed_dictionaries({"acc_len": INT_LIST}), JSON),
    },
    optional={"acc_eagle": st.fixed_dictionaries({"acc_len": INT_LIST}), "acc_x-y": JSON, "extra": JSON},
)
LINE = st.one_of(
    STUDY_RECORD.map(json.dumps), STUDY_RECORD.map(json.dumps), st.binary(max_size=20), JSON.map(json.dumps)
)


@FUZZ
@given(lines=st.lists(LINE, max_size=5), k_max=st.integers(-2, 70000), lenient=st.booleans())
def test_fuzz_specdecode_bench_import(lines, k_max, lenient):
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "study.jsonl"
        src.write_bytes(file_with(lines))
        args = [
            "traces",
            "import",
            "--format",
            "specdecode-bench",
            src,
            "--out",
            Path(d) / "s",
            "--k-max",
            k_max,
        ]
        res = cli(*args, *(["--lenient-lengths"] if lenient else []))
        finish(res, Path(d) / "s")


# --- speclab's own lossless JSONL -------------------------------------------------------------------------------
@st.composite
def speclab_record(draw) -> dict:
    n = draw(st.integers(0, 6))
    k = draw(st.integers(1, 5))
    acc = draw(st.lists(st.integers(1, k + 1), min_size=n, max_size=n))
    d = {
        "id": draw(st.text(min_size=1, max_size=4)),
        "workload": draw(st.text(max_size=4)),
        "category": draw(st.sampled_from(["math", "chat", "other", "bogus"])),
        "prompt_len": 2,
        "output_len": n,
        "prompt_token_ids": [5, 6],
        "output_token_ids": draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n)),
        "methods": {"ngram": {"k_max": k, "acc_len": acc, "num_proposed": None}},
        "meta": draw(st.dictionaries(st.text(max_size=3), st.integers() | st.text(max_size=3), max_size=2)),
    }
    # then break it, sometimes: any field gets any JSON value
    for _ in range(draw(st.integers(0, 2))):
        key = draw(
            st.sampled_from(
                [*d, "methods.ngram.k_max", "methods.ngram.acc_len", "methods.ngram.num_proposed"]
            )
        )
        value = draw(JSON)
        if key.startswith("methods."):
            if isinstance(d["methods"], dict) and isinstance(d["methods"].get("ngram"), dict):
                d["methods"]["ngram"][key.split(".")[-1]] = value
        else:
            d[key] = value
    return d


@FUZZ
@given(recs=st.lists(speclab_record(), max_size=4), junk=st.lists(st.binary(max_size=12), max_size=1))
def test_fuzz_speclab_jsonl_import_roundtrip(recs, junk):
    with tempfile.TemporaryDirectory() as d:
        src, store = Path(d) / "in.jsonl", Path(d) / "s"
        src.write_bytes(file_with([json.dumps(r) for r in recs] + junk))
        res = cli("traces", "import", "--format", "speclab-jsonl", src, "--out", store)
        finish(res, store)
        if res.code == 0:  # lossless: export, import again, export again: the same text
            assert cli("traces", "export", store, "--out", Path(d) / "a.jsonl").code == 0
            again = cli(
                "traces", "import", "--format", "speclab-jsonl", Path(d) / "a.jsonl", "--out", Path(d) / "t"
            )
            assert again.code == 0, again.err
            assert cli("traces", "export", Path(d) / "t", "--out", Path(d) / "b.jsonl").code == 0
            assert (Path(d) / "a.jsonl").read_text() == (Path(d) / "b.jsonl").read_text()


# --- cost models ------------------------------------------------------------------------------------------------
NUMBER = st.one_of(
    st.floats(0, 1e-2),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-5, 5),
    st.text(max_size=3),
    st.booleans(),
)
SECTIONS = {
    "target": ["kv", "batched", "const", "cosnt"],
    "overhead": ["per_step", "switch", "extra"],
    "draft.ngram": ["form", "fraction", "kv"],
    "draft.eagle": ["form", "kv", "num_spec", "const", "fraction"],
}


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    if isinstance(v, int):
        return str(v)
    return json.dumps(str(v))  # a TOML basic string


@st.composite
def cost_model_toml(draw) -> str:
    out = []
    if draw(st.booleans()):
        out.append(f"name = {toml_value(draw(st.text(max_size=4)))}")
    for sec, keys in SECTIONS.items():
        if draw(st.integers(0, 9)) == 0:
            continue  # a missing section
        out.append(f"[{sec}]")
        for key in keys:
            if key == "form":
                form = draw(st.sampled_from(["linear", "chained", "verify_fraction", "cubic"]))
                out.append(f'form = "{form}"')
            elif draw(st.integers(0, 3)):
                out.append(f"{key} = {toml_value(draw(NUMBER))}")
    return "\n".join(out) + "\n"


def _traces() -> list[RequestTrace]:
    rng = np.random.default_rng(0)
    return [
        RequestTrace(
            id=f"r{i}",
            workload="w",
            category="other",
            prompt_len=8,
            output_len=12,
            methods={
                "ngram": MethodTrace(k_max=6, acc_len=rng.integers(1, 8, 12)),
                "eagle": MethodTrace(k_max=6, acc_len=rng.integers(1, 5, 12)),
            },
        )
        for i in range(6)
    ]


TRACES = _traces()


@FUZZ
@given(text=st.one_of(cost_model_toml(), cost_model_toml(), st.text(max_size=30)))
def test_fuzz_cost_model_loader(text):
    try:
        cm = CostModel.from_toml(text, "fuzz.toml")
    except SpeclabError as exc:
        assert "\n" not in str(exc)
        return
    kv, bt = np.array([0.0, 1.0, 5e5]), np.array([1.0, 64.0, 4096.0])
    t = cm.target_time(kv, bt)
    assert np.isfinite(t).all() and (t > 0).all()
    pols = ["none", "fixed:ngram:3", "oracle:eagle", "oracle-combine:ngram,eagle"]
    try:
        res = simulate(TRACES, cm, pols, "continuous", [1, 4])
    except SpeclabError as exc:  # e.g. no drafting cost for a method: one line
        assert "\n" not in str(exc)
        return
    for r in res:
        assert math.isfinite(r.speedup) and r.speedup > 0 and math.isfinite(r.throughput_tok_s)
        assert all(math.isfinite(v) and v >= 0 for v in r.time_split_s.values())


@FUZZ
@given(text=cost_model_toml())
def test_fuzz_cost_model_through_cli(text):
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "m.toml"
        f.write_text(text)
        traces = Path(d) / "s"
        from speclab.traces import write_store

        write_store(traces, TRACES)
        res = cli(
            "simulate",
            "--traces",
            traces,
            "--cost-model",
            f,
            "--policy",
            "oracle:ngram",
            "--batch-sizes",
            "1,4",
            "--json",
        )
        finish(res)
        if res.code == 0:
            assert simulate_rows_finite(res.out), res.out


# --- policy strings ---------------------------------------------------------------------------------------------
TOKENS = ["none", "fixed", "oracle", "oracle-combine", "adaptive-k", "select-ema", "ngram", "eagle", "suffix",
          "custom", "x", "0", "1", "3", "6", "7", "50", "-1", "99999999999999999999", "1e3", "", " "]  # fmt: skip
POLICY = st.lists(
    st.tuples(st.sampled_from(TOKENS), st.sampled_from([":", ",", ""])), min_size=1, max_size=6
).map(lambda parts: "".join(a + b for a, b in parts))


@FUZZ
@given(
    spec=st.one_of(POLICY, POLICY, st.text(max_size=12)),
    batching=st.sampled_from(["continuous", "replicate"]),
)
def test_fuzz_policy_parser(spec, batching):
    try:
        make_policy(spec)
    except SpeclabError as exc:
        assert "\n" not in str(exc)
        return
    try:
        res = simulate(TRACES, "llama3.1-8b-h100", [spec], batching, [1, 3])
    except SpeclabError as exc:  # e.g. K above the traces' k_max, a method the traces lack
        assert "\n" not in str(exc)
        return
    for r in res:
        assert math.isfinite(r.speedup) and r.speedup > 0
        assert all(math.isfinite(v) and v >= 0 for v in r.time_split_s.values())


# --- the timings CSV behind `cost-models fit` -------------------------------------------------------------------
CSV_CELL = st.one_of(
    st.integers(0, 5000).map(str), st.floats(0, 1e-2).map(repr), WILD_SCALAR.map(str), st.just("")
)
CSV_ROW = st.tuples(
    st.sampled_from(["target", "target", "overhead", "draft:ngram", "draft:eagle", "draft:", "x"]),
    *[CSV_CELL] * 5,
).map(",".join)


@FUZZ
@given(rows=st.lists(CSV_ROW, max_size=12), form=st.sampled_from(["linear", "chained"]))
def test_fuzz_cost_model_fit(rows, form):
    with tempfile.TemporaryDirectory() as d:
        csv = Path(d) / "t.csv"
        csv.write_text(
            "kind,kv_tokens,batched_tokens,num_spec_tokens,num_requests,seconds\n" + "\n".join(rows)
        )
        res = cli("cost-models", "fit", csv, "--out", Path(d) / "m.toml", "--draft-form", form)
        finish(res)
        if res.code == 0:  # what fit wrote loads back and simulates to finite figures
            CostModel.from_toml((Path(d) / "m.toml").read_text(), "m.toml")
            assert "nan" not in res.out.lower()
