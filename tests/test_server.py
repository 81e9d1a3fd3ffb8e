"""Server mode without vLLM: /metrics parsing, the [server] table, cells, the load generator's command,
bench-serve result -> rows, the /metrics-vs-offline check, the runner with a fake server, show and report."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from speclab.bench.rows import read_rows
from speclab.bench.spec import load_preset, parse_sweep_text
from speclab.engine.protocol import SpecCounters
from speclab.errors import ConfigError, SpeclabError
from speclab.server.cells import expand_server_cells, group_server_engines
from speclab.server.crosscheck import compare_counters, server_vs_offline
from speclab.server.loadgen import loadgen_command, read_prompts, write_prompts
from speclab.server.metrics import ServerCounters, parse_metrics
from speclab.server.rows import apply_server_baseline, build_server_row, latency_table

METRICS_BEFORE = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="/m/a \\"b\\""} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="/m"} 1.7e9
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="/m"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="2"} 1.0
vllm:generation_tokens_total{engine="0",model_name="/m"} 100.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="/m"} 2.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="/m"} 1.0
vllm:num_requests_running{engine="0",model_name="/m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="/m"} 3.0
"""


def _after(drafts: int, tokens: int, acc: int, per_pos: list[int], gen: int) -> str:
    lines = [
        f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="/m"}} {drafts}.0',
        f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="/m"}} {tokens}.0',
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="/m"}} {acc}.0',
        f'vllm:generation_tokens_total{{engine="0",model_name="/m"}} {gen}.0',
    ]
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="/m",position="{i}"}} {v}'
        for i, v in enumerate(per_pos)
    ]
    return "\n".join(lines) + "\n"


def test_parse_metrics_sums_label_sets_and_skips_other_families():
    c = parse_metrics(METRICS_BEFORE)
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (10, 30, 12)
    assert c.accepted_per_pos == {0: 7, 1: 4, 2: 1}
    assert (c.generation_tokens, c.requests_finished, c.spec_decode) == (100, 3, True)
    # a second engine's label set adds up
    two = parse_metrics(METRICS_BEFORE + METRICS_BEFORE.replace('engine="0"', 'engine="1"'))
    assert two.num_drafts == 20 and two.accepted_per_pos[0] == 14


def test_metrics_delta_and_spec_counters():
    before = parse_metrics(METRICS_BEFORE)
    after = parse_metrics(_after(16, 48, 20, [11, 6, 3], 140))
    d = after.minus(before)
    assert (d.num_drafts, d.num_draft_tokens, d.num_accepted_tokens, d.generation_tokens) == (6, 18, 8, 40)
    assert d.spec_counters() == SpecCounters(6, 18, 8, [4, 2, 2])


def test_metrics_without_sd_and_malformed_lines():
    plain = parse_metrics('vllm:generation_tokens_total{engine="0"} 5.0\n')
    assert plain.spec_decode is False and plain.spec_counters() is None
    with pytest.raises(SpeclabError, match="not a number"):
        parse_metrics('vllm:spec_decode_num_drafts_total{engine="0"} abc\n')
    with pytest.raises(SpeclabError, match="position"):
        parse_metrics('vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0"} 3\n')
    with pytest.raises(SpeclabError, match=">= 0"):
        parse_metrics('vllm:spec_decode_num_drafts_total{engine="0"} -1\n')


SWEEP = """
target = "/nonexistent/target"
workloads = ["offline-code-edit", "offline-math"]
batch_sizes = [4]
num_prompts = 8
max_tokens = 16

[server]
request_rates = [2, 0.5]
concurrency = [4]
slo = { ttft_ms = 500, tpot_ms = 50 }

[[methods]]
name = "ngram"
k = 3
workloads = ["offline-code-edit"]
"""


