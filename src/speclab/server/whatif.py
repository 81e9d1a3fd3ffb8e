"""What another k (or SD off) would give at a running server's observed batch occupancy: a fixed:METHOD:k
policy priced with a cost model (speclab.costmodel), from the acceptance `speclab watch` read on /metrics.

A closed form of the simulator's steady decode step, with these assumptions (stated in `ASSUMES`):
- B requests decode together every step (B = the mean of `vllm:num_requests_running` over the window's samples with any request
  running: idle moments left out), each
  with `ctx` tokens of context (KV); prefill steps are left out.
- A request drafts in a share f of its steps (f = drafts / request-steps, request-steps = generated tokens -
  accepted tokens: each step yields 1 + accepted tokens), and that share does not depend on k.
- Position j is accepted, given a draft, with the observed rate r_j (accepted at j / drafts: vLLM's
  acceptance per position); a draft of k tokens yields 1 + sum_{j<=k} r_j tokens. So k can only go up to the
  k the server runs (r_j for larger j is not observed); k = 0 is SD off.
- One step costs target(kv = B*ctx, batched = sampled = B*(1 + f*k)) + drafting (the cost model's form for the
  method) + overhead(B, B*f*k).
Output per k: tokens per request-step, step time, output tokens/s, and that rate relative to the observed k.
"""

from __future__ import annotations

from typing import Any

from speclab.costmodel.model import CostModel
from speclab.errors import ConfigError

ASSUMES = (
    "steady decode at the observed occupancy B (prefills left out), the observed draft share f and acceptance "
    "per position r_j; k limited to the server's k (no r_j observed beyond it)"
)


def _draft_time(cm: CostModel, method: str, b: float, ctx: float, k: int, f: float, verify: float) -> float:
    if k == 0 or f <= 0:
        return 0.0
    d = cm.draft_for(method)
    kv = b * ctx
    if d.form == "verify_fraction":
        return d.fraction * verify
    if d.form == "linear":
        return d.kv * kv + d.num_spec * k + d.const
    if d.form == "chained":
        return k * (d.kv * kv + d.const) + d.num_spec * b * f * k
    # forwards: k drafter forwards, the first over every batched token, the others over one per request
    return k * (d.kv * kv + d.const) + d.batched * (b * (1 + f * k) + (k - 1) * b)


def what_if(
    cm: CostModel,
    method: str,
    per_pos: list[float],
    running: float,
    draft_share: float,
    ctx: float,
    observed_k: int | None = None,
) -> list[dict[str, Any]]:
    """One row per k in 0..len(per_pos): tokens per request-step, step time (s), output tokens/s, and the
    ratio to the observed k's rate."""
    if running <= 0:
        raise ConfigError("no request was running in the window: no occupancy to price a step at")
    b, f = float(running), min(max(float(draft_share), 0.0), 1.0)
    rows = []
    for k in range(len(per_pos) + 1):
        batched = b * (1 + f * k)
        verify = float(cm.target_time(b * ctx, batched, batched))
        step = verify + _draft_time(cm, method, b, ctx, k, f, verify) + float(cm.overhead_time(b, b * f * k))
        tokens = 1 + f * sum(per_pos[:k])
        rows.append(
            {
                "k": k,
                "tokens_per_step": tokens,
                "step_s": step,
                "tok_s": b * tokens / step if step > 0 else None,
            }
        )
    ref_k = observed_k if observed_k is not None and observed_k < len(rows) else len(per_pos)
    ref = rows[ref_k]["tok_s"]
    for r in rows:
        r["vs_observed"] = r["tok_s"] / ref if ref and r["tok_s"] is not None else None
    return rows
