"""The report's section on the speclab-trained drafters a run used: their held-out figures from each
drafter's training manifest, one row per evaluation source, each row saying which kind of figure it is
(prompts held out of a source the drafter trained on, or a source left out of training entirely), with the
similarity of those prompts to their nearest training prompt.

A run names a drafter by preset (`model = "smollm2-135m-eagle3"`) or by directory; a preset is looked up in
the drafters cache without training anything. No section when the run used no speclab-trained drafter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from speclab.report.data import ReportData
from speclab.report.html import table

MANIFEST = "speclab-manifest.json"
KIND = {
    False: "held out of a training source",
    True: "left out of training",
}
POOLED = {
    "training-sources": "pooled: held out of the training sources",
    "left-out": "pooled: sources left out of training",
}


def _drafter_dir(name: str) -> Path | None:
    """The directory of a drafter named by a run (a directory, or a trained preset already in the cache)."""
    p = Path(name).expanduser()
    if (p / MANIFEST).is_file():
        return p
    try:
        from speclab.models.presets import get_preset
        from speclab.models.trained import trained_resolver

        preset = get_preset(name)
        return trained_resolver(preset).trained_dir(preset) if preset.trained else None
    except Exception:  # an unknown name or no trainer loaded: not a speclab-trained drafter here
        return None


def drafter_manifests(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Drafter name -> its training manifest, for the drafters the rows name that speclab trained."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        name = (r.get("method_options") or {}).get("model")
        if not isinstance(name, str) or name in out:
            continue
        d = _drafter_dir(name)
        if d is None:
            continue
        try:
            m = json.loads((d / MANIFEST).read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(m.get("final"), dict):
            out[name] = m
    return out


def figure_rows(name: str, m: dict[str, Any]) -> list[list[Any]]:
    """Table rows of one manifest: per evaluation source, then the pooled groups."""
    final = m.get("final") or {}
    sims = (m.get("data") or {}).get("heldout_similarity") or {}
    sources = (m.get("evaluation") or {}).get("sources") or {}
    rows = []
    for w, r in final.items():
        if not isinstance(r, dict) or w == "all":
            continue
        if w in POOLED:
            kind = POOLED[w]
        elif w in sources:
            kind = KIND[bool(sources[w].get("left_out"))]
        else:
            kind = "held out (the manifest does not say whether it was trained on)"
        pos = " ".join(f"{x:.2f}" for x in r.get("per_position", []))
        sim = sims.get(w, {}).get("median")
        rows.append([name, w, kind, r.get("first_acceptance"), r.get("tokens_per_step"), pos, sim])
    return rows


def section(d: ReportData) -> list[str]:
    """The trained drafters' held-out figures by source (nothing without a speclab-trained drafter)."""
    found = drafter_manifests(d.all_rows or d.rows or [])
    if not found:
        return []
    h = [
        '<h2 id="drafters">Trained drafters: held-out figures by source</h2>',
        "<p>From each drafter's training manifest (replayed against the target's greedy output, not measured "
        "in this run). <b>Held out of a training source</b>: prompts of a source the drafter trained on, not "
        "seen in training. <b>Left out of training</b>: a source it never trained on, the figure for traffic "
        "unlike its training data. Similarity: the median difflib ratio of those prompts to their nearest "
        "training prompt (near 1: the held-out prompts have twins in training).</p>",
    ]
    rows = [row for name, m in found.items() for row in figure_rows(name, m)]
    headers = [
        "drafter",
        "source",
        "figure",
        "first-position acceptance",
        "tokens/step",
        "per position",
        "similarity",
    ]
    h.append(table(headers, rows, left=3))
    return h
