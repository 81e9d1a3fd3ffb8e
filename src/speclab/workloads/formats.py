"""Prompt wording per task, shared by the study loaders and their offline stand-ins so both read alike.

Each function returns (user message content, (start, end) of the body that truncation may cut).
Short, plain instructions: small instruct models (SmolLM2-135M-Instruct) follow them.
"""

from __future__ import annotations

Body = tuple[int, int]

CODE_SUFFIX = "Just output the code, do not include any explanation."
MATH_SUFFIX = 'Let\'s think step by step and output the final answer after "####".'
REASONING_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."
MC_SUFFIX = (
    "Think step by step, then give your final answer on the last line in the form "
    "'Answer: X', where X is one of A, B, C or D."
)


def code_edit(code: str, instruction: str) -> tuple[str, Body]:
    """InstructCoder: the code first, then the instruction (the layout of vLLM's InstructCoder benchmark)."""
    text = f"{code}\n\n{instruction} {CODE_SUFFIX}"
    return text, (0, len(code))


def summarize(article: str, what: str = "article") -> tuple[str, Body]:
    head = f"Summarize the following {what} in a few sentences.\n\n"
    return head + article, (len(head), len(head) + len(article))


def math(question: str) -> tuple[str, Body]:
    return f"{question}\n{MATH_SUFFIX}", (0, len(question))


def reasoning(problem: str) -> tuple[str, Body]:
    return f"{problem}\n{REASONING_SUFFIX}", (0, len(problem))


def multiple_choice(question: str, choices: list[str]) -> tuple[str, Body]:
    letters = "ABCD"
    opts = "\n".join(f"{letters[i]}) {c}" for i, c in enumerate(choices))
    return f"{question}\n\n{opts}\n\n{MC_SUFFIX}", (0, len(question))
