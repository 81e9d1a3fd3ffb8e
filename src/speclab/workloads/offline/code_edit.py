"""offline-code-edit: InstructCoder stand-in. Functions from installed Python source (the stdlib by default)
with an instruction to apply one concrete edit, so the answer repeats most of the prompt.

Edits: rename the function, rename a parameter, rename a local variable, change a numeric constant (these
four have an exact reference answer), add a docstring, add type hints. The prompt layout is the one used for
InstructCoder (vLLM's benchmark loader): the code first, then the instruction, then "Just output the code".
"""

from __future__ import annotations

import ast
import io
import random
import re
import textwrap
import tokenize
from collections.abc import Iterator
from pathlib import Path

from speclab.workloads import formats
from speclab.workloads.base import Prompt, WorkloadError, WorkloadInfo, content_id, user
from speclab.workloads.offline._common import python_files, stdlib_dir, take_distinct, target_size
from speclab.workloads.registry import register_workload

NAME = "offline-code-edit"
MIN_LINES, MAX_LINES, MAX_CHARS = 8, 40, 2000
PER_FILE = 2  # functions taken per source file at most, for variety


def _candidates(path: Path) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    """(qualname, node, dedented source) of plain functions and methods of modest size in one file."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return []
    lines = text.splitlines()
    out = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if node.decorator_list or not MIN_LINES <= n <= MAX_LINES:
                    continue
                src = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
                if len(src) > MAX_CHARS or "\t" in src or not src.isascii() or src.startswith(" "):
                    continue
                try:
                    fn = ast.parse(src).body[0]
                except SyntaxError:
                    continue
                out.append((prefix + node.name, fn, src))

    visit(tree.body, "")
    return out


def _tokens(src: str) -> list[tokenize.TokenInfo]:
    return list(tokenize.generate_tokens(io.StringIO(src).readline))


def _in_fstring(src_tokens: list[tokenize.TokenInfo], name: str) -> bool:
    pat = re.compile(rf"\b{re.escape(name)}\b")
    return any(
        t.type == tokenize.STRING and re.match(r"^[rbuRBU]*[fF]", t.string) and pat.search(t.string)
        for t in src_tokens
    )


def _replace(src: str, toks: list[tokenize.TokenInfo], new_by_index: dict[int, str]) -> str:
    lines = src.splitlines(keepends=True)
    for i in sorted(new_by_index, key=lambda j: toks[j].start, reverse=True):
        (r, c0), (_, c1) = toks[i].start, toks[i].end
        line = lines[r - 1]
        lines[r - 1] = line[:c0] + new_by_index[i] + line[c1:]
    return "".join(lines)


def _rename(src: str, old: str, new: str, keep_call_keywords: bool) -> str | None:
    """Rename every use of identifier `old`; None if that cannot be done by token replacement."""
    toks = _tokens(src)
    if _in_fstring(toks, old) or any(t.type == tokenize.NAME and t.string == new for t in toks):
        return None
    idx: dict[int, str] = {}
    depth, in_sig = 0, True
    for i, t in enumerate(toks):
        if t.type == tokenize.OP:
            if t.string in "([{":
                depth += 1
            elif t.string in ")]}":
                depth -= 1
            elif t.string == ":" and depth == 0:
                in_sig = False
        if t.type != tokenize.NAME or t.string != old:
            continue
        prev = toks[i - 1] if i else None
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        if prev is not None and prev.string == ".":
            continue  # attribute of something else
        if (
            keep_call_keywords
            and not in_sig
            and depth > 0
            and nxt is not None
            and nxt.string == "="
            and prev is not None
            and prev.string in ("(", ",")
        ):
            continue  # keyword argument name of a call: belongs to the callee
        idx[i] = new
    if not idx:
        return None
    return _replace(src, toks, idx)


def _new_name(old: str, rng: random.Random) -> str:
    base = old.strip("_") or "value"
    lead = "_" if old.startswith("_") else ""
    return lead + rng.choice([f"{base}_impl", f"new_{base}", f"{base}_v2", f"do_{base}", f"{base}_fn"])


def _new_var(old: str, rng: random.Random) -> str:
    base = old.strip("_") or "value"
    return rng.choice([f"{base}_value", f"my_{base}", f"{base}_item", f"the_{base}", f"{base}_var"])


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return [n for n in names if n not in ("self", "cls")]


def _locals(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    params = set(_params(fn)) | {"self", "cls"}
    seen: list[str] = []
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Name)
            and isinstance(node.ctx, ast.Store)
            and node.id not in params
            and node.id not in seen
            and len(node.id) > 1
        ):
            seen.append(node.id)
    return seen


def _has_docstring(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return ast.get_docstring(fn, clean=False) is not None


def _has_annotations(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    a = fn.args
    args = a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x is not None]
    return fn.returns is not None or any(x.annotation is not None for x in args)


def _make_edit(
    qual: str, fn: ast.FunctionDef | ast.AsyncFunctionDef, src: str, rng: random.Random
) -> tuple[str, str, str | None] | None:
    """(edit kind, instruction, reference or None) for one feasible edit chosen at random."""
    kinds = ["rename_function", "rename_parameter", "rename_variable", "change_constant"]
    if not _has_docstring(fn):
        kinds.append("add_docstring")
    if not _has_annotations(fn):
        kinds.append("add_type_hints")
    rng.shuffle(kinds)
    name = fn.name
    for kind in kinds:
        if kind == "rename_function":
            new = _new_name(name, rng)
            ref = _rename(src, name, new, keep_call_keywords=True)
            if ref:
                return kind, f"Rename the function `{name}` to `{new}`.", ref
        elif kind in ("rename_parameter", "rename_variable"):
            names = _params(fn) if kind == "rename_parameter" else _locals(fn)
            if names:
                old = rng.choice(names)
                new = _new_var(old, rng)
                ref = _rename(src, old, new, keep_call_keywords=True)
                if ref:
                    what = (
                        f"parameter `{old}` of `{name}`"
                        if kind == "rename_parameter"
                        else f"local variable `{old}`"
                    )
                    return kind, f"Rename the {what} to `{new}`.", ref
        elif kind == "change_constant":
            toks = _tokens(src)
            nums = [i for i, t in enumerate(toks) if t.type == tokenize.NUMBER and t.string.isdigit()]
            counts: dict[str, int] = {}
            for i in nums:
                counts[toks[i].string] = counts.get(toks[i].string, 0) + 1
            unique = [i for i in nums if counts[toks[i].string] == 1 and int(toks[i].string) >= 2]
            if unique:
                i = rng.choice(unique)
                old_v = toks[i].string
                new_v = str(int(old_v) * 2 if rng.random() < 0.5 else int(old_v) + 1)
                line = toks[i].line.strip()
                ref = _replace(src, toks, {i: new_v})
                return kind, f"Change the constant `{old_v}` in the line `{line}` to `{new_v}`.", ref
        elif kind == "add_docstring":
            return kind, f"Add a concise docstring to `{name}` that explains what it does.", None
        elif kind == "add_type_hints":
            return kind, f"Add type hints to the parameters and the return value of `{name}`.", None
    return None


def _generate(files: list[Path], root: Path, seed: int) -> Iterator[Prompt]:
    for path in files:
        cands = _candidates(path)
        # Each file gets its own generator so the stream does not depend on what earlier files contained.
        frng = random.Random(f"{seed}:{path.name}:{len(cands)}")
        for qual, fn, src in frng.sample(cands, min(PER_FILE, len(cands))):
            edit = _make_edit(qual, fn, src, frng)
            if edit is None:
                continue
            kind, instruction, ref = edit
            code = f"```python\n{src.rstrip()}\n```"
            content, (b0, b1) = formats.code_edit(code, instruction)
            messages = [user(content)]
            rel = str(path.relative_to(root)) if root.is_dir() else path.name
            yield Prompt(
                id=content_id(NAME, messages),
                workload=NAME,
                category="code-editing",
                messages=messages,
                reference=f"```python\n{ref.rstrip()}\n```" if ref else None,
                meta={
                    "stands_in_for": "instructcoder",
                    "edit": kind,
                    "source_file": rel,
                    "function": qual,
                    "function_lines": src.count("\n") + 1,
                    "truncate": {"message": 0, "start": b0, "end": b1},
                },
            )


def build(limit: int | None, seed: int, source: str | None) -> list[Prompt]:
    root = Path(source) if source else stdlib_dir()
    files = python_files(root)
    if not files:
        raise WorkloadError(f"{NAME}: no Python source files under {root}")
    rng = random.Random(seed)
    rng.shuffle(files)
    return take_distinct(_generate(files, root, seed), target_size(limit))


register_workload(
    WorkloadInfo(
        name=NAME,
        category="code-editing",
        kind="offline",
        description="Stand-in for InstructCoder: a stdlib function (8-40 lines) and one concrete edit "
        "(rename, constant change, docstring, type hints); the answer repeats most of the prompt.",
        notes="Built from this machine's Python sources (or --source DIR of .py files); default 500 prompts.",
    ),
    build,
)
