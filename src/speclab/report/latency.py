"""The report's "Latency against load" section: server-mode cells (speclab.server) as a figure and a table.

Per workload and kind of load (open loop: request rate; closed loop: concurrency), TTFT and TPOT at p50
(solid) and p99 (dashed) for every sweep entry, no SD included, so SD's effect on latency at each load is
read off one panel.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from speclab.bench.repeats import contended, row_pressure
from speclab.report.figures import Figure, _color_map, _grid, _legend_below, _png
from speclab.report.html import esc, figure_or_missing, missing, table
from speclab.server.crosscheck import server_vs_offline
from speclab.server.show import load_key, load_text

PANELS = (("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms)"))


def _lat(r: dict[str, Any], metric: str, p: str) -> float | None:
    v = ((r.get("latency_ms") or {}).get(metric) or {}).get(p)
    return float(v) if isinstance(v, int | float) else None


def latency_vs_load(rows: list[dict[str, Any]] | None) -> Figure | None:
    """TTFT and TPOT p50/p99 against load, one line pair per sweep entry; None without ok server rows."""
    ok = [r for r in rows or [] if r.get("status") == "ok"]
    if not ok:
        return None
    # (workload, kind) -> label -> [(x, row)]
    series: dict[tuple[str, str], dict[str, list[tuple[float, dict[str, Any]]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for r in ok:
        kind, x = load_key(r)
        series[(str(r.get("workload")), "rate" if kind == 0 else "concurrency")][str(r.get("label"))].append(
            (x, r)
        )
    keys = sorted(series)
    colors = _color_map([lbl for k in keys for lbl in series[k]])
    fig, axes = _grid(len(keys) * len(PANELS), ncols=len(PANELS), w=5.6, h=3.9)
    for i, key in enumerate(keys):
        wl, kind = key
        for j, (metric, ylabel) in enumerate(PANELS):
            ax = axes[i * len(PANELS) + j]
            for label, pts in sorted(series[key].items(), key=lambda kv: (kv[0] != "none", kv[0])):
                pts = sorted(pts, key=lambda t: t[0])
                xs = [x for x, _ in pts]
                for p, style in (("p50", "o-"), ("p99", "s--")):
                    ys = [_lat(r, metric, p) for _, r in pts]
                    xy = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
                    if xy:
                        ax.plot(
                            *zip(*xy, strict=True),
                            style,
                            color=colors[label],
                            lw=1.8 if p == "p50" else 1.1,
                            label=f"{label} {p}",
                        )
            ax.set_xlabel(
                "request rate (req/s, Poisson)" if kind == "rate" else "concurrency (requests in flight)"
            )
            ax.set_ylabel(ylabel)
            ax.set_title(f"{wl}: {ylabel.split()[0]} vs {kind}")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
    _legend_below(fig, axes, ncols=4, fontsize=8)
    return Figure(
        "latency_vs_load.png",
        "Latency against load, with and without SD",
        "Server mode (vllm serve driven by vllm bench serve): time to first token and time per output token "
        "(after the first) at p50 (solid) and p99 (dashed) per request rate or concurrency level; one colour "
        "per sweep entry, none = no SD. The same numbers are in the table beside it.",
        _png(fig),
    )


HEADERS = [
    "workload",
    "load",
    "method",
    "tok/s",
    "TTFT p50",
    "TTFT p99",
    "TPOT p50",
    "TPOT p99",
    "goodput",
    "good %",
    "mean acc",
    "token-exact",
    "= offline",
    "status",
]


def latency_table(rows: list[dict[str, Any]], all_rows: list[dict[str, Any]] | None = None) -> str:
    checks = {c["server_cell_id"]: c["equal"] for c in server_vs_offline(all_rows or rows)}
    order: dict[str, int] = {}
    for r in rows:
        order.setdefault(str(r.get("label")), len(order) + (0 if r.get("method") == "none" else 1))
    rows = sorted(rows, key=lambda r: (str(r.get("workload")), load_key(r), order[str(r.get("label"))]))
    body, classes = [], []
    for r in rows:
        ok = r.get("status") == "ok"
        status = "ok" if ok else f"{r.get('status')}: {str(r.get('error'))[:40]}"
        if ok and contended(r):
            p = row_pressure(r)
            status = "ok, contended" + ("" if p is None else f" ({p:.0%} CPU pressure)")
        share = r.get("goodput_share")
        body.append(
            [
                r.get("workload"),
                load_text(r),
                r.get("label"),
                r.get("throughput_tok_s"),
                _lat(r, "ttft", "p50"),
                _lat(r, "ttft", "p99"),
                _lat(r, "tpot", "p50"),
                _lat(r, "tpot", "p99"),
                r.get("request_goodput"),
                None if share is None else 100.0 * share,
                r.get("mean_acceptance_length"),
                r.get("lossless"),
                checks.get(r.get("cell_id")),
                status,
            ]
        )
        classes.append("failed" if not ok else "")
    return table(HEADERS, body, left=3, row_classes=classes)


def section(
    server_rows: list[dict[str, Any]] | None, fig: Figure | None, all_rows: list[dict[str, Any]] | None = None
) -> list[str]:
    h = ['<h2 id="latency">Latency against load (server mode)</h2>']
    if not server_rows:
        return h + [
            missing(
                "No server-mode cells in this run (`speclab bench SWEEP --server` with a [server] table)."
            )
        ]
    slo = next((r.get("slo_ms") for r in server_rows if r.get("slo_ms")), None)
    h.append(
        "<p>Each engine configuration behind <code>vllm serve</code> on loopback, driven by <code>vllm bench "
        "serve</code> with the bench's own prompts: open loop at Poisson request rates, closed loop at fixed "
        "concurrency. Latencies in ms (client-side, streaming); goodput = requests/s meeting the SLO"
        + (esc(" (" + ", ".join(f"{k} <= {v:g}" for k, v in sorted(slo.items())) + ")") if slo else "")
        + "; mean acc from the server's /metrics; token-exact = generated texts equal to no SD at the same "
        "load; = offline: /metrics acceptance equals the offline engine's counters for the same requests.</p>"
    )
    h.append('<div class="pair">')
    h.append(figure_or_missing(fig, "No ok server cells to plot."))
    h.append(
        f'<div class="tbl"><b>Server cells</b> ({len(server_rows)} rows)'
        + latency_table(server_rows, all_rows)
        + "</div>"
    )
    h.append("</div>")
    return h
