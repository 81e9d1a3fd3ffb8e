"""`speclab watch URL`: read a running vLLM's /metrics over a window, without sending any request.

Two scrapes of the counters (start and end of the window; speclab.server.metrics, the same parser and the
same arithmetic as a server cell's row) give: acceptance per draft position (accepted at j / drafts), vLLM's
mean acceptance length (1 + accepted / drafts), draft and accepted token rates, generated tokens/s; the gauge
`vllm:num_requests_running` (and `..._waiting`) is sampled every `interval_s` in between (batch occupancy).
With a cost model, speclab.server.whatif prices other k (and SD off) at the observed occupancy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from speclab.errors import SpeclabError
from speclab.server.metrics import ServerCounters, parse_gauges, parse_metrics
from speclab.server.rows import acceptance

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


def metrics_url(url: str) -> str:
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url if url.endswith("/metrics") else url + "/metrics"


def _get(url: str, timeout: float) -> str:
    from speclab.server.process import http_get

    try:
        status, text = http_get(url, timeout)
    except OSError as exc:
        raise SpeclabError(f"{url}: {exc}") from None
    if status != 200:
        raise SpeclabError(f"{url} answered HTTP {status}")
    return text


def watch(
    url: str,
    window_s: float = 10.0,
    interval_s: float = 1.0,
    get: Callable[[str], str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    stop: Any = None,
) -> dict[str, Any]:
    """Watch the server at `url` for `window_s` seconds, or until `stop` (a threading.Event) is set; the
    reading as a dict (see `reading`)."""
    murl = metrics_url(url)
    fetch = get or (lambda u: _get(u, timeout=max(5.0, interval_s)))
    text = fetch(murl)
    t0 = clock()
    before = parse_metrics(text)
    samples = [parse_gauges(text, (RUNNING, WAITING))]
    scrapes = 1
    while True:
        left = t0 + window_s - clock()
        if left <= 0:
            break
        stopped = stop.wait(min(interval_s, left)) if stop is not None else sleep(min(interval_s, left))
        text = fetch(murl)
        scrapes += 1
        samples.append(parse_gauges(text, (RUNNING, WAITING)))
        if stopped:
            break
    after = parse_metrics(text)
    out = reading(after.minus(before), clock() - t0, samples)
    out.update(url=murl, scrapes=scrapes)
    return out


def reading(c: ServerCounters, elapsed_s: float, samples: list[dict[str, float]]) -> dict[str, Any]:
    """The window's numbers: counter deltas `c` over `elapsed_s`, gauge samples for occupancy."""
    mean_len, per_pos = acceptance(c)
    run = [s[RUNNING] for s in samples if RUNNING in s]
    wait = [s[WAITING] for s in samples if WAITING in s]
    dt = elapsed_s if elapsed_s > 0 else None
    request_steps = c.generation_tokens - c.num_accepted_tokens
    return {
        "window_s": elapsed_s,
        "spec_decode": c.spec_decode,
        "k": len(per_pos) or None,
        "num_drafts": c.num_drafts,
        "num_draft_tokens": c.num_draft_tokens,
        "num_accepted_tokens": c.num_accepted_tokens,
        "accepted_per_pos": [c.accepted_per_pos.get(i, 0) for i in range(len(per_pos))],
        "acceptance_rate_per_pos": per_pos,
        "mean_acceptance_length": mean_len,
        "draft_tok_s": c.num_draft_tokens / dt if dt else None,
        "accepted_tok_s": c.num_accepted_tokens / dt if dt else None,
        "generation_tok_s": c.generation_tokens / dt if dt else None,
        "generation_tokens": c.generation_tokens,
        "prompt_tokens": c.prompt_tokens,
        "requests_finished": c.requests_finished,
        # the share of request-steps that drafted (each step yields 1 + accepted tokens)
        "draft_share": c.num_drafts / request_steps if request_steps > 0 else None,
        "running": _occupancy(run),
        "waiting_mean": sum(wait) / len(wait) if wait else None,
    }


def _occupancy(run: list[float]) -> dict[str, Any] | None:
    """Running requests over the samples: mean, max, and the mean over the samples with any running (the
    batch occupancy while the server was busy, which the what-if prices)."""
    if not run:
        return None
    busy = [x for x in run if x > 0]
    return {
        "mean": sum(run) / len(run),
        "max": max(run),
        "samples": len(run),
        "busy_mean": sum(busy) / len(busy) if busy else 0.0,
        "busy_samples": len(busy),
    }


def context_estimate(r: dict[str, Any]) -> float | None:
    """Mean context per running request from the window's finished requests: prompt + half the output."""
    n = r.get("requests_finished") or 0
    if n <= 0:
        return None
    return (r["prompt_tokens"] + r["generation_tokens"] / 2) / n


def _f(v: Any, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def format_watch(r: dict[str, Any]) -> str:
    """The reading (and its what-if, when present) as a small table."""
    run = r.get("running") or {}
    lines = [
        f"{r['url']}: {r['window_s']:.1f} s, {r['scrapes']} scrapes, no request sent",
        f"  running requests     mean {_f(run.get('mean'))}, max {_f(run.get('max'), '.0f')}, "
        f"{_f(run.get('busy_mean'))} while busy ({run.get('busy_samples', 0)} of {run.get('samples', 0)} samples)"
        f"; waiting mean {_f(r.get('waiting_mean'))}",
        f"  generated tokens/s   {_f(r['generation_tok_s'], '.1f')} ({r['generation_tokens']} tokens, "
        f"{r['requests_finished']} requests finished)",
    ]
    if not r["spec_decode"]:
        lines.append("  spec decode          off (no vllm:spec_decode_* counters on /metrics)")
    elif not r["num_drafts"]:
        lines.append("  spec decode          on, no drafts in the window")
    else:
        lines += [
            f"  drafts               {r['num_drafts']} ({r['num_draft_tokens']} draft tokens, "
            f"{r['num_accepted_tokens']} accepted; drafted in {_f(r['draft_share'], '.0%')} of request-steps)",
            f"  draft / accepted     {_f(r['draft_tok_s'], '.1f')} / {_f(r['accepted_tok_s'], '.1f')} tokens/s",
            f"  mean acceptance len  {_f(r['mean_acceptance_length'], '.3f')}",
            "  acceptance per pos   "
            + "  ".join(f"{j + 1}: {a:.3f}" for j, a in enumerate(r["acceptance_rate_per_pos"])),
        ]
    wi = r.get("what_if")
    if wi:
        lines.append(
            f"what-if ({wi['cost_model']}, fixed:{wi['method']}:k at B = {wi['running']:.2f}, "
            f"context {wi['context_tokens']:.0f} tokens, draft share {wi['draft_share']:.2f}):"
        )
        lines.append(f"  {'k':>4} {'tokens/step':>12} {'step ms':>9} {'tok/s':>9} {'vs now':>8}")
        for row in wi["rows"]:
            k = "off" if row["k"] == 0 else str(row["k"])
            mark = "  <- now" if row["k"] == wi["observed_k"] else ""
            lines.append(
                f"  {k:>4} {row['tokens_per_step']:>12.3f} {row['step_s'] * 1e3:>9.2f} "
                f"{_f(row['tok_s'], '.1f'):>9} {_f(row['vs_observed'], '.3f'):>8}{mark}"
            )
        lines.append(f"  assumes: {wi['assumes']}")
    return "\n".join(lines)
