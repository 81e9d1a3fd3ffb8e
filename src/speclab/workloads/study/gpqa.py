"""gpqa: Idavidrein/gpqa gpqa_main (reasoning, multiple choice). Columns: Question, Correct Answer,
Incorrect Answer 1..3 (plus metadata). The four options are shuffled per row under the seed."""

from __future__ import annotations

import random

from speclab.workloads import formats
from speclab.workloads.study_base import StudyDataset, register_study, single_user

WRONG = ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")


def to_prompt(row: dict, rng: random.Random) -> tuple:
    correct = row["Correct Answer"].strip()
    options = [correct, *(row[c].strip() for c in WRONG)]
    rng.shuffle(options)
    content, span = formats.multiple_choice(row["Question"].strip(), options)
    letter = "ABCD"[options.index(correct)]
    return single_user(content), letter, {"correct_answer": correct}, span


register_study(
    StudyDataset(
        name="gpqa",
        category="reasoning",
        hf_id="Idavidrein/gpqa",
        config="gpqa_main",
        split="train",
        columns={"Question": str, "Correct Answer": str, **{c: str for c in WRONG}},
        to_prompt=to_prompt,
        description="GPQA main: graduate-level multiple-choice science questions, reason step by step.",
        notes="gated on the hub (accept the terms and log in); 448 questions",
        hub_note="GPQA is gated: accept its terms on huggingface.co and log in (HF_TOKEN) first",
        id_column="Record ID",
    )
)
