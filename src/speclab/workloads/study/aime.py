"""aime: AI-MO/aimo-validation-aime (reasoning). Columns: id, problem, solution, answer, url."""

from __future__ import annotations

import random

from speclab.workloads import formats
from speclab.workloads.study_base import StudyDataset, register_study, single_user


def to_prompt(row: dict, rng: random.Random) -> tuple:
    content, span = formats.reasoning(row["problem"])
    return single_user(content), str(row["answer"]), {"solution": row.get("solution")}, span


register_study(
    StudyDataset(
        name="aime",
        category="reasoning",
        hf_id="AI-MO/aimo-validation-aime",
        config=None,
        split="train",
        columns={"problem": str, "answer": (str, int)},
        to_prompt=to_prompt,
        description="AIME problems (AIMO validation set): reason step by step, answer in \\boxed{}.",
        notes="small: only 90 problems, so --limit above 90 yields 90",
        hub_note="AIME is small: 90 problems in all",
        id_column="id",
    )
)
