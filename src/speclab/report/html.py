"""HTML building blocks of the report: the stylesheet, escaping, tables, embedded figures, notice boxes."""

from __future__ import annotations

import base64
import html
from typing import Any

from speclab.analyze.tables import fmt
from speclab.report.figures import Figure

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;background:#fff}
main{max-width:1500px;margin:0 auto;padding:16px 28px 60px}
h1{font-size:1.6em;margin:.4em 0 .1em} h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:2em}
.sub{color:#666;margin:0 0 1em}
.headline{background:#f3f7ff;border-left:5px solid #3b6fd6;padding:10px 18px;margin:1em 0}
.headline li{margin:.25em 0}
.missing{background:#fff6e5;border-left:5px solid #e0a030;padding:8px 14px;margin:.8em 0}
.warn{color:#8a5a00}
table{border-collapse:collapse;font-size:12.5px;margin:.5em 0}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f4f4f4;position:sticky;top:0;white-space:normal;vertical-align:bottom}
td.l,th.l,td.t,th.t{text-align:left} td.l,td.t,td.w{white-space:normal} td.long{overflow-wrap:anywhere;min-width:9em}
tr.off td{background:#fdecec} tr.marginal td{background:#fff8e0} tr.failed td{color:#a00}
.pair{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start}
.pair>figure{flex:1.4 1 700px;min-width:480px} .pair>.tbl{flex:1 1 auto;overflow:auto;max-height:760px}
figure{margin:.6em 0} figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:13px;max-width:1100px}
pre{background:#f7f7f7;padding:8px 12px;overflow:auto;font-size:12px;max-height:400px}
nav a{margin-right:14px}
"""


class Html(str):
    """Text that already is HTML (e.g. a header with an entity such as &ge;): `esc` passes it through."""


def esc(x: Any) -> str:
    return x if isinstance(x, Html) else html.escape(str(x))


def num(v: Any, digits: int = 2) -> str:
    """A table cell: numbers formatted (floats to `digits` places, None as "-"), then escaped."""
    return esc(fmt(v, digits))


# a text cell with a word longer than this may break inside it (a label with its options, a path)
LONG_WORD = 24


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _cell_class(value: Any, column: str) -> str:
    """column: "l" (a left label column), "t" (text: no number in it) or "" (numbers). Numbers stay on one
    line; text wraps at spaces and hyphens (inside a very long word too), so a table with a column of
    sentences (why, verdict) fits a laptop window instead of running off its right edge."""
    if not isinstance(value, str):
        return column
    long = " long" if any(len(w) > LONG_WORD for w in value.replace("-", " ").split()) else ""
    return (column or "w") + long


def table(
    headers: list[str], rows: list[list[Any]], left: int = 1, row_classes: list[str] | None = None
) -> str:
    """A table; the first `left` columns are left-aligned, and so are the other columns that hold text and no
    number; `row_classes` (if given) classes each body row."""
    cols = [
        "l" if i < left else ("t" if not any(_is_number(r[i]) for r in rows if i < len(r)) else "")
        for i in range(len(headers))
    ]
    head = "".join(f'<th class="{cols[i]}">{esc(h)}</th>' for i, h in enumerate(headers))
    body = []
    for j, r in enumerate(rows):
        cls = f' class="{row_classes[j]}"' if row_classes and row_classes[j] else ""
        tds = "".join(
            f'<td class="{_cell_class(c, cols[i] if i < len(cols) else "")}">{num(c)}</td>'
            for i, c in enumerate(r)
        )
        body.append(f"<tr{cls}>{tds}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def figure(fig: Figure) -> str:
    """The figure embedded as a base64 PNG (the report is one self-contained file), with its caption."""
    b64 = base64.b64encode(fig.png).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{b64}" alt="{esc(fig.title)}" data-file="{esc(fig.name)}">'
        f"<figcaption><b>{esc(fig.title)}</b> ({esc(fig.name)}). {esc(fig.caption)}</figcaption></figure>"
    )


def missing(text: str) -> str:
    return f'<div class="missing"><b>Missing input.</b> {esc(text)}</div>'


def figure_or_missing(fig: Figure | None, text: str) -> str:
    return figure(fig) if fig else missing(text)