def test_server_table_parses_and_expands():
    spec = parse_sweep_text(SWEEP, "s.toml")
    sv = spec.server
    assert sv is not None and sv.request_rates == [0.5, 2.0] and sv.concurrency == [4]
    assert sv.goodput_args() == ["tpot:50", "ttft:500"] and sv.ignore_eos is False
    cells = expand_server_cells(spec)
    # none: 2 workloads x 3 loads; ngram (restricted to code-edit): 3 loads
    assert len(cells) == 9 and [c.is_baseline for c in cells[:6]] == [True] * 6
    ids = [c.cell_id for c in cells]
    assert len(set(ids)) == 9 and ids == [c.cell_id for c in expand_server_cells(spec)]  # stable
    assert any(i.startswith("ngram-k3.offline-code-edit.srv-r0.5.") for i in ids)
    assert any(i.startswith("none.offline-math.srv-c4.") for i in ids)
    # each SD cell pairs with the no-SD cell at the same load and workload
    for c in cells[6:]:
        (base,) = [b for b in cells if b.is_baseline and b.baseline_key == c.baseline_key]
        assert (base.workload, base.request_rate, base.concurrency) == (
            c.workload,
            c.request_rate,
            c.concurrency,
        )
    groups = group_server_engines(spec, cells)
    assert [g.engine.method for g in groups] == ["none", "ngram"]
    assert all(g.engine.max_num_seqs == 8 for g in groups)  # rates: every request may be in flight
    # the SLO is part of what a cell measures; an offline-only setting is not
    other = parse_sweep_text(SWEEP.replace("tpot_ms = 50", "tpot_ms = 60"), "s.toml")
    assert not set(ids) & {c.cell_id for c in expand_server_cells(other)}
    same = parse_sweep_text(SWEEP.replace("batch_sizes = [4]", "batch_sizes = [4, 8]"), "s.toml")
    assert ids == [c.cell_id for c in expand_server_cells(same)]
    assert spec.to_dict()["server"]["request_rates"] == [0.5, 2.0]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("request_rates = []", "at least one load"),
        ("request_rates = [0]", "finite number > 0"),
        ("request_rates = ['x']", "finite number > 0"),
        ("request_rates = [1, 1.0]", "duplicate"),
        ("concurrency = [0]", "integer >= 1"),
        ("concurrency = [1]\nslo = { ttft = 5 }", "unknown key"),
        ("concurrency = [1]\nignore_eos = 1", "true or false"),
        ("concurrency = [1]\nrate = 3", "unknown field"),
        ("concurrency = [1]\nnum_prompts = 0", "integer >= 1"),
    ],
)
def test_server_table_errors(table: str, message: str):
    text = SWEEP.split("[server]")[0] + "[server]\n" + table + "\n\n[[methods]]\nname = 'none'\n"
    with pytest.raises(ConfigError, match=message):
        parse_sweep_text(text, "s.toml")


def test_server_mode_needs_a_server_table():
    spec = parse_sweep_text(SWEEP.split("[server]")[0] + "[[methods]]\nname = 'none'\n", "s.toml")
    with pytest.raises(ConfigError, match=r"--server needs a \[server\] table"):
        expand_server_cells(spec)


def test_preset_server_cpu():
    spec = load_preset("server-cpu")
    cells = expand_server_cells(spec)
    assert sorted({c.method.name for c in cells}) == ["eagle3", "ngram", "none"]
    assert sorted({c.request_rate for c in cells}) == [0.5, 2.0] and len(cells) == 6
    assert spec.server is not None and spec.server.ignore_eos is False


def test_loadgen_command_is_loopback_only_and_bounded(tmp_path: Path):
    kw: dict[str, Any] = dict(
        prompts=tmp_path / "p.jsonl",
        tokenizer="/m",
        num_prompts=4,
        burstiness=1.0,
        seed=42,
        ignore_eos=False,
        goodput=["ttft:500"],
        result_dir=tmp_path,
        request_id_prefix="c-",
    )
    cmd = loadgen_command(base_url="http://127.0.0.1:8123", request_rate=2.0, concurrency=None, **kw)
    text = " ".join(cmd)
    assert "-m speclab.server.loadgen" in text and "--request-rate 2 " in text
    assert "--num-prompts 4" in text and "--seed 42" in text and "--temperature 0" in text
    assert "--goodput ttft:500" in text and "--save-detailed" in text and "--ignore-eos" not in text
    assert "--max-concurrency" not in text
    closed = " ".join(
        loadgen_command(base_url="http://127.0.0.1:8123", request_rate=None, concurrency=3, **kw)
    )
    assert "--request-rate inf" in closed and "--max-concurrency 3" in closed
    for url in ("http://10.0.0.1:8000", "http://localhost.example.com:80", "https://127.0.0.1:1"):
        with pytest.raises(SpeclabError, match="loopback"):
            loadgen_command(base_url=url, request_rate=1.0, concurrency=None, **kw)


def test_prompts_file_round_trip(tmp_path: Path):
    p = tmp_path / "p.jsonl"
    write_prompts(p, [("a", [1, 2, 3]), ("b", [4])], 16)
    assert read_prompts(p) == [
        {"id": "a", "prompt_token_ids": [1, 2, 3], "max_tokens": 16},
        {"id": "b", "prompt_token_ids": [4], "max_tokens": 16},
    ]
    p.write_text('{"id": "a"}\n')
    with pytest.raises(SpeclabError, match="not a prompt line"):
        read_prompts(p)


