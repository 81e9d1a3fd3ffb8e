"""The distribution check of a whole bench run (`speclab bench check-sampling --run RUN`, docs/sampling.md).

For every SD [[methods]] entry of the run, at every fixed sampling setting with T > 0 and on every workload
the entry ran, the entry is checked against no SD at the same setting, on the first `limit` prompts of the
workload as the bench drew them (the bench's prompt provider: the same sample, chat template and truncation).
The engines are the sweep's (target, dtype, method, k, method options with the drafter, the [engine] table),
one at a time: one engine without SD, then one per SD entry, each running every (workload, setting) as its
own cells of one job (sampling is set per request, so one engine serves every temperature). Two things
differ from the bench's engines, neither of which changes a token's distribution: `enforce_eager` is the
command's (default on: speed is not measured, so torch.compile's start-up is not worth it) and the
prefix cache is on with chunked prefill off (sampling_check.CHECK_LLM_KWARGS).

"as-logged" cells are not checked: each request runs with its own logged settings, so no prompt has one
setting to draw many samples at, which the test needs. Greedy cells (T = 0) are checked token by token by
the bench itself.

Results go to RUN/distribution_checks.json (bench/distribution_checks.py), rewritten after each SD engine, so a
kill loses at most the engine in flight; keys already there are skipped unless `force`. The statistical test
is passed in (`test`): the bench does not import speclab.analyze.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speclab.bench.cells import engine_spec
from speclab.bench.distribution_checks import check_key, checks_path, read_checks, write_checks
from speclab.bench.sampling import Setting, row_setting, sweep_settings
from speclab.bench.sampling_check import (
    CHECK_LLM_KWARGS,
    PRIME,
    CheckSettings,
    acceptance,
    draw_cells,
    is_prime,
    outputs_by_prompt,
    prime_cell,
    run_job,
)
from speclab.bench.spec import MethodEntry, SweepSpec
from speclab.engine.protocol import CellResult, Job, PromptSpec
from speclab.errors import ConfigError, SpeclabError

AS_LOGGED_REASON = (
    "each request runs with its own logged temperature, top_p and top_k, so no prompt has one setting to draw "
    "many samples at; check a fixed setting instead (a sweep with temperatures, or the standalone check)"
)

Group = tuple[str, Setting]  # (workload, setting): one check of an entry


@dataclass
class RunCheckPlan:
    spec: SweepSpec
    baseline: MethodEntry
    entries: list[tuple[MethodEntry, list[Group]]]  # the SD entries and what to check of each
    skipped: dict[str, str] = field(default_factory=dict)  # what is not checked: why


@dataclass
class DrawSettings:
    samples: int = 300
    positions: int = 3
    limit: int = 4
    max_tokens: int = 4
    seed: int = 0
    chunk: int = 64
    enforce_eager: bool = True

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def load_run_sweep(run: str | Path) -> SweepSpec:
    """The sweep a run ran: RUN/sweep.toml with what the command line changed (RUN/sweep.json: the sweep as
    understood) applied the way `speclab bench` applies it."""
    from speclab.bench.api import OVERRIDABLE, load_sweep_source

    rd = Path(run)
    toml = rd / "sweep.toml"
    if not toml.is_file():
        raise ConfigError(f"--run {run}: no sweep.toml (not a bench run directory)")
    spec, _ = load_sweep_source(toml)
    try:
        ran = json.loads((rd / "sweep.json").read_text())
    except (OSError, ValueError):
        return spec
    given = spec.to_dict()
    overrides: dict[str, Any] = {}
    for key in OVERRIDABLE:
        if key.startswith("engine."):
            k = key.split(".", 1)[1]
            old, new = given["engine"].get(k), (ran.get("engine") or {}).get(k)
        else:
            old, new = given.get(key), ran.get(key)
        if new is not None and new != old and not (key == "temperatures" and spec.sampling == "as-logged"):
            overrides[key] = new
    labels = [m.get("label") for m in ran.get("methods") or [] if isinstance(m, dict)]
    keep = [str(x) for x in labels if x and x != "none"] if len(labels) != len(spec.methods) else None
    spec, _ = load_sweep_source(toml, overrides=overrides, methods=keep)
    return spec


def plan_checks(spec: SweepSpec, rows: list[dict[str, Any]]) -> RunCheckPlan:
    """What to check: every SD entry x workload x sampled fixed setting with an ok row in the run."""
    ran = {
        (str(r.get("label")), str(r.get("workload")), row_setting(r))
        for r in rows
        if r.get("status") == "ok" and r.get("method") != "none"
    }
    settings = sweep_settings(spec)
    skipped: dict[str, str] = {}
    if any(st.sampling == "as-logged" for st in settings):
        skipped["as-logged cells"] = AS_LOGGED_REASON
    sampled = [st for st in settings if st.sampling == "fixed" and not st.greedy]
    if not sampled and not skipped:
        skipped["greedy cells"] = (
            "the run has no sampled setting (T > 0); the bench checks greedy cells itself"
        )
    base = next((m for m in spec.methods if m.name == "none"), MethodEntry("none", None))
    entries = []
    for m in spec.methods:
        if m.name == "none":
            continue
        groups = []
        for w in spec.workloads:
            if m.workloads is not None and w not in m.workloads:
                continue
            for st in sampled:
                if (m.label, w, row_setting(st.row_fields())) in ran:
                    groups.append((w, st))
                else:
                    skipped[_key(m, (w, st))] = "no ok row in the run yet (run the sweep first)"
        if groups:
            entries.append((m, groups))
    return RunCheckPlan(spec, base, entries, skipped)


def _key(m: MethodEntry, g: Group) -> str:
    w, st = g
    return check_key(m.label, w, st.temperature or 0.0, st.top_p, st.top_k)


def _prefix(g: Group) -> str:
    return f"{g[0]}|{g[1].tag()}|"


def check_job(
    spec: SweepSpec,
    m: MethodEntry,
    groups: list[Group],
    prompts: dict[str, list[PromptSpec]],
    ds: DrawSettings,
) -> Job:
    """One engine's job: per workload a prime cell (its prompts' prefill into the prefix cache), then per
    (workload, setting) the draws (sampling_check.draw_cells, ids `<workload>|<tag>|sd-<j>`). The engine is
    the sweep's for entry `m`, eager as asked, with CHECK_LLM_KWARGS."""
    sd = m.name != "none"
    cells = []
    for w in dict.fromkeys(w for w, _ in groups):
        cells.append(prime_cell(prompts[w], f"{PRIME}:{w}"))
    for g in groups:
        st = g[1]
        cs = CheckSettings(
            temperature=st.temperature or 0.0, top_p=st.top_p, top_k=st.top_k, samples=ds.samples,
            max_tokens=ds.max_tokens, seed=ds.seed, chunk=ds.chunk,
        )  # fmt: skip
        cells += draw_cells(cs, prompts[g[0]], sd, prefix=_prefix(g))
    eng = engine_spec(spec, m)
    eng.max_num_seqs = min(ds.chunk, ds.samples)
    eng.enforce_eager = ds.enforce_eager
    eng.llm_kwargs = {**eng.llm_kwargs, **CHECK_LLM_KWARGS}
    longest = max(len(p.prompt_token_ids) for w, _ in groups for p in prompts[w])
    eng.max_model_len = max(eng.max_model_len, longest + ds.max_tokens + (m.k or 0) + 16)
    return Job(eng, cells, warmup=True)


