"""What went wrong at a remote OpenAI-compatible server, in one line; and speclab's own requests to it (the
model list, /metrics) with the same reading.

`classify` turns one failed request of `vllm bench serve` (its `errors` entry: a reason phrase such as
"Unauthorized" for a non-200 answer, else a Python traceback) into a short cause: connection refused,
401/403 (the API key), 429 (rate limited), 5xx, a timeout, a dropped stream, a malformed SSE chunk.
"""

from __future__ import annotations

import http
import json
import urllib.error
import urllib.request
from typing import Any

from speclab.errors import SpeclabError
from speclab.server.metrics import ServerCounters, parse_metrics

_PHRASES = {s.phrase.lower(): s.value for s in http.HTTPStatus}
_HINTS = {
    401: "the server refuses the API key (give it with --api-key-env NAME)",
    403: "the API key may not use this model or endpoint",
    429: "rate limited by the server",
}


class EndpointFault(SpeclabError):
    """A remote server did not answer as an OpenAI-compatible server should."""


def status_text(code: int) -> str:
    try:
        phrase = http.HTTPStatus(code).phrase
    except ValueError:
        phrase = "HTTP error"
    text = f"HTTP {code} {phrase}"
    if code in _HINTS:
        text += f": {_HINTS[code]}"
    elif code >= 500:
        text += ": server error"
    return text


def classify(error: str, timeout_s: float | None = None) -> str:
    """One failed request's error (vllm bench serve's `errors` entry) as one short cause."""
    e = (error or "").strip()
    last = e.splitlines()[-1].strip() if e else ""
    if last.lower() in _PHRASES:
        return status_text(_PHRASES[last.lower()])
    checks = (
        (("ClientConnectorError", "Connection refused", "Cannot connect to host"), "connection refused"),
        (("TimeoutError", "ServerTimeoutError"), "timeout: no full answer"),
        (
            ("ClientPayloadError", "ServerDisconnectedError", "payload is not completed", "ConnectionReset"),
            "the stream was dropped before its end",
        ),
        (("JSONDecodeError",), "malformed SSE chunk (not JSON)"),
        (("Never received a valid chunk",), "the stream ended without a token"),
    )
    for needles, cause in checks:
        if any(n in e for n in needles):
            if cause.startswith("timeout") and timeout_s:
                cause += f" within {timeout_s:g} s"
            return cause
    return last[:200] or "request failed (no error text)"


def _request(url: str, api_key: str | None, timeout: float, body: dict[str, Any] | None = None) -> str:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    try:
        with opener.open(req, timeout=timeout) as r:
            return r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        raise EndpointFault(status_text(exc.code)) from None
    except TimeoutError:
        raise EndpointFault(f"timeout: no answer within {timeout:g} s") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ConnectionRefusedError):
            raise EndpointFault("connection refused") from None
        if isinstance(reason, TimeoutError):
            raise EndpointFault(f"timeout: no answer within {timeout:g} s") from None
        raise EndpointFault(f"cannot connect ({reason})") from None
    except (ConnectionError, OSError) as exc:
        raise EndpointFault(f"the connection was dropped ({type(exc).__name__})") from None


def served_models(base_url: str, api_key: str | None, timeout: float = 30.0) -> list[str]:
    """The model ids the server lists at /v1/models."""
    text = _request(f"{base_url}/v1/models", api_key, timeout)
    try:
        data = json.loads(text)
        ids = [str(m["id"]) for m in data["data"]]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise EndpointFault("/v1/models is not an OpenAI model list") from None
    if not ids:
        raise EndpointFault("/v1/models lists no model")
    return ids


def scrape(base_url: str, api_key: str | None, timeout: float = 30.0) -> tuple[ServerCounters | None, str]:
    """The server's counters from /metrics, or None and why not (a server may keep /metrics private; that is
    not a fault). A /metrics that answers but cannot be read is one."""
    try:
        text = _request(f"{base_url}/metrics", api_key, timeout)
    except EndpointFault as exc:
        return None, f"/metrics not reachable: {exc}"
    try:
        return parse_metrics(text), "ok"
    except SpeclabError as exc:
        raise EndpointFault(str(exc)) from None
