"""Sampling as a cell axis of the bench: sweep keys, cell ids, per-request seeds, rows and the as-logged mode
(fake engine worker; no vLLM)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from speclab.bench import preflight as preflight_mod
from speclab.bench.api import default_prompt_provider, load_sweep_source, run_bench
from speclab.bench.cells import expand_cells
from speclab.bench.preflight import PromptSet
from speclab.bench.runner import run_sweep
from speclab.bench.sampling import Setting, cell_prompts, request_sampling, request_seed
from speclab.bench.show import format_run, format_table, load_rows
from speclab.bench.spec import list_presets, load_preset, parse_sweep_text
from speclab.engine.protocol import PromptSpec
from speclab.errors import ConfigError
from speclab.server.cells import expand_server_cells
from speclab.server.loadgen import read_prompts, request_overrides, write_prompts
from speclab.traces import read_store
from test_bench_runner import FAKE_WORKER, fake_prompts  # tests/ is on sys.path
from test_workloads_files import CharTokenizer, write_lines

BASE = """
name = "s"
target = "fake-target"
workloads = ["offline-code-edit"]
batch_sizes = [1, 4]
batching = ["continuous", "replicate"]
num_prompts = 3
max_tokens = 16
seed = 42
{extra}

[[methods]]
name = "none"

