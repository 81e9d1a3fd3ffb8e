"""Estimate, offline, what the live proposers would measure on a bench run's machine: each proposer is played
through vLLM's continuous batching (`adaptive_live.play_engine`, no model) on the run's real requests, and
every step is priced with the run's OWN profiled forwards (median seconds per (requests, tokens) in its
timings.csv; a per-request-count linear fit where a cell was never measured) plus the proposer's own time.

    python benchmarks/live_replay.py RUN [--batch 1,4,16] [--variants ngram-k5,suffix-k8,adaptive]
        [--live-factor 2] [--live-add-ms 0.15] [--sd-step-ms 0.6]

Variants: `ngram-kK` / `suffix-kK` (static, vLLM's rule at K), `adaptive` (the live driver as shipped), and
`adaptive@OPT=VAL;OPT=VAL` with AdaptiveDriver options as JSON values, e.g.
`adaptive@methods=["ngram"];policy="adaptive-pooled"`. Variants are separated by commas, or by `;;` where
any of them has options (as in the README's example). The proposer's
time is its driver call time measured here times --live-factor plus --live-add-ms (the same Python costs
more inside the engine, which shares two cores with torch's threads: stop 20's run measured 0.86 / 1.26 /
1.97 ms per call live at B = 1 / 4 / 16 where this measures ~0.4 / 0.6 / 1.3 ms; vLLM's n-gram, microseconds
here, took 0.14 ms there);
the static lookups are charged what the engine's profile says they cost (draft:ngram / draft:suffix rows).
--sd-step-ms: vLLM's own per-step cost of running speculative decoding at all (rejection sampler and
bookkeeping; "other" time of SD cells over no-SD cells), charged to every SD variant.

This is a model of the engine, for ranking proposer ideas before a quiet live run; the live bench decides.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_adaptive_driver import load_requests  # noqa: E402

from speclab.methods.adaptive_live import AdaptiveDriver, play_engine, vllm_ngram_kernel  # noqa: E402
from speclab.methods.catalog import NGRAM_MAX_N, NGRAM_MIN_N  # noqa: E402


class ForwardTable:
    """Median profiled target forward seconds by (requests, tokens), decode/verify only."""

    def __init__(self, timings: Path) -> None:
        cells: dict[tuple[int, int], list[float]] = defaultdict(list)
        prefill: list[tuple[int, float]] = []
        self.draft_ms: dict[str, list[float]] = defaultdict(list)
        with timings.open() as f:
            for r in csv.DictReader(f):
                n, t = int(r["num_requests"]), int(r["batched_tokens"])
                if r["kind"] == "target" and t <= n * 12:  # not a prefill
                    cells[(n, t)].append(float(r["seconds"]))
                elif r["kind"] == "target":
                    prefill.append((t, float(r["seconds"])))
                elif r["kind"] in ("draft:ngram", "draft:suffix"):
                    self.draft_ms[r["kind"].split(":")[1]].append(1e3 * float(r["seconds"]))
        self.med = {k: statistics.median(v) for k, v in cells.items() if len(v) >= 5}
        pts = [(n, t, s) for (n, t), s in self.med.items()]
        a = np.array([[1.0, n, t] for n, t, _ in pts])
        self.coef = np.linalg.lstsq(a, np.array([s for *_, s in pts]), rcond=None)[0]
        pf = np.array(prefill)  # prefill seconds ~ a + b * tokens (the same for every variant)
        self.prefill = np.polyfit(pf[:, 0], pf[:, 1], 1) if len(pf) >= 2 else np.zeros(2)

    def prefills(self, prompts: list[int]) -> float:
        return float(sum(np.polyval(self.prefill, p) for p in prompts))

    def __call__(self, n: int, t: int) -> float:
        if (n, t) in self.med:
            return self.med[(n, t)]
        same = sorted((tt, s) for (nn, tt), s in self.med.items() if nn == n)
        if len(same) >= 2:  # interpolate within this request count
            xs, ys = zip(*same, strict=True)
            if xs[0] <= t <= xs[-1]:
                return float(np.interp(t, xs, ys))
            slope = (ys[-1] - ys[0]) / max(xs[-1] - xs[0], 1)
            return float(ys[-1] + slope * (t - xs[-1])) if t > xs[-1] else float(ys[0])
        return float(self.coef @ [1.0, n, t])


class Static:
    """vLLM's static lookup: n-gram (its compiled rule) or suffix, always K drafts where it offers."""

    def __init__(self, kind: str, k: int) -> None:
        self.kind, self.kmax = kind, k
        if kind == "ngram":
            self.kernel = vllm_ngram_kernel()
        else:  # the suffix probe of the adaptive driver, always taken at K
            self.drv = AdaptiveDriver(kmax=k, max_model_len=4096, methods=("suffix",),
                                      suffix={"max_cached_requests": 0})  # fmt: skip
            self.drv.policy.decide = lambda v: (  # type: ignore[method-assign]
                np.zeros(len(v), np.int64),
                np.full(len(v), k, np.int64),
            )

    def step(self, sampled: Any, nt: np.ndarray, table: np.ndarray) -> list[list[int]]:
        if self.kind == "ngram":
            return [
                self.kernel(
                    np.ascontiguousarray(table[i, : nt[i]]), NGRAM_MIN_N, NGRAM_MAX_N, 4096, self.kmax
                ).tolist()
                for i in range(len(nt))
            ]
        return self.drv.step(sampled, nt, table)


