"""Diagnostic for docs/adaptive.md "What won and what lost in the second round": the registered adaptive
policies beside three unregistered variants, at the given batch sizes, with the share of oracle combine.

    PYTHONPATH=src python benchmarks/adaptive_diag.py STORE_OR_SYNTH_SHAPE 1[,8,...] [COST_MODEL]

- diag-survival-nolook: adaptive-survival without the lookahead;
- diag-rule-look: the rule (`adaptive`) with the lookahead;
- diag-startbit: adaptive-survival, except that where no copy is in progress an ORACLE says whether the
  n-gram matches >= 3 drafts here (then n-gram with KMAX): what knowing where a copy starts is worth.
Priors are the defaults (synthetic shapes), not leave-one-out."""

from __future__ import annotations

import sys

import numpy as np

import speclab.simulate.adaptive.survival as sv
from speclab.simulate import simulate
from speclab.simulate.adaptive import _factory
from speclab.simulate.adaptive.goodput import batch_choice
from speclab.simulate.adaptive.rule import AdaptiveRule
from speclab.simulate.adaptive.synth import SHAPES, make_set
from speclab.simulate.policies import register_policy
from speclab.traces import read_store


class StartBit(sv.AdaptiveSurvival):
    @classmethod
    def create(cls, spec: str, methods: tuple[str, ...], extra: dict) -> sv.AdaptiveSurvival:
        p = super().create(spec, methods, extra)
        p.oracle = True  # reads the current position: a diagnostic upper bound, not a policy
        return p

    def decide(self, view):  # type: ignore[no-untyped-def]
        m, k = super().decide(view)
        now, _ = sv.states(view.hindsight("ngram", 4), None, 2)
        j = self.methods.index("ngram")
        hit = (now == 0) & (view.oracle_acc("ngram") >= 4)
        return np.where(hit, j, m), np.where(hit, self.kmax[j], k)


class NoLook(sv.AdaptiveSurvival):
    def begin(self, ctx):  # type: ignore[no-untyped-def]
        super().begin(ctx)
        self.extra["lookahead"] = False


class RuleLook(AdaptiveRule):
    def decide(self, view):  # type: ignore[no-untyped-def]
        surv = [self.survival(view, j) for j in range(len(self.methods))]
        group = np.zeros(len(view), np.int64) if view.one_batch else np.arange(len(view))
        return batch_choice(self.cm, self.methods, surv, self.kmax, view.occupancy, view.batch_kv, self.probes,
                            group, lookahead=True)  # fmt: skip


def main() -> None:
    for name, cls in (
        ("diag-startbit", StartBit),
        ("diag-survival-nolook", NoLook),
        ("diag-rule-look", RuleLook),
    ):
        register_policy(name, name, "diagnostic (benchmarks/adaptive_diag.py)", _factory(cls, name))
    src = sys.argv[1]
    tr = make_set(src) if src in SHAPES else read_store(src)
    sizes = [int(x) for x in sys.argv[2].split(",")]
    cm = sys.argv[3] if len(sys.argv) > 3 else "llama3.1-8b-h100-chained"
    ms = sorted(set.intersection(*(set(t.methods) for t in tr)))
    pols = ["adaptive", "adaptive-learned", "adaptive-survival", "diag-survival-nolook", "diag-rule-look"]
    pols += ["diag-startbit", "oracle-combine:" + ",".join(ms)]
    res = simulate(tr, cm, pols, "continuous", sizes)
    comb = {r.batch_size: r.speedup for r in res if r.policy.startswith("oracle-combine")}
    for r in res:
        print(
            f"{r.policy:28s} B={r.batch_size:<4d} {r.speedup:.3f}x ({100 * r.speedup / comb[r.batch_size]:.0f}%)"
        )


if __name__ == "__main__":
    main()
