"""The live adaptive proposer over the engine's EAGLE-3 drafter (speclab.live.vllm_eagle) without an engine:
the per-row merge, the adapter on a fake model runner played step by step, its sweep wiring, and the check
that fails loudly when the vLLM interfaces it relies on change."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from speclab.costmodel.model import CostModel, DraftCost, TargetCost
from speclab.errors import ConfigError
from speclab.live.driver import AdaptiveDriver
from speclab.live.vllm_eagle import merge_drafts

K = 3


def test_merge_drafts_per_row() -> None:
    eagle = [[11, 12, 13], [21, 22, 23], [31, 32, 33], [41, 42, 43]]
    choices = [("eagle3", 2, []), ("ngram", 3, [7, 8, 9]), (None, 0, []), ("ngram", 1, [5, 6])]
    assert merge_drafts(eagle, choices, "eagle3") == [[11, 12], [7, 8, 9], [], [5]]
    assert merge_drafts([[1, 2, 3]], [("eagle3", 0, [])], "eagle3") == [[]]  # k = 0: none
    with pytest.raises(ValueError):
        merge_drafts(eagle, choices[:2], "eagle3")  # one choice per row


def head_cm() -> CostModel:
    return CostModel(
        "test-cpu-head",
        TargetCost(kv=1e-7, batched=1.6e-3, const=2.6e-2),
        {
            "ngram": DraftCost("verify_fraction", fraction=0.01),
            "eagle3": DraftCost("chained", const=2.5e-3, num_spec=3e-4),
        },
        overhead_per_step=2e-3,
    )


def test_driver_takes_the_engine_drafter_only_when_named() -> None:
    with pytest.raises(ConfigError, match="custom_class proposer cannot run it"):
        AdaptiveDriver(K, 4096, methods=("ngram", "eagle3"), cost_model=head_cm())
    with pytest.raises(ConfigError, match="custom_class proposer cannot run it"):
        AdaptiveDriver(
            K, 4096, methods=("ngram", "draft_model"), cost_model=head_cm(), engine_method="eagle3"
        )
    d = AdaptiveDriver(K, 4096, methods=("ngram", "eagle3"), cost_model=head_cm(), engine_method="eagle3")
    assert d.engine_method == "eagle3" and set(d.counts) == {"off", "ngram", "eagle3"}


class FakeRunner:
    """The parts of vLLM's model runner the adapter uses, with the same signatures."""

    def __init__(self, rows: int, width: int, method: str = "eagle3") -> None:
        self.speculative_config = SimpleNamespace(
            method=method, num_speculative_tokens=K, draft_sample_method="greedy"
        )
        self.use_async_scheduling = False
        self.max_model_len = width
        self.input_batch = SimpleNamespace(
            req_id_to_index={},
            num_tokens_no_spec=np.zeros(rows, dtype=np.int32),
            token_ids_cpu=np.zeros((rows, width), dtype=np.int32),
        )
        self.input_batch.req_ids = [f"r{i}" for i in range(rows)]
        self.device = "cpu"
        self.output = None
        self.drafts = None
        self.proposed = 0  # head forwards run

    def sample_tokens(self, grammar_output):
        return self.output

    def take_draft_token_ids(self):
        return self.drafts

    def propose_draft_token_ids(
        self,
        scheduler_output,
        sampled_token_ids,
        sampling_metadata,
        hidden_states,
        sample_hidden_states,
        aux_hidden_states,
        spec_decode_metadata,
        common_attn_metadata,
        slot_mappings,
    ):
        import torch

        self.proposed += 1
        return torch.ones((len(self.input_batch.req_ids), K), dtype=torch.int32)


