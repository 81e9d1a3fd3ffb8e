"""`speclab trace --workload` generation on the engine path, against a fake engine worker: one job, one
continuous-batching cell holding every prompt, outputs handed back in the prompts' order, failures in one line."""

from __future__ import annotations

import json
import sys

import pytest

from speclab.errors import SpeclabError
from speclab.replay.generate import engine_generate

# records the job it got, answers each prompt with its own ids reversed (up to max_tokens), or fails the cell
FAKE_WORKER = r"""
import json, os, sys
from speclab.engine.protocol import CellResult, RequestResult, append_result, read_job

args = sys.argv[1:]
job = read_job(args[args.index("--job") + 1])
out = args[args.index("--out") + 1]
with open(os.environ["FAKE_JOB_COPY"], "w") as f:
    json.dump(job.to_dict(), f)
if os.environ.get("FAKE_DIE"):
    print("RuntimeError: engine start failed (fake)", file=sys.stderr)
    sys.exit(1)
for cell in job.cells:
    if os.environ.get("FAKE_FAIL"):
        append_result(out, CellResult(cell_id=cell.cell_id, status="failed", error="fake: out of memory"))
        continue
    reqs = [RequestResult(id=p.id, copy=0, prompt_len=len(p.prompt_token_ids),
                          output_token_ids=p.prompt_token_ids[::-1][: cell.max_tokens], finish_reason="length")
            for p in reversed(cell.prompts)]  # finished in another order than asked
    append_result(out, CellResult(cell_id=cell.cell_id, status="ok", output_tokens=1, elapsed_s=1.0, steps=1,
                                  requests=reqs))
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    monkeypatch.setenv("SPECLAB_WORKER_CMD", f"{sys.executable} {script}")
    monkeypatch.setenv("FAKE_JOB_COPY", str(tmp_path / "job-seen.json"))
    return tmp_path / "job-seen.json"


def test_every_prompt_in_one_batched_cell_outputs_in_prompt_order(fake, tmp_path):
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    said: list[str] = []
    outs = engine_generate(
        prompts, "some-target", max_tokens=3, max_batch=3, echo=said.append, work_dir=tmp_path
    )
    assert outs == [[7, 6, 5], [9, 8], [13, 12, 11], [14]]
    job = json.loads(fake.read_text())
    eng, (cell,) = job["engine"], job["cells"]
    # the bench's engine defaults (greedy is the worker's), fp32, no speculative decoding; eager, so the engine
    # starts in seconds (compiling costs more than the generation it would speed up)
    assert (eng["target"], eng["dtype"], eng["method"], eng["k"]) == ("some-target", "float32", "none", None)
    assert eng["max_num_seqs"] == 3 and eng["max_model_len"] == 4 + 3 and eng["enforce_eager"] is True
    assert (cell["batching"], cell["batch_size"], cell["max_tokens"]) == ("continuous", 3, 3)
    assert [p["prompt_token_ids"] for p in cell["prompts"]] == prompts
    assert "4 request(s)" in said[0]
    assert not list(tmp_path.glob("speclab-generate-*"))  # its work directory is removed


def test_engine_failures_are_one_line_errors(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "1")
    with pytest.raises(SpeclabError, match="generation failed on the engine: fake: out of memory"):
        engine_generate([[1, 2]], "t", max_tokens=2, echo=lambda s: None, work_dir=tmp_path)
    monkeypatch.delenv("FAKE_FAIL")
    monkeypatch.setenv("FAKE_DIE", "1")
    with pytest.raises(
        SpeclabError, match=r"generation engine exited with code 1: RuntimeError: engine start"
    ):
        engine_generate([[1, 2]], "t", max_tokens=2, echo=lambda s: None, work_dir=tmp_path)
