"""The baselines a user could configure by hand, simulated on the user's own traces (a mixed set, each
request with its category):

- every static configuration: no SD and fixed:METHOD:K for every method all traces hold, k = 1..kmax;
- the best static configuration per category (each category's requests simulated alone);
- per-category static routing: each request runs its category's best static configuration, all requests
  in one mixed batch (the `route` policy below: what routing by request type gives a server that can pick
  the drafter and k per request);
- vLLM's batch-size schedule derived from the same traces (recommend.recommend).

    python -m speclab.simulate.adaptive.baselines STORE [--cost-model NAME] [--batch-sizes 1,4,16] [--kmax 8]
        [--out DIR]     # DIR/baselines.json and .md; the report reads RUN/adaptive/baselines.json

Continuous batching, steady state, speclab's rules throughout. Routing needs requests in the simulator's own
indexing: records with no output under the methods used are dropped first (as simulate() does)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from speclab.atomic import atomic_write_text
from speclab.errors import ConfigError
from speclab.policy import Policy, StepView, register_policy
from speclab.policy.core import _int, _method
from speclab.simulate import fast
from speclab.simulate.adaptive.recommend import recommend
from speclab.simulate.api import simulate
from speclab.traces.model import RequestTrace

NO_SD = "none"


class Route(Policy):
    """Per request a fixed (method, k) chosen before the run (k = 0: no SD for that request)."""

    def decide(self, view: StepView) -> tuple[np.ndarray, np.ndarray]:
        meth, ks = self.extra["meth"][view.req], self.extra["ks"][view.req]
        k = ks.copy()
        for i, m in enumerate(self.methods):
            npr = view.num_proposed(m)
            on = meth == i
            if npr is not None and on.any():
                k[on] = np.minimum(k[on], npr[on])
        return np.where(k > 0, meth, -1).astype(np.int64), np.maximum(k, 0).astype(np.int64)


def _route(spec: str, args: list[str], opts: dict) -> Policy:
    """route:M1@K1|M2@K2|...:CHOICES -- CHOICES one character per request (in the traces' order): the index
    of its configuration in the list, or '-' for no SD."""
    if len(args) != 2 or not args[0]:
        raise ConfigError(f"policy {spec!r}: expected route:M1@K1|M2@K2|...:CHOICES")
    confs = []
    for part in args[0].split("|"):
        m, at, k = part.partition("@")
        if not at:
            raise ConfigError(f"policy {spec!r}: configurations are METHOD@K, got {part!r}")
        confs.append((_method(m, spec), _int(k, "K", spec, 1)))
    if len(confs) > 10 or any(c not in "-0123456789"[: len(confs) + 1] for c in args[1]):
        raise ConfigError(f"policy {spec!r}: CHOICES are one digit per request (0..{len(confs) - 1}) or -")
    methods = tuple(dict.fromkeys(m for m, _ in confs))
    idx = np.array([-1 if c == "-" else int(c) for c in args[1]], np.int64)
    meth = np.array([methods.index(confs[i][0]) if i >= 0 else -1 for i in idx], np.int64)
    ks = np.array([confs[i][1] if i >= 0 else 0 for i in idx], np.int64)
    return Route(
        spec=spec, methods=methods, extra={"meth": meth, "ks": ks, "max_k": max(k for _, k in confs)}
    )


register_policy(
    "route",
    "route:M1@K1|M2@K2|...:CHOICES",
    "per request a fixed configuration (one digit per request: its index in the list, - = no SD)",
    _route,
)


def route_spec(choice: list[str]) -> str:
    """The route policy for per-request static policies ("none" or "fixed:M:K"), in the traces' order."""
    confs = list(dict.fromkeys(c for c in choice if c != NO_SD))
    if not confs:
        return NO_SD
    text = "|".join("@".join(c.removeprefix("fixed:").rsplit(":", 1)) for c in confs)
    return f"route:{text}:" + "".join("-" if c == NO_SD else str(confs.index(c)) for c in choice)


def static_policies(traces: list[RequestTrace], kmax: int) -> list[str]:
    held = sorted(set.intersection(*(set(t.methods) for t in traces)))
    return [NO_SD] + [
        f"fixed:{m}:{k}"
        for m in held
        for k in range(1, min(kmax, min(t.methods[m].k_max for t in traces)) + 1)
    ]


def static_grid(
    traces: list[RequestTrace], cm: Any, sizes: list[int], kmax: int
) -> dict[int, dict[str, float]]:
    """{batch size: {static policy: speedup over no SD}} (continuous batching, steady state)."""
    grid: dict[int, dict[str, float]] = {b: {} for b in sizes}
    for r in simulate(traces, cm, static_policies(traces, kmax), "continuous", sizes):
        grid[r.batch_size][r.policy] = r.speedup
    return grid


def _best(row: dict[str, float]) -> tuple[str, float]:
    # ties go to the earlier policy (no SD first, then the smaller k)
    return max(row.items(), key=lambda kv: kv[1])


def hand_baselines(
    traces: list[RequestTrace], cm: Any, sizes: list[int], kmax: int = 8, schedule: bool = True
) -> dict[str, Any]:
    """The hand-configurable baselines (module docstring) per batch size: {static, best_static,
    per_category: {cat: {requests, best: {B: [policy, speedup]}}}, routed: {B: {speedup, choice}},
    schedule (recommend's result, or None)}."""
    methods = set.intersection(*(set(t.methods) for t in traces)) if traces else set()
    if not methods:
        raise ConfigError(
            "the traces hold no method in common (replay a bench run first: speclab trace --from RUN "
            "--methods ngram,eagle3 --out STORE)"
        )
    lengths = fast.method_lengths(traces, methods)
    traces = [t for t, n in zip(traces, lengths.tolist(), strict=True) if n > 0]
    grid = static_grid(traces, cm, sizes, kmax)
    cats = sorted({t.category for t in traces})
    per_cat: dict[str, Any] = {}
    for c in cats:
        sub = [t for t in traces if t.category == c]
        g = static_grid(sub, cm, sizes, kmax)
        per_cat[c] = {"requests": len(sub), "best": {b: list(_best(g[b])) for b in sizes}}
    routed: dict[int, Any] = {}
    for b in sizes:
        choice = {c: per_cat[c]["best"][b][0] for c in cats}
        spec = route_spec([choice[t.category] for t in traces])
        r = simulate(traces, cm, [spec], "continuous", [b])[0]
        routed[b] = {"speedup": r.speedup, "choice": choice}
    return {
        "static": grid,
        "best_static": {b: list(_best(grid[b])) for b in sizes},
        "per_category": per_cat,
        "routed": routed,
        "schedule": recommend(traces, cm, sizes, kmax) if schedule else None,
    }


def markdown(res: dict[str, Any]) -> str:
    sizes = sorted(res["static"])
    head = "| baseline | " + " | ".join(f"B={b}" for b in sizes) + " |\n|---|" + "---|" * len(sizes)
    lines = [head]

    def cell(p: str, sp: float) -> str:
        return f"{sp:.2f}x ({p.removeprefix('fixed:')})"

    lines.append("| best static | " + " | ".join(cell(*res["best_static"][b]) for b in sizes) + " |")
    for c, v in res["per_category"].items():
        row = " | ".join(cell(*v["best"][b]) for b in sizes)
        lines.append(f"| {c} alone, its best static ({v['requests']} req) | {row} |")
    lines.append(
        "| per-category static routing | "
        + " | ".join(f"{res['routed'][b]['speedup']:.2f}x" for b in sizes)
        + " |"
    )
    s = res.get("schedule")
    if s:
        lines.append(
            f"| vLLM {s['kind']} `{s['policy']}` | "
            + " | ".join(f"{s['speedup'][b]:.2f}x" for b in sizes)
            + " |"
        )
    return "\n".join(lines) + "\n"


def load_traces(source: str | Path, workload: str | None = None) -> list[RequestTrace]:
    """The records of a replayed trace store (`speclab trace --from RUN --methods ngram,eagle3 --out STORE`),
    or of a directory holding one as traces/: one record per (workload, prompt), the first met (a run holds
    each prompt once per cell); `workload` keeps that workload's records only."""
    from speclab.traces import read_store

    p = Path(source)
    if p.is_dir() and (p / "traces").is_dir():
        p = p / "traces"
    seen: set[tuple[str, str]] = set()
    out = []
    for t in read_store(p):
        key = (t.workload, str(t.meta.get("prompt_id", t.id)))
        if (workload is None or t.workload == workload) and key not in seen:
            seen.add(key)
            out.append(t)
    if not out:
        raise ConfigError(f"{source}: no records" + (f" of workload {workload!r}" if workload else ""))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m speclab.simulate.adaptive.baselines")
    ap.add_argument("store", help="a replayed trace store, or a bench RUN whose traces/ were replayed")
    ap.add_argument("--workload", help="only this workload's records (e.g. the run's mixed workload)")
    ap.add_argument("--cost-model", default="llama3.1-8b-h100-chained")
    ap.add_argument("--batch-sizes", default="1,4,16,64")
    ap.add_argument("--kmax", type=int, default=8)
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument(
        "--out", help="also write DIR/baselines.json and DIR/baselines.md (the report reads them)"
    )
    a = ap.parse_args(argv)
    sizes = [int(x) for x in a.batch_sizes.split(",")]
    res = hand_baselines(load_traces(a.store, a.workload), a.cost_model, sizes, a.kmax)
    res["cost_model"] = a.cost_model
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "baselines.json", json.dumps(res, indent=1, default=str) + "\n")
        atomic_write_text(out / "baselines.md", markdown(res))
    print(json.dumps(res, indent=1, default=str) if a.json else markdown(res))


if __name__ == "__main__":
    main()
