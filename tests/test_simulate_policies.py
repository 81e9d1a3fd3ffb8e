"""Policy registry and the online-policy contract: an online policy never sees future positions."""

import numpy as np
import pytest

from sim_policies import AdaptiveK, SelectEMA
from speclab.errors import ConfigError
from speclab.simulate import Policy, StepView, list_policies, make_policy, register_policy, simulate
from speclab.traces import MethodTrace, RequestTrace


def traces(seed=0, n=6):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        L = int(rng.integers(20, 60))
        out.append(
            RequestTrace(
                id=f"r{i}",
                workload="w",
                category="other",
                prompt_len=10,
                output_len=L,
                methods={
                    "ngram": MethodTrace(k_max=8, acc_len=rng.integers(1, 10, L)),
                    "eagle": MethodTrace(k_max=8, acc_len=rng.integers(1, 6, L)),
                },
            )
        )
    return out


def test_parse_and_list():
    assert [p.name for p in list_policies()][:5] == [
        "none",
        "fixed",
        "oracle",
        "oracle-combine",
        "schedule",
    ]
    assert make_policy("fixed:eagle:3").spec == "fixed:eagle:3"
    assert make_policy("oracle-combine:ngram,eagle").methods == ("ngram", "eagle")
    assert make_policy("fixed:custom:my-prop:2").methods == ("custom:my-prop",)
    for bad in ("fixed:eagle", "fixed:eagle:x", "oracle:nope", "oracle-combine:ngram", "wat", "none:1"):
        with pytest.raises(ConfigError):
            make_policy(bad)


def test_k_above_trace_k_max_is_refused():
    with pytest.raises(ConfigError, match="k_max=8"):
        simulate(traces(), "llama3.1-8b-h100", ["fixed:eagle:9"], "static", [1])


class Recorder(AdaptiveK):
    """adaptive-k that logs every decision (request, position, k)."""

    def begin(self, ctx):
        super().begin(ctx)
        self.log = []

    def decide(self, view):
        m, k = super().decide(view)
        self.log += list(zip(view.req.tolist(), view.pos.tolist(), k.tolist(), strict=True))
        return m, k


class SelectRecorder(SelectEMA):
    def begin(self, ctx):
        super().begin(ctx)
        self.log = []

    def decide(self, view):
        m, k = super().decide(view)
        self.log += list(zip(view.req.tolist(), view.pos.tolist(), m.tolist(), k.tolist(), strict=True))
        return m, k


def run_recorder(tr, which):
    from speclab.simulate import fast

    if which == "adaptive-k":
        pol = Recorder(spec="rec", methods=("ngram",), extra={"kmax": 8, "kstart": 3, "alpha": 0.5})
    else:
        pol = SelectRecorder(spec="sel", methods=("ngram", "eagle"), extra={"k": 4, "alpha": 0.5})
    ta = fast.prepare(tr, set(pol.methods))
    fast.run_steps(ta, pol, 4, heuristic=False)
    return pol.log


@pytest.mark.parametrize("which", ["adaptive-k", "select-ema"])
@pytest.mark.parametrize("cut", [1, 5, 17, 30])
def test_online_policy_decisions_do_not_depend_on_future_positions(cut, which):
    """Perturb every trace position >= cut (all methods): decisions made at positions <= cut stay identical."""
    tr = traces(1)
    log = run_recorder(tr, which)
    rng = np.random.default_rng(99)
    for r in tr:
        for m, hi in (("ngram", 10), ("eagle", 6)):
            a = r.methods[m].acc_len.copy()
            a[cut:] = rng.integers(1, hi, max(0, len(a) - cut))
            r.methods[m] = MethodTrace(k_max=8, acc_len=a)
    log2 = run_recorder(tr, which)
    before = sorted(x for x in log if x[1] <= cut)
    after = sorted(x for x in log2 if x[1] <= cut)
    assert before == after and len(before) > 0
    assert log != log2  # the perturbation did change later decisions


def test_online_policy_cannot_read_acceptance():
    class Peeker(Policy):
        def decide(self, view: StepView):
            view.oracle_acc("ngram")  # the future: refused
            return np.zeros(len(view), np.int64), np.ones(len(view), np.int64)

    register_policy(
        "peeker", "peeker", "test only", lambda s, a, o: Peeker(spec="peeker", methods=("ngram",))
    )
    with pytest.raises(PermissionError):
        simulate(traces(), "llama3.1-8b-h100", ["peeker"], "static", [2])


def test_adaptive_k_moves_with_acceptance():
    always = RequestTrace(
        id="x", workload="w", category="other", prompt_len=5, output_len=200,
        methods={"eagle": MethodTrace(k_max=8, acc_len=np.full(200, 9))},
    )  # fmt: skip
    never = RequestTrace(
        id="y", workload="w", category="other", prompt_len=5, output_len=200,
        methods={"eagle": MethodTrace(k_max=8, acc_len=np.full(200, 1))},
    )  # fmt: skip
    from speclab.simulate import fast

    ta = fast.prepare([always, never], {"eagle"})
    st = fast.run_steps(ta, make_policy("adaptive-k:eagle:8"), 1, heuristic=False)
    k_always = st.k[st.req == 0]
    k_never = st.k[st.req == 1]
    assert k_always[0] == 3 and k_always[-1] == 8  # grows to KMAX when everything is accepted
    assert k_never[-1] == 1  # shrinks to 1 when nothing is


def test_adaptive_beats_bad_fixed_and_stays_below_oracle():
    tr = traces(2, 10)
    res = {r.policy: r.speedup for r in simulate(tr, "llama3.1-8b-h100", ["fixed:ngram:8", "adaptive-k:ngram",
                                                                        "oracle:ngram"], "static", [64])}  # fmt: skip
    assert res["adaptive-k:ngram"] <= res["oracle:ngram"]
