"""The server cells of a run as text (`speclab bench show RUN`, `speclab bench SWEEP --server`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from speclab.bench.repeats import contended, row_pressure
from speclab.bench.rows import read_rows
from speclab.bench.sampling import has_sampled, setting_text
from speclab.server.crosscheck import server_vs_offline


def load_key(r: dict[str, Any]) -> tuple[int, float]:
    """Sort order of loads: request rates (ascending), then concurrency levels."""
    load = r.get("load") or {}
    if load.get("request_rate") is not None:
        return (0, float(load["request_rate"]))
    if load.get("arrivals"):
        return (2, 0.0)
    return (1, float(load.get("max_concurrency") or 0))


def load_text(r: dict[str, Any]) -> str:
    load = r.get("load") or {}
    if load.get("request_rate") is not None:
        return f"{load['request_rate']:g}/s"
    if load.get("arrivals"):
        return str(load["arrivals"])
    return f"c{load.get('max_concurrency')}"


def _pressure_text(r: dict[str, Any]) -> str:
    p = row_pressure(r)
    return "" if p is None else f", CPU pressure {p:.0%}"


def _f(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _lat(r: dict[str, Any], metric: str, p: str) -> Any:
    return ((r.get("latency_ms") or {}).get(metric) or {}).get(p)


def format_server_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no server cells)"
    order: dict[str, int] = {}
    for r in rows:
        order.setdefault(str(r.get("label")), len(order) + (0 if r.get("method") == "none" else 1))
    sampled = has_sampled(rows)  # then the method column names each row's temperature (or "as logged")
    rows = sorted(
        rows,
        key=lambda r: (str(r.get("workload")), load_key(r), setting_text(r), order[str(r.get("label"))]),
    )
    header = [
        "workload",
        "load",
        "method",
        "tok/s",
        "TTFT p50",
        "p99",
        "TPOT p50",
        "p99",
        "ITL p50",
        "goodput",
        "acc.len",
        "exact",
        "status",
    ]
    body = []
    for r in rows:
        ok = r.get("status") == "ok"
        status = "ok" if ok else f"failed: {str(r.get('error'))[:50]}"
        if ok and contended(r):
            status = f"ok (contended{_pressure_text(r)})"
        body.append(
            [
                str(r.get("workload")),
                load_text(r),
                str(r.get("label")) + (f" T={setting_text(r)}" if sampled else ""),
                _f(r.get("throughput_tok_s"), ".1f"),
                _f(_lat(r, "ttft", "p50"), ".0f"),
                _f(_lat(r, "ttft", "p99"), ".0f"),
                _f(_lat(r, "tpot", "p50"), ".1f"),
                _f(_lat(r, "tpot", "p99"), ".1f"),
                _f(_lat(r, "itl", "p50"), ".1f"),
                _f(r.get("request_goodput"), ".2f"),
                _f(r.get("mean_acceptance_length"), ".2f"),
                "-" if r.get("lossless") is None else ("yes" if r["lossless"] else "NO"),
                status,
            ]
        )
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    lines = [
        "  ".join(
            h.ljust(w) if i < 3 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True))
        )
    ]
    for b in body:
        lines.append(
            "  ".join(
                c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(b, widths, strict=True))
            )
        )
    return "\n".join(lines)


def format_crosscheck(rows: list[dict[str, Any]]) -> str:
    checks = server_vs_offline(rows)
    if not checks:
        return ""
    out = ["acceptance on /metrics vs the offline engine's counters for the same requests:"]
    for c in checks:
        verdict = {True: "EQUAL", False: "DIFFERENT", None: "n/a"}[c["equal"]]
        out.append(f"  {c['server_cell_id']} vs {c['offline_cell_id']}: {verdict} ({c['detail']})")
    return "\n".join(out)


def format_server_run(run_dir: str | Path) -> str:
    rows = read_rows(run_dir, mode="all")
    server = [r for r in rows if r.get("mode") == "server"]
    parts = [
        "server cells (latency in ms; TPOT = time per output token after the first; goodput = requests/s "
        "meeting the sweep's SLO):",
        format_server_table(server),
    ]
    slo = next((r.get("slo_ms") for r in server if r.get("slo_ms")), None)
    if slo:
        parts.append("SLO: " + ", ".join(f"{k} <= {v:g}" for k, v in sorted(slo.items())))
    cc = format_crosscheck(rows)
    if cc:
        parts += ["", cc]
    return "\n".join(parts)
