"""CLI: traces import/export/validate/info, cost-models list/show/fit, simulate (table, JSON, CSV, plot)."""

import csv
import json

import pytest

from speclab.cli import main


def run(argv, capsys):
    code = 0
    try:
        main(argv)
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def study_file(path, n=6):
    with open(path, "w") as fh:
        for i in range(n):
            L = 10 + i
            fh.write(
                json.dumps(
                    {
                        "id": f"q{i}",
                        "prompt_token_ids": list(range(20)),
                        "generated_token_ids": list(range(L)),
                        "acc_ngram": {"acc_len": [1 + (j * 7 + i) % 9 for j in range(L)]},
                        "acc_eagle": {"acc_len": [1 + (j + i) % 4 for j in range(L)]},
                    }
                )
                + "\n"
            )


@pytest.fixture
def store(tmp_path, capsys):
    f = tmp_path / "instructcoder.jsonl"
    study_file(f)
    code, out, err = run(
        ["traces", "import", "--format", "specdecode-bench", str(f), "--out", str(tmp_path / "st")], capsys
    )
    assert code == 0, err
    assert "imported 6 request(s)" in out and "proposal counts: unknown" in out
    return tmp_path / "st"


def test_traces_commands(store, tmp_path, capsys):
    code, out, _ = run(["traces", "validate", str(store)], capsys)
    assert code == 0 and "ok: 6 record(s)" in out
    code, out, _ = run(["traces", "info", str(store)], capsys)
    assert "instructcoder (code-editing): 6 requests" in out and "proposal counts unknown" in out
    code, out, _ = run(["traces", "info", str(store), "--json"], capsys)
    assert json.loads(out)["workloads"]["instructcoder"]["methods"]["eagle"]["k_max"] == [20]
    eagle = json.loads(out)["workloads"]["instructcoder"]["methods"]["eagle"]
    assert (eagle["min_output_len"], eagle["max_output_len"], eagle["own_length_requests"]) == (10, 15, 0)
    code, out, _ = run(["traces", "export", str(store), "--out", str(tmp_path / "x.jsonl")], capsys)
    assert code == 0 and len((tmp_path / "x.jsonl").read_text().splitlines()) == 6
    # re-import of speclab's own format, and refusal to overwrite
    code, _, err = run(["traces", "import", "--format", "speclab-jsonl", str(tmp_path / "x.jsonl"), "--out",
                        str(store)], capsys)  # fmt: skip
    assert code == 2 and "store exists" in err
    code, _, err = run(["traces", "import", "--format", "speclab-jsonl", str(tmp_path / "x.jsonl"), "--out",
                        str(tmp_path / "s2.parquet")], capsys)  # fmt: skip
    assert code == 0


def test_import_error_is_one_line(tmp_path, capsys):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"id": "a", "prompt_token_ids": [1], "generated_token_ids": [1, 2], '
                 '"acc_ngram": {"acc_len": [1]}}\n')  # fmt: skip
    code, _, err = run(["traces", "import", "--format", "specdecode-bench", str(f), "--out",
                        str(tmp_path / "s")], capsys)  # fmt: skip
    assert code == 2
    assert err.count("\n") == 1 and "line 1" in err and "acc_ngram.acc_len" in err and str(f) in err


def test_cost_models_cli(tmp_path, capsys):
    code, out, _ = run(["cost-models", "list"], capsys)
    assert code == 0 and out.splitlines()[0].startswith("llama3.1-8b-h100")
    code, out, _ = run(["cost-models", "show", "llama3.1-8b-h100"], capsys)
    assert "3.92645679e-08" in out
    t = tmp_path / "t.csv"
    t.write_text(
        "kind,kv_tokens,batched_tokens,num_spec_tokens,num_requests,seconds\n"
        + "".join(
            f"target,{kv},{b},0,{b},{1e-8 * kv + 2e-5 * b + 5e-3}\n"
            for kv in (0, 1000, 5000)
            for b in (1, 64)
        )
        + "overhead,0,0,0,1,0.001\n"
    )
    code, out, err = run(["cost-models", "fit", str(t), "--out", str(tmp_path / "m.toml")], capsys)
    assert code == 0, err
    code, out, _ = run(["cost-models", "show", str(tmp_path / "m.toml")], capsys)
    assert "[target]" in out


