"""A training corpus for drafters from real text every machine with speclab has: the source code and
docstrings of Python's standard library, turned into prompts of several kinds (one named source each):

  stdlib-explain    explain a function (its code, docstring removed)
  stdlib-complete   complete a function from its signature and docstring
  stdlib-docqa      answer a question about a paragraph of a docstring
  stdlib-summarize  summarise a module's documentation
  stdlib-math       a word problem made from the numbers on a line of code or documentation

Deterministic under a seed: the standard library's files are visited in an order seeded by (seed, source)
and each file's prompts come from a generator seeded by (seed, source, file), so a larger draw starts with a
smaller one. The only thing that varies between machines is the Python version's standard library (recorded
in the training manifest). Each prompt is on one side of a split by the content of the material it is made
from (the function, the paragraph, the line): the held-out side is the evaluation set of the source, and a
function or paragraph is never on both sides, whatever question is asked about it.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
import sys
import sysconfig
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from speclab.workloads.base import Prompt, content_id, user
from speclab.workloads.offline._common import STDLIB_SKIP

SOURCES: dict[str, str] = {
    "stdlib-explain": "explain a standard-library function (its code)",
    "stdlib-complete": "complete a standard-library function from its signature and docstring",
    "stdlib-docqa": "answer a question about a paragraph of a standard-library docstring",
    "stdlib-summarize": "summarise a standard-library module's documentation",
    "stdlib-math": "a word problem from the numbers on a standard-library line",
}
CATEGORY = {
    "stdlib-explain": "code",
    "stdlib-complete": "code",
    "stdlib-docqa": "qa",
    "stdlib-summarize": "summarization",
    "stdlib-math": "math",
}
HELD_PERMILLE = 150  # share (per mille) of the material on the held-out side of the split
SKIP_DIRS = STDLIB_SKIP  # tests, demos and GUI code, as the built-in workloads skip them
MAX_CODE_CHARS = 1800  # longer functions are skipped (prompts stay within max_prompt_tokens)
MIN_CODE_LINES = 4

QUESTIONS = (
    "What does this passage say the code returns or produces?",
    "Which arguments or inputs does the passage mention, and what is each one for?",
    "Explain this passage to someone new to Python, in your own words.",
    "What could go wrong for a caller who ignored what this passage says?",
    "Give a short example of code that follows what this passage describes.",
    "List the facts this passage states, one per line.",
)
EXPLAIN = (
    "Explain what this Python function from the `{mod}` module does, step by step:\n\n```python\n{code}\n```",
    "Here is `{name}` from Python's `{mod}` module. What is it for, and how does it work?\n\n"
    "```python\n{code}\n```",
    "Review this function from `{mod}`: describe its inputs, its result and any edge cases it handles.\n\n"
    "```python\n{code}\n```",
)
COMPLETE = (
    "Complete this Python function from the `{mod}` module. Write the body that does what the docstring "
    "says.\n\n```python\n{code}\n```",
    "Implement the following function (from Python's `{mod}`):\n\n```python\n{code}\n```",
)
SUMMARIZE = (
    "Summarise the following documentation of Python's `{mod}` module in two or three sentences:\n\n{text}",
    "Read this module documentation and write a short summary for a busy developer:\n\n{text}",
    "What is the `{mod}` module for? Summarise its documentation below.\n\n{text}",
)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def python_version() -> str:
    return ".".join(map(str, sys.version_info[:3]))


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's Python files (tests, tools and installed packages left out), sorted."""
    root = root or stdlib_root()
    out = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root).parts
        if any(part in SKIP_DIRS or part.startswith((".", "_test")) for part in rel[:-1]):
            continue
        if rel[-1].startswith("test_"):
            continue
        out.append(p)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def normalize(text: str) -> str:
    """Content as compared for splits and deduplication: lower case, whitespace runs as one space."""
    return " ".join(text.lower().split())


def content_hash(text: str) -> str:
    return hashlib.sha1(normalize(text).encode("utf-8")).hexdigest()


def held_by_content(text: str, permille: int) -> bool:
    """Whether `text` falls on the held-out side of a split by content (`permille` per mille of all texts):
    the hash of its normalised text decides, so equal content is always on the same side."""
    return int(content_hash(text)[:8], 16) % 1000 < permille


def is_held(material: str) -> bool:
    """Which side of the split a piece of material (a function, a paragraph, a line) is on."""
    return held_by_content(material, HELD_PERMILLE)


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or path.stem