class Recorder:
    def __init__(self, inner: Any) -> None:
        self.inner, self.kmax = inner, inner.kmax
        self.steps: list[tuple[int, int]] = []
        self.secs: list[float] = []

    def step(self, *a: Any) -> list[list[int]]:
        t0 = time.perf_counter()
        out = self.inner.step(*a)
        self.secs.append(time.perf_counter() - t0)
        self.steps.append((len(out), sum(len(d) for d in out)))
        return out


def make(variant: str) -> tuple[Any, str]:
    if variant.startswith(("ngram-k", "suffix-k")):
        kind, k = variant.split("-k")
        return Static(kind, int(k)), kind
    name, _, opts = variant.partition("@")
    kw: dict[str, Any] = {"suffix": {"max_cached_requests": 0}}
    for part in filter(None, opts.split(";")):
        key, _, val = part.partition("=")
        kw[key] = json.loads(val)
    return AdaptiveDriver(kmax=kw.pop("kmax", 8), max_model_len=4096, **kw), name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--batch", default="1,4,16")
    ap.add_argument("--variants", default="ngram-k5,suffix-k8,adaptive")
    ap.add_argument("--live-factor", type=float, default=2.0)
    ap.add_argument("--live-add-ms", type=float, default=0.15)
    ap.add_argument("--sd-step-ms", type=float, default=0.6)
    ap.add_argument("--workloads", default=None)
    args = ap.parse_args(argv)
    table = ForwardTable(args.run / "timings.csv")
    static_ms = {k: statistics.median(v) for k, v in table.draft_ms.items()}
    reqs = load_requests(args.run)
    variants = args.variants.split(";;") if ";;" in args.variants else args.variants.split(",")
    print("# speedup estimated from the run's profiled forwards; proposer ms/step in parentheses")
    for wl, rs in sorted(reqs.items()):
        if args.workloads and wl not in args.workloads.split(","):
            continue
        for b in (int(x) for x in args.batch.split(",")):
            base = pre = table.prefills([len(p) for p, _ in rs])
            for n in _none_steps(rs, b):
                base += table(n, n)
            cols = []
            for v in variants:
                drv, kind = make(v)
                rec = Recorder(drv)
                log = play_engine(rec, rs, b)
                if kind in static_ms:
                    own = static_ms[kind] / 1e3
                else:
                    own = args.live_factor * statistics.mean(rec.secs) + args.live_add_ms / 1e3
                t = (
                    pre
                    + sum(table(n, n + d) for n, d in rec.steps)
                    + len(rec.steps) * (own + args.sd_step_ms / 1e3)
                )
                drafted = sum(d for lg in log.values() for d, _ in lg)
                acc = sum(a for lg in log.values() for _, a in lg)
                cols.append(f"{v}: {base / t:.3f} ({1e3 * own:.2f} ms, {drafted}/{acc} drafted/acc)")
            print(f"{wl:18s} B={b:<3d} " + " | ".join(cols), flush=True)
    return 0


class _Off:
    """A proposer that never drafts: no SD."""

    kmax = 1

    def step(self, sampled: Any, *_: Any) -> list[list[int]]:
        return [[] for _ in sampled]


def _none_steps(rs: list[tuple[list[int], list[int]]], b: int) -> list[int]:
    """Rows per step without SD under continuous batching (play_engine's, one token per request per step)."""
    rec = Recorder(_Off())
    play_engine(rec, rs, b)
    return [n for n, _ in rec.steps]


if __name__ == "__main__":
    raise SystemExit(main())