def play(runner: FakeRunner, reqs: dict[str, tuple[list[int], list[int]]], good_head: set[str], steps: int):
    """Play the engine: each step commits the accepted prefix of the row's last draft plus one token of the
    request's (greedy) output; the engine's EAGLE drafts are the true next tokens for requests in
    `good_head`, junk for the others. Returns per request the source of each step's draft."""
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

    ids = list(reqs)
    ib = runner.input_batch
    ib.req_id_to_index = {r: i for i, r in enumerate(ids)}
    done = {r: 0 for r in ids}  # output tokens committed
    last: dict[str, list[int]] = {r: [] for r in ids}
    src: dict[str, list[str]] = {r: [] for r in ids}
    for i, r in enumerate(ids):  # prefill: the prompt and the first token
        p, o = reqs[r]
        ib.token_ids_cpu[i, : len(p) + 1] = p + o[:1]
        ib.num_tokens_no_spec[i] = len(p) + 1
        done[r] = 1
    sampled = {r: [reqs[r][1][0]] for r in ids}
    for _ in range(steps):
        runner.output = ModelRunnerOutput(
            req_ids=ids, req_id_to_index=dict(ib.req_id_to_index), sampled_token_ids=[sampled[r] for r in ids]
        )
        eagle = [o[done[r] : done[r] + K] if r in good_head else [0] * K for r, (_, o) in reqs.items()]
        runner.drafts = DraftTokenIds(list(ids), [list(e) for e in eagle])
        assert runner.sample_tokens(None) is runner.output
        got = runner.take_draft_token_ids().draft_token_ids
        for i, r in enumerate(ids):
            p, o = reqs[r]
            d = got[i]
            last[r] = d
            if not d:
                src[r].append("off")
            elif d == eagle[i][: len(d)]:
                src[r].append("eagle3")
            else:
                src[r].append("ngram")
            acc = 0
            while acc < len(d) and done[r] + acc < len(o) and d[acc] == o[done[r] + acc]:
                acc += 1
            new = o[done[r] : done[r] + acc + 1]
            n = int(ib.num_tokens_no_spec[i])
            ib.token_ids_cpu[i, n : n + len(new)] = new
            ib.num_tokens_no_spec[i] = n + len(new)
            done[r] += len(new)
            sampled[r] = new
    return src


def test_adapter_chooses_per_row_on_a_fake_runner() -> None:
    pytest.importorskip("vllm")
    from speclab.live.vllm_eagle import install

    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 5000, size=200).tolist()
    copy = (prompt, prompt[20:140])  # the output copies the prompt: n-gram drafts are accepted
    free = (rng.integers(100, 5000, size=60).tolist(), rng.integers(100, 5000, size=120).tolist())
    runner = FakeRunner(2, 512)
    adapter = install(runner, {"methods": ["ngram", "eagle3"], "cost_model": "smollm2-135m-cpu-live"})
    assert install(runner) is adapter  # once per runner
    src = play(runner, {"copy": copy, "free": free}, good_head={"free"}, steps=25)
    # the free-text row (no copy, a head that is always right) drafts from the head; the copying row (a
    # head that is always wrong) ends up on the lookup
    assert src["free"].count("eagle3") >= 20 and "ngram" not in src["free"], src["free"]
    assert src["copy"][-10:].count("ngram") >= 8, src["copy"]
    c = adapter.counts()
    assert c["eagle3"] >= 20 and c["ngram"] >= 8 and sum(c.values()) == 50


def test_static_modes_are_arms_of_one_engine() -> None:
    """The modes a benchmark switches between cells: the lookup alone, the head alone (first k drafts), no
    drafts; the head's forward is skipped where its drafts are never kept; bad modes are refused."""
    pytest.importorskip("vllm")
    from speclab.live.vllm_eagle import install

    rng = np.random.default_rng(1)
    prompt = rng.integers(100, 5000, size=200).tolist()
    copy = (prompt, prompt[20:140])
    free = (rng.integers(100, 5000, size=60).tolist(), rng.integers(100, 5000, size=120).tolist())
    runner = FakeRunner(2, 512)
    adapter = install(runner, {"methods": ["ngram", "eagle3"], "cost_model": "smollm2-135m-cpu-live"})
    args = (None,) * 9

    assert adapter.set_mode("ngram:3") == "ngram:3"
    out = runner.propose_draft_token_ids(*args)
    assert runner.proposed == 0 and out.shape == (2, K) and int(out.abs().sum()) == 0  # head skipped
    src = play(runner, {"copy": copy, "free": free}, good_head=set(), steps=12)
    # a lookup only: the copying row drafts from its prompt, the free row (nothing to copy) drafts nothing
    assert "eagle3" not in src["copy"] + src["free"] and src["copy"][2:].count("ngram") >= 8, src
    assert set(src["free"]) == {"off"}, src["free"]

    assert adapter.set_mode("eagle3:2") == "eagle3:2"
    runner.propose_draft_token_ids(*args)
    assert runner.proposed == 1  # the head runs
    runner2 = FakeRunner(2, 512)
    a2 = install(runner2, {"cost_model": "smollm2-135m-cpu-live"})
    a2.set_mode("eagle3:2")
    src = play(runner2, {"copy": copy, "free": free}, good_head={"free", "copy"}, steps=6)
    assert set(src["copy"] + src["free"]) == {"eagle3"}
    assert adapter.set_mode("off") == "off"
    runner.propose_draft_token_ids(*args)
    assert runner.proposed == 1
    assert adapter.set_mode("adaptive") == "adaptive"
    runner.propose_draft_token_ids(*args)
    assert runner.proposed == 2
    for bad in ("ngram", "ngram:0", f"ngram:{K + 1}", "suffix:2", "eagle3:x", "off:1"):
        with pytest.raises(ValueError, match="mode"):
            adapter.set_mode(bad)
    assert adapter.mode == ("adaptive", K)


