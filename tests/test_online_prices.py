"""The live proposer's online price fit (speclab.costmodel.online, AdaptiveDriver(price_fit=...)): the engine
is played offline (speclab.methods.adaptive_live.play_engine) and a fake clock advances by a known "machine"
between the driver's calls, so what the fit should find is known."""

from __future__ import annotations

import numpy as np
import pytest

from speclab.costmodel import get_cost_model
from speclab.costmodel.model import CostModel, DraftCost, TargetCost
from speclab.costmodel.online import OnlinePriceFit
from speclab.errors import ConfigError
from speclab.methods.adaptive_live import AdaptiveDriver, play_engine
from speclab.simulate.adaptive.goodput import step_time
from test_adaptive_live import MAX_LEN, copy_request, cpu_like, rejecting_request, with_head


class Machine:
    """A fake engine clock: each step costs step + request * rows + draft * (drafts verified), times a
    seeded noise factor. `wrap` makes the driver's step advance it before the driver reads the clock."""

    def __init__(self, step: float, request: float, draft: float, noise: float = 0.05, seed: int = 0) -> None:
        self.step, self.request, self.draft, self.noise = step, request, draft, noise
        self.now = 0.0
        self.rng = np.random.default_rng(seed)
        self.pending = 0  # drafts returned at the previous call: the next step verifies them
        self.outliers: list[int] = []  # call numbers whose interval is made 50x longer
        self.calls = 0

    def clock(self) -> float:
        return self.now

    def wrap(self, driver: AdaptiveDriver) -> AdaptiveDriver:
        real = driver.step

        def step(sampled, num_tokens, token_ids, *a):  # type: ignore[no-untyped-def]
            rows = len(sampled)
            dt = (self.step + self.request * rows + self.draft * self.pending) * (
                1 + self.noise * self.rng.uniform(-1, 1)
            )
            self.calls += 1
            self.now += dt * (50 if self.calls in self.outliers else 1)
            out = real(sampled, num_tokens, token_ids, *a)
            self.pending = sum(len(d) for d in out)
            return out

        driver.step = step  # type: ignore[method-assign]
        return driver


def driver(machine: Machine | None, cm: CostModel | None = None, **fit) -> AdaptiveDriver:
    d = AdaptiveDriver(
        kmax=8,
        max_model_len=MAX_LEN,
        methods=("ngram", "suffix"),
        cost_model=cm or cpu_like(),
        price_fit=fit or True,
        clock=machine.clock if machine else __import__("time").perf_counter,
    )
    return machine.wrap(d) if machine else d


def workload(n: int = 6) -> list[tuple[list[int], list[int]]]:
    return [copy_request(s, 100) for s in range(n)] + [rejecting_request(s, 100) for s in range(n)]


def test_fit_finds_the_machine_prices() -> None:
    """A machine 3x slower than the prior with a dear fixed cost: the fit recovers the step at the batch it
    ran and the draft token's price within a few percent, and the policy prices with it."""
    m = Machine(step=0.09, request=0.006, draft=0.004)
    d = driver(m)
    play_engine(d, workload(), 4, max_len=MAX_LEN)
    fit = d.fit
    assert fit is not None and fit.samples > 100
    p = fit.prices()
    assert p.seconds(4, 0) == pytest.approx(0.09 + 4 * 0.006, rel=0.05)
    assert p.draft_token == pytest.approx(0.004, rel=0.2)
    # the prior was far off: cpu_like prices the same step at ~1/3
    assert fit.prior_prices.seconds(4, 0) < 0.5 * p.seconds(4, 0)
    assert d.policy.cm is d.cm and d.cm.name.endswith("+online")
    # the policy's own step price (goodput.step_time) is the fitted one (refitted every few steps: the
    # latest intervals may not be in it yet)
    got = step_time(d.cm, None, np.float64(2.0), np.float64(4.0), np.float64(0.0), d.policy.probes)
    assert float(got) == pytest.approx(p.seconds(4, 8), rel=0.01)


