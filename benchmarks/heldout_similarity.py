"""How far the drafters' held-out prompts are from their training prompts: for each held-out prompt of a
workload or training source (the demo/bench draw, seed 42; for a corpus or file source its held-out side),
the difflib similarity ratio of its text to the most similar training prompt of
`speclab.drafters.data.training_prompts`, at several training-set sizes (the measure every training manifest
reports as heldout_similarity: speclab.drafters.similarity, on each text's first 2,000 characters).

    python benchmarks/heldout_similarity.py [--workload offline-chat] [--sizes 64,256,512,1024] [--heldout 16]
    python benchmarks/heldout_similarity.py --workload stdlib-docqa --sizes 64,256

Templated workloads (the offline-* stand-ins) have near twins in training that differ in one slot; the share
of held-out prompts with a twin above 0.9 says how much of a held-out acceptance figure is coverage of the
same frames rather than generalisation (docs/drafters.md, "16x chat data").
"""

from __future__ import annotations

import argparse
import statistics
import sys

from speclab.drafters.data import eval_prompts, training_prompts
from speclab.drafters.similarity import nearest as best_similarity
from speclab.drafters.similarity import prompt_text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="offline-chat")
    ap.add_argument("--sizes", default="64,256,512,1024", help="training prompts of the workload")
    ap.add_argument("--heldout", type=int, default=16, help="held-out prompts (the drafters' eval set)")
    ap.add_argument("--seed", type=int, default=0, help="the training recipe's seed")
    args = ap.parse_args(argv)
    held = [prompt_text(p) for p in eval_prompts([args.workload], args.heldout)]
    print(f"{args.workload}: {len(held)} held-out prompts")
    print("training prompts  median best similarity  held-out with a twin >= 0.9  >= 0.8")
    for n in (int(x) for x in args.sizes.split(",")):
        train = [prompt_text(p) for p in training_prompts({args.workload: n}, args.seed)]
        best = best_similarity(held, train)
        print(
            f"{n:16d}  {statistics.median(best):22.3f}  {sum(b >= 0.9 for b in best):17d}/{len(best)}"
            f"  {sum(b >= 0.8 for b in best):5d}/{len(best)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