def test_adapter_refuses_what_it_cannot_keep_right() -> None:
    pytest.importorskip("vllm")
    from speclab.live.vllm_eagle import AdaptiveEagle

    with pytest.raises(RuntimeError, match="model-based drafter"):
        AdaptiveEagle(FakeRunner(1, 64, method="ngram"))
    r = FakeRunner(1, 64)
    r.speculative_config.draft_sample_method = "probabilistic"
    with pytest.raises(RuntimeError, match="greedy drafts"):
        AdaptiveEagle(r)
    r = FakeRunner(1, 64)
    r.use_async_scheduling = True
    with pytest.raises(RuntimeError, match="async_scheduling"):
        AdaptiveEagle(r)
    with pytest.raises(ValueError, match="unknown option"):
        AdaptiveEagle(FakeRunner(1, 64), {"nope": 1})
    with pytest.raises(ValueError, match="kmax"):
        AdaptiveEagle(FakeRunner(1, 64), {"kmax": K + 1})


def test_vllm_still_offers_what_the_adapter_relies_on() -> None:
    """Fails when vLLM changes the runner methods, output fields or engine-core call the adapter builds on
    (speclab.live.vllm_eagle's module docstring lists them)."""
    pytest.importorskip("vllm")
    import inspect

    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from speclab.live.vllm_eagle import check_vllm

    check_vllm(GPUModelRunner)
    check_vllm(CPUModelRunner)
    # the engine core hands the runner's drafts to the scheduler after each step (no async scheduling)
    post = inspect.getsource(EngineCore.post_step)
    assert "take_draft_token_ids()" in post and "update_draft_token_ids(" in post
    assert list(inspect.signature(Scheduler.update_draft_token_ids).parameters) == ["self", "draft_token_ids"]
    # the worker forwards both calls to its runner
    from vllm.v1.worker.gpu_worker import Worker

    assert "model_runner.take_draft_token_ids()" in inspect.getsource(Worker.take_draft_token_ids)
    assert "model_runner.sample_tokens(" in inspect.getsource(Worker.sample_tokens)

    class Changed(GPUModelRunner):
        def take_draft_token_ids(self, scheduler_output):  # type: ignore[override]
            return None

    with pytest.raises(RuntimeError, match="take_draft_token_ids"):
        check_vllm(Changed)


def test_sweep_and_engine_settings_select_the_adapter() -> None:
    from speclab.bench.spec_methods import method_entry
    from speclab.engine import cpu_sampling
    from speclab.engine.protocol import EngineSpec
    from speclab.engine.settings import adaptive_model_drafter, llm_kwargs
    from speclab.live import vllm_eagle

    assert vllm_eagle.WORKER_EXTENSION == cpu_sampling.ADAPTIVE_EXTENSION
    entry = {"name": "eagle3", "k": 3, "model": "smollm2-135m-eagle3",
             "proposer_options": {"methods": ["ngram", "eagle3"], "policy": "adaptive"}}  # fmt: skip
    m = method_entry(entry, 0, "sweep")
    assert m.options["proposer_options"]["methods"] == ["ngram", "eagle3"]
    with pytest.raises(ConfigError, match="proposer_options"):
        method_entry({"name": "ngram", "k": 3, "proposer_options": {}}, 0, "sweep")
    spec = EngineSpec(method="eagle3", k=3, target="t", options=dict(m.options))
    assert adaptive_model_drafter(spec)
    kw = llm_kwargs(spec, "t", "head")
    assert kw["worker_extension_cls"] == cpu_sampling.ADAPTIVE_EXTENSION
    assert "proposer_options" not in kw["speculative_config"]
    plain = EngineSpec(method="eagle3", k=3, target="t", options={"model": "h"})
    assert not adaptive_model_drafter(plain)
    assert llm_kwargs(plain, "t", "h").get("worker_extension_cls") != cpu_sampling.ADAPTIVE_EXTENSION


