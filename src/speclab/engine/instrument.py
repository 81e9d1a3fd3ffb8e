"""Time split of vLLM engine steps into drafting, target forward (verification) and the rest.

Works with the engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0, distributed_executor_backend="uni"),
where the model runner is reachable as
`llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner`.
Instance attributes of the runner are wrapped with timers (the class is untouched):

- verify ("target"): `runner._model_forward` (the target model's forward: prefill, decode or verification
  of k+1 tokens per request) plus `runner.model.compute_logits` (the target's lm_head over the sampled
  positions). Calls made while a proposal is running are not counted here.
- propose ("draft:<method>"): `runner.propose_draft_token_ids` (everything the drafter does for one step:
  input preparation, draft model / head forwards, n-gram or suffix lookups), and where the live adaptive
  proposer over the engine's drafter is installed (speclab.live.vllm_eagle), its choice of each row's drafts
  in `runner.take_draft_token_ids`.
- other ("overhead"): the step's wall clock (`LLMEngine.step()`) minus the two above: scheduling, input
  preparation, sampling and rejection sampling, bookkeeping, output processing.

On CPU the clock is synchronous with the compute; on a GPU the wrapped calls are launched asynchronously,
so the wrappers synchronize the device around them (adds a little overhead, makes the split honest).

Per-forward features come from the step's SchedulerOutput: kv_tokens = tokens already in the KV cache
before the step (sum of num_computed_tokens over scheduled requests), batched_tokens = tokens run through
the target this step, num_spec_tokens = draft tokens verified this step, num_requests = scheduled requests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TimingRow:
    kind: str
    kv_tokens: int
    batched_tokens: int
    num_spec_tokens: int
    num_requests: int
    seconds: float

    def as_list(self) -> list[Any]:
        return [
            self.kind,
            self.kv_tokens,
            self.batched_tokens,
            self.num_spec_tokens,
            self.num_requests,
            f"{self.seconds:.6e}",
        ]


@dataclass
class _StepState:
    kv_tokens: int = 0
    batched_tokens: int = 0
    num_spec_tokens: int = 0
    num_requests: int = 0
    verify_s: float = 0.0
    propose_s: float = 0.0
    drafted: int = 0
    proposed_calls: int = 0
    forwards: int = 0


@dataclass
class StepProfiler:
    method: str
    enabled: bool = False
    sync: Any = None  # callable that waits for the device (GPU) or None (CPU)
    rows: list[TimingRow] = field(default_factory=list)
    propose_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    steps: int = 0
    _step: _StepState | None = None
    _in_propose: bool = False

    def reset(self) -> None:
        self.rows = []
        self.propose_s = self.verify_s = self.other_s = 0.0
        self.steps = 0

    # --- hooks into the runner ----------------------------------------------------------------------
    def install(self, runner: Any) -> None:
        prof = self
        orig_execute = runner.execute_model
        orig_forward = runner._model_forward
        orig_propose = getattr(runner, "propose_draft_token_ids", None)
        model = runner.model
        orig_logits = getattr(model, "compute_logits", None)

        def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            if prof._step is not None:
                prof._note_schedule(scheduler_output)
            return orig_execute(scheduler_output, *args, **kwargs)

        def timed(orig: Any, kind: str) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                st = prof._step
                if st is None or (kind == "verify" and prof._in_propose):
                    return orig(*args, **kwargs)
                if prof.sync:
                    prof.sync()
                if kind == "propose":
                    prof._in_propose = True
                t0 = time.perf_counter()
                try:
                    out = orig(*args, **kwargs)
                    if prof.sync:
                        prof.sync()
                finally:
                    dt = time.perf_counter() - t0
                    if kind == "propose":
                        prof._in_propose = False
                if kind == "verify":
                    st.verify_s += dt
                    if orig is orig_forward:
                        st.forwards += 1
                else:
                    st.propose_s += dt
                    st.proposed_calls += 1
                    st.drafted += _count_drafts(out)
                return out

            return wrapper

        orig_take = getattr(runner, "take_draft_token_ids", None)
        if orig_take is not None and getattr(runner, "_speclab_adaptive", None) is not None:
            # the live adaptive proposer over the engine's drafter (speclab.live.vllm_eagle) chooses each
            # row's drafts here, after the step's bookkeeping: drafting time, as a custom proposer's
            def take_draft_token_ids() -> Any:
                st = prof._step
                t0 = time.perf_counter()
                try:
                    return orig_take()
                finally:
                    if st is not None:
                        st.propose_s += time.perf_counter() - t0

            runner.take_draft_token_ids = take_draft_token_ids
        runner.execute_model = execute_model
        runner._model_forward = timed(orig_forward, "verify")
        if orig_propose is not None:
            runner.propose_draft_token_ids = timed(orig_propose, "propose")
        if orig_logits is not None:
            # nn.Module.__setattr__ stores a plain function as an instance attribute
            model.compute_logits = timed(orig_logits, "verify")

    def _note_schedule(self, so: Any) -> None:
        st = self._step
        assert st is not None
        nsched = getattr(so, "num_scheduled_tokens", {}) or {}
        kv = 0
        for r in getattr(so, "scheduled_new_reqs", []) or []:
            kv += int(r.num_computed_tokens)
        cached = getattr(so, "scheduled_cached_reqs", None)
        if cached is not None:
            kv += int(sum(cached.num_computed_tokens))
        spec = getattr(so, "scheduled_spec_decode_tokens", {}) or {}
        st.kv_tokens = kv
        st.batched_tokens = int(getattr(so, "total_num_scheduled_tokens", 0))
        st.num_spec_tokens = int(sum(len(v) for v in spec.values()))
        st.num_requests = len(nsched)

    # --- around each engine step --------------------------------------------------------------------
    def begin_step(self) -> None:
        self._step = _StepState() if self.enabled else None

    def end_step(self, step_seconds: float) -> None:
        st, self._step = self._step, None
        if st is None or st.forwards == 0:
            return  # not profiling, or a step without a model forward (nothing scheduled)
        other = max(0.0, step_seconds - st.verify_s - st.propose_s)
        self.steps += 1
        self.verify_s += st.verify_s
        self.propose_s += st.propose_s
        self.other_s += other
        base = (st.kv_tokens, st.batched_tokens, st.num_spec_tokens, st.num_requests)
        self.rows.append(TimingRow("target", *base, st.verify_s))
        if st.proposed_calls:
            kv_after = st.kv_tokens + st.batched_tokens
            self.rows.append(
                TimingRow(
                    f"draft:{self.method}",
                    kv_after,
                    st.batched_tokens,
                    st.drafted,
                    st.num_requests,
                    st.propose_s,
                )
            )
        self.rows.append(TimingRow("overhead", *base, other))


def _count_drafts(out: Any) -> int:
    """Draft tokens proposed in one call: list of per-request lists (ngram, suffix, custom) or a
    [num_reqs, k] tensor (model-based drafters)."""
    if out is None:
        return 0
    if isinstance(out, list):
        return int(sum(len(x) for x in out))
    numel = getattr(out, "numel", None)
    return int(numel()) if callable(numel) else 0
