"""render_prompt (chat template, honest truncation) and the overlap statistic."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from speclab.cli import main
from speclab.workloads import (
    Prompt,
    WorkloadError,
    load_workload,
    ngram_overlap,
    ngram_precisions,
    render_prompt,
)
from speclab.workloads import render as render_mod


class CharTokenizer:
    """One token per character; a chat template with visible markers."""

    chat_template = "fake"

    def apply_chat_template(
        self, messages: list[dict], tokenize: bool, add_generation_prompt: bool, **kw: Any
    ) -> str:
        assert not tokenize and add_generation_prompt
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + "<assistant>"

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(map(chr, ids))


def _text(ids: list[int]) -> str:
    return "".join(map(chr, ids))


def test_render_no_truncation() -> None:
    p = Prompt("x", "w", "chat", [{"role": "user", "content": "hello"}], None, {})
    ids, truncated = render_prompt(p, CharTokenizer(), max_prompt_tokens=1000)
    assert _text(ids) == "<user>hello</user><assistant>" and not truncated


def test_render_truncates_body_keeps_instruction() -> None:
    p = load_workload("offline-code-edit", limit=5, seed=0)[0]
    tok = CharTokenizer()
    full, _ = render_prompt(p, tok)
    ids, truncated = render_prompt(p, tok, max_prompt_tokens=len(full) - 40)
    text = _text(ids)
    assert truncated and len(ids) <= len(full) - 40
    assert text.endswith("Just output the code, do not include any explanation.</user><assistant>")
    assert render_mod.TRUNCATION_MARKER in text
    with pytest.raises(WorkloadError, match="does not fit"):
        render_prompt(p, tok, max_prompt_tokens=50)


def test_render_default_span_is_last_user_message() -> None:
    msgs = [
        {"role": "user", "content": "a" * 50},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "b" * 100},
    ]
    ids, truncated = render_prompt(
        Prompt("x", "w", "chat", msgs, None, {}), CharTokenizer(), max_prompt_tokens=150
    )
    assert truncated and len(ids) <= 150 and "a" * 50 in _text(ids)


def test_render_real_tokenizer_if_present() -> None:
    # A prepared SmolLM2 checkpoint (speclab models prepare) loads its tokenizer in ~1 s; the GGUF takes ~20 s.
    root = Path(os.environ.get("SPECLAB_CACHE", Path.home() / ".cache" / "speclab")).expanduser()
    tok_dir = next((p.parent for p in sorted(root.glob("models/smollm2-135m*/*/tokenizer.json"))), None)
    if tok_dir is None:
        pytest.skip("no prepared smollm2-135m checkpoint (speclab models prepare smollm2-135m)")
    pytest.importorskip("transformers")
    tok = render_mod.load_tokenizer(str(tok_dir))
    p = load_workload("offline-summarization", limit=1)[0]
    ids, truncated = render_prompt(p, tok)
    assert not truncated and 50 < len(ids) < 1200
    ids2, truncated2 = render_prompt(p, tok, max_prompt_tokens=60)
    assert truncated2 and len(ids2) <= 60
    text = tok.decode(ids2)
    assert (
        "Summarize the following text" in text and "truncated" in text and text.rstrip().endswith("assistant")
    )


def test_cli_export_with_tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(render_mod, "load_tokenizer", lambda path: CharTokenizer())
    out = tmp_path / "o.jsonl"
    main(["workloads", "export", "offline-summarization", "--limit", "4", "--tokenizer", "fake",
          "--max-prompt-tokens", "300", "--out", str(out)])  # fmt: skip
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 4 and all(r["prompt_len"] <= 300 for r in rows)
    assert all(r["truncated"] == (r["untruncated_prompt_len"] > 300) for r in rows)
    assert any(r["truncated"] for r in rows)
    assert all(r["prompt_text"] == _text(r["prompt_token_ids"]) for r in rows)


def test_overlap() -> None:
    text = "def f(x):\n    return x + 1\n"
    assert ngram_overlap(text, text) == pytest.approx(1.0)
    assert ngram_overlap("alpha beta gamma delta", "one two three four five") == 0.0
    assert ngram_overlap([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 7, 8]) == pytest.approx(
        (6 / 8 * 5 / 7 * 4 / 6 * 3 / 5) ** 0.25
    )
    assert ngram_precisions("a b c", "a a a", n=1) == [pytest.approx(1 / 3)]  # clipped counts
    assert ngram_overlap("a b c d", "", n=4) == 0.0
    assert ngram_overlap("a b c d e f", "a b c", brevity_penalty=True) == 0.0  # too short for 4-grams
    with pytest.raises(TypeError):
        ngram_overlap("text", [1, 2])
