"""`build_report`: gather the inputs, draw the figures, write OUT/report.html and OUT/*.png."""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any

from speclab.atomic import atomic_write_bytes, atomic_write_text
from speclab.bench.distribution_checks import merge_checks
from speclab.bench.expected_acceptance import merge_expected
from speclab.bench.noise import load_noise
from speclab.bench.rows import read_rows
from speclab.errors import SpeclabError
from speclab.report import figures as F
from speclab.report.html import CSS, esc
from speclab.report.latency import latency_vs_load
from speclab.report.recommend import recommendations
from speclab.report.sampling import cells, greedy_view, has_sampling
from speclab.report.sections import NAV, SECTIONS, TEMPERATURE_LINK, ReportData
from speclab.report.temperature_figures import acceptance_vs_temperature, speedup_vs_temperature


def _readable(path: Path) -> None:
    """atomic_path's temp files are 0600; a report is meant to be shared: apply the usual umask."""
    mask = os.umask(0)
    os.umask(mask)
    path.chmod(0o666 & ~mask)


def _load_analysis(
    analysis: str | Path | dict[str, Any] | None,
    traces: str | Path | None,
    run_path: Path | None,
    cost_model: str | None,
) -> dict[str, Any] | None:
    """The analysis as given (a dict or a JSON file), else computed in process from the traces."""
    if isinstance(analysis, str | Path):
        try:
            return json.loads(Path(analysis).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SpeclabError(f"{analysis}: cannot read analysis JSON: {exc}") from None
    if analysis is None and traces is not None:
        from speclab.analyze import analyze

        return analyze(
            traces,
            run=run_path,
            cost_model=cost_model,
            command="computed by this `speclab report` run (in process)",
        )
    return analysis


def build_report(
    out_dir: str | Path,
    run: str | Path | None = None,
    traces: str | Path | None = None,
    analysis: str | Path | dict[str, Any] | None = None,
    title: str | None = None,
    cost_model: str | None = None,
    command: str | None = None,
) -> Path:
    """Write OUT/report.html and OUT/*.png; returns the HTML path."""
    run_path = Path(run) if run else None
    # with the expected acceptance and engine faults of `trace crosscheck RUN --expected` and the distribution
    # checks of `bench check-sampling --run RUN` merged in
    all_rows = merge_checks(merge_expected(read_rows(run_path), run_path), run_path) if run_path else None
    server_rows_all = read_rows(run_path, mode="server") if run_path else None
    # the greedy sections read T = 0 only where the run also has sampled cells (the temperature section
    # reads every setting)
    rows, server_rows = greedy_view(all_rows), greedy_view(server_rows_all)
    if traces is None and run_path is not None and (run_path / "traces").exists():
        traces = run_path / "traces"
    analysis = _load_analysis(analysis, traces, run_path, cost_model)
    if rows is None and analysis is None:
        raise SpeclabError("nothing to report: give --run RUN, --traces STORE or --analysis FILE")
    analysis = analysis or {}
    noise = load_noise(run_path)  # the run's A/A machine noise: verdicts by interval where measured
    gap = analysis.get("oracle_gap") or {}
    acc = analysis.get("acceptance") or []
    adaptive_dir = run_path / "adaptive" if run_path else None  # python -m speclab.simulate.adaptive.evaluate
    if (
        adaptive_dir is not None
        and "adaptive" not in analysis
        and (adaptive_dir / "adaptive_eval.json").is_file()
    ):
        try:
            analysis["adaptive"] = json.loads((adaptive_dir / "adaptive_eval.json").read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SpeclabError(f"{adaptive_dir / 'adaptive_eval.json'}: cannot read: {exc}") from None
    plot = adaptive_dir / "adaptive_eval.png" if adaptive_dir else None
    figs = {
        "adaptive_eval": F.Figure(
            "adaptive_eval.png",
            "Adaptive speculation",
            "Simulated speedup against batch size per trace set: no SD, the best static (method, k), the "
            "oracles, vLLM's derived batch-size schedule and the online policies.",
            plot.read_bytes(),
        )
        if plot is not None and plot.is_file()
        else None,
        "speedup": F.speedup_vs_batch(rows, gap),
        "time": F.time_split(rows),
        "memory": F.memory(rows),
        "hist": F.acceptance_hist(acc),
        "position": F.acceptance_position(acc),
        "spread": F.per_request_spread(acc),
        "overlap": F.overlap_advantage(analysis.get("overlap") or {}),
        "latency": latency_vs_load(server_rows),
    }
    if has_sampling(all_rows):
        by_temperature = cells(all_rows or [], noise)
        figs["temp_speedup"] = speedup_vs_temperature(by_temperature)
        figs["temp_acceptance"] = acceptance_vs_temperature(by_temperature)
    data = ReportData(
        rows=rows,
        run_path=run_path,
        traces=traces,
        analysis=analysis,
        recs=recommendations(rows, gap, noise),
        figs=figs,
        command=command,
        server_rows=server_rows,
        noise=noise,
        all_rows=all_rows,
        server_rows_all=server_rows_all,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for fig in figs.values():
        if fig is not None:
            atomic_write_bytes(out_dir / fig.name, fig.png)
            _readable(out_dir / fig.name)

    title = title or "speclab report"
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    h: list[str] = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>",
        f"<h1>{esc(title)}</h1>",
        f'<p class="sub">Generated {now} by speclab. Run: {esc(run_path or "none")}; traces: {esc(traces or "none")}.</p>',
        NAV if not has_sampling(all_rows) else NAV.replace(*TEMPERATURE_LINK),
    ]
    for section in SECTIONS:
        h += section(data)
    h.append("</main></body></html>")

    path = out_dir / "report.html"
    atomic_write_text(path, "\n".join(h) + "\n")
    _readable(path)
    return path
