"""offline-summarization: CNN/DailyMail stand-in. Passages of local documentation prose to summarise.

Material, in this order: Python's own documentation text shipped in the stdlib (pydoc_data.topics, the
language reference behind `help()`), long docstrings of the stdlib (read with `ast`, nothing is
imported), and plain-text files under /usr/share/doc (README, *.txt, *.md; gzip files too). With --source,
the text files under that directory (or that file) instead. Passages are runs of prose paragraphs of
120-400 words, like a news article; code-like or list-like paragraphs are dropped.
"""

from __future__ import annotations

import ast
import functools
import gzip
import random
import re
from pathlib import Path

from speclab.workloads import formats
from speclab.workloads.base import Prompt, WorkloadError, WorkloadInfo, content_id, user
from speclab.workloads.offline._common import python_files, stdlib_dir, take_distinct, target_size
from speclab.workloads.registry import register_workload

NAME = "offline-summarization"
MIN_WORDS, MAX_WORDS = 120, 400
DOC_ROOT = Path("/usr/share/doc")
_TEXT_NAME = re.compile(r"(readme|news|changes|faq|intro|overview|guide|about|\.txt$|\.md$|\.rst$)", re.I)
_SKIP_NAME = re.compile(
    r"(copyright|changelog|license|licence|authors|thanks|\.html|\.js|\.css|\.json)", re.I
)
_MAX_FILE_BYTES = 400_000


def _is_prose(par: str) -> bool:
    lines = [ln for ln in par.splitlines() if ln.strip()]
    if not lines:
        return False
    indented = sum(ln.startswith((" ", "\t", ">>>", "$ ", "#", "*", "-", "|", "+", "=")) for ln in lines)
    if indented > len(lines) * 0.25:
        return False
    chars = [c for c in par if not c.isspace()]
    if not chars:
        return False
    letters = sum(c.isalpha() for c in chars)
    words = par.split()
    if par.count("://") > 1 or re.search(r"^\s*\[[^\]]+\]:", par, re.M):  # link lists, markdown refs
        return False
    return (
        letters / len(chars) > 0.78
        and len(words) >= 12
        and par.count("=") < 3
        and len(chars) / len(words) < 8.5  # long "words" = URLs, hashes, identifiers
    )


def _clean(par: str) -> str:
    text = " ".join(ln.strip() for ln in par.splitlines())
    text = re.sub(r"[*`]{1,2}([^*`]+)[*`]{1,2}", r"\1", text)  # light markdown / reST emphasis
    return re.sub(r"\s+", " ", text).strip()


def _passages(text: str) -> list[str]:
    """Runs of consecutive prose paragraphs, MIN_WORDS..MAX_WORDS words each."""
    out: list[str] = []
    cur: list[str] = []
    n = 0
    for par in re.split(r"\n\s*\n", text.replace("\r", "")):
        if not _is_prose(par):
            if n >= MIN_WORDS:
                out.append("\n\n".join(cur))
            cur, n = [], 0
            continue
        clean = _clean(par)
        w = len(clean.split())
        if w > MAX_WORDS:
            cur, n = [], 0
            continue
        if n + w > MAX_WORDS:
            if n >= MIN_WORDS:
                out.append("\n\n".join(cur))
            cur, n = [], 0
        cur.append(clean)
        n += w
    if n >= MIN_WORDS:
        out.append("\n\n".join(cur))
    return out


def _read_text(path: Path) -> str:
    try:
        if path.stat().st_size > _MAX_FILE_BYTES:
            return ""
        if path.suffix == ".gz":
            with gzip.open(path) as f:
                data = f.read(_MAX_FILE_BYTES)
        else:
            data = path.read_bytes()
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError):
        return ""


def _text_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    files = []
    for p in root.rglob("*"):
        name = p.name[:-3] if p.name.endswith(".gz") else p.name
        if p.is_file() and _TEXT_NAME.search(name) and not _SKIP_NAME.search(name):
            files.append(p)
    return sorted(files)


@functools.lru_cache(maxsize=1)
def _machine_material() -> tuple[tuple[str, str], ...]:
    """(origin, text) pieces of local documentation, in a fixed order."""
    pieces: list[tuple[str, str]] = []
    try:
        from pydoc_data.topics import topics  # plain data: the language reference text

        pieces += [(f"pydoc_data.topics:{k}", topics[k]) for k in sorted(topics)]
    except ImportError:  # some distributions strip it
        pass
    root = stdlib_dir()
    for path in python_files(root):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        rel = path.relative_to(root)
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc and len(doc.split()) >= MIN_WORDS:
                    where = "" if isinstance(node, ast.Module) else f":{node.name}"
                    pieces.append((f"stdlib:{rel}{where}", doc))
    if DOC_ROOT.is_dir():
        pieces += [(str(p), _read_text(p)) for p in _text_files(DOC_ROOT)]
    return tuple(pieces)


def build(limit: int | None, seed: int, source: str | None) -> list[Prompt]:
    if source:
        root = Path(source)
        pieces = [(str(p), _read_text(p)) for p in _text_files(root)]
    else:
        pieces = list(_machine_material())
    pool: list[tuple[str, str]] = []
    for origin, text in pieces:
        pool += [(origin, passage) for passage in _passages(text)]
    if not pool:
        where = source or "this machine's documentation"
        raise WorkloadError(f"{NAME}: no prose passages of {MIN_WORDS}-{MAX_WORDS} words found in {where}")
    rng = random.Random(seed)
    order = list(range(len(pool)))
    rng.shuffle(order)
    return take_distinct((_prompt(*pool[i]) for i in order), target_size(limit))


def _prompt(origin: str, passage: str) -> Prompt:
    content, (b0, b1) = formats.summarize(passage, what="text")
    messages = [user(content)]
    return Prompt(
        id=content_id(NAME, messages),
        workload=NAME,
        category="summarization",
        messages=messages,
        reference=None,
        meta={
            "stands_in_for": "cnn-dailymail",
            "origin": origin,
            "words": len(passage.split()),
            "truncate": {"message": 0, "start": b0, "end": b1},
        },
    )


register_workload(
    WorkloadInfo(
        name=NAME,
        category="summarization",
        kind="offline",
        description="Stand-in for CNN/DailyMail: 120-400-word prose passages of local documentation "
        "(Python's docs in pydoc_data, stdlib docstrings, /usr/share/doc) to summarise.",
        notes="The pool depends on what is installed here; --source DIR uses your own text files. "
        "Default 500 prompts (fewer if the pool is smaller).",
    ),
    build,
)
