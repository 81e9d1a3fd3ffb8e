"""The live adaptive proposer with vLLM's own EAGLE-3 drafter: per request and per step, the lookups' drafts,
the EAGLE head's, or none, and how many (docs/adaptive.md, "With an EAGLE-3 head").

vLLM's `custom_class` seam hands a proposer token ids only, so it cannot run a model drafter. This adapter
takes the other way round: the engine runs with `method = "eagle3"` and the head, so EAGLE's forward runs
at every step exactly as without the adapter (its KV cache sees every verified token, whichever proposer's
drafts were verified: its next forward reads the target's tokens and hidden states, not its own drafts), and
the adapter rewrites the drafts the engine core takes from the model runner before the scheduler sees them:
per row EAGLE's first k drafts, a lookup's draft, or none, as the policy (speclab.live.driver, the
simulator's policy objects) chose.

It relies on these parts of vLLM 0.32 (`check_runner` asserts them, so a vLLM that changes under it fails
at start-up, not silently):

- `runner.sample_tokens(grammar_output)` returns the step's ModelRunnerOutput, whose `sampled_token_ids`
  (per row, empty while prefilling) and `req_id_to_index` are what a custom_class proposer is given;
- `runner.take_draft_token_ids()` returns a DraftTokenIds (`req_ids`, `draft_token_ids`: one list per row),
  called by the engine core after the step without async scheduling (EngineCore.post_step), and passed to
  `Scheduler.update_draft_token_ids`, which takes lists of any length up to k per row (as n-gram's);
- `runner.input_batch` (`req_id_to_index`, `num_tokens_no_spec`, `token_ids_cpu`) holds each row's tokens
  after the step's bookkeeping, as the custom_class path reads them;
- `runner.propose_draft_token_ids(...)` runs the drafter for one step and returns its drafts as a tensor (one
  row per request, k columns); the adapter skips it in the static modes that never keep the head's drafts;
- EAGLE's drafts are greedy (`draft_sample_method` not "probabilistic"): its draft probabilities, kept by the
  runner per row for the rejection sampler, would otherwise belong to tokens the adapter replaced.

Besides the adaptive choice, the adapter has static modes (`set_mode`), so that the adaptive proposer and the
static configurations a user could pick can be measured as arms of one engine start-up: `off` (no drafts),
`ngram:K` (vLLM's n-gram lookup, K drafts) and `<drafter>:K` (the engine's drafter, its first K drafts). In
`off` and `ngram:K` the head's forward is skipped altogether, so those arms cost what an engine without the
head costs (the target still returns the head's input features); a request's head state starts at its
prefill, so a mode is switched between cells, never while requests run.

It is installed through vLLM's worker-extension seam: the engine starts with
`worker_extension_cls = "speclab.engine.sampling_ext.AdaptiveEagleExtension"` and one
`llm.collective_rpc("speclab_adaptive_install", args=(options,))` wraps each worker's runner (speclab's
bench does both for a model-based `[[methods]]` entry with `proposer_options`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np

from speclab.catalog import ADAPTIVE_DRAFTERS, NGRAM_MAX_N, NGRAM_MIN_N
from speclab.costmodel import get_cost_model
from speclab.costmodel.model import CostModel, DraftCost
from speclab.errors import ConfigError
from speclab.live.driver import DEFAULT_COST_MODEL, AdaptiveDriver
from speclab.methods.ngram import vllm_ngram_kernel

#: vLLM's worker_extension_cls that can install the adapter (it also carries the CPU sampling fix)
WORKER_EXTENSION = "speclab.engine.sampling_ext.AdaptiveEagleExtension"
#: the collective_rpc names of that extension: install the adapter, read its decision counts
RPC_INSTALL = "speclab_adaptive_install"
RPC_COUNTS = "speclab_adaptive_counts"
RPC_MODE = "speclab_adaptive_mode"
EAGLE_KEYS = ("methods", "kmax", "cost_model", "policy", "ngram", "suffix")
DEFAULT_LOOKUPS = ("ngram",)
DEFAULT_POLICY = "adaptive"
ADAPTIVE_MODE = "adaptive"  # the adapter's default mode: the policy chooses per row and step (set_mode)
#: what the adapter calls on vLLM's model runner: method -> its parameters (beyond self)
RUNNER_METHODS: dict[str, tuple[str, ...]] = {
    "sample_tokens": ("grammar_output",),
    "take_draft_token_ids": (),
    "propose_draft_token_ids": (
        "scheduler_output",
        "sampled_token_ids",
        "sampling_metadata",
        "hidden_states",
        "sample_hidden_states",
        "aux_hidden_states",
        "spec_decode_metadata",
        "common_attn_metadata",
        "slot_mappings",
    ),
}
INPUT_BATCH_ATTRS = ("req_id_to_index", "num_tokens_no_spec", "token_ids_cpu")
DRAFT_IDS_FIELDS = ("req_ids", "draft_token_ids")
OUTPUT_FIELDS = ("req_id_to_index", "sampled_token_ids")

Choice = tuple[str | None, int, list[int]]


def merge_drafts(
    engine_rows: Sequence[Sequence[int]], choices: Sequence[Choice], engine_method: str
) -> list[list[int]]:
    """Per row: the engine drafter's first k drafts where the policy chose it, the lookup's draft where it
    chose a lookup, none where it chose none."""
    out: list[list[int]] = []
    for row, (name, k, draft) in zip(engine_rows, choices, strict=True):
        if name is None or k <= 0:
            out.append([])
        elif name == engine_method:
            out.append([int(t) for t in row[:k]])
        else:
            out.append([int(t) for t in draft[:k]])
    return out


def _params(fn: Any) -> tuple[str, ...]:
    return tuple(p for p in inspect.signature(fn).parameters if p != "self")


def check_vllm(runner_cls: Any = None) -> None:
    """Assert the vLLM interfaces the adapter relies on (module docstring); raise RuntimeError naming the
    first one that changed."""

    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

    if runner_cls is None:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner as runner_cls
    for name, want in RUNNER_METHODS.items():
        fn = getattr(runner_cls, name, None)
        if fn is None or _params(fn) != want:
            raise RuntimeError(f"speclab adaptive EAGLE: vLLM's {runner_cls.__name__}.{name}{want} changed")
    for cls, fields in ((DraftTokenIds, DRAFT_IDS_FIELDS), (ModelRunnerOutput, OUTPUT_FIELDS)):
        have = {f.name for f in dataclasses.fields(cls)}
        if not set(fields) <= have:
            raise RuntimeError(f"speclab adaptive EAGLE: vLLM's {cls.__name__} lacks {set(fields) - have}")


def check_runner(runner: Any) -> None:
    """check_vllm on the runner's class, and the runner's own state: a model-based drafter, the input
    batch's attributes, no async scheduling, greedy drafts."""
    check_vllm(type(runner))
    sc = getattr(runner, "speculative_config", None)
    if sc is None or sc.method not in ADAPTIVE_DRAFTERS:
        raise RuntimeError(
            f"speclab adaptive EAGLE: the engine must run a model-based drafter it supports (method "
            f"{getattr(sc, 'method', None)!r}); use {', '.join(ADAPTIVE_DRAFTERS)}"
        )
    missing = [a for a in INPUT_BATCH_ATTRS if not hasattr(runner.input_batch, a)]
    if missing:
        raise RuntimeError(f"speclab adaptive EAGLE: vLLM's input batch lacks {missing}")
    if getattr(runner, "use_async_scheduling", False):
        raise RuntimeError(
            "speclab adaptive EAGLE: needs async_scheduling off (the drafts must go through "
            "take_draft_token_ids)"
        )
    if getattr(sc, "draft_sample_method", "greedy") == "probabilistic":
        raise RuntimeError(
            "speclab adaptive EAGLE: needs greedy drafts (draft_sample_method 'probabilistic' keeps draft "
            "probabilities for tokens the adapter replaces)"
        )


