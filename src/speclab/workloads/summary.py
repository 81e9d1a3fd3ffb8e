"""`speclab workloads inspect PATH`: what a prompts file or request log holds, before any run.

Count, prompt lengths in tokens (the target's tokenizer and chat template when one is given, else words and
punctuation marks as an approximation), what the requests asked for (max_tokens, temperature, model, arrival
times) and the n-gram overlap potential: the study's BLEU-4-style overlap of known outputs (`reference`, and
earlier assistant turns of a conversation) against the text before them.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from typing import Any

from speclab.workloads.arrivals import pattern, pattern_lines
from speclab.workloads.base import Prompt, seeded_sample
from speclab.workloads.files import parse_file
from speclab.workloads.overlap import _units, ngram_overlap

NGRAM_WINS = 0.6  # the study: n-gram drafting wins once the overlap exceeds about this


def _percentile(sorted_vals: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    i = max(0, min(len(sorted_vals) - 1, math.ceil(q / 100 * len(sorted_vals)) - 1))
    return sorted_vals[i]


def distribution(values: list[float]) -> dict[str, float]:
    v = sorted(values)
    if not v:
        return {}
    out = {"min": v[0], "p50": _percentile(v, 50), "p90": _percentile(v, 90), "p99": _percentile(v, 99)}
    out.update({"max": v[-1], "mean": sum(v) / len(v)})
    return out


def _overlaps(prompts: list[Prompt]) -> dict[str, Any]:
    ref = [ngram_overlap(p.text, p.reference) for p in prompts if p.reference]
    hist = []
    for p in prompts:
        for i, m in enumerate(p.messages):
            if i and m["role"] == "assistant" and m["content"].strip():
                context = "\n\n".join(x["content"] for x in p.messages[:i])
                hist.append(ngram_overlap(context, m["content"]))

    def stats(vals: list[float]) -> dict[str, Any] | None:
        if not vals:
            return None
        d = distribution(vals)
        share = sum(1 for x in vals if x > NGRAM_WINS) / len(vals)
        return {"n": len(vals), "mean": d["mean"], "median": d["p50"], "share_above_0.6": share}

    out: dict[str, Any] = {"reference": stats(ref), "history": stats(hist)}
    basis = out["reference"] or out["history"]
    if basis is None:
        out["verdict"] = (
            "unknown: the file holds no outputs (no reference, no earlier assistant turns); "
            "bench it with methods none + ngram to measure"
        )
    elif basis["mean"] > NGRAM_WINS:
        out["verdict"] = "high: n-gram and suffix drafting have a good chance (n-gram wins above ~0.6)"
    elif basis["mean"] >= 0.3:
        out["verdict"] = "moderate: worth benching n-gram and suffix against a draft model"
    else:
        out["verdict"] = (
            "low: outputs rarely copy the prompt; n-gram is unlikely to pay, prefer a draft model or EAGLE "
            "(suffix may still gain from text repeated across requests)"
        )
    return out


def _requests(prompts: list[Prompt], fmt: str) -> dict[str, Any]:
    meta = [p.meta for p in prompts]
    mt = [m["max_tokens"] for m in meta if "max_tokens" in m]
    arrivals = sorted(m["arrival_s"] for m in meta if "arrival_s" in m)
    span = arrivals[-1] - arrivals[0] if arrivals else 0.0
    return {
        "max_tokens": {"n": len(mt), **distribution(mt)} if mt else None,
        "temperature_above_0": sum(1 for m in meta if m.get("temperature", 0.0) > 0),
        # a request without temperature gets the server's default (1.0 on OpenAI-compatible servers)
        "temperature_missing": sum(1 for m in meta if "temperature" not in m) if fmt == "request-log" else 0,
        "models": dict(Counter(m["model"] for m in meta if "model" in m).most_common()),
        "completions_raw": sum(1 for m in meta if m.get("chat_template") is False),
        "arrival": (
            {
                "n": len(arrivals),
                "span_s": span,
                "rate_per_s": (len(arrivals) - 1) / span if span > 0 else None,
                "pattern": pattern(arrivals),  # rate over time, burstiness (workloads.arrivals)
            }
            if arrivals
            else None
        ),
    }


def summarize_file(
    path: str | os.PathLike[str],
    fmt: str = "auto",
    tokenizer: Any = None,
    max_prompt_tokens: int | None = None,
    limit: int | None = None,
    seed: int = 0,
    skip_invalid: bool = False,
) -> dict[str, Any]:
    """The summary `workloads inspect` prints. tokenizer: a HF tokenizer (or None: approximate lengths).
    limit/seed: the same seeded sample a sweep with num_prompts=limit and this seed would draw."""
    pf = parse_file(path, fmt, skip_invalid=skip_invalid)
    prompts = seeded_sample(pf.prompts, limit, seed)
    if tokenizer is not None:
        from speclab.workloads.render import render_prompt

        lengths = [len(render_prompt(p, tokenizer)[0]) for p in prompts]
        unit = "tokens"
    else:
        lengths = [sum(len(_units(m["content"])) for m in p.messages) for p in prompts]
        unit = "words"
    out: dict[str, Any] = {
        "path": str(pf.path),
        "format": pf.format,
        "requests": pf.rows,
        "duplicates_dropped": pf.duplicates,
        "invalid_skipped": len(pf.invalid),
        "first_invalid": pf.invalid[0] if pf.invalid else None,
        "prompts": len(pf.prompts),
        "inspected": len(prompts),
        "category": pf.category,
        "categories": dict(Counter(p.category for p in prompts).most_common()),
        "with_reference": sum(1 for p in prompts if p.reference),
        "length_unit": unit,
        "prompt_length": distribution(lengths),
        "over_budget": (
            sum(1 for n in lengths if n > max_prompt_tokens)
            if max_prompt_tokens and unit == "tokens"
            else None
        ),
        "requests_asked": _requests(prompts, pf.format),
        "overlap": _overlaps(prompts),
    }
    return out


def _fmt_dist(d: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.0f}" if k != "mean" else f"{k} {v:.1f}" for k, v in d.items())


def format_summary(
    s: dict[str, Any], tokenizer_name: str | None = None, max_prompt_tokens: int | None = None
) -> str:
    """The summary as a few lines of text."""
    lines = [f"{s['path']}: format {s['format']}, {s['requests']} requests -> {s['prompts']} prompts"]
    if s["duplicates_dropped"]:
        lines[0] += f" ({s['duplicates_dropped']} repeated, dropped)"
    if s["invalid_skipped"]:
        lines.append(f"skipped {s['invalid_skipped']} invalid lines (first: {s['first_invalid']})")
    if s["inspected"] != s["prompts"]:
        lines.append(f"inspected a seeded sample of {s['inspected']} (as a sweep with this num_prompts/seed)")
    cats = ", ".join(f"{k} {v}" for k, v in s["categories"].items())
    lines.append(
        f"category: {s['category']} (per line: {cats}); with a reference output: {s['with_reference']}"
    )
    if s["length_unit"] == "tokens":
        what = f"tokens, {tokenizer_name or 'the given tokenizer'}, chat template applied"
        if s["requests_asked"]["completions_raw"]:
            what += " (completions requests: raw text)"
    else:
        what = "words and punctuation marks, approximate: no --tokenizer given"
    lines.append(f"prompt length ({what}): {_fmt_dist(s['prompt_length'])}")
    if s["over_budget"]:
        lines.append(
            f"  {s['over_budget']} longer than {max_prompt_tokens} tokens (the bench truncates their body)"
        )
    r = s["requests_asked"]
    if r["max_tokens"]:
        mt = r["max_tokens"]
        lines.append(
            f"max_tokens asked by {mt['n']} ({mt['min']:.0f}-{mt['max']:.0f}, median {mt['p50']:.0f}): kept in "
            "meta; the bench generates up to its sweep's max_tokens for every prompt "
            '(sampling = "as-logged": each its own)'
        )
    if r["temperature_above_0"] or r["temperature_missing"]:
        lines.append(
            f"temperature > 0 in {r['temperature_above_0']}"
            + (
                f", not given in {r['temperature_missing']} (server default)"
                if r["temperature_missing"]
                else ""
            )
            + ": the bench decodes at its sweep's temperatures (greedy by default, so SD outputs can be checked "
            'token for token); sampling = "as-logged" runs each request with its own settings'
        )
    if r["models"]:
        lines.append("models asked for: " + ", ".join(f"{k} ({v})" for k, v in r["models"].items()))
    if r["completions_raw"]:
        lines.append(
            f"completions requests (prompt, sent as raw text, no chat template): {r['completions_raw']}"
        )
    if r["arrival"]:
        a = r["arrival"]
        rate = f", {a['rate_per_s']:.3g} req/s" if a["rate_per_s"] else ""
        lines.append(
            f"arrival times: {a['n']} over {a['span_s']:.1f} s{rate} (kept in meta['arrival_s'] for a "
            "server-mode replay)"
        )
        lines += pattern_lines(a.get("pattern"))
    ov = s["overlap"]
    lines.append("n-gram overlap potential (BLEU-4 style, the study's statistic):")
    for key, label in (
        ("reference", "reference outputs vs prompt"),
        ("history", "earlier assistant turns vs context"),
    ):
        o = ov[key]
        if o:
            lines.append(
                f"  {label} ({o['n']}): mean {o['mean']:.2f}, median {o['median']:.2f}, "
                f"{100 * o['share_above_0.6']:.0f}% above {NGRAM_WINS}"
            )
    lines.append(f"  -> {ov['verdict']}")
    return "\n".join(lines)