[[methods]]
name = "ngram"
k = 3
"""


def sweep(extra: str = ""):
    return parse_sweep_text(BASE.format(extra=extra), "s.toml")


def ids(extra: str = "") -> list[str]:
    return [c.cell_id for c in expand_cells(sweep(extra))]


# --- parsing ---------------------------------------------------------------------------------------------


def test_defaults_are_greedy_and_keys_parse():
    s = sweep()
    assert (s.temperatures, s.top_p, s.top_k, s.sampling) == ([0.0], 1.0, 0, "fixed")
    s = sweep('temperatures = [0, 0.7, 1]\ntop_p = 0.9\ntop_k = 50\nsampling = "fixed"')
    assert (s.temperatures, s.top_p, s.top_k) == ([0.0, 0.7, 1.0], 0.9, 50)
    assert s.to_dict()["temperatures"] == [0.0, 0.7, 1.0]


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("temperatures = [-0.5]", "temperatures"),
        ("temperatures = []", "temperatures"),
        ('temperatures = ["hot"]', "temperatures"),
        ("temperatures = [0.7, 0.7]", "temperatures"),
        ("temperatures = [true]", "temperatures"),
        ("top_p = 0", "top_p"),
        ("top_p = 1.5", "top_p"),
        ("top_k = -1", "top_k"),
        ("top_k = 2.5", "top_k"),
        ('sampling = "nucleus"', "sampling"),
        ('sampling = "as-logged"', "sampling"),  # offline-code-edit is not a request log
    ],
)
def test_bad_sampling_keys_are_one_error_naming_the_key(extra: str, key: str):
    with pytest.raises(ConfigError) as err:
        sweep(extra)
    msg = str(err.value)
    assert "\n" not in msg and f"field {key}" in msg, msg


def test_as_logged_takes_no_temperatures(tmp_path: Path):
    log = write_lines(tmp_path / "log.jsonl", [{"prompt": "hi", "temperature": 0.5}])
    text = BASE.format(extra='sampling = "as-logged"\ntemperatures = [0.7]').replace(
        '["offline-code-edit"]', f'["file:{log}"]'
    )
    with pytest.raises(ConfigError, match="field sampling: .*give no temperatures"):
        parse_sweep_text(text, "s.toml")


# --- cell ids --------------------------------------------------------------------------------------------


def test_greedy_cell_ids_are_unchanged_by_the_sampling_keys():
    plain = ids()
    assert ids("temperatures = [0]") == plain
    assert ids('temperatures = [0.0]\ntop_p = 1.0\ntop_k = 0\nsampling = "fixed"') == plain
    both = ids("temperatures = [0, 0.7]")
    assert set(plain) < set(both) and len(both) == 2 * len(plain)
    hot = [c for c in both if c not in plain]
    assert all(".t0.7." in c for c in hot)
    # the hash differs too, and every temperature is its own cell
    assert {c.rsplit(".", 1)[1] for c in hot}.isdisjoint({c.rsplit(".", 1)[1] for c in plain})
    assert set(ids("temperatures = [1.0]")).isdisjoint(plain) and set(ids("temperatures = [1.0]")) != set(hot)
    assert set(ids("temperatures = [0.7]\ntop_p = 0.9")).isdisjoint(hot)
    # at T = 0 top_p and top_k change nothing: the greedy cells, with their ids
    assert set(plain) < set(ids("temperatures = [0, 0.7]\ntop_p = 0.9\ntop_k = 20"))


def test_server_cells_follow_the_same_rule():
    srv = "\n[server]\nconcurrency = [1, 2]\n"
    spec = parse_sweep_text(BASE.format(extra="") + srv, "s.toml")
    plain = [c.cell_id for c in expand_server_cells(spec)]
    spec2 = parse_sweep_text(BASE.format(extra="temperatures = [0, 0.7]") + srv, "s.toml")
    cells = expand_server_cells(spec2)
    assert set(plain) < {c.cell_id for c in cells} and len(cells) == 2 * len(plain)
    for c in cells:
        base = [b for b in cells if b.is_baseline and b.baseline_key == c.baseline_key]
        assert len(base) == 1 and base[0].setting == c.setting


def test_each_sd_cell_matches_the_baseline_at_its_own_temperature():
    cells = expand_cells(sweep("temperatures = [0, 0.7, 1.0]"))
    for c in cells:
        base = [b for b in cells if b.is_baseline and b.baseline_key == c.baseline_key]
        assert len(base) == 1
        assert base[0].setting == c.setting and base[0].batch_size == c.batch_size
    assert {c.setting.temperature for c in cells} == {0.0, 0.7, 1.0}


# --- seeds -----------------------------------------------------------------------------------------------


def test_seeds_are_stable_per_prompt_and_the_same_for_sd_and_baseline():
    assert request_seed(42, "p1") == request_seed(42, "p1")
    assert len({request_seed(42, f"p{i}") for i in range(50)}) == 50
    assert request_seed(42, "p1") != request_seed(43, "p1")
    assert 0 <= request_seed(7, "x") < 2**31 - 2**16
    cells = expand_cells(sweep("temperatures = [0, 0.7]"))
    ps = fake_prompts("offline-code-edit")
    for c in cells:
        base = next(b for b in cells if b.is_baseline and b.baseline_key == c.baseline_key)
        mine, _ = cell_prompts(c.setting, c.seed, ps, 2048)
        theirs, _ = cell_prompts(base.setting, base.seed, ps, 2048)
        assert [p.sampling for p in mine] == [p.sampling for p in theirs]
        if c.setting.temperature == 0:
            assert all(p.sampling is None for p in mine)  # greedy cells send what they always sent
        else:
            assert [p.sampling["seed"] for p in mine] == [request_seed(42, p.id) for p in ps.prompts]
            assert all(p.sampling["temperature"] == 0.7 for p in mine)


def test_as_logged_request_settings():
    st = Setting(sampling="as-logged", temperature=None)
    s, own = request_sampling(
        st, 1, "a", {"temperature": 0.3, "top_p": 0.8, "top_k": 5, "max_tokens": 9}, 100
    )
    assert own and s == {
        "temperature": 0.3,
        "top_p": 0.8,
        "top_k": 5,
        "seed": request_seed(1, "a"),
        "max_tokens": 9,
    }
    s, own = request_sampling(st, 1, "b", {}, 100)  # nothing logged: the API defaults
    assert not own and s is not None and s["temperature"] == 1.0 and "max_tokens" not in s
    s, own = request_sampling(st, 1, "c", {"max_tokens": 500}, 100)  # cut to the model length left
    assert not own and s is not None and s["max_tokens"] == 100


# --- the runner (fake worker) ----------------------------------------------------------------------------


@pytest.fixture
def fake_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import sys

    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    monkeypatch.setenv("SPECLAB_WORKER_CMD", f"{sys.executable} {script}")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "worker.log"))
    monkeypatch.setitem(preflight_mod._TOKENIZERS, "fake-target", CharTokenizer())
    return tmp_path


def jobs(run: Path) -> dict[str, dict]:
    """cell id -> its cell in the engines' job files."""
    out = {}
    for f in run.glob("engines/*/attempt-*/job.json"):
        for c in json.loads(f.read_text())["cells"]:
            out[c["cell_id"]] = c
    return out


