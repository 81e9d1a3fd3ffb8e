"""Bench an OpenAI-compatible server that already runs (`speclab bench SWEEP --endpoint URL`): server mode
without starting a server. One endpoint, or two (A/B: e.g. the same model with and without SD), each driven by
the same `vllm bench serve` (speclab.server.loadgen) with the sweep's prompts at its [server] loads; its
/metrics is scraped before and after each cell where reachable; at T = 0 the generated texts of each cell are
compared with the baseline endpoint's at the same load.

An API key comes from an environment variable (`--api-key-env NAME`) and reaches the load generator only
through its environment (`OPENAI_API_KEY`): it is never in a command line, a log, a row or a report. Rows
name the endpoint (label, URL without credentials, model).

Every remote failure stops the run with one line (EndpointFault): connection refused, 401/403, 429, 5xx, a
timeout, a dropped stream, a malformed SSE chunk, or /metrics without spec-decode counters at an endpoint
labelled as running SD. The cell's row keeps what completed (failed, with `completed` counted and vLLM's
result file); rerunning the command resumes.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speclab.atomic import atomic_write_text
from speclab.bench.cells import digest, mix_fingerprint
from speclab.bench.preflight import PromptSet
from speclab.bench.results import ResultsStore, write_run_files
from speclab.bench.runner import SweepOutcome
from speclab.bench.sampling import sweep_settings
from speclab.bench.spec import MethodEntry, SweepSpec
from speclab.engine.launch import describe_exit, log_tail, spawn_child
from speclab.engine.worker import cpu_stall_us
from speclab.errors import ConfigError, SpeclabError
from speclab.procs import kill_group
from speclab.server.cells import ServerCell, load_name, server_loads
from speclab.server.faults import EndpointFault, classify, scrape, served_models
from speclab.server.loadgen import loadgen_command
from speclab.server.process import loopback_env
from speclab.server.rows import apply_server_baseline, build_server_row, generated_texts, read_result
from speclab.server.runner import LOADGEN_STOP, SERVER_DIR, ServerRunner, _safe, format_server_line
from speclab.workloads.file_workloads import file_fingerprint

BASELINE_LABEL = "none"


@dataclass
class Endpoint:
    label: str
    url: str  # scheme://host[:port][/path], no credentials, no query, no trailing /v1
    baseline: bool = False  # the other endpoint's texts are compared with this one's
    expects_sd: bool | None = None  # labelled as running SD (True), as not (False: "none"), or unsaid

    def describe(self, model: str | None = None) -> dict[str, Any]:
        return {"label": self.label, "url": self.url, "model": model}


def _clean_url(raw: str) -> str:
    u = urllib.parse.urlsplit(raw.strip())
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ConfigError(f"--endpoint {raw!r}: need an http:// or https:// URL, e.g. http://127.0.0.1:8000")
    if u.username or u.password or u.query or u.fragment:
        raise ConfigError(
            f"--endpoint {u.scheme}://{u.hostname}...: no credentials or query in the URL "
            "(give an API key with --api-key-env NAME)"
        )
    path = u.path.rstrip("/")
    path = path[: -len("/v1")] if path.endswith("/v1") else path
    return f"{u.scheme}://{u.netloc}{path}"


def parse_endpoints(values: list[str]) -> list[Endpoint]:
    """`--endpoint [LABEL=]URL`, once or twice. The endpoint labelled `none` (else the first) is the baseline;
    a label other than `none` says the server runs SD, so its /metrics must show spec-decode counters."""
    if not 1 <= len(values) <= 2:
        raise ConfigError("--endpoint: give one endpoint, or two for an A/B comparison")
    out: list[Endpoint] = []
    for i, v in enumerate(values):
        label, sep, rest = v.partition("=")
        if not sep or "://" in label:
            label, rest, expects = ("A", "B")[i] if len(values) == 2 else "endpoint", v, None
        else:
            label = label.strip()
            if not label or not all(c.isalnum() or c in "-_" for c in label):
                raise ConfigError(f"--endpoint {v!r}: a label is letters, digits, - and _ (LABEL=URL)")
            expects = label != BASELINE_LABEL
        out.append(Endpoint(label=label, url=_clean_url(rest), expects_sd=expects))
    if len({e.label for e in out}) < len(out):
        raise ConfigError(f"--endpoint: two endpoints labelled {out[0].label!r}")
    base = next((e for e in out if e.label == BASELINE_LABEL), out[0])
    base.baseline = True
    return sorted(out, key=lambda e: not e.baseline)


@dataclass
class EndpointCell(ServerCell):
    endpoint: Endpoint | None = None

    @property
    def is_baseline(self) -> bool:
        return self.endpoint is not None and self.endpoint.baseline

    def describe(self, spec: SweepSpec) -> dict[str, Any]:
        d = super().describe(spec)
        d.update(
            {"k": None, "method_options": {}, "endpoint": self.endpoint.describe() if self.endpoint else None}
        )
        return d


def expand_endpoint_cells(spec: SweepSpec, endpoints: list[Endpoint]) -> list[EndpointCell]:
    """Endpoint x workload x load x sampling setting, the baseline endpoint's cells first."""
    sv = spec.server
    if sv is None:
        raise ConfigError(f"{spec.source}: --endpoint needs a [server] table (request_rates / concurrency)")
    n = sv.num_prompts or spec.num_prompts
    loads = server_loads(sv)
    cells: list[EndpointCell] = []
    for ep in endpoints:
        method = MethodEntry(name=BASELINE_LABEL if ep.label == BASELINE_LABEL else "endpoint", k=None)
        method.label = ep.label
        for w in spec.workloads:
            fp = file_fingerprint(w, spec.workload_files)
            for (rate, conc, arr), st in ((ld, st) for ld in loads for st in sweep_settings(spec)):
                common: dict[str, Any] = {
                    "mode": "endpoint",
                    "target": spec.target,
                    "workload": w,
                    "source": spec.workload_sources.get(w),
                    "num_prompts": n,
                    "max_tokens": spec.max_tokens,
                    "max_prompt_tokens": spec.prompt_budget,
                    "seed": spec.seed,
                    "load": {"request_rate": rate, "concurrency": conc, "burstiness": sv.burstiness},
                    **({"arrivals": arr} if arr else {}),
                    "ignore_eos": sv.ignore_eos,
                    "slo": sv.slo,
                    "file_sha256": fp,
                    **({"mix": mix_fingerprint(spec, w)} if w in spec.workload_mixes else {}),
                    "sampling": None if st.is_default else st.key(),
                }
                h = digest({"common": common, "endpoint": ep.url, "label": ep.label})
                load = load_name("ep", rate, conc, arr, st)
                cells.append(
                    EndpointCell(
                        cell_id=f"{ep.label}.{w}.{load}.{h}",
                        engine_key=digest({"endpoint": ep.url, "label": ep.label}),
                        method=method,
                        workload=w,
                        request_rate=rate,
                        concurrency=conc,
                        num_prompts=n,
                        baseline_key=digest(common),
                        setting=st,
                        endpoint=ep,
                        arrivals=arr,
                    )
                )
    return cells