def by_group(results: list[CellResult], groups: list[Group]) -> dict[Group, list[CellResult]]:
    """An engine's cell results per (workload, setting), prime cells left out."""
    at = {_prefix(g): g for g in groups}
    out: dict[Group, list[CellResult]] = {g: [] for g in groups}
    for r in results:
        if not is_prime(r.cell_id):
            out[at[r.cell_id.rpartition("|")[0] + "|"]].append(r)
    return out


Test = Callable[[dict[str, list[list[int]]], dict[str, list[list[int]]]], dict[str, Any]]


def check_run(
    run: str | Path,
    plan: RunCheckPlan,
    prompt_provider: Callable[[str], Any],
    ds: DrawSettings,
    test: Test,
    *,
    force: bool = False,
    echo: Callable[[str], None] = print,
    env: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the plan's checks not yet in RUN/distribution_checks.json (all of them with `force`), writing the
    file after each SD engine; returns every check of the file. `extra`: more settings to record."""
    have = {} if force else dict(read_checks(run, echo) or {})
    todo = [(m, [g for g in gs if _key(m, g) not in have]) for m, gs in plan.entries]
    todo = [(m, gs) for m, gs in todo if gs]
    for what, why in plan.skipped.items():
        echo(f"not checked: {what}: {why}")
    settings = {**ds.to_dict(), **(extra or {})}
    if not todo:
        echo(f"every check of the run is in {checks_path(run)} already (--force draws them again)")
        return have
    needed = list(dict.fromkeys(g for _, gs in todo for g in gs))
    prompts = {w: _prompts(prompt_provider, w, ds.limit) for w in dict.fromkeys(w for w, _ in needed)}
    with tempfile.TemporaryDirectory(prefix="speclab-check-sampling-") as tmp:
        d = Path(tmp)
        eager = ", eager (speed is not measured here)" if ds.enforce_eager else ""
        echo(
            f"engines: the run's sweep's, one at a time{eager}; the first {ds.limit} prompt(s) of each workload"
        )
        echo(f"engine without SD: {_what(needed, prompts, ds)}")
        base_res = by_group(
            run_job(check_job(plan.spec, plan.baseline, needed, prompts, ds), d, "base", env), needed
        )
        base = {g: outputs_by_prompt(rs) for g, rs in base_res.items()}
        failed = []
        for i, (m, gs) in enumerate(todo):
            echo(f"engine {i + 1}/{len(todo)} {m.label} ({m.name} k={m.k}): {_what(gs, prompts, ds)}")
            try:
                res = run_job(check_job(plan.spec, m, gs, prompts, ds), d, f"sd-{i}", env)
            except SpeclabError as exc:
                echo(f"  {m.label}: {exc}")
                failed.append(m.label)
                continue
            info = res[-1].engine_info if res else {}
            for g, rs in by_group(res, gs).items():
                check = test(outputs_by_prompt(rs), base[g])
                have[_key(m, g)] = _entry(m, g, ds, check, acceptance(rs), info)
                p = check.get("p_value")
                p_text = "-" if p is None else format(p, ".3g")
                echo(f"  {g[0]} T={g[1].temperature:g}: {check.get('verdict')} (p = {p_text})")
            write_checks(run, have, settings, plan.skipped)
    if failed:
        raise SpeclabError(
            f"engine(s) failed: {', '.join(failed)}; the other checks are in {checks_path(run)}"
        )
    return have


def _prompts(provider: Callable[[str], Any], workload: str, limit: int) -> list[PromptSpec]:
    ps = list(provider(workload).prompts)[:limit]
    if not ps:
        raise ConfigError(f"workload {workload}: no prompts")
    return [PromptSpec(p.id, list(p.prompt_token_ids)) for p in ps]


def _what(groups: list[Group], prompts: dict[str, list[PromptSpec]], ds: DrawSettings) -> str:
    ws = sorted({w for w, _ in groups})
    return (
        f"{len(groups)} check(s) ({', '.join(ws)}), {sum(len(prompts[w]) for w, _ in groups)} prompt(s) x "
        f"{ds.samples} draws"
    )


def _entry(
    m: MethodEntry,
    g: Group,
    ds: DrawSettings,
    check: dict[str, Any],
    acc: dict[str, Any],
    info: dict[str, Any],
) -> dict[str, Any]:
    w, st = g
    return {
        "label": m.label,
        "method": m.name,
        "k": m.k,
        "method_options": m.options,
        "workload": w,
        "sampling": st.sampling,
        "temperature": st.temperature,
        "top_p": st.top_p,
        "top_k": st.top_k,
        "settings": ds.to_dict(),
        "check": check,
        "acceptance": acc,
        "engine_info": {k: info.get(k) for k in ("vllm_version", "device", "method", "k") if k in info},
    }
