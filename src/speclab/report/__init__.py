"""`speclab report`: one self-contained HTML file (PNGs embedded as base64) plus the same PNGs beside it.

Inputs, each optional but at least one needed: a bench run (RUN/results.jsonl, RUN/traces, RUN/timings.csv),
a trace store, an analysis JSON from `speclab analyze`. Whatever is missing gets a labelled section saying
so, instead of an empty plot.

Modules: build (build_report: inputs, figures, files), sections (one function per report section), html
(stylesheet, escaping, tables), figures (matplotlib), recommend (the recommendation table).
"""

from speclab.report.build import build_report

__all__ = ["build_report"]
