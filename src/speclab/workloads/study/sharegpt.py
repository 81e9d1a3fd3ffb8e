"""sharegpt: ShareGPT V3 (chat). A JSON list of {"id", "conversations": [{"from": "human"|"gpt", "value"}]}.

As in vLLM's benchmark: conversations with fewer than two turns are skipped (counted in meta), the prompt is
the first turn and the reference the second.
"""

from __future__ import annotations

import random

from speclab.workloads.study_base import StudyDataset, register_study, single_user

HF_ID = "anon8231489123/ShareGPT_Vicuna_unfiltered"
FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"


def check_row(row: dict) -> str | None:
    for j, turn in enumerate(row["conversations"]):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            return f"conversations[{j}] should be an object with a string 'value'"
    return None


def keep(row: dict) -> bool:
    conv = row["conversations"]
    return len(conv) >= 2 and bool(conv[0]["value"].strip())


def to_prompt(row: dict, rng: random.Random) -> tuple:
    first, second = row["conversations"][0], row["conversations"][1]
    text = first["value"]
    return single_user(text), second["value"], {"turns": len(row["conversations"])}, (0, len(text))


register_study(
    StudyDataset(
        name="sharegpt",
        category="chat",
        hf_id=HF_ID,
        config=None,
        split="train",
        data_files=FILE,
        columns={"conversations": list},
        to_prompt=to_prompt,
        description="ShareGPT V3 conversations: continue the first user turn (reference: the first reply).",
        notes=f"The hub repo is a plain file ({FILE}); --source accepts that file.",
        id_column="id",
        keep=keep,
        check_row=check_row,
    )
)