def test_decisions_follow_the_machine() -> None:
    """Same prior, same requests: on a machine where a draft token costs as much as a whole step the refitted
    proposer drafts far less than on one where drafts are nearly free; without the fit both draft alike."""
    drafted = {}
    for name, tok in (("cheap", 0.0005), ("dear", 0.06)):
        m = Machine(step=0.05, request=0.002, draft=tok)
        log = play_engine(driver(m), workload(), 1, max_len=MAX_LEN)
        drafted[name] = sum(k for lg in log.values() for k, _ in lg)
    assert drafted["dear"] < 0.5 * drafted["cheap"], drafted
    plain = []
    for tok in (0.0005, 0.06):
        m = Machine(step=0.05, request=0.002, draft=tok)
        d = AdaptiveDriver(kmax=8, max_model_len=MAX_LEN, methods=("ngram", "suffix"), cost_model=cpu_like())
        log = play_engine(m.wrap(d), workload(), 1, max_len=MAX_LEN)
        plain.append(sum(k for lg in log.values() for k, _ in lg))
    assert plain[0] == plain[1]


def test_prefill_steps_and_outliers_are_not_fitted() -> None:
    m = Machine(step=0.05, request=0.003, draft=0.003, noise=0.0)
    m.outliers = [40, 41]
    d = driver(m)
    reqs = workload(3)
    play_engine(d, reqs, 2, max_len=MAX_LEN)
    fit = d.fit
    assert fit is not None
    assert fit.rejected == 2
    # every interval but the first call's and those whose step prefilled a request (<= one per request)
    assert m.calls - 1 - len(reqs) <= fit.samples + fit.rejected < m.calls - 1
    # noise-free and linear: the fit is exact where it has data (batch 2)
    assert fit.prices().seconds(2, 4) == pytest.approx(0.05 + 0.006 + 0.012, rel=0.02)


def test_a_prior_far_off_does_not_lock_the_steps_out() -> None:
    """A prior 20x too fast: intervals are judged against their recent median, not the prior, so the fit
    still takes them."""
    m = Machine(step=0.6, request=0.01, draft=0.02)
    d = driver(m)
    play_engine(d, workload(3), 1, max_len=MAX_LEN)
    assert d.fit is not None and d.fit.rejected <= 2
    assert d.fit.prices().seconds(1, 0) == pytest.approx(0.61, rel=0.05)


@pytest.mark.parametrize("request_price", [0.001, 0.02])
def test_model_prices_every_step_as_fitted(request_price: float) -> None:
    """Whichever of the request's and the draft token's price is larger, the CostModel the policy gets
    prices a step (goodput.step_time, KV included) as the fit's coefficients say."""
    cm = get_cost_model("smollm2-135m-cpu-live")
    fit = OnlinePriceFit(cm, ("ngram", "suffix"), 8, min_samples=4)
    rng = np.random.default_rng(1)
    for _ in range(200):
        r, dd = int(rng.integers(1, 17)), int(rng.integers(0, 40))
        fit.add(r, dd, 0.0, 0.03 + request_price * r + 0.004 * dd)
    p = fit.prices()
    assert p.request == pytest.approx(request_price, rel=0.05)
    model = fit.model().validate()
    for r, k, kv in ((1, 0.0, 0.0), (4, 3.0, 5000.0), (16, 1.5, 20000.0)):
        want = p.seconds(r, r * k) + fit.kv * kv
        got = float(step_time(model, None, np.float64(k), np.float64(r), np.float64(kv), ("ngram", "suffix")))
        assert got == pytest.approx(want, rel=1e-9)


def test_bad_options() -> None:
    with pytest.raises(ConfigError, match="price_fit"):
        driver(None, half_life=-1)
    with pytest.raises(ConfigError, match="price_fit"):
        driver(None, nope=1)
    with pytest.raises(ConfigError, match="model-free"):
        AdaptiveDriver(
            kmax=8, methods=("ngram", "eagle3"), model_drafter=True, cost_model=with_head(), price_fit=True
        )
    cm = CostModel(
        "no-probe", TargetCost(0.0, 1e-3, 1e-2), {"ngram": DraftCost("verify_fraction", fraction=0)}
    )
    assert OnlinePriceFit(cm, ("ngram",), 4).prices().seconds(1, 0) > 0


def test_benchmark_sweeps_load() -> None:
    """Every sweep file under benchmarks/sweeps parses and names methods the bench can run (adaptive-online
    among them, with its price_fit entry)."""
    from pathlib import Path

    from speclab.bench.spec import load_sweep

    files = sorted((Path(__file__).parent.parent / "benchmarks" / "sweeps").glob("*.toml"))
    assert any(f.name == "adaptive-online.toml" for f in files)
    for f in files:
        sw = load_sweep(str(f))
        assert sw.methods, f
        if f.name == "adaptive-online.toml":
            fit = [m for m in sw.methods if m.label == "adaptive-fit"]
            assert fit and fit[0].options["proposer_options"]["price_fit"] is True