def sunk_drafter_cost(cm: CostModel, method: str, k: int) -> CostModel:
    """The cost model as the live choice sees it: the engine runs its drafter at every step for k drafts
    per row whatever the policy chooses, so the drafter's cost is the same for every option (none included).
    Its drafting is moved into the per-step overhead (passes = k: const per pass per step, num_spec per
    draft token per request; the kv term, 0 in the CPU presets, is left out) and choosing it costs nothing
    more."""
    d = cm.draft_for(method)
    if d.form not in ("chained", "linear"):
        raise ConfigError(
            f"adaptive EAGLE: cost model {cm.name!r} prices {method} as {d.form!r}; use chained"
        )
    per_step = d.const * (k if d.form == "chained" else 1)
    return dataclasses.replace(
        cm,
        name=f"{cm.name}, {method} sunk",
        draft={**cm.draft, method: DraftCost("chained", const=0.0)},
        overhead_per_step=cm.overhead_per_step + per_step,
        overhead_per_request=cm.overhead_per_request + d.num_spec * k,
    )


class AdaptiveEagle:
    """The adapter on one model runner: wraps its sample_tokens (to see the step's committed tokens) and
    take_draft_token_ids (to rewrite the drafts per row). `options`: as SpeclabAdaptiveProposer's; `methods`
    lists the lookups and the engine's drafter (default: n-gram and the drafter); the cost model's price of
    the drafter is paid at every step (sunk_drafter_cost)."""

    def __init__(self, runner: Any, options: dict[str, Any] | None = None) -> None:
        check_runner(runner)
        o = dict(options or {})
        bad = sorted(set(o) - set(EAGLE_KEYS))
        if bad:
            raise ValueError(f"adaptive EAGLE: unknown option(s) {bad} (have {list(EAGLE_KEYS)})")
        sc = runner.speculative_config
        self.method = str(sc.method)
        self.k = int(sc.num_speculative_tokens)
        kmax = int(o.get("kmax", self.k))
        if not 1 <= kmax <= self.k:
            raise ValueError(f"adaptive EAGLE: kmax={kmax} must lie in 1..num_speculative_tokens ({self.k})")
        methods = tuple(o.get("methods", (*DEFAULT_LOOKUPS, self.method)))
        self.driver = AdaptiveDriver(
            kmax=kmax,
            max_model_len=getattr(runner, "max_model_len", None),
            methods=methods,
            cost_model=sunk_drafter_cost(
                get_cost_model(str(o.get("cost_model", DEFAULT_COST_MODEL))), self.method, self.k
            ),
            policy=str(o.get("policy", DEFAULT_POLICY)),
            ngram=o.get("ngram"),
            suffix=o.get("suffix"),
            engine_method=self.method,
        )
        self.runner = runner
        self.mode: tuple[str, int] = (ADAPTIVE_MODE, kmax)
        ng = dict(o.get("ngram") or {})
        self._ngram_n = (int(ng.get("min_n", NGRAM_MIN_N)), int(ng.get("max_n", NGRAM_MAX_N)))
        self._ngram_kernel: Any = None
        self._output: Any = None
        self._sample = runner.sample_tokens
        self._take = runner.take_draft_token_ids
        self._propose = runner.propose_draft_token_ids
        runner.sample_tokens = self.sample_tokens
        runner.take_draft_token_ids = self.take_draft_token_ids
        runner.propose_draft_token_ids = self.propose_draft_token_ids

    def set_mode(self, mode: str) -> str:
        """`adaptive`, `off`, `ngram:K` or `<drafter>:K` (1 <= K <= num_speculative_tokens); returns the mode
        as set. Switch between cells, never while requests run (module docstring)."""
        name, _, kk = str(mode).partition(":")
        if name in (ADAPTIVE_MODE, "off") and not kk:
            self.mode = (name, self.k if name == ADAPTIVE_MODE else 0)
            return name
        if name not in ("ngram", self.method) or not kk.isdigit() or not 1 <= int(kk) <= self.k:
            raise ValueError(
                f"adaptive EAGLE: mode {mode!r}: use adaptive, off, ngram:K or {self.method}:K with K in "
                f"1..{self.k}"
            )
        if name == "ngram" and self._ngram_kernel is None:
            self._ngram_kernel = vllm_ngram_kernel()
            if self._ngram_kernel is None:
                raise ValueError(
                    "adaptive EAGLE: mode ngram needs vLLM's n-gram lookup, which did not import"
                )
        self.mode = (name, int(kk))
        return f"{name}:{kk}"

    def propose_draft_token_ids(self, *args: Any, **kwargs: Any) -> Any:
        """The engine's drafter for one step, or, in the modes that never keep its drafts, zeros in its
        place without running it."""
        if self.mode[0] not in ("off", "ngram"):
            return self._propose(*args, **kwargs)
        import torch

        rows = len(self.runner.input_batch.req_ids)
        return torch.zeros((rows, self.k), dtype=torch.int32, device=self.runner.device)

    def sample_tokens(self, grammar_output: Any) -> Any:
        out = self._sample(grammar_output)
        self._output = out
        return out

    def take_draft_token_ids(self) -> Any:
        drafts = self._take()
        out, self._output = self._output, None
        if drafts is None or out is None or not hasattr(out, "sampled_token_ids"):
            return drafts
        drafts.draft_token_ids = self.rewrite(list(drafts.req_ids), list(drafts.draft_token_ids), out)
        return drafts

    def rewrite(self, req_ids: list[str], rows: list[list[int]], out: Any) -> list[list[int]]:
        """The drafts for rows `req_ids` (the engine drafter's `rows`) after the step that produced `out`."""
        ib = self.runner.input_batch
        idx = [ib.req_id_to_index[r] for r in req_ids]
        sampled = [
            out.sampled_token_ids[out.req_id_to_index[r]] if r in out.req_id_to_index else [] for r in req_ids
        ]
        if idx == list(range(len(idx))):
            num, tok = ib.num_tokens_no_spec, ib.token_ids_cpu
        else:  # rows in another order than the batch's: gather them
            num, tok = ib.num_tokens_no_spec[idx], ib.token_ids_cpu[idx]
        name, k = self.mode
        if name == ADAPTIVE_MODE:
            choices = self.driver.choose(sampled, np.asarray(num), tok)
        elif name == "ngram":
            lo, hi = self._ngram_n
            mml = getattr(self.runner, "max_model_len", None) or 2**31 - 1
            choices = [
                ("ngram", k, self._ngram_kernel(np.ascontiguousarray(tok[i, : int(num[i])], dtype=np.int32),
                                                lo, hi, mml, k).tolist())
                if len(sampled[i]) else (None, 0, [])
                for i in range(len(req_ids))
            ]  # fmt: skip
        else:  # off, or the engine's drafter with its first k drafts
            choices = [(None if name == "off" else name, k, []) for _ in req_ids]
        return merge_drafts(rows, choices, self.method)

    def counts(self) -> dict[str, int]:
        """Rows per decision so far: "off", each lookup and the engine's drafter."""
        return dict(self.driver.counts)


def install(runner: Any, options: dict[str, Any] | None = None) -> AdaptiveEagle:
    """Install the adapter on `runner` (idempotent: a second call returns the first adapter)."""
    have = getattr(runner, "_speclab_adaptive", None)
    if have is not None:
        return have
    adapter = AdaptiveEagle(runner, options)
    runner._speclab_adaptive = adapter
    return adapter
