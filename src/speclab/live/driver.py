"""The simulator's adaptive policies driven live inside vLLM, one engine step at a time (docs/adaptive.md).

`AdaptiveDriver.step` takes what vLLM hands a `custom_class` proposer (per running row: this step's
committed tokens and the row's whole context; rows compacted, no request ids) and returns each row's draft.
It decides nothing itself: every step it builds the simulator's `StepView` for the decoding rows and calls
the policy object the simulator runs (`speclab.policy`: `adaptive`, `adaptive-pooled` or `adaptive-gated`),
so the live proposer and the simulated policy are one rule. What the driver adds is the bookkeeping an
engine has to do to feed that view from observable signals only:

- request identity: a row is recognised by a hash of the context it had at the previous call (as the suffix
  adapter does); a context seen for the first time is a new request (its prompt = context before this
  step's tokens);
- the probes: the model-free proposers it is given (n-gram: vLLM's own compiled lookup where vLLM imports, else
  speclab's index; suffix: speclab's driver of arctic-inference's cache) run on every decoding row every
  step, with up to KMAX drafts, whatever is chosen; their drafts now are the current offers
  (`StepView.num_proposed`), and their drafts at earlier positions, checked against the output known now,
  are the hindsight (`StepView.hindsight` / `past_offers`);
- the outcome of the previous step: accepted = len(sampled) - 1 after a non-empty draft (the scheduler's
  own formula), passed to `Policy.observe`;
- the live batch: occupancy = rows in the call (prefilling rows included), batch KV = their tokens.

With `engine_method` (speclab.live.vllm_eagle) the engine runs a model drafter itself at every step; the
policy may choose it like a lookup, and `choose` then says how many of the engine's drafts a row keeps.

A position the engine stepped over (inside a multi-token step) was never probed; it is given the draft of
the last probed position shifted by the distance (the same source span, continued), which is what the
lookup proposers nearly always return there. Censored matches (a draft that still agrees with everything
generated so far) are extended as later tokens arrive, so hindsight at a position is the match against the
output known now, as in the simulator.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speclab.catalog import MODEL_BASED, NGRAM_MAX_N, NGRAM_MIN_N
from speclab.costmodel import get_cost_model
from speclab.costmodel.model import CostModel
from speclab.errors import ConfigError
from speclab.methods.ngram import IncrementalNgram, vllm_ngram_kernel
from speclab.methods.suffix import SuffixSpeculator, suffix_options
from speclab.policy import AdaptiveBase, PolicyContext, StepOutcome, StepView, make_policy
from speclab.policy.pooling import RATE_WINDOW

DEFAULT_COST_MODEL = "smollm2-135m-cpu-live"
LIVE_METHODS = ("ngram", "suffix")  # model-free proposers the driver can run as probes
# what the vLLM adapter (SpeclabAdaptiveProposer) runs without options: the n-gram probe only, with the
# lookup priors pooled over the requests served; on one engine start-up it was the faster of the two
# against the rule with both probes, at a quarter to a half of its time per step
# (docs/results/2026-12-03-adaptive-live.md)
ENGINE_DEFAULT_METHODS = ("ngram",)
ENGINE_DEFAULT_POLICY = "adaptive-pooled"
WINDOW = RATE_WINDOW  # positions of hindsight kept per request (what the rule reads)
_CAPACITY = 256  # initial size of the policy's per-request arrays (slots are recycled)


def ctx_key(ids: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(ids, dtype=np.int32).tobytes(), digest_size=16).digest()


@dataclass
class _History:
    """One probe's record for one request: acc_len (1 + drafts matching the output known now) and the
    number of drafts offered, per output position; `open` holds positions whose draft still agrees with
    everything generated so far (censored: extended when more tokens arrive)."""

    acc: list[int] = field(default_factory=list)
    off: list[int] = field(default_factory=list)
    open: dict[int, list[int]] = field(default_factory=dict)
    last: tuple[int, list[int]] | None = None  # (position, draft) of the latest probe

    def advance(self, out: list[int], start: int, end: int) -> None:
        """Record positions start..end-1 (new since the last call) and extend censored matches; `out` is
        the request's output known now (length end). Plain lists: a few short drafts per row and step, where
        numpy's per-call cost would dominate."""
        for q in range(start, end):
            if self.last is None:
                d: list[int] = []  # before the first probe (position 0 is prefill)
            else:
                q0, d0 = self.last
                d = d0[q - q0 :]
            self.acc.append(1)
            self.off.append(len(d))
            if d:
                self.open[q] = d
        for q, d in list(self.open.items()):
            n = min(len(d), end - q)
            m = 0
            while m < n and d[m] == out[q + m]:
                m += 1
            self.acc[q] = 1 + m
            if m < n or m == len(d):  # a miss, or the whole draft matched: final
                del self.open[q]
        # keep memory bounded: nothing older than the window is read
        if len(self.open) > WINDOW:
            for q in sorted(self.open)[:-WINDOW]:
                del self.open[q]


