"""A few built-in prompts and a function that renders them with a checkpoint's chat template.

Used by the engine tests and quick measurements; real runs take prompts from speclab.workloads.
Several prompts ask to repeat or edit given text, so prompt lookup (n-gram) has something to find.
"""

from __future__ import annotations

import os

SMOKE_PROMPTS: list[str] = [
    "Rewrite this Python function so it uses a list comprehension:\n\n"
    "def squares(numbers):\n    result = []\n    for n in numbers:\n        result.append(n * n)\n"
    "    return result\n",
    "Summarize in two sentences: The city council met on Tuesday to discuss the new park on Elm Street. "
    "Residents raised concerns about parking and noise, and the council agreed to hold another public "
    "meeting next month before voting on the park's final design.",
    "What is 17 times 23? Explain step by step.",
    "Fix the bug in this code and return the corrected code:\n\n"
    "def average(values):\n    total = 0\n    for v in values:\n        total += v\n"
    "    return total / len(value)\n",
    "List three facts about the history of the bicycle.",
    "Translate to French: The weather is nice today and I would like to go for a walk in the park.",
    "Write a haiku about autumn leaves.",
    "Explain what a hash table is to a beginner programmer.",
]


def render_chat(checkpoint: str | os.PathLike[str], texts: list[str]) -> list[list[int]]:
    """Token ids of each text as one user message under the checkpoint's chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(checkpoint))
    out = []
    for t in texts:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        out.append([int(i) for i in ids])
    return out
