"""instructcoder: likaixin/InstructCoder (code editing). Columns: instruction, input, output."""

from __future__ import annotations

import random

from speclab.workloads import formats
from speclab.workloads.study_base import StudyDataset, register_study, single_user


def to_prompt(row: dict, rng: random.Random) -> tuple:
    content, span = formats.code_edit(row["input"], row["instruction"])
    return single_user(content), row["output"], {}, span


register_study(
    StudyDataset(
        name="instructcoder",
        category="code-editing",
        hf_id="likaixin/InstructCoder",
        config=None,
        split="train",
        columns={"instruction": str, "input": str, "output": str},
        to_prompt=to_prompt,
        description="InstructCoder: apply an instruction to a piece of code (the answer repeats the code).",
        notes="~108k rows; the study sampled 500.",
    )
)
