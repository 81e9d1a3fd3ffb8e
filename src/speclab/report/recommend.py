"""Recommendation table: best method and k per (workload, batching, batch size), or "SD off".

Logic (also in docs/report.md):
1. Measured first. Among the bench's SD cells for that workload, batching and batch size (status ok, speedup
   not null), take the highest speedup. If it is >= 1.0, recommend that sweep entry (by its label, so two
   entries with the same method and k but other options are two candidates); if it is < 1.0, the
   recommendation is "SD off" (every SD configuration measured there was slower than no SD).
2. Else simulated. Where the bench has no SD cell but the analysis simulated that batch size, use the best
   *fixed* policy (fixed:METHOD:K; oracles are bounds, not deployable) by the same rule.
3. Noise (measured cells): a verdict must rest on evidence beyond this machine's noise
   (`bench.repeats.evidence`): only matched pairs measured on a quiet machine count, and either at least
   three of them lie all above (or all below) 1.00x, or the 95% interval that the machine's measured A/A
   noise (RUN/noise.json, `bench.noise`) puts around them clears 1.00x. A single run is one pair, and does
   not count at all if the cell or its no-SD baseline was contended.
   "use SD" needs one such candidate above 1.00x (the best of them is recommended), "SD off" needs every
   candidate below; anything else is "cannot tell", with what was measured and how many more repeats would
   decide.
4. A supported best speedup under 1.05x is flagged "marginal": faster beyond the noise, but by under 5%, so
   SD may not be worth its memory and complexity. (Simulated rows: by value, as they have no noise.)
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from speclab.bench.repeats import evidence
from speclab.bench.rows import entry_labels

MARGINAL = 1.05


CANNOT_TELL = "cannot tell"


def _verdict(best: float) -> str:
    if best < 1.0:
        return "SD off"
    return "marginal" if best < MARGINAL else "use SD"


def _spread(r: dict[str, Any]) -> str | None:
    sp = r.get("speedup_spread")
    if not isinstance(sp, dict) or sp.get("min") is None:
        return None
    return f"{sp['min']:.2f}-{sp['max']:.2f} (n={sp.get('n')})"


def _measured(
    key: tuple[str, str, int],
    cands: list[tuple[float, str, dict[str, Any]]],
    by_id: dict[str, dict[str, Any]] | None = None,
    noise: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A measured recommendation that only says on or off where the noise supports it (by_id: rows by cell
    id, to find each candidate's no-SD baseline: a contended baseline voids a single run's speedup too;
    noise: the machine's A/A noise, for intervals)."""
    ranked = sorted(cands, key=lambda c: c[0], reverse=True)
    by_id = by_id or {}
    ev = {label: evidence(r, by_id.get(str(r.get("baseline_cell_id"))), noise) for _, label, r in ranked}
    faster = sorted(((ev[lb][1], lb) for _, lb, _ in ranked if ev[lb][0] == "faster"), reverse=True)
    if faster:
        rest = [(sp, lb) for sp, lb, _ in ranked if ev[lb][0] != "faster"]
        rec = _rec(key, faster + rest, "measured")  # runner-up: the next supported one, else the best other
    else:
        rec = _rec(key, [(sp, lb) for sp, lb, _ in ranked], "measured")
        if any(ev[lb][0] != "slower" for _, lb, _ in ranked):
            rec["verdict"] = rec["recommend"] = CANNOT_TELL
    best = rec["best_method"]
    rec["spread"] = _spread(next(r for _, lb, r in ranked if lb == best))
    if rec["verdict"] == CANNOT_TELL:
        rec["why"] = "; ".join(f"{lb}: {ev[lb][2]}" for _, lb, _ in ranked if ev[lb][0] == "unsure")
    else:
        rec["why"] = f"{best}: {ev[best][2]}"
    return rec


