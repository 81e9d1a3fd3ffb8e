"""The report's figures, drawn with matplotlib's Agg backend (no display, no pyplot global state).

Each function returns a `Figure` record (file name, title, caption, PNG bytes) or None when its input is
missing; the report says what is missing instead of drawing an empty plot.
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.figure import Figure as MplFigure

from speclab.bench.rows import entry_labels

DPI = 100
GIB = 1024**3


@dataclass
class Figure:
    name: str  # file name, e.g. speedup_vs_batch.png
    title: str
    caption: str
    png: bytes


def _ok_labelled(rows: list[dict[str, Any]] | None) -> list[tuple[str, dict[str, Any]]]:
    """(sweep-entry label, row) of the ok rows; labels come from all rows, as every table names them."""
    rows = rows or []
    return [(lbl, r) for lbl, r in zip(entry_labels(rows), rows, strict=True) if r.get("status") == "ok"]


def _color_map(names: list[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {n: cmap(i % 10) for i, n in enumerate(sorted(set(names)))}


def _method_of(label: str) -> str:
    return (
        label.split("@", 1)[0].split(":", 1)[-1]
        if label.startswith(("oracle:", "fixed:"))
        else label.split("@", 1)[0]
    )


def _grid(n: int, ncols: int = 3, w: float = 5.0, h: float = 3.8) -> tuple[MplFigure, list[Any]]:
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig = MplFigure(figsize=(w * ncols, h * nrows + 0.4), dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _legend_below(fig: MplFigure, axes: list[Any], ncols: int, fontsize: float = 8) -> None:
    """One legend for all panels, below them (so it hides no line): each label once, first handle kept."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for hnd, lbl in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lbl, hnd)
    fig.legend(
        list(handles.values()), list(handles), loc="outside lower center", ncols=ncols, fontsize=fontsize
    )


def _png(fig: MplFigure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor="white")
    return buf.getvalue()


def speedup_vs_batch(rows: list[dict[str, Any]] | None, gap: dict[str, Any] | None) -> Figure | None:
    """Measured speedup per method (solid, values printed) and simulated bounds (dashed / dotted)."""
    measured: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    # entry label -> its method, for the colour it shares with that method's simulated bounds
    method_of: dict[str, str] = {}
    for label, r in _ok_labelled(rows):
        if r.get("method") in (None, "none") or r.get("speedup") is None:
            continue
        wl = f"{r.get('workload')} ({r.get('batching', 'replicate')})"
        method_of[label] = str(r.get("method"))
        bs = int(r["batch_size"])
        measured[wl][label][bs] = max(float(r["speedup"]), measured[wl][label].get(bs, 0.0))
    simulated: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for g in (gap or {}).get("rows") or []:
        wl = f"{g['workload']} ({g['batching']})"
        for policy, v in (g.get("simulated") or {}).items():
            if policy == "none":
                continue
            simulated[wl][policy][int(g["batch_size"])] = float(v)
    workloads = sorted(set(measured) | set(simulated))
    if not workloads:
        return None
    names = [
        method_of.get(lbl) or _method_of(lbl) for w in workloads for lbl in [*measured[w], *simulated[w]]
    ]
    colors = _color_map(names)
    fig, axes = _grid(len(workloads), ncols=2, w=5.6, h=4.2)
    for ax, wl in zip(axes, workloads, strict=True):
        for label, pts in sorted(measured[wl].items()):
            xs = sorted(pts)
            ys = [pts[x] for x in xs]
            ax.plot(xs, ys, "o-", color=colors[method_of[label]], lw=2, label=f"{label} measured")
            for x, y in zip(xs, ys, strict=True):
                ax.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        for policy, pts in sorted(simulated[wl].items()):
            xs = sorted(pts)
            ys = [pts[x] for x in xs]
            if policy.startswith("oracle-combine:"):
                ax.plot(xs, ys, "k:", marker="^", lw=2, label="oracle-combine (sim)")
            elif policy.startswith("oracle:"):
                ax.plot(
                    xs,
                    ys,
                    "--",
                    marker="v",
                    color=colors[_method_of(policy)],
                    lw=1.3,
                    label=f"{policy} (sim)",
                )
            else:
                ax.plot(
                    xs, ys, "-.", color=colors[_method_of(policy)], lw=1, alpha=0.7, label=f"{policy} (sim)"
                )
        ax.axhline(1.0, color="grey", lw=1)
        ax.set_xscale("log", base=2)
        sizes = sorted({x for d in (measured[wl], simulated[wl]) for pts in d.values() for x in pts})
        ax.set_xticks(sizes, [str(x) for x in sizes])
        ax.minorticks_off()
        ax.set_xlabel("batch size")
        ax.set_ylabel("speedup vs no SD")
        ax.set_title(wl)
        ax.grid(alpha=0.3)
    _legend_below(fig, axes, ncols=3, fontsize=8)
    return Figure(
        "speedup_vs_batch.png",
        "Speedup vs batch size",
        "Solid lines with printed values: measured speedup (output tokens/s with SD / without), the same numbers "
        "as the results table. Dashed: simulated single-method oracle; dotted black: simulated oracle-combine "
        "(per position the best method); dash-dot: simulated fixed-k policy (simulator check). Grey line: 1x.",
        _png(fig),
    )


