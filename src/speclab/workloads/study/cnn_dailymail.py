"""cnn-dailymail: abisee/cnn_dailymail 3.0.0 (summarisation). Columns: article, highlights, id."""

from __future__ import annotations

import random

from speclab.workloads import formats
from speclab.workloads.study_base import StudyDataset, register_study, single_user


def to_prompt(row: dict, rng: random.Random) -> tuple:
    content, span = formats.summarize(row["article"], what="article")
    return single_user(content), row["highlights"], {}, span


register_study(
    StudyDataset(
        name="cnn-dailymail",
        category="summarization",
        hf_id="abisee/cnn_dailymail",
        config="3.0.0",
        split="test",
        columns={"article": str, "highlights": str},
        to_prompt=to_prompt,
        description="CNN/DailyMail news articles to summarise (reference: the highlights).",
        notes="Articles are long (often >1k tokens): use --max-prompt-tokens when rendering.",
        id_column="id",
    )
)
