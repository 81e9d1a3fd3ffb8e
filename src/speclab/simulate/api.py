"""simulate(): the public entry point (CONTRACTS.md section 6)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from speclab.costmodel import CostModel, get_cost_model
from speclab.errors import ConfigError
from speclab.simulate import fast
from speclab.simulate.policies import Policy, check_k_within_traces, make_policy
from speclab.simulate.study import STUDY_NUM_REQUESTS, match_p_for, study_sample
from speclab.traces.model import RequestTrace

AGGREGATES = ("total", "study")


@dataclass
class SimResult:
    batch_size: int
    policy: str
    throughput_tok_s: float
    speedup: float
    time_split_s: dict[str, float]  # verify (all target forwards, prefill included), propose, overhead
    mean_accepted_len: float | None  # tokens produced per request per SD step (accepted drafts + 1)
    tokens_rejected: int  # verified but not kept (rejected drafts, plus tokens past the request's end)
    steps: int  # engine steps (target forward passes, prefill passes included)
    batching: str = ""
    aggregate: str = ""
    baseline_throughput_tok_s: float = 0.0
    output_tokens: int = 0
    total_time_s: float = 0.0
    num_requests: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = None
        return d


def _aggregate(tm: fast.Timing, aggregate: str) -> float:
    if aggregate == "total":
        # what a deployment sees: all output tokens over all the time it took
        return float(tm.tokens.sum() / tm.total_s) if tm.total_s > 0 else float("nan")
    # study: per batch, tokens in batch / mean request latency; then the mean over batches
    nb = int(tm.batch.max()) + 1
    cnt = np.bincount(tm.batch, minlength=nb)
    lat = np.bincount(tm.batch, weights=tm.latency, minlength=nb) / np.maximum(cnt, 1)
    tok = np.bincount(tm.batch, weights=tm.tokens, minlength=nb)
    ok = cnt > 0
    return float(np.mean(tok[ok] / lat[ok]))


def resolve_inputs(
    traces: list[RequestTrace],
    policies: list[str],
    batching: str,
    batch_sizes: list[int],
    aggregate: str,
    seed: int,
    opts: dict[str, Any],
) -> tuple[list[RequestTrace], list[Policy], dict[str, Any], list[str]]:
    unknown = set(opts) - {
        "ngram_miss_heuristic",
        "combine_draft",
        "switch_overhead",
        "sample",
        "engine",
        "linear_draft_kv",
    }
    if unknown:
        raise ConfigError(f"unknown simulate option(s): {', '.join(sorted(unknown))}")
    if batching not in fast.BATCHING_MODES:
        raise ConfigError(f"unknown batching {batching!r} (use {', '.join(fast.BATCHING_MODES)})")
    if aggregate not in AGGREGATES:
        raise ConfigError(f"unknown aggregate {aggregate!r} (use {', '.join(AGGREGATES)})")
    if aggregate == "study" and batching == "continuous":
        raise ConfigError("--aggregate study averages over batches; continuous batching has none (use total)")
    if not batch_sizes or any((not isinstance(b, int | np.integer)) or b < 1 for b in batch_sizes):
        raise ConfigError(f"batch sizes must be integers >= 1, got {batch_sizes!r}")
    if not policies:
        raise ConfigError("no policy given")
    sw = opts.get("switch_overhead")
    if sw is not None and (isinstance(sw, bool) or not isinstance(sw, int | float) or not 0 <= sw <= 1e3):
        raise ConfigError(f"switch overhead must be a finite number of seconds in 0..1000, got {sw!r}")
    if opts.get("linear_draft_kv", "batch") not in ("batch", "request"):
        raise ConfigError(f"linear_draft_kv {opts['linear_draft_kv']!r}: use batch or request")
    notes: list[str] = []
    traces = list(traces)
    if aggregate == "study":
        wls = sorted({t.workload for t in traces})
        if len(wls) > 1:
            notes.append(
                f"sampling across {len(wls)} workloads ({', '.join(wls)}); the study sampled each dataset "
                "on its own (select one with --workload)"
            )
        n = int(opts.get("sample") or STUDY_NUM_REQUESTS)
        traces, note = study_sample(traces, seed, n)
    elif opts.get("sample"):
        traces, note = study_sample(traces, seed, int(opts["sample"]))
    else:
        note = None
    if note:
        notes.append(note)
    combine = opts.get("combine_draft") or "auto"
    if combine == "auto":
        combine = "ngram" if aggregate == "study" else "chosen"
    pols = [make_policy(p, combine_draft=combine) for p in policies]
    seen: set[str] = set()
    for p in pols:
        if p.spec in seen:
            raise ConfigError(f"policy {p.spec!r} given twice")
        seen.add(p.spec)
    return traces, pols, {"combine_draft": combine}, notes


def simulate(
    traces: list[RequestTrace],
    cost_model: str | CostModel,
    policies: list[str],
    batching: str,
    batch_sizes: list[int],
    aggregate: str = "total",
    seed: int = 42,
    **opts: Any,
) -> list[SimResult]:
    """Simulate every policy at every batch size; rows ordered by batch size, then policy as given.

    opts: ngram_miss_heuristic (None | "auto" | study dataset name | probability): the study's guess of
          n-gram lookup misses where a trace has no proposal counts (off by default);
          combine_draft ("auto" | "chosen" | "ngram"): what oracle-combine's drafting is charged as
          (auto = ngram under aggregate="study", as the study did; otherwise the chosen method);
          switch_overhead (seconds; default the cost model's); sample (N requests, the study's sampling rule);
          linear_draft_kv ("batch" | "request"): the kv_tokens in a "linear" drafting term (the study's EAGLE
          form): the batch's (default) or the drafting request's own, before the max over requests;
          engine ("fast" | "reference"): the vectorised simulator or the plain per-step loop.
    """
    cm = get_cost_model(cost_model)
    traces, pols, _, notes = resolve_inputs(traces, policies, batching, batch_sizes, aggregate, seed, opts)
    methods = {m for p in pols for m in p.methods}
    ta = fast.prepare(traces, methods)
    notes += ta.notes
    notes += check_k_within_traces(pols, ta.k_max)
    heur = opts.get("ngram_miss_heuristic")
    match_p = None
    needs = any("ngram" in p.methods and p.heuristic_ok for p in pols) and "ngram" in ta.nprop
    unknown = needs and ta.nprop["ngram"] is None
    if heur is not None and unknown:
        match_p = np.array([match_p_for(heur, w) for w in ta.workloads], dtype=np.float64)
        notes.append(
            "n-gram lookup misses drawn with the study's heuristic (match_p "
            + ", ".join(f"{w}={match_p_for(heur, w)}" for w in sorted(set(ta.workloads)))
            + ") where acc_len is 1"
        )
    elif heur is not None and needs:
        notes.append("n-gram miss heuristic not used: the traces record proposal counts")
    elif unknown:
        notes.append(
            "n-gram traces have no proposal counts: a lookup is assumed to always find k drafts "
            "(pass ngram_miss_heuristic / --ngram-miss-heuristic for the study's guess)"
        )
    switch = cm.switch_overhead if opts.get("switch_overhead") is None else float(opts["switch_overhead"])
    use_ref = opts.get("engine", "fast") == "reference"
    dkv = opts.get("linear_draft_kv") or "batch"
    baseline = make_policy("none")
    results: list[SimResult] = []
    tables: dict[str, fast.StepTable] = {}
    for b in batch_sizes:
        b = int(b)
        draws = None
        if match_p is not None:
            draws = fast.miss_draws(ta, match_p, batching, b, seed)
        if use_ref:
            from speclab.simulate.reference import reference_timing

            def timing(p: Policy, b=b, draws=draws) -> fast.Timing:
                return reference_timing(ta, p, cm, batching, b, draws, switch, match_p is not None, dkv)
        else:

            def timing(p: Policy, b=b, draws=draws) -> fast.Timing:
                if p.spec not in tables or p.uses_batch_size:
                    tables[p.spec] = (
                        fast.baseline_steps(ta)
                        if p.spec == "none"
                        else fast.run_steps(ta, p, b, match_p is not None)
                    )
                return fast.step_costs(tables[p.spec], p, ta, cm, batching, b, draws, switch, dkv)

        base_tm = timing(baseline)
        base_thr = _aggregate(base_tm, aggregate)
        for p in pols:
            tm = base_tm if p.spec == "none" else timing(p)
            thr = _aggregate(tm, aggregate)
            results.append(
                SimResult(
                    batch_size=b,
                    policy=p.spec,
                    throughput_tok_s=thr,
                    speedup=thr / base_thr if base_thr > 0 else float("nan"),
                    time_split_s={"verify": tm.verify_s, "propose": tm.propose_s, "overhead": tm.overhead_s},
                    mean_accepted_len=(tm.produced / tm.request_steps) if tm.request_steps else None,
                    tokens_rejected=tm.rejected,
                    steps=tm.steps,
                    batching=batching,
                    aggregate=aggregate,
                    baseline_throughput_tok_s=base_thr,
                    output_tokens=int(tm.tokens.sum()),
                    total_time_s=tm.total_s,
                    num_requests=ta.n,
                    notes=list(notes),
                )
            )
    return results
