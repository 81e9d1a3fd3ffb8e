"""Map a bench run's observed methods to the speclab proposer (and options) that replays them.

Stateless proposers (n-gram, draft model) are replayed request by request. Suffix decoding (vLLM's built-in
`suffix` and speclab's `custom:SpeclabSuffixProposer`, the same arctic-inference cache) is replayed by
re-enacting each engine of the run (speclab.replay.engine_sim): its global tree depends on every request
the engine ran before and beside the one checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from speclab.bench.results import ResultsStore, effective_options
from speclab.catalog import ADAPTIVE_EAGLE_TRACE, NGRAM_MAX_N, NGRAM_MIN_N
from speclab.methods import make_proposer
from speclab.methods.suffix import SuffixSpeculator, suffix_options
from speclab.traces import RequestTrace

SUFFIX_METHODS = ("suffix", "custom:SpeclabSuffixProposer")
ADAPTIVE_METHOD = "custom:SpeclabAdaptiveProposer"
ADAPTIVE_METHODS = (ADAPTIVE_METHOD, ADAPTIVE_EAGLE_TRACE)  # with the lookups only / with the EAGLE head too
# The adaptive proposer's drafts at a step depend on the live batch (occupancy, KV) and on every earlier
# step's outcome of the request, so no per-position trace of one proposer predicts them; its token-exactness
# is checked against no SD by the bench and its decisions by tests/test_adaptive_live.py.
ADAPTIVE_REFUSAL = (
    "the adaptive proposer chooses method and k per step from the live batch and its own past outcomes: "
    "not replayable per request (its outputs are checked token-exact against no SD instead)"
)
OLD_TRIE_OPTIONS = ("max_depth", "max_match", "min_prob", "spec_factor", "use_global")


def replay_spec(
    method: str, engine_options: dict[str, Any], cli: dict[str, Any]
) -> tuple[str, dict[str, Any]] | str:
    """(speclab method, proposer options) that reproduces an observed engine method, or a reason why
    it cannot be replayed."""
    if method in ("ngram", "custom:SpeclabNgramProposer"):
        lo = engine_options.get("prompt_lookup_min", engine_options.get("min_n"))
        hi = engine_options.get("prompt_lookup_max", engine_options.get("max_n"))
        if lo is None and hi is None:
            # what the engine used: vLLM's built-in defaults to 5/5; speclab's adapter to 3/7
            lo, hi = (5, 5) if method == "ngram" else (NGRAM_MIN_N, NGRAM_MAX_N)
        lo = hi if lo is None else lo  # vLLM fills a missing bound from the other one
        hi = lo if hi is None else hi
        return "ngram", {"min_n": int(lo), "max_n": int(hi), "max_model_len": cli.get("max_model_len")}
    if method in SUFFIX_METHODS:
        # replayed per engine, not per request (make_run_replay_fn); these are its options
        if method != "suffix" and any(k in engine_options for k in OLD_TRIE_OPTIONS):
            return "made with speclab's former Python suffix trie (options max_match/use_global/...): not replayable"
        return "suffix", suffix_options(engine_options)
    if method == "draft_model":
        model = engine_options.get("model") or cli.get("draft_model")
        if not model:
            return "no draft checkpoint recorded (pass --draft-model)"
        try:
            from speclab.models.prepare import resolve_model

            path = str(resolve_model(model, prepare=False))
        except Exception as exc:  # noqa: BLE001 - reported as a skip reason
            return f"draft checkpoint {model!r} unavailable here ({exc})"
        return "draft_model", {
            "model": path,
            "max_model_len": cli.get("max_model_len"),
            "threads": cli.get("threads"),
        }
    if method == "eagle3":
        head = engine_options.get("model") or cli.get("eagle3_head")
        target = cli.get("target")
        if not head:
            return "no EAGLE-3 head recorded (pass --eagle3-head)"
        if not target:
            return "no target recorded (pass --target)"
        dtype = str(cli.get("dtype") or "float32")
        try:
            from speclab.models.prepare import resolve_model

            head_path = str(resolve_model(head, prepare=False))
            target_path = str(resolve_model(target, dtype, prepare=False))
        except Exception as exc:  # noqa: BLE001 - reported as a skip reason
            return f"EAGLE-3 head {head!r} or target {target!r} unavailable here ({exc})"
        return "eagle3", {
            "head": head_path,
            "target": target_path,
            "dtype": dtype,
            "max_model_len": cli.get("max_model_len"),
            "threads": cli.get("threads"),
        }
    if method in ADAPTIVE_METHODS:
        return ADAPTIVE_REFUSAL
    return f"no speclab replay for {method!r}"


def make_run_replay_fn(run: Path, cli: dict[str, Any]):
    """A replay_fn for crosscheck_records, plus {method: reason} for methods it cannot replay.

    The method options and max_model_len come from the record's meta["observed"] where the bench recorded
    them; for older runs, the options come from the cell's row in results.jsonl and max_model_len from cli.
    Suffix methods come from re-enacting the run's engines (RUN/engines/*/attempt-*)."""
    rows: dict[str, dict[str, Any]] | None = None  # results.jsonl, read only if a record needs it
    proposers: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    cache: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    engine: dict[tuple[str, str, int], tuple[np.ndarray, np.ndarray]] | None = None

    def fn(rec: RequestTrace, method: str, k: int, observed: dict[str, Any]):
        nonlocal rows, engine
        if method in SUFFIX_METHODS:
            if engine is None:
                engine = _replay_engines(Path(run), cli, skipped)
            got = engine.get((str(rec.meta.get("cell_id")), str(rec.meta.get("prompt_id", rec.id)), 0))
            if got is None:
                skipped.setdefault(method, "no engine record of this request (RUN/engines/*/job.json)")
            return got
        if "options" in observed:
            eopts = dict(observed["options"] or {})
        else:
            if rows is None:
                rows = ResultsStore(run).rows  # empty when run is not a bench run dir
            row = rows.get(str(rec.meta.get("cell_id")), {})
            eopts = effective_options(str(row.get("method", "")), dict(row.get("method_options") or {}))
        mml = observed.get("max_model_len")
        here = dict(cli if mml is None else {**cli, "max_model_len": mml})
        # the engine's target and dtype (model-fed drafters: EAGLE-3 reads the target's hidden states)
        here["target"] = rec.meta.get("target") or cli.get("target")
        here["dtype"] = rec.meta.get("dtype") or cli.get("dtype")
        spec = replay_spec(method, eopts, here)
        if isinstance(spec, str):
            skipped[method] = spec
            return None
        name, opts = spec
        okey = json.dumps([name, opts], sort_keys=True, default=str)
        if okey not in proposers:
            proposers[okey] = make_proposer(name, **opts)
        ck = (okey + f"|{k}", rec.id)
        if ck not in cache:
            cache[ck] = proposers[okey].replay(rec.prompt_token_ids, rec.output_token_ids, k)
        return cache[ck]

    return fn, skipped


