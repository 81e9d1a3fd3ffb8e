"""Workloads: the study's six datasets and offline stand-ins that need no network.

    from speclab.workloads import list_workloads, load_workload, render_prompt
    prompts = load_workload("offline-math", limit=100, seed=0)
    ids, truncated = render_prompt(prompts[0], tokenizer, max_prompt_tokens=1024)

Importing this package is light (no torch, vllm, transformers or datasets).
"""

from speclab.workloads.base import CATEGORIES, Prompt, WorkloadError, WorkloadInfo, read_prompts
from speclab.workloads.overlap import ngram_overlap, ngram_precisions
from speclab.workloads.registry import get_workload, list_workloads, load_workload, register_workload
from speclab.workloads.render import render_prompt

__all__ = [
    "CATEGORIES",
    "Prompt",
    "WorkloadError",
    "WorkloadInfo",
    "get_workload",
    "list_workloads",
    "load_workload",
    "ngram_overlap",
    "ngram_precisions",
    "read_prompts",
    "register_workload",
    "render_prompt",
]
