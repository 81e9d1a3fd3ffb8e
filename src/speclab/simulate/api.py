"""simulate(): the public entry point (CONTRACTS.md section 6)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from speclab.costmodel import CostModel, get_cost_model
from speclab.errors import ConfigError
from speclab.policy import Policy, bind_methods, check_k_within_traces, make_policy
from speclab.simulate import costs, fast, sampled
from speclab.simulate.reference import reference_timing
from speclab.simulate.study import STUDY_NUM_REQUESTS, match_p_for, miss_generator, study_sample_state
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
    # continuous batching: throughput_tok_s / speedup are the steady state (all B slots busy) unless
    # continuous_measure="makespan"; these are the single pass's makespan figures beside them (other
    # batching modes: the same as throughput_tok_s / speedup), and the share of that makespan with fewer
    # than B requests running (the tail; None for other modes)
    makespan_throughput_tok_s: float = 0.0
    makespan_speedup: float = 0.0
    tail_share: float | None = None
    steady_throughput_tok_s: float | None = None  # continuous batching only
    steady_speedup: float | None = None
    notes: list[str] = field(default_factory=list)
    # sampled traces (accept_prob): realisations averaged, and the speedup's {min, max, std, n} over them
    draws: int = 0
    speedup_spread: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = None
        return d


def _aggregate(tm: costs.Timing, aggregate: str) -> float:
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


RULES = ("auto", "speclab", "study")
LENGTHS = ("own", "common")
_OPTS = {
    "ngram_miss_heuristic",
    "combine_draft",
    "switch_overhead",
    "sample",
    "engine",
    "linear_draft_kv",
    "rules",
    "lengths",
    "continuous_measure",
    "draws",  # simulate()'s own argument; listed so that sweeps (distributed.py) pass it through
}
MEASURES = ("steady", "makespan")
TAIL_WARN = 0.2  # warn when the tail is more than this share of the makespan


def check_args(
    policies: list[str], batching: str, batch_sizes: list[int], aggregate: str, opts: dict[str, Any]
) -> tuple[list[Policy], str, list[str]]:
    """Validate arguments; returns (policies, rules, notes)."""
    unknown = set(opts) - _OPTS
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
    rules = opts.get("rules") or "auto"
    if rules not in RULES:
        raise ConfigError(f"rules {rules!r}: use {', '.join(RULES)}")
    if rules == "auto":
        rules = "study" if aggregate == "study" and batching == "replicate" else "speclab"
    if rules == "study" and batching != "replicate":
        raise ConfigError("the study's step rules are defined for replicate batching only")
    if (opts.get("continuous_measure") or "steady") not in MEASURES:
        raise ConfigError(f"continuous_measure {opts['continuous_measure']!r}: use {', '.join(MEASURES)}")
    if (opts.get("lengths") or "own") not in LENGTHS:
        raise ConfigError(f"lengths {opts['lengths']!r}: use {', '.join(LENGTHS)}")
    combine = opts.get("combine_draft") or "auto"
    if combine == "auto":
        combine = "ngram" if aggregate == "study" or rules == "study" else "chosen"
    pols = [make_policy(p, combine_draft=combine) for p in policies]
    seen: set[str] = set()
    for p in pols:
        if p.spec in seen:
            raise ConfigError(f"policy {p.spec!r} given twice")
        seen.add(p.spec)
    return pols, rules, []


def _select(
    traces: list[RequestTrace], methods: tuple[str, ...], aggregate: str, seed: int, opts: dict[str, Any]
) -> tuple[list[RequestTrace], Any, list[str]]:
    """The requests one group of policies runs on: drop those of length 0 under these methods, then sample
    (the study's rule, anew for each run). Returns (requests, generator state after sampling, notes)."""
    notes: list[str] = []
    lengths = fast.method_lengths(traces, methods)
    kept = [t for t, n in zip(traces, lengths.tolist(), strict=True) if n > 0]
    if len(kept) < len(traces):
        notes.append(f"skipped {len(traces) - len(kept)} request(s) with no output tokens")
    n = int(opts.get("sample") or 0) or (STUDY_NUM_REQUESTS if aggregate == "study" else 0)
    if aggregate == "study":
        wls = sorted({t.workload for t in kept})
        if len(wls) > 1:
            notes.append(
                f"sampling across {len(wls)} workloads ({', '.join(wls)}); the study sampled each dataset "
                "on its own (select one with --workload)"
            )
    state = None
    if n:
        kept, note, state = study_sample_state(kept, seed, n)
        if note:
            notes.append(note)
    return kept, state, notes


def _length_notes(traces: list[RequestTrace], methods: set[str]) -> list[str]:
    notes = []
    for m in sorted(methods):
        own = sum(1 for t in traces if m in t.methods and len(t.methods[m].acc_len) != t.output_len)
        if own:
            notes.append(
                f"{m}: {own} of {len(traces)} request(s) have their own output length (that method's own run); "
                "each policy runs over its methods' lengths (combine: the shorter), its baseline over the same"
            )
    return notes


def simulate(
    traces: list[RequestTrace],
    cost_model: str | CostModel,
    policies: list[str],
    batching: str,
    batch_sizes: list[int],
    aggregate: str = "total",
    seed: int = 42,
    draws: int = sampled.DEFAULT_DRAWS,
    **opts: Any,
) -> list[SimResult]:
    """Simulate every policy at every batch size; rows ordered by batch size, then policy as given.

    Sampled traces (accept_prob on a method a policy uses): `draws` realisations of each step's accepted
    count (speclab.simulate.sampled, seeded by `seed`), each simulated as a greedy trace; the rows are their
    mean, with speedup_spread. Traces without accept_prob run once, without any random draw.

    Lengths: a method's trace may have its own length (from its own run). Each policy runs over its methods'
    lengths (several methods: per request the shortest, acceptance per position over that prefix), and its
    speedup is against the baseline over the same requests and lengths; `none` runs over the records' own
    output lengths. lengths="common" instead runs every policy (and one baseline) over the shortest length of
    all the methods the call uses, so that all rows describe exactly the same work.

    opts: ngram_miss_heuristic (None | "auto" | study dataset name | probability): the study's guess of
          n-gram lookup misses where a trace has no proposal counts (off by default);
          combine_draft ("auto" | "chosen" | "ngram"): what oracle-combine's drafting is charged as
          (auto = ngram under aggregate="study", as the study did; otherwise the chosen method);
          switch_overhead (seconds; default the cost model's); sample (N requests, the study's sampling rule);
          linear_draft_kv ("batch" | "request"): the kv_tokens in a "linear" drafting term (the study's EAGLE
          form): the batch's (default) or the drafting request's own, before the max over requests;
          rules ("auto" | "speclab" | "study"): step rules; auto = the study's with replicate batching and
          aggregate="study" (docs/simulator.md lists them);
          lengths ("own" | "common"): see above;
          engine ("fast" | "reference"): the vectorised simulator or the plain per-step loop.
    """
    cm = get_cost_model(cost_model)
    pols, rules, notes = check_args(policies, batching, batch_sizes, aggregate, opts)
    if isinstance(draws, bool) or not isinstance(draws, int | np.integer) or not 0 <= draws <= 10_000:
        raise ConfigError(f"draws must be an integer 0..10000, got {draws!r}")
    study = rules == "study"
    bind_methods(pols, traces, cm)  # bare adaptive policies: every method the traces hold
    for p in pols:
        p.cost_model = cm
        fast.check_probes(p, cm)
    all_methods = tuple(sorted({m for p in pols for m in p.methods}))
    if draws and sampled.has_accept_prob(traces, set(all_methods)):
        runs = [
            simulate(sampled.realise(traces, seed, d), cm, policies, batching, batch_sizes, aggregate, seed,
                     draws=0, **opts)
            for d in range(draws)
        ]  # fmt: skip
        return sampled.combine(runs, seed)
    notes += _length_notes(traces, set(all_methods))
    groups: dict[tuple[str, ...], list[Policy]] = {}
    for p in pols:
        key = all_methods if opts.get("lengths") == "common" else tuple(sorted(p.methods))
        groups.setdefault(key, []).append(p)
    rows: dict[tuple[int, str], SimResult] = {}
    for key, gpols in groups.items():
        sel, state, gnotes = _select(list(traces), key, aggregate, seed, opts)
        ta = fast.prepare(sel, set(key), shift=study)
        for n in gnotes + ta.notes + check_k_within_traces(gpols, ta.k_max):
            if n not in notes:
                notes.append(n)
        for r in _run_group(ta, gpols, cm, batching, batch_sizes, aggregate, seed, opts, study, state, notes):
            rows[(r.batch_size, r.policy)] = r
    out = [rows[(int(b), p.spec)] for b in batch_sizes for p in pols]
    for b in dict.fromkeys(int(x) for x in batch_sizes):
        tails = [(r.tail_share, r.policy) for r in out if r.batch_size == b and r.tail_share is not None]
        share, pol = max(tails, default=(0.0, ""))
        if share > TAIL_WARN:
            notes.append(
                f"continuous batching, B={b}: fewer than {b} requests run for up to {share:.0%} of the single "
                f"pass's makespan ({pol}); that tail, not a server's steady state, drives the makespan_* "
                f"figures. throughput/speedup: the steady state (all {b} slots busy, the requests re-admitted "
                "in turn)"
            )
    for r in out:
        r.notes = list(notes)
    return out


def _run_group(  # long: per batch size the step tables, miss draws and passes of one group share state
    ta: fast.TraceArrays,
    pols: list[Policy],
    cm: CostModel,
    batching: str,
    batch_sizes: list[int],
    aggregate: str,
    seed: int,
    opts: dict[str, Any],
    study: bool,
    state: Any,
    notes: list[str],
) -> list[SimResult]:
    heur = opts.get("ngram_miss_heuristic")
    match_p = None
    needs = any("ngram" in p.methods and p.heuristic_ok for p in pols) and "ngram" in ta.nprop
    unknown = needs and ta.nprop["ngram"] is None
    if heur is not None and unknown:
        match_p = np.array([match_p_for(heur, w) for w in ta.workloads], dtype=np.float64)
        note = (
            "n-gram lookup misses drawn with the study's heuristic (match_p "
            + ", ".join(f"{w}={match_p_for(heur, w)}" for w in sorted(set(ta.workloads)))
            + ") where acc_len is 1"
        )
    elif heur is not None and needs:
        note = "n-gram miss heuristic not used: the traces record proposal counts"
    elif unknown:
        note = (
            "n-gram traces have no proposal counts: a lookup is assumed to always find k drafts "
            "(pass ngram_miss_heuristic / --ngram-miss-heuristic for the study's guess)"
        )
    else:
        note = None
    if note and note not in notes:
        notes.append(note)
    switch = cm.switch_overhead if opts.get("switch_overhead") is None else float(opts["switch_overhead"])
    use_ref = opts.get("engine", "fast") == "reference"
    dkv = opts.get("linear_draft_kv") or "batch"
    baseline = make_policy("none")
    results: list[SimResult] = []
    tables: dict[str, fast.StepTable] = {}
    on = match_p is not None
    for b in batch_sizes:
        b = int(b)
        shared = fast.miss_draws(ta, match_p, batching, b, seed) if on and not study else None

        def draws_for(p: Policy, b: int = b, shared: np.ndarray | None = shared) -> np.ndarray | None:
            if not on or not study:
                return shared
            # the study's own stream: random.random() per copy where acc is 1, batch after batch
            return fast.study_miss_draws(
                tables[p.spec], ta, match_p, b, miss_generator(state or _fresh(seed))
            )

        if use_ref:

            def timing(
                p: Policy, b: int = b, shared: np.ndarray | None = shared, passes: int = 1
            ) -> costs.Timing:
                gen = miss_generator(state or _fresh(seed)) if on and study else None
                return reference_timing(
                    ta, p, cm, batching, b, shared, switch, on, dkv, study, gen, match_p, passes
                )
        else:

            def timing(p: Policy, b: int = b, passes: int = 1) -> costs.Timing:
                if p.uses_occupancy and batching != "replicate" and (b > 1 or p.pools_requests):
                    # decisions read the live batch (or what earlier requests showed: served in order)
                    from speclab.simulate.coupled import run_steps_coupled

                    tx, sx = run_steps_coupled(ta, p, batching, b, on, study, passes)
                    d = draws_for(p)
                    d = None if d is None else np.tile(d, passes)
                    return costs.step_costs(sx, p, tx, cm, batching, b, d, switch, dkv, study)
                if passes == 1 and (p.spec not in tables or p.uses_batch_size):
                    tables[p.spec] = (
                        fast.baseline_steps(ta)
                        if p.spec == "none"
                        else fast.run_steps(ta, p, b, on, batching, study)
                    )
                d = draws_for(p) if p.spec != "none" else None
                tx, sx = fast.repeat_requests(ta, tables[p.spec], passes)
                d = None if d is None else np.tile(d, passes)
                return costs.step_costs(sx, p, tx, cm, batching, b, d, switch, dkv, study)

        cont = batching == "continuous"
        passes, capped = fast.steady_passes(ta.out_len, b) if cont else (1, False)
        cap_note = (
            f"continuous batching, B={b}: the steady-state run was capped at {passes} pass(es) over the "
            "requests; the longest requests are under-represented in it (their life is long compared "
            "with the measured window)"
        )
        if capped and cap_note not in notes:
            notes.append(cap_note)
        base_tm = timing(baseline)
        base_thr = _aggregate(base_tm, aggregate)
        # one pass is the single pass itself: its timing is reused (the coupled loop of an online policy
        # is most of a simulation's time)
        base_steady = (
            _steady(base_tm if passes == 1 else timing(baseline, passes=passes)) if cont else base_thr
        )
        for p in pols:
            tm = base_tm if p.spec == "none" else timing(p)
            thr = _aggregate(tm, aggregate)
            steady = thr
            if cont:
                steady = (
                    base_steady
                    if p.spec == "none"
                    else _steady(tm if passes == 1 else timing(p, passes=passes))
                )
            tail = (1.0 - tm.busy_s / tm.total_s if tm.total_s > 0 else 0.0) if cont else None
            head, head_base = (
                (steady, base_steady) if opts.get("continuous_measure") != "makespan" else (thr, base_thr)
            )
            results.append(
                SimResult(
                    batch_size=b,
                    policy=p.spec,
                    throughput_tok_s=head,
                    speedup=head / head_base if head_base > 0 else float("nan"),
                    makespan_throughput_tok_s=thr,
                    makespan_speedup=thr / base_thr if base_thr > 0 else float("nan"),
                    tail_share=tail,
                    steady_throughput_tok_s=steady if cont else None,
                    steady_speedup=(steady / base_steady if base_steady > 0 else float("nan"))
                    if cont
                    else None,
                    time_split_s={"verify": tm.verify_s, "propose": tm.propose_s, "overhead": tm.overhead_s},
                    mean_accepted_len=(tm.produced / tm.request_steps) if tm.request_steps else None,
                    tokens_rejected=tm.rejected,
                    steps=tm.steps,
                    batching=batching,
                    aggregate=aggregate,
                    baseline_throughput_tok_s=head_base,
                    output_tokens=int(tm.tokens.sum()),
                    total_time_s=tm.total_s,
                    num_requests=ta.n,
                )
            )
    return results


def _steady(tm: costs.Timing) -> float:
    return tm.full_tokens / tm.full_s if tm.full_s > 0 else float("nan")


def _fresh(seed: int) -> Any:
    import random

    return random.Random(seed).getstate()