def _replay_engines(
    run: Path, cli: dict[str, Any], skipped: dict[str, str]
) -> dict[tuple[str, str, int], tuple[np.ndarray, np.ndarray]]:
    """Re-enact every suffix engine of the run: {(cell_id, prompt_id, copy): (acc_len, num_proposed)}."""
    from speclab.replay.engine_sim import attempt_dirs, per_position, replay_attempt

    name = "suffix"

    def make_spec(method: str, options: dict[str, Any], k: int | None):
        nonlocal name
        if method == "suffix":
            name = "suffix"
        elif method == "custom_class" and str(options.get("model", "")).endswith(".SpeclabSuffixProposer"):
            name = "custom:SpeclabSuffixProposer"
            options = effective_options(method, options)
        else:
            return "not a suffix engine"
        spec = replay_spec(name, options, cli)
        if isinstance(spec, str):
            skipped[name] = spec
            return spec
        return SuffixSpeculator(**spec[1]), int(k or 0)

    out: dict[tuple[str, str, int], tuple[np.ndarray, np.ndarray]] = {}
    for ad in attempt_dirs(run):
        got = replay_attempt(ad, make_spec)
        if isinstance(got, str):
            if got != "not a suffix engine":
                skipped.setdefault(name, f"{ad.parent.name}: {got}")
            continue
        out.update({key: per_position(req) for key, req in got.items()})
    return out


