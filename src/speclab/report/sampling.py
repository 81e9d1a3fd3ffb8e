"""Sampled decoding in the report: which rows are greedy, each row's sampling setting, the per-cell evidence
at every temperature, the engine-fault flag and the per-temperature recommendations in words.

A row's setting is (temperature, top_p, top_k) for `sampling = "fixed"` cells, or "as logged" (each request
ran with its own logged settings; the row's temperature is null). Rows written before sampling was a cell
axis carry none of these fields: they are greedy (T = 0). The greedy sections of the report read the T = 0
rows only whenever a run also has sampled cells; everything at other settings is in the temperature section.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from speclab.bench.repeats import evidence
from speclab.bench.rows import entry_labels
from speclab.report.recommend import CANNOT_TELL, recommendations

AS_LOGGED = "as-logged"
VERDICT = {"faster": "faster", "slower": "slower", "unsure": CANNOT_TELL}

Setting = tuple[int, float, float, int]  # (as-logged?, temperature, top_p, top_k): sorts greedy first


def setting(r: dict[str, Any]) -> Setting:
    """The row's sampling setting as a sortable key."""
    top_p = r.get("top_p")
    top_k = r.get("top_k")
    top_p = 1.0 if top_p is None else float(top_p)
    top_k = 0 if top_k is None else int(top_k)
    if r.get("sampling") == AS_LOGGED:
        return (1, 0.0, top_p, top_k)
    return (0, float(r.get("temperature") or 0.0), top_p, top_k)


def setting_label(s: Setting) -> str:
    """ "T = 0.7" (with top-p / top-k where they are on), or "as logged"."""
    if s[0]:
        return "as logged"
    text = f"T = {s[1]:g}"
    if s[1] > 0 and s[2] < 1.0:
        text += f", top-p {s[2]:g}"
    if s[1] > 0 and s[3] > 0:
        text += f", top-k {s[3]}"
    return text


def is_greedy(r: dict[str, Any]) -> bool:
    s = setting(r)
    return not s[0] and s[1] == 0.0


def has_sampling(rows: list[dict[str, Any]] | None) -> bool:
    """Whether the run needs the temperature section: more than one setting, or any sampled one."""
    settings = {setting(r) for r in rows or []}
    return len(settings) > 1 or any(s[0] or s[1] > 0 for s in settings)