class EndpointRunner(ServerRunner):
    """The server runner's prompts, rows, resume and text comparison; no server to start."""

    def __init__(
        self,
        spec: SweepSpec,
        run_dir: str | Path,
        prompt_provider: Callable[[str], PromptSet],
        endpoints: list[Endpoint],
        *,
        tokenizer: str,
        api_key_env: str | None = None,
        model: str | None = None,
        request_timeout_s: float = 300.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(spec, run_dir, prompt_provider, **kwargs)
        self.endpoints = endpoints
        self.cells = expand_endpoint_cells(spec, endpoints)  # type: ignore[assignment]
        self.tokenizer = tokenizer
        self.model = model
        self.request_timeout_s = request_timeout_s
        self.api_key: str | None = None
        if api_key_env:
            self.api_key = os.environ.get(api_key_env) or None
            if self.api_key is None:
                raise ConfigError(f"--api-key-env {api_key_env}: that environment variable is not set")
        self.fault: str | None = None  # the one line of the first remote failure

    def _run(self) -> SweepOutcome:
        rd = self.run_dir
        self.store = store = ResultsStore(rd)
        write_run_files(rd, self.spec, self.spec_text, self.command_line)
        if self.redo:
            store.redo([c.cell_id for c in self.cells], self.redo, "endpoint cell")
        skipped = sum(1 for c in self.cells if store.is_ok(c.cell_id))
        if skipped:
            self.echo(f"resuming {rd}: {skipped} of {len(self.cells)} endpoint cells already done")
        try:
            for ep in self.endpoints:
                todo = [c for c in self.cells if c.endpoint is ep and not store.is_ok(c.cell_id)]
                if todo:
                    self._run_endpoint(ep, todo)
        except EndpointFault as exc:
            self.fault = str(exc)
        except KeyboardInterrupt:
            self.echo(f"interrupted: completed cells are kept in {rd}; rerun the same command to resume")
            raise
        self._refresh_lossless()
        rows = [store.rows[c.cell_id] for c in self.cells if c.cell_id in store.rows]
        return SweepOutcome(rd, len(self.cells), skipped, 0, self.counts["ok"], self.counts["failed"], rows)

    def _run_endpoint(self, ep: Endpoint, cells: list[EndpointCell]) -> None:
        self.echo(f"[endpoint {ep.label}] {ep.url}: {len(cells)} cell(s)")
        try:
            models = served_models(ep.url, self.api_key)
            if self.model is not None and self.model not in models:
                raise EndpointFault(f"model {self.model!r} is not served (it lists {', '.join(models[:5])})")
        except EndpointFault as exc:
            for c in cells:
                self._put_failed(c, ep, str(exc))
            raise EndpointFault(self._line(ep, str(exc), 0, cells[0].num_prompts)) from None
        model = self.model or models[0]
        for c in cells:
            self._run_endpoint_cell(ep, c, model)

    def _line(self, ep: Endpoint, cause: str, completed: int, n: int) -> str:
        return (
            f"endpoint {ep.label} ({ep.url}): {cause}; {completed} of {n} requests completed "
            f"(kept in {self.run_dir / 'results.jsonl'})"
        )

    def _put_failed(self, c: EndpointCell, ep: Endpoint, reason: str) -> None:
        assert self.store is not None
        row = build_server_row(
            self._settings(c, None),
            None,
            None,
            category="other",
            engine_id=f"endpoint-{ep.label}",
            result_file=None,
            server={"endpoint": ep.url},
            error=reason,
        )
        self.store.put(row)
        self.counts["failed"] += 1

    def _settings(self, c: EndpointCell, model: str | None) -> dict[str, Any]:
        s = c.describe(self.spec)
        s["mode"] = "server"  # the server table, show and report read these rows as server rows
        s["endpoint"] = c.endpoint.describe(model) if c.endpoint else None
        s["target"] = model or self.spec.target
        s["dtype"] = None  # not known from outside
        return s

    def _loadgen(
        self, ep: Endpoint, c: EndpointCell, model: str, path: Path, n: int, celldir: Path
    ) -> list[str]:
        cmd = loadgen_command(
            prompts=path.resolve(),
            base_url=ep.url,
            tokenizer=self.tokenizer,
            num_prompts=n,
            request_rate=c.request_rate,
            concurrency=c.concurrency,
            burstiness=self.sv.burstiness,
            seed=self.spec.seed,
            ignore_eos=self.sv.ignore_eos,
            goodput=self.sv.goodput_args(),
            result_dir=celldir.resolve(),
            request_id_prefix=f"{_safe(c.cell_id)}-",
            remote=True,
        )
        # the served model by name; no retried test request (a fault shows on the measured requests); each
        # request bounded in time, so a stalled one fails alone and the others still count
        cmd += ["--model", model, "--ready-check-timeout-sec", "0"]
        return cmd + ["--speclab-request-timeout", f"{self.request_timeout_s:g}"]

    def _env(self) -> dict[str, str]:
        env = loopback_env()
        env.pop("OPENAI_API_KEY", None)
        if self.api_key:
            env["OPENAI_API_KEY"] = self.api_key  # vllm bench serve's own way to send a bearer token
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _run_endpoint_cell(self, ep: Endpoint, c: EndpointCell, model: str) -> None:
        assert self.store is not None
        path, _, category, n, own = self._prompts_file(c)
        celldir = self.run_dir / SERVER_DIR / "cells" / _safe(c.cell_id)
        celldir.mkdir(parents=True, exist_ok=True)
        result_path = celldir / "result.json"
        result_path.unlink(missing_ok=True)
        settings = self._settings(c, model)
        settings["num_prompts"] = n
        if c.setting.sampling == "as-logged":
            settings["requests_own_settings"] = own
        cmd = self._loadgen(ep, c, model, path, n, celldir)
        atomic_write_text(celldir / "command.txt", " ".join(cmd) + "\n")
        try:
            before, note = scrape(ep.url, self.api_key)
        except EndpointFault as exc:  # a /metrics that answers what cannot be read
            self._put_failed(c, ep, str(exc))
            raise EndpointFault(self._line(ep, str(exc), 0, n)) from None
        fault: str | None = None
        stall0, t0 = cpu_stall_us(), time.time()
        with open(celldir / "loadgen.log", "wb") as log:
            proc = spawn_child(cmd, self._env(), log)
            try:
                rc = proc.wait(timeout=self.sv.cell_timeout_s)
            except subprocess.TimeoutExpired:
                kill_group(proc, LOADGEN_STOP)
                rc, fault = None, f"timeout: the cell did not finish within {self.sv.cell_timeout_s:g} s"
            except BaseException:
                kill_group(proc, LOADGEN_STOP)
                raise
        elapsed, stall1 = time.time() - t0, cpu_stall_us()
        result = None
        if result_path.exists():
            try:
                result = read_result(result_path)
            except SpeclabError as exc:
                fault = fault or str(exc)
        if result is None and fault is None:
            fault = (
                classify(log_tail(celldir / "loadgen.log")) + f" (vllm bench serve {describe_exit(rc or 0)})"
            )
        if result is not None and fault is None and int(result.get("failed") or 0):
            errors = [e for e in result.get("errors") or [] if e]
            fault = classify(errors[0] if errors else "", self.request_timeout_s)
            fault += f" ({result.get('failed')} of {n} requests failed)"
        counters = None
        if before is not None:
            try:
                after, note = scrape(ep.url, self.api_key)
            except EndpointFault as exc:
                after, fault = None, fault or str(exc)
            counters = after.minus(before) if after is not None else None
            if fault is None and ep.expects_sd and counters is not None and not counters.spec_decode:
                fault = "/metrics has no spec-decode counters (vllm:spec_decode_*): is SD on at this server?"
        pressure = None
        if stall0 is not None and stall1 is not None and elapsed > 0:
            pressure = round((stall1 - stall0) / 1e6 / elapsed, 3)
        row = build_server_row(
            settings,
            result,
            counters,
            category=category,
            engine_id=f"endpoint-{ep.label}",
            result_file=str(result_path.relative_to(self.run_dir)) if result is not None else None,
            server={"endpoint": ep.url, "model": model, "metrics": note},
            error=fault,
            cpu_pressure=pressure,
        )
        if row["status"] == "ok" and not c.is_baseline:
            base_row, base_texts = self._baseline(c)
            apply_server_baseline(row, generated_texts(result), base_row, base_texts)
        self.store.put(row)
        self.counts["ok" if row["status"] == "ok" else "failed"] += 1
        self.echo("  " + format_server_line(row))
        if fault is not None:
            raise EndpointFault(self._line(ep, fault, row["completed"], n))


def run_endpoint_bench(
    spec: SweepSpec,
    run_dir: str | Path,
    prompt_provider: Callable[[str], PromptSet],
    endpoints: list[Endpoint],
    **kwargs: Any,
) -> tuple[SweepOutcome, str | None]:
    """Run the cells; returns the outcome and the one line of a remote failure (None when there was none)."""
    runner = EndpointRunner(spec, run_dir, prompt_provider, endpoints, **kwargs)
    return runner.run(), runner.fault