def test_simulate_table_json_csv_plot(store, tmp_path, capsys):
    base = ["simulate", "--traces", str(store), "--cost-model", "llama3.1-8b-h100", "--batch-sizes", "1,8"]
    code, out, err = run(base + ["--policy", "oracle-combine:ngram,eagle", "--policy", "fixed:eagle:3",
                                 "--batching", "replicate", "--aggregate", "study"], capsys)  # fmt: skip
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["batch", "policy", "speedup"] and len(lines) == 5
    assert "file order" in err  # fewer than 300 requests: said so
    code, out, _ = run(base + ["--policy", "oracle:ngram", "--json", "--csv", str(tmp_path / "r.csv"),
                               "--plot", str(tmp_path / "p.png")], capsys)  # fmt: skip
    rows = json.loads(out)
    assert [r["batch_size"] for r in rows] == [1, 8]
    assert {"batch_size", "policy", "speedup", "throughput_tok_s", "time_split_s"} <= set(rows[0])
    with open(tmp_path / "r.csv") as fh:
        crow = list(csv.DictReader(fh))
    assert float(crow[1]["speedup"]) == pytest.approx(rows[1]["speedup"])
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, out, _ = run(
        base + ["--policy", "fixed:ngram:5", "--ngram-miss-heuristic", "instructcoder"], capsys
    )
    assert code == 0


def test_simulate_list_policies_and_errors(store, capsys):
    code, out, _ = run(["simulate", "--list-policies"], capsys)
    assert out.split()[:5] == ["none", "fixed", "oracle", "oracle-combine", "schedule"]
    code, _, err = run(["simulate", "--traces", str(store), "--policy", "fixed:eagle:99"], capsys)
    assert code == 2 and "k_max=20" in err and err.count("\n") == 1
    code, _, err = run(["simulate", "--traces", str(store), "--policy", "bogus"], capsys)
    assert code == 2 and "unknown policy" in err


def test_traces_info_shows_per_method_lengths(tmp_path, capsys):
    f = tmp_path / "gsm8k.jsonl"
    rows = [
        {"id": "a", "prompt_token_ids": [1], "generated_token_ids": [1, 2, 3, 4],
         "acc_ngram": {"acc_len": [1, 2, 1, 1]}, "acc_eagle": {"acc_len": [2, 2, 1, 1, 1, 1, 1]}},
        {"id": "b", "prompt_token_ids": [1], "generated_token_ids": [1, 2, 3, 4],
         "acc_ngram": {"acc_len": [1, 2, 1, 1]}, "acc_eagle": {"acc_len": [2, 1, 1, 1]}},
    ]  # fmt: skip
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, _, err = run(["traces", "import", "--format", "specdecode-bench", str(f), "--out", str(tmp_path / "s")],
                       capsys)  # fmt: skip
    assert code == 0 and "acc_eagle: 1 record(s) with their own length" in err
    code, out, _ = run(["traces", "info", str(tmp_path / "s")], capsys)
    assert "length mean 5.5, min 4, max 7; 1 of 2 with their own length (mean |difference| 1.5)" in out
    assert "length mean 4.0, min 4, max 4; all as the records' output" in out


def test_simulate_continuous_shows_both_measures(store, tmp_path, capsys):
    base = ["simulate", "--traces", str(store), "--policy", "oracle:ngram", "--batch-sizes", "1,4"]
    code, out, err = run(base + ["--csv", str(tmp_path / "c.csv")], capsys)
    assert code == 0, err
    head = out.splitlines()[0].split()
    assert head[-2:] == ["makespan", "tail%"]
    with open(tmp_path / "c.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {"makespan_speedup", "tail_share", "steady_speedup"} <= set(rows[0])
    assert float(rows[1]["speedup"]) == pytest.approx(float(rows[1]["steady_speedup"]))
    code, out, _ = run(base + ["--continuous-measure", "makespan", "--json"], capsys)
    r = json.loads(out)[1]
    assert r["speedup"] == r["makespan_speedup"] and r["tail_share"] > 0  # 6 requests in 4 slots: a tail
    code, out, _ = run(base + ["--continuous-measure", "makespan"], capsys)
    assert out.splitlines()[0].split()[-2:] == ["steady", "tail%"]
