"""The temperature section's figures: speedup against temperature (one panel per workload and batch size,
one line per configuration) and the engine's acceptance per draft position against temperature (one panel
per workload and configuration, one line per position). Both read `report.sampling.cells` records."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from speclab.report.figures import Figure, _color_map, _grid, _legend_below, _png

SPEEDUP_CAPTION = (
    "One panel per workload and batch size, one line per configuration; printed values are the table's "
    "speedups (median of matched pairs). Filled dot: the noise supports a verdict (faster or slower than "
    "no SD); hollow dot: cannot tell. Pale bar: the matched pairs' range. Red cross: engine fault flagged "
    "on that cell. Grey line: 1x.",
)

ACCEPTANCE_CAPTION = (
    "The engine's acceptance rate of the draft at each position (bench rows' acceptance_rate_per_pos: "
    "the share of steps whose draft at that position was accepted), mean over the batch sizes measured; "
    "one panel per workload and configuration. Red band: a cell at that temperature is flagged as an "
    "engine fault.",
)


def _axis(cs: list[dict[str, Any]]) -> tuple[list[Any], dict[Any, int]]:
    """The settings measured, in order (greedy first, as logged last), and each one's x position."""
    keys = sorted({c["key"] for c in cs})
    return keys, {k: i for i, k in enumerate(keys)}


def _finish(fig: Any, axes: list[Any], ncols: int, name: str, title: str, caption: str) -> Figure:
    """The shared legend below the panels, and the figure as a PNG."""
    _legend_below(fig, axes, ncols=ncols, fontsize=8.5)
    return Figure(name, title, caption, _png(fig))


def _label(ax: Any, cs: list[dict[str, Any]], keys: list[Any], ylabel: str, title: str) -> None:
    """A panel's temperature ticks, y label and title."""
    _ticks(ax, cs, keys)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)


def _ticks(ax: Any, cs: list[dict[str, Any]], keys: list[Any]) -> None:
    names = {c["key"]: c["setting"].replace("T = ", "") for c in cs}
    ax.set_xticks(range(len(keys)), [names[k] for k in keys])
    ax.set_xlim(-0.4, len(keys) - 0.6)
    ax.set_xlabel("temperature")
    ax.grid(alpha=0.3)


def speedup_vs_temperature(cs: list[dict[str, Any]]) -> Figure | None:
    """Measured speedup per configuration against temperature, with its matched-pair spread."""
    ok = [c for c in cs if c["speedup"] is not None]
    if not ok:
        return None
    keys, xpos = _axis(ok)
    panels: dict[tuple[str, str, int], dict[str, list[dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for c in ok:
        panels[(c["workload"], c["batching"], c["batch_size"])][c["configuration"]].append(c)
    names = sorted(panels)
    sizes = sorted({k[2] for k in names})
    ncols = min(len(sizes), 4) if len(sizes) > 1 else min(len(names), 3)
    colors = _color_map([c["configuration"] for c in ok])
    fig, axes = _grid(len(names), ncols=ncols, w=4.6, h=3.4)
    for ax, key in zip(axes, names, strict=True):
        for label, pts in sorted(panels[key].items()):
            pts = sorted(pts, key=lambda c: c["key"])
            xs = [xpos[c["key"]] for c in pts]
            ys = [float(c["speedup"]) for c in pts]
            ax.plot(xs, ys, "-", color=colors[label], lw=1.8, label=label)
            for x, y, c in zip(xs, ys, pts, strict=True):
                sp = c["spread_values"]
                if sp is not None:
                    ax.plot([x, x], sp, color=colors[label], lw=5, alpha=0.25, solid_capstyle="butt")
                supported = c["status"] in ("faster", "slower")
                ax.plot(x, y, "o", ms=6, color=colors[label], mfc=colors[label] if supported else "white")
                if c["flag"]:
                    ax.plot(x, y, "x", ms=11, mew=2.5, color="#c00000")
                ax.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(5, 3), fontsize=7.5)
        ax.axhline(1.0, color="grey", lw=1)
        _label(ax, ok, keys, "speedup vs no SD", f"{key[0]} ({key[1]}), batch {key[2]}")
    return _finish(fig, axes, 6, "speedup_vs_temperature.png", "Speedup vs temperature", SPEEDUP_CAPTION)


def acceptance_vs_temperature(cs: list[dict[str, Any]]) -> Figure | None:
    """The engine's acceptance rate at each draft position against temperature (mean over batch sizes)."""
    ok = [c for c in cs if c["per_pos"]]
    if not ok:
        return None
    keys, xpos = _axis(ok)
    panels: dict[tuple[str, str], dict[Any, list[list[float]]]] = defaultdict(lambda: defaultdict(list))
    flagged: dict[tuple[str, str], set[Any]] = defaultdict(set)
    for c in ok:
        panels[(c["workload"], c["configuration"])][c["key"]].append(c["per_pos"])
        if c["flag"]:
            flagged[(c["workload"], c["configuration"])].add(c["key"])
    names = sorted(panels)
    depth = max(len(p) for c in ok for p in [c["per_pos"]])
    shades = [f"C{i}" for i in range(10)]
    configurations = len({k[1] for k in names})
    fig, axes = _grid(len(names), ncols=configurations if configurations <= 4 else 3, w=3.6, h=2.9)
    for ax, key in zip(axes, names, strict=True):
        by_key = panels[key]
        ks = sorted(by_key)
        for j in range(depth):
            xs, ys = [], []
            for k in ks:
                vals = [p[j] for p in by_key[k] if len(p) > j]
                if vals:
                    xs.append(xpos[k])
                    ys.append(sum(vals) / len(vals))
            if xs:
                ax.plot(xs, ys, "o-", ms=4, color=shades[j % 10], label=f"position {j + 1}")
        for k in flagged[key]:
            ax.axvspan(xpos[k] - 0.3, xpos[k] + 0.3, color="#c00000", alpha=0.12, lw=0)
        ax.set_ylim(-0.03, 1.03)
        _label(ax, ok, keys, "acceptance rate", f"{key[0]}: {key[1]}")
    title = "Engine acceptance per position vs temperature"
    return _finish(fig, axes, 8, "acceptance_vs_temperature.png", title, ACCEPTANCE_CAPTION)
