"""Utilities for the reliability tests: run the CLI in-process (or as its own process) and classify how it ended."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from speclab.cli import main

SRC = str(Path(__file__).resolve().parent.parent / "src")


@dataclass
class Outcome:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [x for x in self.err.splitlines() if x.strip()]

    def error_line(self) -> str:
        """The one error line; fails the test unless there is exactly one and it is well formed."""
        errs = [x for x in self.err_lines if not x.startswith("note:")]
        assert len(errs) == 1, f"expected one error line, got:\n{self.err}"
        assert errs[0].startswith("speclab: error: "), errs[0]
        assert "Traceback" not in self.err
        return errs[0]


def cli(*argv: str | os.PathLike[str]) -> Outcome:
    """Run `speclab ARGV` in this process; stdout/stderr captured, exit code as the shell would see it."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return Outcome(code, out.getvalue(), err.getvalue())


def cli_subprocess(*argv: str | os.PathLike[str], **kw) -> subprocess.Popen:
    """`speclab ARGV` as its own process (for kill and concurrency tests)."""
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = "import sys; from speclab.cli import main; sys.argv[0] = 'speclab'; main(sys.argv[1:])"
    opts = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **kw}  # kw may override
    return subprocess.Popen([sys.executable, "-c", code, *map(str, argv)], env=env, **opts)


def study_line(rid: str, n: int, seed: int = 0, k_max: int = 20) -> str:
    """One request in the study's specdecode-bench JSONL format."""
    return json.dumps(
        {
            "id": rid,
            "prompt_token_ids": [(seed * 31 + i) % 1000 for i in range(12)],
            "generated_token_ids": [(seed * 17 + i) % 1000 for i in range(n)],
            "acc_ngram": {"acc_len": [1 + (seed + i * 7) % (k_max + 1) for i in range(n)]},
            "acc_eagle": {"acc_len": [1 + (seed + i) % 4 for i in range(n)]},
        }
    )


def write_study(path: Path, ids: list[str], n: int = 12) -> Path:
    path.write_text("".join(study_line(r, n + i % 5, seed=i) + "\n" for i, r in enumerate(ids)))
    return path


def simulate_rows_finite(out: str) -> bool:
    """`simulate --json` printed rows whose figures are all finite numbers >= 0 (NaN prints as null)."""
    rows = json.loads(out)

    def ok(v: object) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0

    keys = ("speedup", "throughput_tok_s", "baseline_throughput_tok_s", "total_time_s")
    return bool(rows) and all(
        all(ok(r[k]) for k in keys) and all(ok(v) for v in r["time_split_s"].values()) for r in rows
    )


# a small cost model that prices n-gram drafting (the reliability tests' valid model)
NGRAM_MODEL = """
[target]
kv = 4e-8
batched = 2e-5
const = 6e-3
[overhead]
per_step = 1.2e-3
[draft.ngram]
form = "verify_fraction"
fraction = 0.006
"""


def tree(root: Path) -> dict[str, str]:
    """Every entry under root: a file's sha256, a symlink's target, a directory's mark."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir" if p.is_dir() else "other"
    return out
