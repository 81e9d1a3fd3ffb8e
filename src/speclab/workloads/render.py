"""Turn a Prompt into the target model's token ids through its chat template, truncating honestly.

Truncation never happens silently: render_prompt returns a flag, and only the prompt's body (the article,
the code, the passage: meta["truncate"] = {"message": i, "start": char, "end": char}, default the whole last
user message) is cut at its end, with a visible marker, so the instruction and the template stay intact.
A prompt whose meta["chat_template"] is False (a completions request from a request log) is tokenised as raw
text instead, as the server did.
"""

from __future__ import annotations

from typing import Any

from speclab.workloads.base import Prompt, WorkloadError

TRUNCATION_MARKER = "\n[... truncated]\n"


def load_tokenizer(path: str) -> Any:
    """A Hugging Face tokenizer from a local directory, a GGUF file, or a model name speclab.models knows."""
    from pathlib import Path

    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise WorkloadError("rendering prompts needs `transformers` (pip install speclab[models])") from exc
    p = Path(path).expanduser()
    if not p.exists():
        from speclab.models import resolve_model  # a preset name (e.g. smollm2-135m) or a hub id

        p = resolve_model(path)
    try:
        if p.is_file() and p.suffix == ".gguf":
            return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
        return AutoTokenizer.from_pretrained(str(p))
    except Exception as exc:
        raise WorkloadError(f"cannot load a tokenizer from {path}: {type(exc).__name__}: {exc}") from exc


def _template_ids(
    messages: list[dict], tokenizer: Any, raw: bool = False, **template_kwargs: Any
) -> list[int]:
    if raw:
        # a completions request from a request log: the text as the server tokenised it, no chat template
        return list(tokenizer(messages[-1]["content"])["input_ids"])
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **template_kwargs
        )
    else:
        # No chat template (a base model): a plain, documented layout.
        text = "".join(f"{m['role']}: {m['content']}\n\n" for m in messages) + "assistant:"
    # The template already holds any BOS/special tokens as text; do not add them twice.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _prompt_ids(
    prompt: Prompt, messages: list[dict], tokenizer: Any, raw: bool, **template_kwargs: Any
) -> list[int]:
    """_template_ids, with a template's refusal (e.g. of the role order) as one line naming the prompt."""
    try:
        return _template_ids(messages, tokenizer, raw, **template_kwargs)
    except WorkloadError:
        raise
    except Exception as exc:  # jinja2's TemplateError and whatever a template's raise_exception raises
        where = prompt.meta.get("source") or f"prompt {prompt.id}"
        why = " ".join(str(exc).split())[:200]
        raise WorkloadError(
            f"{where}: field messages: the chat template refused it ({type(exc).__name__}: {why})"
        ) from None


def _span(prompt: Prompt) -> tuple[int, int, int]:
    spec = prompt.meta.get("truncate")
    if spec:
        i = int(spec["message"])
        return i, int(spec["start"]), int(spec["end"])
    users = [i for i, m in enumerate(prompt.messages) if m.get("role") == "user"]
    i = users[-1] if users else len(prompt.messages) - 1
    return i, 0, len(prompt.messages[i]["content"])


def render_prompt(
    prompt: Prompt, tokenizer: Any, max_prompt_tokens: int | None = None, **template_kwargs: Any
) -> tuple[list[int], bool]:
    """Token ids of the prompt with the target's chat template (generation prompt added), and whether it was
    truncated to fit max_prompt_tokens. `tokenizer` is a HF tokenizer or a path to load one from."""
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer)
    raw = prompt.meta.get("chat_template") is False
    ids = _prompt_ids(prompt, prompt.messages, tokenizer, raw, **template_kwargs)
    if max_prompt_tokens is None or len(ids) <= max_prompt_tokens:
        return ids, False
    mi, start, end = _span(prompt)
    content = prompt.messages[mi]["content"]
    head, body, tail = content[:start], content[start:end], content[end:]
    body_ids = list(tokenizer(body, add_special_tokens=False)["input_ids"])
    keep = len(body_ids) - (len(ids) - max_prompt_tokens)
    for _ in range(50):  # re-tokenising the joined text can shift counts by a few tokens; retry smaller
        if keep <= 0:
            break
        cut = tokenizer.decode(body_ids[:keep], skip_special_tokens=True)
        messages = [dict(m) for m in prompt.messages]
        messages[mi]["content"] = head + cut.rstrip() + TRUNCATION_MARKER + tail.lstrip("\n")
        new_ids = _prompt_ids(prompt, messages, tokenizer, raw, **template_kwargs)
        if len(new_ids) <= max_prompt_tokens:
            return new_ids, True
        keep -= max(len(new_ids) - max_prompt_tokens, 1)
    raise WorkloadError(
        f"prompt {prompt.id}: does not fit in {max_prompt_tokens} tokens even with its body removed "
        f"({len(ids)} tokens untruncated); raise --max-prompt-tokens"
    )