def test_sampled_rows_fields_seeds_and_no_token_exactness(tmp_path: Path, fake_env: Path, monkeypatch):
    monkeypatch.setenv("FAKE_LOSSY_METHOD", "ngram")  # SD outputs differ from no SD everywhere
    spec = sweep("temperatures = [0, 0.7]")
    run = tmp_path / "run"
    out = run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.05)
    assert out.failed == 0 and out.ok == 16
    rows = load_rows(run)
    by_id = {r["cell_id"]: r for r in rows}
    for r in rows:
        assert r["sampling"] == "fixed" and r["top_p"] == 1.0 and r["top_k"] == 0
        assert r["requests_own_settings"] is None and "distribution_check" not in r
        if r["method"] == "none":
            continue
        base = by_id[r["baseline_cell_id"]]
        assert base["method"] == "none" and base["temperature"] == r["temperature"]
        assert base["batching"] == r["batching"] and base["batch_size"] == r["batch_size"]
        if r["temperature"] == 0:
            assert r["lossless"] is False  # greedy: checked, and these outputs differ
        else:
            assert r["lossless"] is None and "does not apply" in r["lossless_detail"]
            assert r["copies_identical"] is None
    # the SD cell and its baseline sent the same seeds; copies draw seed + copy in the worker
    cells = jobs(run)
    for r in rows:
        if r["method"] == "none" or r["temperature"] == 0:
            continue
        mine = [p["sampling"] for p in cells[r["cell_id"]]["prompts"]]
        theirs = [p["sampling"] for p in cells[r["baseline_cell_id"]]["prompts"]]
        assert mine == theirs and all(s["temperature"] == 0.7 and "seed" in s for s in mine)
    assert all(
        "sampling" not in p for c in cells.values() if ".t0.7." not in c["cell_id"] for p in c["prompts"]
    )
    # traces carry each request's sampling (absent for greedy)
    recs = read_store(run / "traces")
    hot = [t for t in recs if ".t0.7." in t.meta["cell_id"]]
    assert hot and all(t.meta["sampling"]["temperature"] == 0.7 for t in hot)
    assert all("sampling" not in t.meta for t in recs if ".t0.7." not in t.meta["cell_id"])
    # show: a temperature column, the sampled SD cells named, none of them called different
    text = format_run(run)
    header = text.splitlines()[3]
    assert " T " in header
    assert "token-exact vs no-SD: 0/4 SD cells" in text
    assert "sampled decoding: 4 SD cell(s)" in text
    for line in text.splitlines():
        if "ngram" in line and " 0.7 " in line:
            assert " NO " not in line
    # a rerun repeats: nothing left to run
    again = run_sweep(spec, run, fake_prompts, progress=False, echo=lambda s: None, poll_s=0.05)
    assert again.skipped == 16 and again.ok == 0


def test_show_table_without_sampled_rows_has_no_temperature_column():
    rows = [{"workload": "w", "batching": "continuous", "batch_size": 1, "method": "none", "status": "ok"}]
    assert " T " not in format_table(rows).splitlines()[0] + " "
    rows[0]["sampling"] = "as-logged"
    rows[0]["temperature"] = None
    assert "as logged" in format_table(rows)