@dataclass
class _Request:
    slot: int  # index into the policy's per-request arrays
    prompt_len: int
    steps: int = 0  # SD steps taken (calls after the first)
    last_method: int = -1
    last_k: int = 0
    hist: dict[str, _History] = field(default_factory=dict)
    suffix_id: str | None = None
    ngram: IncrementalNgram | None = None
    pos: int = 0  # output position at the latest call


class AdaptiveDriver:
    """Per engine: the policy, the probes and each running request's record.

    `methods`: the model-free proposers to choose among (ngram, suffix); `kmax`: the most drafts per step
    (<= the engine's num_speculative_tokens); `cost_model`: name or path (prices the goodput);
    `policy`: a registered adaptive policy family (`adaptive`, `adaptive-pooled` or `adaptive-gated`)."""

    def __init__(
        self,
        kmax: int,
        max_model_len: int | None = None,
        methods: Sequence[str] = LIVE_METHODS,
        cost_model: str | CostModel = DEFAULT_COST_MODEL,
        policy: str = "adaptive",
        ngram: dict[str, Any] | None = None,
        suffix: dict[str, Any] | None = None,
        ngram_impl: str = "auto",
        engine_method: str | None = None,
    ) -> None:
        methods = tuple(methods)
        model = [m for m in methods if m in MODEL_BASED and m != engine_method]
        if model:
            raise ConfigError(
                f"adaptive proposer: {model[0]!r} is model-based; a custom_class proposer cannot run it "
                f"(vLLM gives it no hidden states); use {', '.join(LIVE_METHODS)}"
            )
        have = (*LIVE_METHODS, engine_method) if engine_method else LIVE_METHODS
        bad = [m for m in methods if m not in have]
        if bad:
            raise ConfigError(f"adaptive proposer: unknown method {bad[0]!r} (have: {', '.join(have)})")
        if not methods or len(set(methods)) != len(methods):
            raise ConfigError("adaptive proposer: methods must be a non-empty list without repeats")
        if kmax < 1:
            raise ConfigError(f"adaptive proposer: kmax must be >= 1, got {kmax}")
        self.kmax = int(kmax)
        self.max_model_len = max_model_len
        self.cm = get_cost_model(cost_model)
        spec = f"{policy}:{','.join(methods)}:{self.kmax}"
        pol = make_policy(spec)
        if not isinstance(pol, AdaptiveBase):
            raise ConfigError(f"adaptive proposer: policy {policy!r} is not an adaptive policy")
        pol.bind(methods, self.cm, named=True)
        missing = [m for m in methods if m in LIVE_METHODS and m not in pol.probes]
        if missing:
            raise ConfigError(
                f"adaptive proposer: cost model {self.cm.name!r} must charge {missing[0]} as a probe "
                "(form verify_fraction)"
            )
        pol.cost_model = self.cm
        self.policy = pol
        self.methods = methods
        # the model-based drafter the engine runs itself at every step (its drafts are the engine's; the
        # driver only says per row whether to keep them and how many): speclab.live.vllm_eagle
        self.engine_method = engine_method if engine_method in methods else None
        self._cap = _CAPACITY
        pol.begin(
            PolicyContext(num_requests=self._cap, batch_size=0, k_max=dict.fromkeys(methods, self.kmax))
        )
        self._free: list[int] = []
        self._next_slot = 0
        self.probes: dict[str, Callable[[_Request, np.ndarray, Sequence[int], int], list[int]]] = {}
        self._kernel: Callable[..., np.ndarray] | None = None  # vLLM's n-gram lookup, when used
        if "ngram" in methods:
            o = dict(ngram or {})
            self.min_n, self.max_n = int(o.pop("min_n", NGRAM_MIN_N)), int(o.pop("max_n", NGRAM_MAX_N))
            if not 1 <= self.min_n <= self.max_n:
                raise ConfigError(
                    f"adaptive proposer: ngram needs 1 <= min_n <= max_n, got {self.min_n}, {self.max_n}"
                )
            if o:
                raise ConfigError(f"adaptive proposer: unknown ngram option(s): {', '.join(sorted(o))}")
            if ngram_impl not in ("auto", "vllm", "python"):
                raise ConfigError(f"adaptive proposer: ngram_impl {ngram_impl!r}: use auto, vllm or python")
            self._kernel = vllm_ngram_kernel() if ngram_impl != "python" else None
            if ngram_impl == "vllm" and self._kernel is None:
                raise ConfigError(
                    "adaptive proposer: ngram_impl 'vllm' but vLLM's n-gram kernel cannot be imported"
                )
            # the kernel takes an int limit; no limit = larger than any context
            self._mml = max_model_len if max_model_len is not None else 2**31 - 1
            self.probes["ngram"] = self._probe_ngram
        if "suffix" in methods:
            self._suffix = SuffixSpeculator(**suffix_options(dict(suffix or {}), strict=True))
            self.probes["suffix"] = self._probe_suffix
        self._reqs: dict[bytes, list[_Request]] = {}
        # counters for tests and logs: decisions per method name ("off" = no drafts) and rows seen
        self.counts: dict[str, int] = dict.fromkeys(("off", *methods), 0)
        # rows whose probes ran / were skipped by a gated policy (adaptive-gated: AdaptiveBase.gate)
        self.probe_rows: dict[str, int] = {"probed": 0, "skipped": 0}

    # --- probes ---------------------------------------------------------------------------------------
    def _kernel_draft(self, context: np.ndarray) -> list[int]:
        assert self._kernel is not None
        return self._kernel(context, self.min_n, self.max_n, self._mml, self.kmax).tolist()

    def _probe_ngram(self, req: _Request, row: np.ndarray, sampled: Sequence[int], n: int) -> list[int]:
        if self._kernel is not None:
            return self._kernel_draft(row[:n])
        if req.ngram is None:
            req.ngram = IncrementalNgram(self.min_n, self.max_n, self.max_model_len)
        g = req.ngram
        g.extend(row[len(g.toks) : n].tolist())
        return g.propose(self.kmax)

    def _probe_suffix(self, req: _Request, row: np.ndarray, sampled: Sequence[int], n: int) -> list[int]:
        if req.suffix_id is None:
            req.suffix_id = self._suffix.new_id()
        d = self._suffix.step(
            req.suffix_id, row[: n - len(sampled)], sampled, row, self.kmax, self.max_model_len
        )
        return [int(t) for t in d]

    def _probe_prompt(self, req: _Request, row: np.ndarray, plen: int) -> None:
        """A new request's position 0 (context = the prompt; its token came from prefill): what each probe
        would have drafted there, so hindsight starts at position 0 as in a replayed trace."""
        if "ngram" in self.probes and self._kernel is not None:
            req.hist["ngram"].last = (0, self._kernel_draft(row[:plen]))
        elif "ngram" in self.probes:
            req.ngram = IncrementalNgram(self.min_n, self.max_n, self.max_model_len)
            req.ngram.extend(row[:plen].tolist())
            req.hist["ngram"].last = (0, req.ngram.propose(self.kmax))
        if "suffix" in self.probes:
            # as the suffix replay does at position 0: the request enters the cache with its prompt and
            # speculates once before its first token is added (SuffixSpeculator.step continues from here)
            sp = self._suffix
            req.suffix_id = sp.new_id()
            prompt = np.ascontiguousarray(row[:plen], dtype=np.int32)
            sp.cache.start_request(req.suffix_id, prompt)
            limit = self.kmax if self.max_model_len is None else min(self.kmax, self.max_model_len - plen - 1)
            d: Any = []
            if limit > 0:
                d = sp.cache.speculate(
                    req.suffix_id,
                    prompt[max(0, plen - sp.max_tree_depth) :],
                    max_spec_tokens=limit,
                    max_spec_factor=sp.max_spec_factor,
                    min_token_prob=sp.min_token_prob,
                ).token_ids
            req.hist["suffix"].last = (0, [int(t) for t in d])

    # --- request slots ---------------------------------------------------------------------------------
    def _new_request(self, prompt_len: int) -> _Request:
        if self._free:
            slot = self._free.pop()
        else:
            slot = self._next_slot
            self._next_slot += 1
            if slot >= self._cap:
                self._grow()
        self.policy.reset_request(slot)  # a recycled slot starts from the prior
        return _Request(slot, prompt_len, hist={m: _History() for m in self.probes})

    def _grow(self) -> None:
        self._cap *= 2
        self.policy.grow(self._cap)

    # --- one engine step -------------------------------------------------------------------------------
    def step(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens: np.ndarray,
        token_ids: np.ndarray,
    ) -> list[list[int]]:
        """One proposer call: per row, this step's committed tokens (empty while prefilling), the row's
        token count (these included) and the token table (row i valid up to num_tokens[i])."""
        return [draft for _, _, draft in self.choose(sampled_token_ids, num_tokens, token_ids)]

    def choose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens: np.ndarray,
        token_ids: np.ndarray,
    ) -> list[tuple[str | None, int, list[int]]]:
        """As `step`, per row: (method chosen or None = off, k, the lookup's draft). For the engine's own
        drafter (`engine_method`) the draft is empty: keep the engine's first k drafts of that row."""
        rows = len(sampled_token_ids)
        out: list[tuple[str | None, int, list[int]]] = [(None, 0, []) for _ in range(rows)]
        kv = float(np.sum(np.asarray(num_tokens[:rows], dtype=np.float64)))
        live: list[tuple[int, _Request, np.ndarray]] = []
        args: list[tuple[Sequence[int], int]] = []  # per live row: this step's tokens, context length
        new_reqs: dict[bytes, list[_Request]] = {}
        obs: list[tuple[int, int, int, int]] = []  # (slot, method, k, accepted) of the previous step
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens[i])
            m = len(sampled)
            if not m:
                continue  # partial prefill: no proposal (the row still counts in the batch)
            row = np.ascontiguousarray(token_ids[i, :n], dtype=np.int32)
            prev = self._reqs.get(ctx_key(row[: n - m]))
            if prev:
                req = prev.pop(0)
                req.steps += 1
                if req.last_k > 0:
                    obs.append((req.slot, req.last_method, req.last_k, min(m - 1, req.last_k)))
            else:
                req = self._new_request(n - m)
                self._probe_prompt(req, row, n - m)
            new_reqs.setdefault(ctx_key(row), []).append(req)
            pos = n - req.prompt_len
            out_tok = row[req.prompt_len :].tolist()
            for h in req.hist.values():
                h.advance(out_tok, len(h.acc), pos)
            req.last_method, req.last_k = -1, 0
            req.pos = pos
            if self.max_model_len is not None and n >= self.max_model_len:
                continue
            live.append((i, req, row))
            args.append((sampled, n))
        # requests that left the batch: free their slots, stop their suffix state
        for left in self._reqs.values():
            for req in left:
                self._free.append(req.slot)
        self._reqs = new_reqs
        if "suffix" in self.probes:
            self._suffix.stop_missing(
                [r.suffix_id for rs in new_reqs.values() for r in rs if r.suffix_id is not None]
            )
        if obs:
            a = np.array(obs, dtype=np.int64)
            self.policy.observe(StepOutcome(req=a[:, 0], method=a[:, 1], k=a[:, 2], accepted=a[:, 3]))
        # a gated policy says which rows to probe before any probe runs (from the hindsight of earlier ones)
        view = self._view(live, rows, kv) if live and self.policy.gating else None
        mask = self.policy.gate(view) if view is not None else None
        for r, ((_, req, row), (sampled, n)) in enumerate(zip(live, args, strict=True)):
            run = mask is None or bool(mask[r])
            for meth, probe in self.probes.items():
                if run:
                    req.hist[meth].last = (req.pos, probe(req, row, sampled, n))
                else:  # not probed: no offer; the suffix cache still takes this step's tokens
                    if meth == "suffix" and req.suffix_id is not None:
                        self._suffix.step(req.suffix_id, row[: n - len(sampled)], sampled, row, 0)
                    req.hist[meth].last = (req.pos, [])
            self.probe_rows["probed" if run else "skipped"] += 1
        offered = self.engine_method is not None or any(
            len(req.hist[m].last[1])  # type: ignore[index]
            for _, req, _ in live
            for m in self.probes
        )
        if not live or (not offered and view is None):
            # nothing offered by any probe: every option drafts nothing, so the rule's answer is "off" for
            # all rows (its survival is 0 beyond the offer); skip computing it (a gated policy's decide also
            # says which rows to keep probing: not skipped)
            self.counts["off"] += len(live)
            return out
        if view is None:
            view = self._view(live, rows, kv)
        else:
            self._set_offers(view, live)
        meth, k = self.policy.decide(view)
        for (i, req, _), j, kk in zip(live, meth.tolist(), k.tolist(), strict=True):
            out[i] = self._take(req, j, kk)
        return out

    def _take(self, req: _Request, j: int, kk: int) -> tuple[str | None, int, list[int]]:
        """A row's decision (methods[j], k = kk; j < 0 or kk = 0: off) as (method, drafts, lookup draft),
        counted and recorded as the request's pending step."""
        name = self.methods[j] if j >= 0 and kk > 0 else None
        draft: list[int] = []
        n_d = 0
        if name == self.engine_method and name is not None:
            n_d = min(kk, self.kmax)
        elif name is not None:
            draft = [int(t) for t in req.hist[name].last[1][: min(kk, self.kmax)]]  # type: ignore[index]
            n_d = len(draft)
        if n_d == 0:
            self.counts["off"] += 1
            return None, 0, []
        self.counts[name] += 1  # type: ignore[index]
        req.last_method, req.last_k = j, n_d
        return name, n_d, draft

    def _view(self, live: list[tuple[int, _Request, np.ndarray]], rows: int, kv: float) -> StepView:
        """The simulator's StepView for the decoding rows: hindsight and offers per probe over the last
        WINDOW positions (flat arrays, one block of WINDOW + 1 entries per row), current offers."""
        nl = len(live)
        pos = np.array([r.pos for _, r, _ in live], dtype=np.int64)
        past: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}
        nprop: dict[str, np.ndarray | None] = {}
        blk = WINDOW + 1
        fi = np.arange(nl, dtype=np.int64) * blk + WINDOW
        for meth in self.probes:
            acc = np.ones(nl * blk, dtype=np.int64)
            off = np.zeros(nl * blk, dtype=np.int64)
            cur = np.zeros(nl, dtype=np.int64)
            for r, (_, req, _) in enumerate(live):
                h = req.hist[meth]
                w = min(WINDOW, len(h.acc))
                if w:
                    acc[r * blk + WINDOW - w : r * blk + WINDOW] = h.acc[-w:]
                    off[r * blk + WINDOW - w : r * blk + WINDOW] = h.off[-w:]
                cur[r] = len(h.last[1]) if h.last is not None else 0
            past[meth] = (acc, fi, off)
            nprop[meth] = cur
        view = StepView(
            req=np.array([r.slot for _, r, _ in live], dtype=np.int64),
            pos=pos,
            step=np.array([r.steps for _, r, _ in live], dtype=np.int64),
            nprop=nprop,
            acc=None,
            occupancy=np.full(nl, float(rows)),
            batch_kv=np.full(nl, kv),
            past=past,
        )
        view.one_batch = True
        return view

    def _set_offers(self, view: StepView, live: list[tuple[int, _Request, np.ndarray]]) -> None:
        """The current offers, once the probes have run (after a gated policy's gate())."""
        for meth in self.probes:
            cur = [
                len(req.hist[meth].last[1]) if req.hist[meth].last is not None else 0 for _, req, _ in live
            ]
            view.set_offers(meth, np.array(cur, dtype=np.int64))