def test_worker_extension_offers_the_rpc_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("vllm")
    import importlib
    import sys

    from speclab.engine.cpu_sampling import FIX_ENV

    # importing the extension outside a worker: leave the sampling fix out (it needs the worker's platform)
    monkeypatch.setenv(FIX_ENV, "off")
    monkeypatch.delitem(sys.modules, "speclab.engine.sampling_ext", raising=False)
    AdaptiveEagleExtension = importlib.import_module("speclab.engine.sampling_ext").AdaptiveEagleExtension
    from speclab.live.vllm_eagle import RPC_COUNTS, RPC_INSTALL

    assert callable(getattr(AdaptiveEagleExtension, RPC_INSTALL))
    assert callable(getattr(AdaptiveEagleExtension, RPC_COUNTS))
    from vllm.v1.worker.cpu_worker import CPUWorker

    # vLLM refuses an extension whose names the worker already has
    assert not hasattr(CPUWorker, RPC_INSTALL) and not hasattr(CPUWorker, RPC_COUNTS)


def test_the_drafters_cost_is_paid_by_every_option() -> None:
    from speclab.costmodel import get_cost_model
    from speclab.live.vllm_eagle import sunk_drafter_cost

    cm = get_cost_model("smollm2-135m-cpu-live")
    d = cm.draft["eagle3"]
    live = sunk_drafter_cost(cm, "eagle3", K)
    assert live.overhead_per_step == pytest.approx(cm.overhead_per_step + K * d.const)
    assert live.overhead_per_request == pytest.approx(cm.overhead_per_request + K * d.num_spec)
    assert live.draft["eagle3"].const == 0.0 and live.draft["ngram"] == cm.draft["ngram"]
    assert cm.draft["eagle3"] is d  # the preset itself is left as it was
    with pytest.raises(ConfigError, match="use chained"):
        sunk_drafter_cost(cm, "ngram", K)


def test_sweep_preset_parses() -> None:
    from speclab.bench.spec import load_preset

    sw = load_preset("adaptive-eagle-cpu")
    by_label = {m.label: m for m in sw.methods}
    assert {"none", "ngram-k3", "eagle3-k3", "adaptive-eagle3"} <= set(by_label)
    ad = by_label["adaptive-eagle3"]
    assert ad.name == "eagle3" and ad.options["proposer_options"]["methods"] == ["ngram", "eagle3"]


def test_its_rows_are_not_taken_for_the_heads() -> None:
    """Its drafts are not EAGLE-3's: its bench rows carry their own trace name, which replay refuses."""
    from speclab.catalog import trace_method_name
    from speclab.replay.runs import ADAPTIVE_REFUSAL, replay_spec

    opts = {"model": "smollm2-135m-eagle3", "proposer_options": {}}
    name = trace_method_name("eagle3", opts)
    assert name == "custom:SpeclabAdaptiveEagle"
    assert trace_method_name("eagle3", {"model": "h"}) == "eagle3"
    assert replay_spec(name, opts, {}) == ADAPTIVE_REFUSAL


def test_profiler_counts_the_choice_as_drafting() -> None:
    import time

    from speclab.engine.instrument import StepProfiler

    class Runner:
        def __init__(self) -> None:
            self.model = SimpleNamespace()
            self._speclab_adaptive = object()  # the adapter is installed

        def execute_model(self, so):
            return None

        def _model_forward(self):
            return None

        def take_draft_token_ids(self):
            time.sleep(0.005)
            return "drafts"

    runner = Runner()
    prof = StepProfiler(method="custom:SpeclabAdaptiveEagle", enabled=True)
    prof.install(runner)
    prof.begin_step()
    st = prof._step
    assert runner.take_draft_token_ids() == "drafts"
    assert st is not None and st.propose_s >= 0.005