def time_split(rows: list[dict[str, Any]] | None) -> Figure | None:
    """Share of each cell's time in propose / verify / other, stacked."""
    cells = [(lbl, r) for lbl, r in _ok_labelled(rows) if isinstance(r.get("time_split_s"), dict)]
    if not cells:
        return None
    by_wl: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for lbl, r in cells:
        by_wl[str(r.get("workload"))].append((lbl, r))
    workloads = sorted(by_wl)
    most = max(len(v) for v in by_wl.values())
    fig, axes = _grid(
        len(workloads), ncols=1 if most > 8 else 2, w=min(30.0, max(6.0, 0.55 * most + 2)), h=3.6
    )
    parts = (("propose", "#4c72b0"), ("verify", "#dd8452"), ("other", "#8c8c8c"))
    for ax, wl in zip(axes, workloads, strict=True):
        lrs = sorted(by_wl[wl], key=lambda lr: (str(lr[1].get("batching")), int(lr[1]["batch_size"]), lr[0]))
        labels = [f"{lbl}\nbs{r['batch_size']}" for lbl, r in lrs]
        rs = [r for _, r in lrs]
        x = np.arange(len(rs))
        bottom = np.zeros(len(rs))
        for key, color in parts:
            vals = []
            for r in rs:
                ts = r["time_split_s"]
                total = sum(float(ts.get(k) or 0) for k, _ in parts) or 1.0
                vals.append(100.0 * float(ts.get(key) or 0) / total)
            ax.bar(x, vals, bottom=bottom, color=color, label=key, width=0.7)
            bottom += np.array(vals)
        ax.set_xticks(x, labels, fontsize=7, rotation=35, ha="right", rotation_mode="anchor")
        ax.set_ylabel("% of step time")
        ax.set_ylim(0, 100)
        ax.set_title(wl)
        ax.legend(fontsize=7, loc="lower right")
    return Figure(
        "time_split.png",
        "Time split",
        "Share of each measured cell's time spent proposing (drafting), verifying (target forward) and on "
        "everything else (scheduling, sampling, rejection), from time_split_s in the results table.",
        _png(fig),
    )


def memory(rows: list[dict[str, Any]] | None) -> Figure | None:
    """Weights, KV cache, draft weights and peak RSS per method (max over the method's cells), in GiB."""
    cells = [(lbl, r) for lbl, r in _ok_labelled(rows) if isinstance(r.get("memory"), dict)]
    if not cells:
        return None
    agg: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for lbl, r in cells:
        for k, v in r["memory"].items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                agg[lbl][k] = max(agg[lbl][k], float(v))
    top = max((v for d in agg.values() for v in d.values()), default=0.0)
    unit, scale = ("GiB", GIB) if top >= 0.5 * GIB else ("MiB", 1024**2)
    labels = sorted(agg, key=lambda s: (s != "none", s))
    keys = ("weights_bytes", "draft_weights_bytes", "kv_cache_bytes", "peak_rss_bytes")
    fig = MplFigure(figsize=(max(6.0, 1.4 * len(labels) + 2), 3.8), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(labels))
    w = 0.8 / len(keys)
    for i, k in enumerate(keys):
        vals = [agg[lbl].get(k, 0.0) / scale for lbl in labels]
        bars = ax.bar(x + (i - 1.5) * w, vals, width=w, label=k.replace("_bytes", ""))
        ax.bar_label(bars, fmt="%.2f", fontsize=6)
    ax.set_xticks(x, labels)
    ax.set_ylabel(unit)
    ax.set_title("Memory per method (max over its cells)")
    ax.legend(fontsize=7)
    return Figure(
        "memory.png",
        "Memory",
        "Target weights, drafter weights, KV cache and peak process RSS per method, from the memory columns "
        f"of the results table (the maximum over that method's cells), in {unit}.",
        _png(fig),
    )


