"""gsm8k: openai/gsm8k main (grade-school math). Columns: question, answer ("... #### 42")."""

from __future__ import annotations

import random

from speclab.workloads import formats
from speclab.workloads.study_base import StudyDataset, register_study, single_user


def to_prompt(row: dict, rng: random.Random) -> tuple:
    content, span = formats.math(row["question"])
    final = row["answer"].rsplit("####", 1)[-1].strip() if "####" in row["answer"] else None
    return single_user(content), row["answer"], {"answer": final}, span


register_study(
    StudyDataset(
        name="gsm8k",
        category="math",
        hf_id="openai/gsm8k",
        config="main",
        split="test",
        columns={"question": str, "answer": str},
        to_prompt=to_prompt,
        description="GSM8K grade-school word problems: solve step by step, answer after '####'.",
        notes="1319 test problems.",
    )
)
