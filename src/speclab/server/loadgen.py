"""vLLM's own load generator (`vllm bench serve`) driven with the bench's own prompts.

    python -m speclab.server.loadgen --speclab-prompts PROMPTS.jsonl [any `vllm bench serve` flag ...]

This is `vllm bench serve` (its argument parser, arrival process, concurrency limit, streaming client, TTFT /
TPOT / ITL / goodput arithmetic and result JSON), with one step replaced: the dataset. vLLM's file datasets
(`custom`, `sharegpt`, ...) take prompt *text* and re-tokenise it on the client and again on the server (and
`custom` applies the chat template itself); its token-level `timed_trace` dataset synthesises random tokens.
A server cell must send exactly the token ids the offline bench ran (rendered once by
speclab.bench.preflight), so that its acceptance can be compared with the offline engine's counters for the
same requests; vLLM's completions backends send a `prompt` given as token ids unchanged. PROMPTS.jsonl has
one line per request, in order: {"id": str, "prompt_token_ids": [int], "max_tokens": int}, and for a sampled
cell "sampling": {temperature, top_p, top_k, seed, max_tokens} (PromptSpec.sampling): sent as the request's
own body fields (SampleRequest.request_overrides, merged over the command line's `--temperature 0`), so every
request draws with the same seed as offline. A line may carry "arrival_s": its send time in seconds from the
load's start (a logged replay, speclab.server.arrivals); then every line must, they are sent at those times by
vLLM's own self-timed scheduler (`get_request(..., self_timed=True)`, which `vllm bench serve` only switches
on for its `timed_trace` dataset) and `--request-rate` is ignored.

`load_requests` builds vLLM's own `SampleRequest`s from it; `main` installs them in place of
`vllm.benchmarks.serve.get_samples` and runs `vllm.benchmarks.serve.main`. The caller passes
`--dataset-name custom --dataset-path PROMPTS.jsonl` so that vLLM's dataset-specific defaults (e.g. random's
forced ignore_eos) stay off; `--num-prompts` takes the first N lines.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from speclab.atomic import atomic_write_text
from speclab.engine.request_sampling import check_sampling
from speclab.errors import ConfigError, SpeclabError


def read_prompts(path: str | Path) -> list[dict[str, Any]]:
    out = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            ids = [int(t) for t in d["prompt_token_ids"]]
            p = {"id": str(d["id"]), "prompt_token_ids": ids, "max_tokens": int(d["max_tokens"])}
            if d.get("sampling"):
                p["sampling"] = check_sampling(d["sampling"], f"{path}:{i}")
            if d.get("arrival_s") is not None:
                p["arrival_s"] = float(d["arrival_s"])
            out.append(p)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, ConfigError) as exc:
            raise SpeclabError(f"{path}:{i}: not a prompt line ({exc})") from None
    if not out:
        raise SpeclabError(f"{path}: no prompts")
    timed = sum(1 for p in out if "arrival_s" in p)
    if timed not in (0, len(out)):
        raise SpeclabError(f"{path}: {timed} of {len(out)} lines have an arrival_s; all or none must")
    return out


def write_prompts(
    path: str | Path,
    prompts: list[tuple[str, list[int]]],
    max_tokens: int,
    sampling: list[dict[str, Any] | None] | None = None,
    arrival_s: list[float] | None = None,
    own_max_tokens: list[int | None] | None = None,
) -> None:
    """One line per request; `sampling`: each request's settings (PromptSpec.sampling), None for greedy;
    `arrival_s`: each request's send time from the load's start (a logged replay); `own_max_tokens`: each
    request's own max_tokens (None: the sweep's)."""
    lines = []
    for i, (pid, ids) in enumerate(prompts):
        d: dict[str, Any] = {"id": pid, "prompt_token_ids": ids, "max_tokens": max_tokens}
        if own_max_tokens and own_max_tokens[i]:
            d["max_tokens"] = int(own_max_tokens[i])  # type: ignore[arg-type]
        s = sampling[i] if sampling else None
        if s:
            d["sampling"] = s
            d["max_tokens"] = int(s.get("max_tokens") or d["max_tokens"])
        if arrival_s is not None:
            d["arrival_s"] = round(float(arrival_s[i]), 6)
        lines.append(json.dumps(d) + "\n")
    atomic_write_text(path, "".join(lines))


def request_overrides(sampling: dict[str, Any] | None) -> dict[str, Any] | None:
    """The request-body fields that send one request's sampling settings to vLLM's OpenAI server (merged
    over the command line's --temperature 0 by `vllm bench serve`; max_tokens is the request's own)."""
    if not sampling:
        return None
    out: dict[str, Any] = {k: sampling[k] for k in ("temperature", "top_p", "seed") if k in sampling}
    if sampling.get("top_k"):
        out["top_k"] = int(sampling["top_k"])
    return out


def load_requests(path: str | Path, num_prompts: int, request_id_prefix: str = "") -> list[Any]:
    """vLLM SampleRequests (prompt = token ids) for the first `num_prompts` lines of the prompts file."""
    from vllm.benchmarks.datasets import SampleRequest

    prompts = read_prompts(path)
    if num_prompts > len(prompts):
        raise SpeclabError(f"{path}: {len(prompts)} prompts, {num_prompts} asked for")
    return [
        SampleRequest(
            prompt=p["prompt_token_ids"],
            prompt_len=len(p["prompt_token_ids"]),
            expected_output_len=p["max_tokens"],
            request_id=f"{request_id_prefix}{i}",
            request_overrides=request_overrides(p.get("sampling")),
            timestamp=p.get("arrival_s"),
        )
        for i, p in enumerate(prompts[:num_prompts])
    ]


def self_timed(get_request: Any) -> Any:
    """vllm bench serve's request scheduler with its self-timed path on (each request sent at its own
    timestamp from the start); its command line allows that only for the timed_trace dataset."""

    def timed(input_requests: Any, request_rate: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("self_timed", None)
        return get_request(input_requests, request_rate, *args[:4], self_timed=True)

    return timed


def main(argv: list[str] | None = None) -> int:
    from vllm.benchmarks import serve as vserve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(
        prog="python -m speclab.server.loadgen", description=__doc__.splitlines()[0]
    )
    vserve.add_cli_args(parser)
    parser.add_argument("--speclab-prompts", required=True, help="PROMPTS.jsonl: token-id prompts, in order")
    parser.add_argument(
        "--speclab-request-timeout", type=float, help="fail a request with no full answer within S seconds"
    )
    args = parser.parse_args(argv)
    requests = load_requests(args.speclab_prompts, args.num_prompts, args.request_id_prefix)
    if args.speclab_request_timeout:
        bound_requests(vserve, args.speclab_request_timeout)

    def samples(_args: Any, _tokenizer: Any) -> list[Any]:
        return requests

    vserve.get_samples = samples  # the dataset step only; everything else is vllm bench serve's
    if requests and requests[0].timestamp is not None:
        vserve.get_request = self_timed(vserve.get_request)
    vserve.main(args)
    return 0


def bound_requests(vserve: Any, timeout_s: float) -> None:
    """Every request of `vllm bench serve` bounded in time: one past `timeout_s` is a failed request (its
    error names the timeout), the others still count."""
    import asyncio

    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    def bounded(func: Any) -> Any:
        async def call(request_func_input: Any, session: Any, pbar: Any = None) -> Any:
            try:
                return await asyncio.wait_for(func(request_func_input, session, pbar), timeout_s)
            except TimeoutError:
                return RequestFuncOutput(
                    success=False, error=f"TimeoutError: no answer within {timeout_s:g} s"
                )

        return call

    vserve.ASYNC_REQUEST_FUNCS = {k: bounded(f) for k, f in vserve.ASYNC_REQUEST_FUNCS.items()}


def loadgen_command(
    *,
    prompts: Path,
    base_url: str,
    tokenizer: str,
    num_prompts: int,
    request_rate: float | None,
    concurrency: int | None,
    burstiness: float,
    seed: int,
    ignore_eos: bool,
    goodput: list[str],
    result_dir: Path,
    request_id_prefix: str,
    remote: bool = False,
) -> list[str]:
    """The load generator's command line for one cell (loopback only unless `remote`, an existing endpoint the
    user names; results saved with per-request detail, generated texts included, for the token-exactness
    check)."""
    if not remote and not base_url.startswith("http://127.0.0.1:"):
        raise SpeclabError(f"load generator: {base_url} is not a loopback address (127.0.0.1)")
    cmd = [
        sys.executable,
        "-m",
        "speclab.server.loadgen",
        "--speclab-prompts",
        str(prompts),
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(prompts),
        "--backend",
        "vllm",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/completions",
        "--tokenizer",
        tokenizer,
        "--num-prompts",
        str(num_prompts),
        # open loop: Poisson arrivals at this rate; closed loop: everything queued at once, N in flight
        "--request-rate",
        "inf" if request_rate is None else f"{request_rate:g}",
        "--burstiness",
        f"{burstiness:g}",
        "--seed",
        str(seed),
        "--temperature",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        "result.json",
        "--request-id-prefix",
        request_id_prefix,
        "--disable-tqdm",
    ]
    if concurrency is not None:
        cmd += ["--max-concurrency", str(concurrency)]
    if ignore_eos:
        cmd.append("--ignore-eos")
    if goodput:
        cmd += ["--goodput", *goodput]
    return cmd


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SpeclabError as exc:
        print(f"speclab loadgen: {exc}", file=sys.stderr)
        sys.exit(2)
