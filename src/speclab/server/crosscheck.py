"""Does the acceptance a server reports on /metrics equal the engine's own counters for the same requests?

With greedy sampling a request's drafts and acceptances do not depend on what else is in the batch for a
lookup proposer (n-gram, suffix without its global tree) and, in float32, for any proposer whose outputs stay
token-exact. So a server cell and an offline cell that ran the same prompts (same ids, max tokens, EOS
handling, method, k and options) must show the same totals: drafts, draft tokens, accepted tokens and accepted
tokens per position. The offline side is the worker's delta of `LLM.get_metrics()` around the cell
(results.jsonl `spec_counters`); the server side is the delta of two /metrics scrapes around the load.
"""

from __future__ import annotations

from typing import Any

from speclab.bench.sampling import is_sampled_row
from speclab.engine.protocol import SpecCounters

FIELDS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_pos")


def counters_from_row(row: dict[str, Any]) -> SpecCounters | None:
    sc = row.get("spec_counters")
    if not isinstance(sc, dict):
        return None
    return SpecCounters(
        num_drafts=int(sc.get("num_drafts", 0)),
        num_draft_tokens=int(sc.get("num_draft_tokens", 0)),
        num_accepted_tokens=int(sc.get("num_accepted_tokens", 0)),
        accepted_per_pos=[int(x) for x in sc.get("accepted_per_pos") or []],
    )


def compare_counters(server: SpecCounters, offline: SpecCounters) -> tuple[bool, str]:
    """(equal, one line saying what differs or what matched)."""
    n = max(len(server.accepted_per_pos), len(offline.accepted_per_pos))
    sp = server.accepted_per_pos + [0] * (n - len(server.accepted_per_pos))
    op = offline.accepted_per_pos + [0] * (n - len(offline.accepted_per_pos))
    diffs = []
    for f in FIELDS[:3]:
        a, b = getattr(server, f), getattr(offline, f)
        if a != b:
            diffs.append(f"{f} {a} (server) vs {b} (offline)")
    if sp != op:
        diffs.append(f"accepted_per_pos {sp} (server) vs {op} (offline)")
    if diffs:
        return False, "; ".join(diffs)
    return True, (
        f"equal: {server.num_drafts} drafts, {server.num_draft_tokens} draft tokens, "
        f"{server.num_accepted_tokens} accepted, per position {sp}"
    )


def _same_requests(s: dict[str, Any], o: dict[str, Any]) -> bool:
    """Did an offline row run the same requests as a server row, each once? (replicate copies each prompt
    B times, so only its B = 1 runs them once)."""
    keys = (
        "label",
        "method",
        "k",
        "method_options",
        "target",
        "dtype",
        "workload",
        "num_prompts",
        "max_tokens",
        "seed",
    )
    if any(s.get(k) != o.get(k) for k in keys):
        return False
    return o.get("batching") == "continuous" or o.get("batch_size") == 1


def server_vs_offline(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For every ok server SD row that respects EOS (as the offline bench does), the comparison with each
    ok offline row that ran the same requests: {server_cell_id, offline_cell_id, equal, detail}."""
    server = [r for r in rows if r.get("mode") == "server"]
    offline = [r for r in rows if r.get("mode") != "server"]
    out = []
    for s in server:
        if s.get("status") != "ok" or s.get("method") == "none" or s.get("ignore_eos"):
            continue
        if is_sampled_row(s):  # drafts and acceptances of a sampled request depend on its draws: greedy only
            continue
        if (s.get("load") or {}).get("arrivals"):  # a logged replay: each request's own max_tokens
            continue
        sc = counters_from_row(s)
        for o in offline:
            if o.get("status") != "ok" or not _same_requests(s, o):
                continue
            oc = counters_from_row(o)
            if sc is None or oc is None:
                equal, detail = (
                    None,
                    "counters not recorded on both sides (offline rows from before they were)",
                )
            else:
                equal, detail = compare_counters(sc, oc)
            out.append(
                {
                    "server_cell_id": s["cell_id"],
                    "offline_cell_id": o["cell_id"],
                    "equal": equal,
                    "detail": detail,
                }
            )
    return out