def bench_result(n: int = 4, failed: int = 0, texts: list[str] | None = None) -> dict[str, Any]:
    """A result shaped like vllm bench serve's (--save-detailed, --percentile-metrics ttft,tpot,itl,e2el,
    --metric-percentiles 50,90,99, --goodput)."""
    r: dict[str, Any] = {
        "duration": 10.0,
        "completed": n - failed,
        "failed": failed,
        "total_input_tokens": 400,
        "total_output_tokens": 256,
        "request_throughput": 0.4,
        "request_goodput": 0.3,
        "output_throughput": 25.6,
        "generated_texts": texts if texts is not None else [f"t{i}" for i in range(n)],
        "errors": ["boom\nConnectionError: refused"] * failed + [""] * (n - failed),
    }
    for i, m in enumerate(("ttft", "tpot", "itl", "e2el")):
        r[f"mean_{m}_ms"] = 10.0 * (i + 1)
        for p in ("50", "90", "99"):
            r[f"p{p}_{m}_ms"] = 10.0 * (i + 1) + int(p)
    return r


def settings(method: str = "ngram", rate: float | None = 2.0, cell_id: str = "ngram-k3.w.srv-r2.x") -> dict:
    return {
        "cell_id": cell_id,
        "mode": "server",
        "method": method,
        "label": "none" if method == "none" else "ngram-k3",
        "k": None if method == "none" else 3,
        "method_options": {},
        "target": "/m",
        "dtype": "float32",
        "workload": "w",
        "batching": "server",
        "batch_size": None,
        "load": {"request_rate": rate, "max_concurrency": None if rate else 4, "burstiness": 1.0},
        "num_prompts": 4,
        "max_tokens": 64,
        "ignore_eos": False,
        "slo_ms": {"ttft_ms": 500.0},
        "seed": 42,
    }


def test_result_to_row():
    counters = ServerCounters(6, 18, 8, {0: 4, 1: 2, 2: 2}, generation_tokens=256, spec_decode=True)
    row = build_server_row(
        settings(), bench_result(), counters, category="code", engine_id="e", result_file="r.json", server={}
    )
    assert row["status"] == "ok" and row["error"] is None
    assert row["latency_ms"]["ttft"] == {"mean": 10.0, "p50": 60.0, "p90": 100.0, "p99": 109.0}
    assert row["latency_ms"]["tpot"]["p99"] == 119.0
    assert row["throughput_tok_s"] == 25.6 and row["output_tokens"] == 256 and row["elapsed_s"] == 10.0
    assert row["request_goodput"] == 0.3 and row["goodput_share"] == pytest.approx(0.75)
    assert row["spec_counters"] == {
        "num_drafts": 6,
        "num_draft_tokens": 18,
        "num_accepted_tokens": 8,
        "accepted_per_pos": [4, 2, 2],
    }
    assert row["mean_acceptance_length"] == pytest.approx(1 + 8 / 6)
    assert row["acceptance_rate_per_pos"] == pytest.approx([4 / 6, 2 / 6, 2 / 6])
    assert row["speedup"] is None and row["mode"] == "server"
    # any failed request fails the cell, with the first error's last line
    bad = build_server_row(
        settings(),
        bench_result(failed=1),
        counters,
        category="code",
        engine_id="e",
        result_file=None,
        server={},
    )
    assert bad["status"] == "failed" and "1 of 4 requests failed: ConnectionError: refused" in bad["error"]
    # no result at all (load generator died)
    dead = build_server_row(
        settings(),
        None,
        None,
        category="c",
        engine_id="e",
        result_file=None,
        server={},
        error="vllm bench serve exited with code 1",
    )
    assert dead["status"] == "failed" and dead["latency_ms"]["ttft"]["p50"] is None
    assert latency_table({})["itl"] == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_text_exactness_against_the_no_sd_cell():
    base = {"cell_id": "none.w.srv-r2.y", "status": "ok"}
    row = build_server_row(
        settings(), bench_result(), None, category="c", engine_id="e", result_file="r", server={}
    )
    apply_server_baseline(row, ["a", "b"], base, ["a", "b"])
    assert row["lossless"] is True and row["baseline_cell_id"] == "none.w.srv-r2.y"
    apply_server_baseline(row, ["a", "x"], base, ["a", "b"])
    assert row["lossless"] is False and "1/2 generated texts differ" in row["lossless_detail"]
    apply_server_baseline(row, None, base, ["a", "b"])
    assert row["lossless"] is None