def _by_workload(acc: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in acc:
        out[e["workload"]].append(e)
    return out


def acceptance_hist(acc: list[dict[str, Any]] | None) -> Figure | None:
    if not acc:
        return None
    by = _by_workload(acc)
    colors = _color_map([e["method"] for e in acc])
    fig, axes = _grid(len(by))
    for ax, (wl, es) in zip(axes, sorted(by.items()), strict=True):
        for e in es:
            v = np.array(e["hist"]["values"])
            c = np.array(e["hist"]["counts"], dtype=float)
            ax.step(
                v,
                c / max(c.sum(), 1),
                where="mid",
                color=colors[e["method"]],
                lw=1.8,
                label=f"{e['method']} k{e['k_max']} (mean {e['mean']:.2f})",
            )
        ax.set_xlabel("acceptance length (accepted + 1)")
        ax.set_ylabel("share of positions")
        ax.set_title(wl)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return Figure(
        "acceptance_hist.png",
        "Acceptance length histograms",
        "Distribution of acc_len over output positions 1..n-1 (replayed traces), per workload and method. A "
        "long right tail means rare long bursts.",
        _png(fig),
    )


def acceptance_position(acc: list[dict[str, Any]] | None) -> Figure | None:
    if not acc:
        return None
    by = _by_workload(acc)
    colors = _color_map([e["method"] for e in acc])
    fig, axes = _grid(len(by))
    for ax, (wl, es) in zip(axes, sorted(by.items()), strict=True):
        for e in es:
            pc = e["position_curve"]
            edges = np.array(pc["edges"])
            mids = (edges[:-1] + edges[1:]) / 2
            y = np.array([np.nan if v is None else v for v in pc["mean"]], dtype=float)
            yw = np.array([np.nan if v is None else v for v in pc["mean_request_weighted"]], dtype=float)
            ax.plot(mids, y, "o-", color=colors[e["method"]], label=f"{e['method']} k{e['k_max']}")
            ax.plot(mids, yw, ":", color=colors[e["method"]], lw=1)
        ax.set_xlabel("position in output (0 = start, 1 = end)")
        ax.set_ylabel("mean acceptance length")
        ax.set_xlim(0, 1)
        ax.set_title(wl)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return Figure(
        "acceptance_position.png",
        "Acceptance along the output",
        "Mean acc_len per normalised position bin (position / output length), all outputs including long "
        "ones. Solid: pooled over positions; dotted: each request weighted equally.",
        _png(fig),
    )


def per_request_spread(acc: list[dict[str, Any]] | None) -> Figure | None:
    es = [e for e in acc or [] if e["per_request"].get("values")]
    if not es:
        return None
    fig = MplFigure(figsize=(max(6.0, 0.9 * len(es) + 2), 3.8), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    ax.boxplot([e["per_request"]["values"] for e in es], whis=(5, 95), showfliers=True)
    ax.set_xticks(
        range(1, len(es) + 1), [f"{e['workload']}\n{e['method']} k{e['k_max']}" for e in es], fontsize=7
    )
    ax.set_ylabel("per-request mean acc_len")
    ax.set_title("Per-request spread (box: p25-p75, whiskers: p5-p95)")
    ax.grid(alpha=0.3, axis="y")
    return Figure(
        "per_request_spread.png",
        "Per-request spread",
        "Distribution over requests of each request's mean acceptance length.",
        _png(fig),
    )


def overlap_advantage(overlap: dict[str, Any] | None) -> Figure | None:
    groups = (overlap or {}).get("groups") or []
    if not groups:
        return None
    fig, axes = _grid(len(groups))
    for ax, g in zip(axes, groups, strict=True):
        pts = np.array([[p[0], p[1]] for p in g["points"]], dtype=float)
        ax.scatter(pts[:, 0], pts[:, 1], s=12, alpha=0.6)
        if g.get("fit"):
            xs = np.linspace(pts[:, 0].min(), pts[:, 0].max(), 20)  # the data's range: no extrapolation
            ax.plot(xs, g["fit"]["slope"] * xs + g["fit"]["intercept"], "r-", lw=1, label="linear fit")
        ax.axhline(0.0, color="grey", lw=1)
        ax.set_xlim(-0.02, 1.02)
        ax.set_xlabel("prompt-output overlap")
        ax.set_ylabel(f"acc({g['free_method']}) - acc({g['model_method']})")
        ax.set_title(f"{g['workload']}: {g['free_method']} vs {g['model_method']}")
        ax.grid(alpha=0.3)
        if g.get("fit"):
            ax.legend(fontsize=7)
    return Figure(
        "overlap_advantage.png",
        "Prompt-output overlap vs n-gram advantage",
        f"One point per request: overlap ({overlap.get('overlap_source')}) against the difference in mean "
        "acceptance length between the model-free proposer and a model drafter. Above 0: n-gram wins.",
        _png(fig),
    )