def _functions(tree: ast.AST, lines: list[str]) -> Iterator[tuple[str, str, str, str | None]]:
    """(name, code, code without its docstring, signature and docstring or None) of the functions and
    methods in a module, dedented; functions too short or too long are skipped."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.end_lineno is None:
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
        seg = lines[first : node.end_lineno]
        if len(seg) < MIN_CODE_LINES or sum(map(len, seg)) > MAX_CODE_CHARS:
            continue
        body0 = node.body[0]
        has_doc = ast.get_docstring(node) is not None and body0.end_lineno is not None
        if has_doc:
            d0, d1 = body0.lineno - 1 - first, body0.end_lineno - first  # type: ignore[operator]
            bare = textwrap.dedent("\n".join(seg[:d0] + seg[d1:]))
            head = textwrap.dedent("\n".join(seg[:d1]))
        else:
            bare, head = textwrap.dedent("\n".join(seg)), None
        yield node.name, textwrap.dedent("\n".join(seg)), bare, head


def _paragraphs(doc: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", doc) if 120 <= len(p.strip()) <= 1200]


_NUM = re.compile(r"(?<![\w.])(\d{1,5})(?![\w.])")


def _math_prompt(rng: random.Random, line: str, mod: str) -> str | None:
    nums = sorted({int(x) for x in _NUM.findall(line) if 2 <= int(x) <= 99999}, key=str)
    if len(nums) < 2:
        return None
    a, b = rng.sample(nums, 2)
    c = rng.randint(2, 12)
    where = f"This line appears in Python's `{mod}` module:\n\n    {line.strip()}\n\n"
    asks = (
        f"A program uses the first number, {a}, as a batch size and the second, {b}, as the number of "
        f"items to process. How many full batches are there, and how many items are left over?",
        f"Suppose {a} and {b} are prices in cents and a shop sells {c} of each. What is the total in "
        f"dollars and cents?",
        f"What is the difference between {a} and {b}, and what percentage of the larger is the smaller? "
        f"Round to one decimal place.",
        f"A loop runs {c} times and adds {a} then subtracts {b} each time, starting from 0. What is the "
        f"final value? Show your working.",
        f"Find the average of {a}, {b} and {c}, and say which of the three is closest to it.",
    )
    return where + rng.choice(asks) + " Explain each step."


def _module_prompts(source: str, rng: random.Random, root: Path, path: Path) -> Iterator[tuple[str, str]]:
    """(material, prompt text) pairs of one source from one file, in a seeded order."""
    try:
        src = path.read_text(encoding="utf-8")
        tree = ast.parse(src)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return
    mod = _module_name(root, path)
    items: list[tuple[str, str]] = []
    if source in ("stdlib-explain", "stdlib-complete"):
        for name, code, bare, head in _functions(tree, src.splitlines()):
            if source == "stdlib-explain":
                if bare.count("\n") < 2:  # a stub once its docstring is gone
                    continue
                items.append((code, rng.choice(EXPLAIN).format(mod=mod, name=name, code=bare)))
            elif head and len(head) >= 80:
                items.append((code, rng.choice(COMPLETE).format(mod=mod, code=head)))
    elif source == "stdlib-docqa":
        docs = [ast.get_docstring(n) for n in ast.walk(tree) if isinstance(n, _DOC_NODES)]
        for para in (p for d in docs if d for p in _paragraphs(d)):
            q = rng.choice(QUESTIONS)
            items.append((para, f"From the documentation of Python's `{mod}` module:\n\n{para}\n\n{q}"))
    elif source == "stdlib-summarize":
        doc = ast.get_docstring(tree)
        if doc and len(doc) >= 200:
            text = doc[:2000]
            items.append((doc, rng.choice(SUMMARIZE).format(mod=mod, text=text)))
    elif source == "stdlib-math":
        for line in src.splitlines():
            if 20 <= len(line.strip()) <= 160 and (p := _math_prompt(rng, line, mod)):
                items.append((line.strip(), p))
    rng.shuffle(items)
    yield from items


_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def corpus_prompts(
    source: str, limit: int, seed: int, held: bool = False, per_file: int = 3, root: Path | None = None
) -> list[Prompt]:
    """The first `limit` prompts of `source` on one side of the split (held: the evaluation side), drawn
    under `seed`: files in a seeded order, at most `per_file` prompts from each (so a draw spans many
    modules), material repeated within the draw dropped."""
    root = root or stdlib_root()
    files = stdlib_files(root)
    random.Random(f"{seed}/{source}").shuffle(files)
    out: list[Prompt] = []
    seen: set[str] = set()
    for path in files:
        rel = path.relative_to(root).as_posix()
        rng = random.Random(f"{seed}/{source}/{rel}")
        taken = 0
        for material, text in _module_prompts(source, rng, root, path):
            h = content_hash(material)
            if is_held(material) != held or h in seen:
                continue
            seen.add(h)
            msgs = [user(text)]
            meta: dict[str, Any] = {"source": source, "module": _module_name(root, path)}
            out.append(Prompt(content_id(source, msgs), source, CATEGORY[source], msgs, meta=meta))
            taken += 1
            if len(out) >= limit:
                return out
            if taken >= per_file:
                break
    return out


def describe_source(name: str) -> dict[str, Any]:
    """What a training source is, for the manifest."""
    if name in SOURCES:
        return {"kind": "stdlib", "what": SOURCES[name], "python": python_version()}
    if name.startswith("file:"):
        return {"kind": "file", "what": "the user's prompts file or request log", "path": name[5:]}
    return {"kind": "workload", "what": "a built-in workload (templated offline stand-in)"}