def offline_row(cell_id: str, counters: dict | None, batching: str = "continuous", bs: int = 4) -> dict:
    return {
        "cell_id": cell_id,
        "status": "ok",
        "method": "ngram",
        "label": "ngram-k3",
        "k": 3,
        "method_options": {},
        "target": "/m",
        "dtype": "float32",
        "workload": "w",
        "batching": batching,
        "batch_size": bs,
        "num_prompts": 4,
        "max_tokens": 64,
        "seed": 42,
        "spec_counters": counters,
    }


def test_compare_counters_and_pairing():
    a = SpecCounters(6, 18, 8, [4, 2, 2])
    assert compare_counters(a, SpecCounters(6, 18, 8, [4, 2, 2]))[0] is True
    ok, detail = compare_counters(a, SpecCounters(6, 18, 9, [4, 3, 2]))
    assert ok is False and "num_accepted_tokens 8 (server) vs 9 (offline)" in detail and "per_pos" in detail
    counters = ServerCounters(6, 18, 8, {0: 4, 1: 2, 2: 2}, spec_decode=True)
    srv = build_server_row(
        settings(), bench_result(), counters, category="c", engine_id="e", result_file="r", server={}
    )
    same = {"num_drafts": 6, "num_draft_tokens": 18, "num_accepted_tokens": 8, "accepted_per_pos": [4, 2, 2]}
    rows = [
        srv,
        offline_row("off-cont", same),
        offline_row("off-rep4", same, "replicate", 4),  # each prompt 4 times: not the same requests
        offline_row("off-old", None),  # from before offline rows recorded counters
        dict(offline_row("off-other", same), max_tokens=32),
    ]
    checks = {c["offline_cell_id"]: c for c in server_vs_offline(rows)}
    assert set(checks) == {"off-cont", "off-old"}
    assert checks["off-cont"]["equal"] is True and checks["off-old"]["equal"] is None
    # fixed-length server requests (ignore_eos) are not the offline bench's requests
    assert server_vs_offline([dict(srv, ignore_eos=True), offline_row("off-cont", same)]) == []


# --- the runner, with a fake server and a fake load generator -----------------------------------------

FAKE_LOADGEN = r"""
import json, sys, time
result_dir, n, sleep = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
time.sleep(sleep)
r = {"completed": n, "failed": 0, "duration": 1.0, "total_output_tokens": 8 * n, "output_throughput": 8.0 * n,
     "request_throughput": float(n), "request_goodput": float(n), "generated_texts": ["same"] * n,
     "errors": [""] * n, "p50_ttft_ms": 5.0, "p99_ttft_ms": 9.0, "p50_tpot_ms": 2.0, "p99_tpot_ms": 3.0}
open(result_dir + "/result.json", "w").write(json.dumps(r))
"""


class FakeServer:
    started: list[str] = []

    def __init__(self, spec, workdir, startup_timeout_s=900.0):
        self.spec, self.workdir = spec, Path(workdir)
        self.url, self.target, self.startup_s, self.proc = "http://127.0.0.1:1", "/m", 0.1, None
        self.log_path = self.workdir / "server.log"
        self.calls = 0

    def __enter__(self):
        self.workdir.mkdir(parents=True)
        self.log_path.write_text("fake\n")
        FakeServer.started.append(self.spec.method)
        return self

    def __exit__(self, *a):
        return None

    def warmup(self, ids):
        assert ids

    def scrape(self) -> ServerCounters:
        self.calls += 1
        if self.spec.method == "none":
            return ServerCounters(generation_tokens=10 * self.calls)
        n = 3 * self.calls
        return ServerCounters(n, 3 * n, n, {0: n, 1: 0, 2: 0}, spec_decode=True)


def _fake_run(tmp_path, monkeypatch, sleep: float = 0.0, timeout: float = 60.0):
    from speclab.bench.preflight import PromptSet
    from speclab.engine.protocol import PromptSpec
    from speclab.server import runner as R

    spec = parse_sweep_text(SWEEP.replace("slo = {", f"cell_timeout_s = {timeout}\nslo = {{"), "s.toml")
    monkeypatch.setattr(R, "Server", FakeServer)

    def fake_cmd(**kw):
        return [sys.executable, "-c", FAKE_LOADGEN, str(kw["result_dir"]), str(kw["num_prompts"]), str(sleep)]

    monkeypatch.setattr(R, "loadgen_command", fake_cmd)

    def provider(w: str) -> PromptSet:
        return PromptSet(w, "code", [PromptSpec(f"{w}-{i}", [1, 2, 3, i]) for i in range(10)])

    lines: list[str] = []
    out = R.run_server_bench(spec, tmp_path / "run", provider, echo=lines.append, spec_text=SWEEP)
    return out, lines