def labelled(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of the rows, each carrying its sweep-entry label (named over all rows, so a subset taken later
    names each row as the whole run does)."""
    return [dict(r, label=lbl) for lbl, r in zip(entry_labels(rows), rows, strict=True)]


def greedy_view(rows: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The rows the greedy sections read: all of them for a greedy-only run (unchanged), else the T = 0 rows
    (labelled as in the whole run)."""
    if rows is None or not has_sampling(rows):
        return rows
    return [r for r in labelled(rows) if is_greedy(r)]


def fault(r: dict[str, Any]) -> str | None:
    """The plain engine-fault text of a row, or None: a failed distribution check, or the row's own
    `engine_fault` text (engine acceptance far below the replayed expectation)."""
    parts = []
    dc = r.get("distribution_check")
    if isinstance(dc, dict) and dc.get("verdict") == "fail":
        p = dc.get("p_value")
        parts.append(
            "output distribution differs from the target's"
            + (f" (distribution check p = {p:.2g})" if isinstance(p, int | float) else "")
        )
    ef = r.get("engine_fault")
    if isinstance(ef, str) and ef:
        parts.append(ef)
    return "ENGINE FAULT: " + "; ".join(parts) if parts else None


def output_check(r: dict[str, Any]) -> str:
    """What is known of the cell's output: token-exact (greedy), or the distribution check with its power."""
    dc = r.get("distribution_check")
    if isinstance(dc, dict):
        bits = [str(dc.get("verdict"))]
        if isinstance(dc.get("p_value"), int | float):
            bits.append(f"p = {dc['p_value']:.2g}")
        if isinstance(dc.get("tv_detectable_80"), int | float):
            bits.append(f"detects TV >= {dc['tv_detectable_80']:.2f} at 80% power")
        if dc.get("samples") is not None:
            bits.append(f"{dc['samples']} samples")
        return bits[0] + (f" ({', '.join(bits[1:])})" if len(bits) > 1 else "")
    if r.get("lossless") is True:
        return "token-exact"
    if r.get("lossless") is False:
        return "NOT token-exact"
    return "not checked" if r.get("method") not in (None, "none") else "-"


def _spread(r: dict[str, Any]) -> str | None:
    sp = r.get("speedup_spread")
    if not isinstance(sp, dict) or sp.get("min") is None:
        return None
    return f"{sp['min']:.2f}-{sp['max']:.2f} (n={sp.get('n')})"


def _spread_values(r: dict[str, Any]) -> tuple[float, float] | None:
    sp = r.get("speedup_spread")
    if not isinstance(sp, dict) or sp.get("min") is None or sp.get("max") is None:
        return None
    return (float(sp["min"]), float(sp["max"]))


def cells(rows: list[dict[str, Any]], noise: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One record per SD row (failed ones too), sorted so that the temperature varies fastest: workload,
    batching, batch_size, setting (label), configuration, speedup, spread, verdict, figure (what the verdict
    rests on), why, mean_acc, expected_acc (the replay's expectation of it, `trace crosscheck --expected`),
    acc_per_pos (text), check (output check), flag (engine fault or failure)."""
    rows = labelled(rows)
    by_id = {str(r.get("cell_id")): r for r in rows}
    out = []
    for r in rows:
        if r.get("method") in (None, "none"):
            continue
        ok = r.get("status") == "ok"
        status, figure, why = (
            evidence(r, by_id.get(str(r.get("baseline_cell_id"))), noise) if ok else ("unsure", None, "")
        )
        per_pos = r.get("acceptance_rate_per_pos") or []
        flag = fault(r)
        if not ok:
            flag = f"{r.get('status')}: {str(r.get('error'))[:60]}" + (f"; {flag}" if flag else "")
        out.append(
            {
                "workload": str(r.get("workload")),
                "batching": str(r.get("batching", "replicate")),
                "batch_size": int(r.get("batch_size") or 0),
                "key": setting(r),
                "setting": setting_label(setting(r)),
                "configuration": r["label"],
                "speedup": r.get("speedup") if ok else None,
                "spread": _spread(r),
                "spread_values": _spread_values(r),
                "status": status if ok else "failed",
                "verdict": VERDICT[status] if ok else "-",
                "figure": figure,
                "why": why,
                "mean_acc": r.get("mean_acceptance_length") if ok else None,
                "expected_acc": r.get("expected_mean_acceptance_length") if ok else None,
                "acc_per_pos": " ".join(f"{a:.2f}" for a in per_pos) or None,
                "per_pos": [float(a) for a in per_pos],
                "check": output_check(r),
                "flag": flag,
                "requests_own_settings": r.get("requests_own_settings"),
            }
        )
    out.sort(key=lambda c: (c["workload"], c["batching"], c["batch_size"], c["configuration"], c["key"]))
    return out


def _x(c: dict[str, Any]) -> str:
    return f"{c['figure']:.2f}x" if c["figure"] is not None else "-"


def _at(cs: list[dict[str, Any]]) -> str:
    """ "T = 0.7 (0.90x), T = 1 (0.85x)"."""
    return ", ".join(f"{c['setting']} ({_x(c)})" for c in cs)


def says(cs: list[dict[str, Any]]) -> str:
    """One configuration's cells at one (workload, batching, batch size), in setting order, in words; a
    setting only counts as paying or not where the noise supports it (`bench.repeats.evidence`). Settings
    with an engine fault flagged are named at the end."""
    text = _says(cs)
    faulty = [c["setting"] for c in cs if c.get("flag") and c["status"] != "failed"]
    return text + (f" (engine fault flagged at {', '.join(faulty)})" if faulty else "")


def _says(cs: list[dict[str, Any]]) -> str:
    cs = [c for c in cs if c["status"] != "failed"]
    if not cs:
        return "no finished cell"
    faster = [c for c in cs if c["status"] == "faster"]
    slower = [c for c in cs if c["status"] == "slower"]
    unsure = [c for c in cs if c["status"] == "unsure"]
    if len(faster) == len(cs):
        return f"pays at every temperature measured: {_at(cs)}"
    if len(slower) == len(cs):
        return f"does not pay at any temperature measured: {_at(cs)}"
    if len(unsure) == len(cs):
        return f"{CANNOT_TELL} at any temperature measured: {_at(cs)}"
    fixed = [c for c in cs if not c["key"][0]]
    n = len(faster)
    if faster == fixed[:n] and len(fixed) == len(cs) and all(c["status"] == "slower" for c in fixed[n:]):
        first = fixed[n]["setting"].replace("T = ", "T >= ", 1)
        return f"pays at {_at(faster)} and stops at {first}: {_at(fixed[n:])}"
    parts: list[str] = []
    if faster:
        parts.append(f"pays at {_at(faster)}")
    if slower:
        parts.append(f"does not pay at {_at(slower)}")
    if unsure:
        parts.append(f"{CANNOT_TELL} at {_at(unsure)}")
    return "; ".join(parts)


def sentences(cs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (workload, batching, batch size, configuration): says(...) over its settings."""
    groups: dict[tuple[str, str, int, str], list[dict[str, Any]]] = defaultdict(list)
    for c in cs:
        groups[(c["workload"], c["batching"], c["batch_size"], c["configuration"])].append(c)
    return [
        {"workload": k[0], "batching": k[1], "batch_size": k[2], "configuration": k[3], "says": says(v)}
        for k, v in sorted(groups.items())
    ]


def recs_per_setting(rows: list[dict[str, Any]], noise: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The recommendation table's verdicts (best configuration per workload and batch size, the same noise
    rules), computed at each setting on its own rows; each carries `setting`."""
    by: dict[Setting, list[dict[str, Any]]] = defaultdict(list)
    faulty: dict[tuple[Setting, str, str, int], list[str]] = defaultdict(list)
    for r in labelled(rows):
        by[setting(r)].append(r)
        if r.get("status") == "ok" and fault(r):
            key = (
                setting(r),
                str(r.get("workload")),
                str(r.get("batching", "replicate")),
                int(r["batch_size"]),
            )
            faulty[key].append(r["label"])
    out = []
    for s in sorted(by):
        for rec in recommendations(by[s], None, noise):
            names = faulty.get((s, rec["workload"], rec["batching"], rec["batch_size"]))
            if names:
                rec["why"] = f"engine fault flagged on {', '.join(names)}; " + (rec["why"] or "")
            out.append({**rec, "setting": setting_label(s)})
    out.sort(key=lambda r: (r["workload"], r["batching"], r["batch_size"]))
    return out
