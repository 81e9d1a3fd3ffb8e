"""Property-based tests (hypothesis) for each class of defence: output paths, input streams, numbers and
nesting; and two writers racing for one new store.

The property: exit 0 with the right result, or exit 2 with one `speclab: error:` line; never a traceback,
and a refused command leaves every file as it was. CI runs few derandomized examples per test; the longer
local run (docs/dev/errors.md):
    SPECLAB_FUZZ_EXAMPLES=500 pytest -q tests/test_reliab_props.py
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("hypothesis", reason="the property tests need hypothesis: pip install -e '.[dev]'")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from reliab_helpers import cli, cli_subprocess, tree, write_study  # tests/ is on sys.path
from speclab.traces import read_store

_LONG = "SPECLAB_FUZZ_EXAMPLES" in os.environ
_N = int(os.environ.get("SPECLAB_FUZZ_EXAMPLES", "15"))


def fuzz(n: int = _N) -> settings:
    """n examples in CI (fewer for the tests that start processes); SPECLAB_FUZZ_EXAMPLES for all of them."""
    return settings(
        max_examples=_N if _LONG else n,
        deadline=None,
        database=None,
        derandomize=not _LONG,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def one_line_or_ok(res) -> None:
    assert res.code in (0, 2), (res.code, res.err)
    if res.code == 2:
        res.error_line()


def _simulate_csv(store: Path, out: Path) -> tuple:
    """A simulate run of one small policy that writes its rows to `out` as CSV."""
    return ("simulate", "--traces", store, "--cost-model", "llama3.1-8b-h100", "--policy", "fixed:ngram:3",
            "--batch-sizes", "1", "--csv", out)  # fmt: skip


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("props")
    write_study(d / "study.jsonl", [f"r{i}" for i in range(4)])
    assert (
        cli(
            "traces", "import", "--format", "specdecode-bench", d / "study.jsonl", "--out", d / "s.parquet"
        ).code
        == 0
    )
    return d


# --- paths -----------------------------------------------------------------------------------------------------
HIDDEN = st.lists(st.from_regex(r"\.[a-z]{1,6}", fullmatch=True), min_size=1, max_size=3, unique=True)


@fuzz()
@given(hidden=HIDDEN, as_dir=st.lists(st.booleans(), min_size=3, max_size=3), force=st.booleans())
def test_a_directory_that_is_not_a_store_is_never_replaced(base, hidden, as_dir, force):
    with tempfile.TemporaryDirectory(dir=base) as t:
        d = Path(t) / "out"
        d.mkdir()
        for name, is_dir in zip(hidden, as_dir, strict=False):
            (d / name).mkdir() if is_dir else (d / name).write_text(name)
        before = tree(Path(t))
        res = cli("traces", "import", "--format", "specdecode-bench", base / "study.jsonl", "--out", d,
                  *(["--force"] if force else []))  # fmt: skip
        assert res.code == 2 and "not trace parts" in res.error_line()
        assert tree(Path(t)) == before


# how the output can point at an input: the same path, a symlink to it, a hard link, a relative detour
ALIASES = st.sampled_from(["same", "symlink", "hardlink", "detour"])
COMMANDS = st.sampled_from(["export", "fit", "csv", "import-parquet"])


@fuzz()
@given(alias=ALIASES, command=COMMANDS, force=st.booleans())
def test_an_output_that_is_an_input_is_refused(base, alias, command, force):
    with tempfile.TemporaryDirectory(dir=base) as t:
        t = Path(t)
        src = {"export": "s.parquet", "fit": "t.csv", "csv": "s.parquet", "import-parquet": "study.jsonl"}[
            command
        ]
        inp = t / src
        inp.write_bytes((base / src).read_bytes() if (base / src).exists() else b"kind,batch\n")
        out = {
            "same": inp,
            "symlink": t / ("link" + inp.suffix),
            "hardlink": t / ("hard" + inp.suffix),
            "detour": t / "sub" / ".." / inp.name,
        }[alias]
        (t / "sub").mkdir()
        if alias == "symlink":
            out.symlink_to(inp.name)
        elif alias == "hardlink":
            os.link(inp, out)
        argv = {
            "export": ("traces", "export", inp, "--out", out),
            "fit": ("cost-models", "fit", inp, "--out", out),
            "csv": _simulate_csv(inp, out),
            "import-parquet": ("traces", "import", "--format", "specdecode-bench", inp, "--out", out),
        }[command]
        before = tree(t)
        res = cli(*argv, *(["--force"] if force else []))
        assert res.code == 2 and "input" in res.error_line(), res.err
        assert tree(t) == before


@fuzz(6)
@given(
    where=st.sampled_from(["parent-is-file", "read-only-fs"]),
    what=st.sampled_from(["csv", "export", "store"]),
)
def test_an_unwritable_output_is_refused_before_any_work(base, where, what):
    if where == "read-only-fs":
        probe = Path("/proc/self/speclab-probe")  # read-only for root too
        out = probe / "out.csv"
    else:
        (base / "plain").write_text("x")
        out = base / "plain" / "out.csv"
    argv = {
        "csv": _simulate_csv(base / "s.parquet", out),
        "export": ("traces", "export", base / "s.parquet", "--out", out),
        "store": (
            "traces",
            "import",
            "--format",
            "specdecode-bench",
            base / "study.jsonl",
            "--out",
            out.with_suffix(""),
        ),
    }[what]
    res = cli(*argv)
    assert res.code == 2
    line = res.error_line()
    assert str(out.parent) in line and ".tmp" not in line


# --- streams ---------------------------------------------------------------------------------------------------
@fuzz(4)
@given(n=st.integers(1, 3000), gz=st.booleans(), via=st.sampled_from(["stdin", "fifo"]))
def test_a_stream_is_read_once_from_its_first_byte(tmp_path_factory, n, gz, via):
    import gzip

    rows = "".join(json.dumps({"prompt": f"q{i} " + "y" * (i % 90)}) + "\n" for i in range(n)).encode()
    data = gzip.compress(rows) if gz else rows
    if via == "stdin":
        p = cli_subprocess("workloads", "inspect", "/dev/stdin", "--json", stdin=subprocess.PIPE, text=False)
        out, err = p.communicate(data, timeout=120)
    else:
        fifo = tmp_path_factory.mktemp("fifo") / "f"
        os.mkfifo(fifo)
        p = cli_subprocess("workloads", "inspect", fifo, "--json", text=False)
        time.sleep(0.2)
        with open(fifo, "wb") as w:
            w.write(data)
        out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert json.loads(out)["requests"] == n


# --- numbers ---------------------------------------------------------------------------------------------------
WILD_NUMBER = st.one_of(
    st.integers(-(10**400), 10**400),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 10**23]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1.8e308, -1.8e308, 1e-320]),
)
FIELDS = st.sampled_from(["max_tokens", "max_completion_tokens", "timestamp", "created", "temperature", "id"])


@fuzz()
@given(rows=st.lists(st.tuples(FIELDS, WILD_NUMBER), min_size=1, max_size=4))
def test_any_number_in_a_prompts_file_is_used_or_refused_in_one_line(base, rows):
    with tempfile.TemporaryDirectory(dir=base) as t:
        f = Path(t) / "p.jsonl"
        lines = []
        for i, (field, value) in enumerate(rows):
            text = json.dumps({"prompt": f"p{i}", field: value}) if not isinstance(value, float) or math.isfinite(value) else (
                f'{{"prompt": "p{i}", "{field}": {"NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")}}}'
            )  # fmt: skip
            lines.append(text)
        f.write_text("\n".join(lines) + "\n")
        res = cli("workloads", "inspect", f, "--json")
        one_line_or_ok(res)
        if res.code == 0:
            json.loads(res.out, parse_constant=lambda c: pytest.fail(f"{c} in --json output"))


SWEEP_NUMBERS = st.sampled_from(
    [
        "k",
        "batch_sizes",
        "kv_cache_gib",
        "max_tokens",
        "num_prompts",
        "seed",
        "max_model_len",
        "prompt_lookup_min",
    ]
)


@fuzz()
@given(key=SWEEP_NUMBERS, value=WILD_NUMBER)
def test_any_number_in_a_sweep_is_checked_by_the_dry_run(base, key, value):
    if isinstance(value, float) and not math.isfinite(value):
        v = "nan" if value != value else ("inf" if value > 0 else "-inf")
    else:
        v = repr(value) if isinstance(value, float) else str(value)
    lines = {"top": "", "engine": "", "method": ""}
    where = {
        "k": "method",
        "prompt_lookup_min": "method",
        "kv_cache_gib": "engine",
        "max_model_len": "engine",
    }
    lines[where.get(key, "top")] = f"{key} = [{v}]\n" if key == "batch_sizes" else f"{key} = {v}\n"
    text = (
        'target = "smollm2-135m"\nworkloads = ["offline-math"]\n'
        + ("" if key == "batch_sizes" else "batch_sizes = [1]\n")
        + lines["top"]
        + "[engine]\n" + lines["engine"]
        + '[[methods]]\nname = "ngram"\n' + ("" if key == "k" else "k = 3\n") + lines["method"]
    )  # fmt: skip
    with tempfile.TemporaryDirectory(dir=base) as t:
        (Path(t) / "s.toml").write_text(text)
        from speclab.bench.spec import load_sweep
        from speclab.errors import SpeclabError

        try:
            spec = load_sweep(Path(t) / "s.toml")
        except SpeclabError as exc:
            assert "\n" not in str(exc)
            return
        # accepted: every number the engine will see is in range
        assert all(1 <= b <= 1 << 20 for b in spec.batch_sizes)
        assert all(m.k is None or 1 <= m.k < spec.max_model_len for m in spec.methods)
        assert math.isfinite(spec.kv_cache_gib) and spec.kv_cache_gib > 0


# --- nesting ---------------------------------------------------------------------------------------------------
@fuzz()
@given(depth=st.integers(1, 20_000), kind=st.sampled_from(["jsonl", "json", "trace", "sweep", "cost"]),
       brackets=st.sampled_from(["[]", "{}"]))  # fmt: skip
def test_any_nesting_depth_is_read_or_refused_in_one_line(base, depth, kind, brackets):
    o, c = brackets
    if kind in ("sweep", "cost"):
        inner = ("[" * depth + "]" * depth) if o == "[" else ("{a = " * depth + "1" + "}" * depth)
    else:
        inner = ("[" * depth + "]" * depth) if o == "[" else ('{"a": ' * depth + "1" + "}" * depth)
    with tempfile.TemporaryDirectory(dir=base) as t:
        t = Path(t)
        if kind == "jsonl":
            (t / "p.jsonl").write_text(f'{{"prompt": "x", "reference": "r", "meta": {inner}}}\n')
            argv = ("workloads", "inspect", t / "p.jsonl")
        elif kind == "json":
            (t / "p.json").write_text(f'[{{"prompt": "x", "extra": {inner}}}]')
            argv = ("workloads", "inspect", t / "p.json")
        elif kind == "trace":
            (t / "t.jsonl").write_text(f'{{"id": "a", "prompt_len": 0, "output_len": 0, "meta": {inner}}}\n')
            argv = ("traces", "import", "--format", "speclab-jsonl", t / "t.jsonl", "--out", t / "s")
        elif kind == "sweep":
            (t / "s.toml").write_text(
                f'target = "x"\nworkloads = ["offline-math"]\nbatch_sizes = [1]\nz = {inner}\n'
            )
            argv = ("bench", "run", t / "s.toml", "--dry-run", "--out", t / "run")
        else:
            (t / "c.toml").write_text(f"[target]\nkv = {inner}\n")
            argv = (
                "simulate",
                "--traces",
                base / "s.parquet",
                "--cost-model",
                t / "c.toml",
                "--policy",
                "fixed:ngram:3",
            )
        res = cli(*argv)
        assert res.code == 2 or (res.code == 0 and kind in ("jsonl", "json", "trace")), res.err
        if res.code == 2:
            res.error_line()


# --- two writers at once ---------------------------------------------------------------------------------------
def test_two_imports_into_one_new_store_at_once(tmp_path):
    """Both start together: one writes the store, the other waits for the lock and then refuses, saying that
    another writer created the store; the store holds every record of the winner, none is lost silently."""
    ids = {"a": [f"a{i}" for i in range(400)], "b": [f"b{i}" for i in range(400)]}
    for k, v in ids.items():
        write_study(tmp_path / f"{k}.jsonl", v)
    store = tmp_path / "store"
    procs = {
        k: cli_subprocess(
            "traces", "import", "--format", "specdecode-bench", tmp_path / f"{k}.jsonl", "--out", store
        )
        for k in ids
    }
    results = {k: p.communicate(timeout=120) + (p.returncode,) for k, p in procs.items()}
    winners = [k for k, r in results.items() if r[2] == 0]
    losers = [k for k, r in results.items() if r[2] != 0]
    assert len(winners) == 1 and len(losers) == 1, results
    out, err, code = results[losers[0]]
    # the loser says which store and why: found it there before starting, or another writer created it while
    # this one waited for the lock
    assert code == 2 and err.count("speclab: error:") == 1 and f"{store}: store exists" in err, err
    assert sorted(r.id for r in read_store(store)) == sorted(ids[winners[0]])