def test_runner_records_rows_and_resumes(tmp_path, monkeypatch):
    FakeServer.started = []
    out, lines = _fake_run(tmp_path, monkeypatch)
    assert (out.ok, out.failed, out.total) == (9, 0, 9)
    assert FakeServer.started == ["none", "ngram"]  # one server per engine, no SD first
    rows = read_rows(tmp_path / "run", mode="server")
    assert len(rows) == 9 and all(r["status"] == "ok" for r in rows)
    sd = [r for r in rows if r["method"] == "ngram"]
    # each cell's counters are the delta of the two scrapes around it (3 drafts each)
    assert all(r["spec_counters"]["num_drafts"] == 3 for r in sd)
    assert all(r["lossless"] is True for r in sd)  # same texts as no SD at the same load
    assert read_rows(tmp_path / "run") == []  # offline readers see no server rows
    assert (tmp_path / "run" / "server" / "prompts").is_dir()
    assert any("TTFT p50/p99 5/9 ms" in ln for ln in lines)
    # rerun: nothing to do, no server started
    FakeServer.started = []
    out2, lines2 = _fake_run(tmp_path, monkeypatch)
    assert (out2.ok, out2.skipped) == (0, 9) and FakeServer.started == []


def test_runner_bounds_a_cell_in_time(tmp_path, monkeypatch):
    out, _ = _fake_run(tmp_path, monkeypatch, sleep=30.0, timeout=0.5)
    rows = read_rows(tmp_path / "run", mode="server")
    assert out.failed == 9 and all("did not finish within 0.5 s" in (r["error"] or "") for r in rows)


def test_show_and_report_with_server_rows(tmp_path, monkeypatch, capsys):
    from speclab.cli import main
    from speclab.report import build_report

    _fake_run(tmp_path, monkeypatch)
    run = tmp_path / "run"
    main(["bench", "show", str(run)])
    text = capsys.readouterr().out
    assert "server cells" in text and "ngram-k3" in text and "0.5/s" in text and "c4" in text
    path = build_report(tmp_path / "rep", run=run, title="SYNTHETIC server")
    html = path.read_text()
    assert "Latency against load (server mode)" in html
    assert "latency_vs_load.png" in html and (tmp_path / "rep" / "latency_vs_load.png").exists()
    assert ">9.00<" in html  # TTFT p99 of the fake results, in the table


def test_report_without_server_rows_says_so(tmp_path):
    from speclab.report.latency import section

    assert "No server-mode cells" in "".join(section(None, None))
    assert "No server-mode cells" in "".join(section([], None))


def test_offline_rows_record_counters():
    """Offline rows carry the worker's spec counters (the cross-check's other side)."""
    from speclab.bench.cells import expand_cells
    from speclab.bench.results import build_row
    from speclab.engine.protocol import CellResult

    spec = parse_sweep_text(SWEEP, "s.toml")
    cell = next(c for c in expand_cells(spec) if c.method.name == "ngram")
    res = CellResult(cell_id=cell.cell_id, status="ok", spec_counters=SpecCounters(2, 6, 3, [2, 1, 0]))
    row = build_row(
        cell, res, category="c", engine_id="e", trace_part=None, baseline_row=None, baseline_out=None
    )
    assert row["spec_counters"] == {
        "num_drafts": 2,
        "num_draft_tokens": 6,
        "num_accepted_tokens": 3,
        "accepted_per_pos": [2, 1, 0],
    }
    assert json.loads(json.dumps(row))["spec_counters"]["accepted_per_pos"] == [2, 1, 0]


def test_cli_server_dry_run_and_a_sweep_without_server_table(tmp_path, capsys):
    from speclab.cli import main

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    sweep = tmp_path / "s.toml"
    sweep.write_text(SWEEP.replace("/nonexistent/target", str(ckpt)))
    main(["bench", str(sweep), "--server", "--dry-run", "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert "server mode: 9 cells on 2 servers" in out
    assert "max_num_seqs=8" in out and "(0.5 req/s, 8 requests)" in out and "(conc 4, 8 requests)" in out
    assert not (tmp_path / "run").exists()  # a dry run touches nothing
    plain = tmp_path / "plain.toml"
    plain.write_text(
        SWEEP.split("[server]")[0].replace("/nonexistent/target", str(ckpt)) + "[[methods]]\nname = 'none'\n"
    )
    with pytest.raises(SystemExit) as ei:
        main(["bench", str(plain), "--server", "--out", str(tmp_path / "run")])
    assert ei.value.code == 2
    assert "--server needs a [server] table" in capsys.readouterr().err