def _rec(key: tuple[str, str, int], ranked: list[tuple[float, str]], source: str) -> dict[str, Any]:
    """One recommendation row from (speedup, label) candidates sorted best first."""
    best, label = ranked[0]
    runner_up = ranked[1] if len(ranked) > 1 else (None, None)
    return {
        "workload": key[0],
        "batching": key[1],
        "batch_size": key[2],
        "verdict": _verdict(best),
        "recommend": label if best >= 1.0 else "SD off",
        "best_method": label,
        "best_speedup": best,
        "runner_up": runner_up[1],
        "runner_up_speedup": runner_up[0],
        "source": source,
        "candidates": len(ranked),
        "spread": None,  # measured: the best candidate's matched-pair speedup range
        "why": None,  # measured: what the verdict rests on (or why the noise cannot tell)
    }


def recommendations(
    rows: list[dict[str, Any]] | None, oracle_gap: dict[str, Any] | None, noise: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One recommendation per (workload, batching, batch size); `noise`: the run's A/A noise (or None)."""
    recs: dict[tuple[str, str, int], dict[str, Any]] = {}
    rows = rows or []
    labels = entry_labels(rows)  # keyed by sweep entry: same method and k with other options stay apart
    ok = [(label, r) for label, r in zip(labels, rows, strict=True) if r.get("status") == "ok"]
    multi_target = len({r.get("target") for _, r in ok}) > 1
    cells: dict[tuple[str, str, int], list[tuple[float, str, dict[str, Any]]]] = defaultdict(list)
    for label, r in ok:
        if r.get("method") in (None, "none") or r.get("speedup") is None:
            continue
        wl = str(r.get("workload"))
        if multi_target:
            wl = f"{wl} [{r.get('target')}]"
        cells[(wl, str(r.get("batching", "replicate")), int(r["batch_size"]))].append(
            (float(r["speedup"]), label, r)
        )
    by_id = {str(r.get("cell_id")): r for _, r in ok}
    for key, vals in cells.items():
        recs[key] = _measured(key, vals, by_id, noise)
    for g in (oracle_gap or {}).get("rows") or []:
        key = (str(g["workload"]), str(g["batching"]), int(g["batch_size"]))
        if key in recs:
            continue
        fixed = sorted(
            (
                (v, p.split(":", 1)[1].replace(":", "@k"))
                for p, v in (g.get("simulated") or {}).items()
                if p.startswith("fixed:")
            ),
            reverse=True,
        )
        if fixed:
            recs[key] = _rec(key, fixed, "simulated")
    return [recs[k] for k in sorted(recs)]


def headline(recs: list[dict[str, Any]]) -> list[str]:
    """A few plain sentences for the top of the report."""
    if not recs:
        return ["No speedup data (neither bench cells nor simulated fixed policies): no recommendation."]
    on = [r for r in recs if r["verdict"] == "use SD"]
    off = [r for r in recs if r["verdict"] == "SD off"]
    marginal = [r for r in recs if r["verdict"] == "marginal"]
    unsure = [r for r in recs if r["verdict"] == CANNOT_TELL]
    supported = [r for r in recs if r["verdict"] != CANNOT_TELL]
    best = max(supported or recs, key=lambda r: r["best_speedup"])
    lines = [
        f"SD helps (>= {MARGINAL:.2f}x) in {len(on)} of {len(recs)} (workload, batch size) cells, is marginal "
        f"(1.00-{MARGINAL:.2f}x) in {len(marginal)} and should be off in {len(off)}"
        + (f"; the noise cannot tell in {len(unsure)}." if unsure else "."),
        f"Largest speedup: {best['best_speedup']:.2f}x with {best['best_method']} on {best['workload']} at batch "
        f"{best['batch_size']} ({best['source']}"
        + (", not supported by the noise)." if best["verdict"] == CANNOT_TELL else ")."),
    ]
    by_wl: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        by_wl[r["workload"]].append(r)
    for wl, rs in sorted(by_wl.items()):
        parts = [
            f"batch {r['batch_size']}: {r['recommend']} ({r['best_speedup']:.2f}x"
            + (", sim" if r["source"] != "measured" else "")
            + (f"; {r['why']}" if r["verdict"] == CANNOT_TELL else "")
            + ")"
            for r in sorted(rs, key=lambda r: (r["batching"], r["batch_size"]))
        ]
        lines.append(f"{wl}: " + "; ".join(parts) + ".")
    return lines


def _direction(verdict: str) -> str | None:
    return {"use SD": "on", "marginal": "on", "SD off": "off"}.get(verdict)


def compare_recommendations(quiet: list[dict[str, Any]], other: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Cell by cell (workload, batching, batch size), the verdicts of a run measured beside a competing
    process (`other`) against a quiet run's. outcome: "same" (same verdict and recommendation), "cannot
    tell" (the other run says it cannot tell), "differs" (both confident and on the same side, SD on or off,
    but another method or strength), "WRONG" (the other side of on/off, or confident where the quiet run
    could not tell), "missing" (a cell in only one run)."""
    key = lambda r: (r["workload"], r["batching"], int(r["batch_size"]))  # noqa: E731
    q, o = {key(r): r for r in quiet}, {key(r): r for r in other}
    out = []
    for k in sorted(set(q) | set(o)):
        a, b = q.get(k), o.get(k)
        row = {
            "workload": k[0], "batching": k[1], "batch_size": k[2],
            "quiet": None if a is None else f"{a['verdict']} ({a['recommend']})",
            "other": None if b is None else f"{b['verdict']} ({b['recommend']})",
        }  # fmt: skip
        if a is None or b is None:
            row["outcome"] = "missing"
        elif b["verdict"] == CANNOT_TELL:
            row["outcome"] = "cannot tell"
        elif a["verdict"] == b["verdict"] and a["recommend"] == b["recommend"]:
            row["outcome"] = "same"
        elif _direction(a["verdict"]) is not None and _direction(a["verdict"]) == _direction(b["verdict"]):
            row["outcome"] = "differs"
        else:
            row["outcome"] = "WRONG"
        out.append(row)
    return out


def stops_paying(rows: list[dict[str, Any]], noise: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Per (workload, batching, sweep entry): the batch sizes where it was measured faster than no SD, and the
    batch size from which it stops paying (the smallest measured batch size from which on no larger one is
    supported as faster; `bench.repeats.evidence` decides "faster" per cell, so noise and contention count).

    Each entry: workload, batching, method (label), measured ("B=1: 2.10x, B=4: 1.30x (cannot tell), ..."),
    stops_at (int or None) and says (one sentence)."""
    labels = entry_labels(rows)
    by_id = {str(r.get("cell_id")): r for r in rows}
    groups: dict[tuple[str, str, str], list[tuple[int, str, float | None]]] = defaultdict(list)
    for r, label in zip(rows, labels, strict=True):
        if r.get("method") == "none" or r.get("status") != "ok" or r.get("speedup") is None:
            continue
        status, figure, _ = evidence(r, by_id.get(str(r.get("baseline_cell_id"))), noise)
        key = (str(r.get("workload")), str(r.get("batching")), label)
        groups[key].append((int(r["batch_size"]), status, figure))
    out = []
    for (wl, batching, label), cells in sorted(groups.items()):
        cells.sort()
        measured = ", ".join(
            f"B={b}: {sp:.2f}x" + ("" if st != "unsure" else " (cannot tell)")
            if sp is not None
            else f"B={b}: -"
            for b, st, sp in cells
        )
        faster = [b for b, st, _ in cells if st == "faster"]
        unsure = [b for b, st, _ in cells if st == "unsure"]
        if not faster:
            stops_at, says = (
                cells[0][0],
                (
                    "never supported as faster than no SD at the batch sizes measured"
                    + (f" (cannot tell at B={', '.join(map(str, unsure))})" if unsure else "")
                ),
            )
        elif faster[-1] == cells[-1][0]:
            stops_at, says = None, f"pays at every batch size measured up to B={cells[-1][0]}"
            if len(faster) < len(cells):
                says = f"pays at B={', '.join(map(str, faster))} (not supported at the others)"
        else:
            stops_at = next(b for b, _, _ in cells if b > faster[-1])
            st = next(st for b, st, _ in cells if b == stops_at)
            says = f"pays up to B={faster[-1]}; " + (
                f"stops paying at B={stops_at}" if st == "slower" else f"cannot tell from B={stops_at}"
            )
        out.append(
            {
                "workload": wl,
                "batching": batching,
                "method": label,
                "measured": measured,
                "stops_at": stops_at,
                "says": says,
            }
        )
    return out