def record_sampling_in_run(rec: RequestTrace, rows: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """A bench record's sampling settings: its meta["sampling"], else its cell's row fields (temperature,
    top_p, top_k); None when greedy (temperature 0 or no fields)."""
    s = rec.meta.get("sampling")
    if not isinstance(s, dict):
        row = rows.get(str(rec.meta.get("cell_id")), {})
        s = {k: row.get(k) for k in ("temperature", "top_p", "top_k")}
    if not float(s.get("temperature") or 0.0) > 0.0:
        return None
    return {"temperature": float(s["temperature"]), "top_p": float(s.get("top_p") or 1.0),
            "top_k": int(s.get("top_k") or 0)}  # fmt: skip


class SharedProbs:
    """The target's distributions of a (prompt, output, sampling) that several replay groups score (e.g.
    one output under two methods' cells), computed once and kept until its last group took it; every
    other one is computed and passed on (a group scores each of its distinct records once)."""

    def __init__(self, scorer: Any, groups: list[list[RequestTrace]]) -> None:
        self.scorer = scorer
        self.left: dict[str, int] = {}
        for recs in groups:
            for key in {self.key(r.prompt_token_ids, r.output_token_ids, r.meta["sampling"]) for r in recs}:
                self.left[key] = self.left.get(key, 0) + 1
        self.kept: dict[str, Any] = {}

    @staticmethod
    def key(prompt_ids: Any, output_ids: Any, sampling: dict[str, Any]) -> str:
        a, b = np.asarray(prompt_ids, np.int64), np.asarray(output_ids, np.int64)
        return a.tobytes().hex() + "|" + b.tobytes().hex() + "|" + json.dumps(sampling, sort_keys=True)

    def probs(self, prompt_ids: Any, output_ids: Any, sampling: dict[str, Any]) -> Any:
        key = self.key(prompt_ids, output_ids, sampling)
        got = self.kept.pop(key, None)
        if got is None:
            got = self.scorer.probs(prompt_ids, output_ids, sampling)
        self.left[key] = self.left.get(key, 1) - 1
        if self.left[key] > 0:
            self.kept[key] = got
        return got


def _counting(label: str, total: int, report: Any):
    """A replay_records `progress` wrapper calling report(label, done, total) after each record."""

    def wrap(it: Any) -> Any:
        for done, i in enumerate(it, 1):
            yield i
            report(label, done, total)

    return wrap


def expected_traces(
    run: Path, records: list[RequestTrace], cli: dict[str, Any], scorer: Any, progress: Any = None
) -> tuple[dict[str, tuple[Any, dict[str, Any]]], dict[str, str]]:
    """accept_prob for every sampled record with observed acceptance: {record id: (MethodTrace, sampling)},
    and {method: reason} for those it cannot give. Records are replayed (speclab.replay.replay) in groups
    of one method, k and options, along their own output; suffix's global tree follows the run's record
    order (not the engine re-enacted). `scorer` gives the target's distributions (TargetScorer); each model
    is loaded once, and each distribution computed once however many groups need it. `progress(label,
    done, total)`, if given, is called after each record of a group."""
    from speclab.replay.replay import replay_records

    rows = ResultsStore(run).rows if run.is_dir() else {}
    skipped: dict[str, str] = {}
    groups: dict[str, tuple[str, int, dict[str, Any], list[RequestTrace]]] = {}
    samplings: dict[str, dict[str, Any]] = {}
    for rec in records:
        obs = rec.meta.get("observed")
        sampling = record_sampling_in_run(rec, rows) if obs and rec.output_token_ids is not None else None
        if sampling is None:
            continue
        method, k = str(obs["method"]), int(obs["k"])
        row = rows.get(str(rec.meta.get("cell_id")), {})
        eopts = dict(obs["options"] or {}) if "options" in obs else effective_options(
            str(row.get("method", "")), dict(row.get("method_options") or {}))  # fmt: skip
        here = {**cli, "target": rec.meta.get("target") or cli.get("target"),
                "dtype": rec.meta.get("dtype") or cli.get("dtype")}  # fmt: skip
        spec = replay_spec(method, eopts, here) if method not in ADAPTIVE_METHODS else ADAPTIVE_REFUSAL
        if isinstance(spec, str):
            skipped[method] = spec
            continue
        # model drafters: what the engine ran (the method's draft_sample_method, vLLM's default "greedy")
        ds = str(eopts.get("draft_sample_method") or cli.get("draft_sampling") or "greedy")
        key = json.dumps([method, k, spec, ds], sort_keys=True, default=str)
        copy = RequestTrace(rec.id, rec.workload, rec.category, rec.prompt_len, rec.output_len,
                            prompt_token_ids=rec.prompt_token_ids, output_token_ids=rec.output_token_ids,
                            meta={"sampling": sampling})  # fmt: skip
        groups.setdefault(key, (spec[0], k, spec[1], ds, []))[4].append(copy)
        samplings[rec.id] = sampling
    out: dict[str, tuple[Any, dict[str, Any]]] = {}
    shared = SharedProbs(scorer, [g[4] for g in groups.values()])
    models: dict[str, Any] = {}
    for gi, (name, k, opts, ds, recs) in enumerate(groups.values(), 1):
        label = f"[{gi}/{len(groups)}] {name} k={k}"
        replay_records(recs, [name], k, {name: opts}, scorer=lambda: shared, draft_sampling=ds, models=models,
                       progress=_counting(label, len(recs), progress) if progress else None)  # fmt: skip
        for r in recs:
            if r.methods[name].accept_prob is not None:
                out[r.id] = (r.methods[name], samplings[r.id])
    return out, skipped