LOG = [
    {"prompt": "Once upon a time", "temperature": 0.7, "top_p": 0.9, "max_tokens": 12},
    {"messages": [{"role": "user", "content": "Hello"}], "temperature": 0, "max_tokens": 5},
    {"body": {"prompt": "Count: 1 2 3", "temperature": 1.2, "top_k": 40, "max_completion_tokens": 20}},
    {"messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 0.3, "top_k": -1},
]

AS_LOGGED = """
name = "logged"
target = "fake-target"
workloads = ["file:{log}"]
batch_sizes = [1, 2]
num_prompts = 4
max_tokens = 8
sampling = "as-logged"

[[methods]]
name = "none"

[[methods]]
name = "ngram"
k = 2
"""


def test_as_logged_runs_every_request_with_its_own_settings(tmp_path: Path, fake_env: Path):
    log = write_lines(tmp_path / "traffic.jsonl", LOG)
    f = tmp_path / "logged.toml"
    f.write_text(AS_LOGGED.format(log=log))
    spec, text = load_sweep_source(f)
    provider = default_prompt_provider(spec, check_models=False)
    said: list[str] = []
    out = run_bench(
        spec, tmp_path / "run", spec_text=text, prompt_provider=provider, progress=False, echo=said.append
    )
    assert out.failed == 0 and out.ok == 4
    assert not any("asked for temperature > 0" in s for s in said)  # nothing done differently: no note
    rows = load_rows(tmp_path / "run")
    assert all(".logged." in r["cell_id"] for r in rows)
    for r in rows:
        assert r["sampling"] == "as-logged" and r["temperature"] is None
        assert r["requests_own_settings"] == len(LOG) == r["num_requests"]
        if r["method"] != "none":
            assert r["lossless"] is None
    cells = jobs(tmp_path / "run")
    for c in cells.values():
        got = sorted(
            (
                p["sampling"]["temperature"],
                p["sampling"].get("max_tokens"),
                p["sampling"]["top_p"],
                p["sampling"]["top_k"],
            )
            for p in c["prompts"]
        )
        assert got == [(0.0, 5, 1.0, 0), (0.3, None, 1.0, 0), (0.7, 12, 0.9, 0), (1.2, 20, 1.0, 40)]
    assert "as logged" in format_run(tmp_path / "run")


# --- server mode: the prompts file carries each request's settings ------------------------------------


def test_server_prompts_file_sends_each_requests_sampling(tmp_path: Path):
    sampling = [{"temperature": 0.7, "top_p": 0.9, "top_k": 0, "seed": 11}, None]
    write_prompts(tmp_path / "p.jsonl", [("a", [1, 2]), ("b", [3])], 16, sampling)
    back = read_prompts(tmp_path / "p.jsonl")
    assert back[0]["sampling"] == sampling[0] and "sampling" not in back[1]
    assert request_overrides(back[0]["sampling"]) == {"temperature": 0.7, "top_p": 0.9, "seed": 11}
    assert request_overrides({"temperature": 1.0, "top_k": 5, "seed": 1, "max_tokens": 3}) == {
        "temperature": 1.0,
        "seed": 1,
        "top_k": 5,
    }
    assert request_overrides(None) is None
    write_prompts(tmp_path / "q.jsonl", [("a", [1])], 16, [{"temperature": 1.0, "seed": 2, "max_tokens": 4}])
    assert read_prompts(tmp_path / "q.jsonl")[0]["max_tokens"] == 4  # as logged: the request's own length


# --- presets ---------------------------------------------------------------------------------------------


def test_every_shipped_preset_parses_and_the_sampled_ones_say_so():
    names = [n for n, _ in list_presets()]
    assert "sampling" in names
    for n in names:
        assert expand_cells(load_preset(n)), n
    s = load_preset("sampling")
    assert s.temperatures == [0.0, 0.7, 1.0] and s.batch_sizes == [1, 4, 16] and len(s.workloads) == 3
    assert {m.name for m in s.methods} == {"none", "ngram", "suffix", "draft_model", "eagle3"}
    assert len(expand_cells(s)) == 5 * 3 * 3 * 3  # configurations x temperatures x batch sizes x workloads
    for n in names:
        if n.startswith("study-"):
            assert load_preset(n).temperatures == [0.0, 0.7, 1.0], n


def test_prompt_set_without_logged_settings_is_fine():
    ps = PromptSet(workload="w", category="other", prompts=[PromptSpec(id="a", prompt_token_ids=[1])])
    specs, own = cell_prompts(Setting(sampling="as-logged", temperature=None), 3, ps, 64)
    assert own == set() and specs[0].sampling is not None and specs[0].sampling["temperature"] == 1.0


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="needs the vLLM stack (scripts/setup.sh)"
)
def test_server_requests_carry_their_sampling(tmp_path: Path):
    from speclab.server.loadgen import load_requests

    sampling = [{"temperature": 0.7, "top_p": 1.0, "top_k": 0, "seed": 11}, None]
    write_prompts(tmp_path / "p.jsonl", [("a", [1, 2]), ("b", [3])], 16, sampling)
    reqs = load_requests(tmp_path / "p.jsonl", 2, "x-")
    assert reqs[0].request_overrides == {"temperature": 0.7, "top_p": 1.0, "seed": 11}
    assert (
        reqs[1].request_overrides is None and reqs[0].prompt == [1, 2] and reqs[0].expected_output_len == 16
    )
