"""A small fake OpenAI-compatible server for tests (127.0.0.1 only): /v1/models, /metrics and streaming
/v1/completions, with one fault mode at a time. The first `ok_first` completions are answered well; every
later one gets the fault:

  ok          no fault
  refuse      the server stops listening (connections refused from then on)
  unauthorized / forbidden / ratelimit / error   HTTP 401 / 403 / 429 / 500
  timeout     no answer at all (the connection stays open)
  drop        a few tokens, then the connection is cut in the middle of the stream
  badsse      a chunk that is not JSON
  nometrics   answers well, but /metrics has no spec-decode counters
  badmetrics  /metrics answers a counter that is not a number

With `api_key`, every /v1 request without `Authorization: Bearer <api_key>` gets 401.
"""

from __future__ import annotations

import asyncio
import json
import threading

STATUS = {"unauthorized": 401, "forbidden": 403, "ratelimit": 429, "error": 500}
REASON = {200: "OK", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 429: "Too Many Requests"}
REASON[500] = "Internal Server Error"
MODEL = "fake-model"


class FakeOpenAI:
    def __init__(self, mode: str = "ok", ok_first: int = 2, api_key: str | None = None) -> None:
        self.mode, self.ok_first, self.api_key = mode, ok_first, api_key
        self.completions = 0  # completion requests received
        self.drafts = 0
        self.auth_seen: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    async def _shutdown(self) -> None:
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            lines = head.split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)
            }
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            await self._route(method, path, headers, body, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def _plain(
        self, writer: asyncio.StreamWriter, status: int, text: str, ctype: str = "application/json"
    ) -> None:
        data = text.encode()
        writer.write(
            f"HTTP/1.1 {status} {REASON[status]}\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + data
        )

    async def _route(self, method: str, path: str, headers: dict, body: bytes, writer) -> None:
        auth = headers.get("authorization", "")
        if path.startswith("/v1/"):  # as vLLM's --api-key: the /v1 routes only
            self.auth_seen.append(auth)
        if self.api_key is not None and path.startswith("/v1/") and auth != f"Bearer {self.api_key}":
            return self._plain(writer, 401, '{"error": "bad key"}')
        if path == "/v1/models":
            return self._plain(
                writer, 200, json.dumps({"object": "list", "data": [{"id": MODEL, "root": MODEL}]})
            )
        if path == "/metrics" and self.mode == "badmetrics":
            return self._plain(writer, 200, "vllm:spec_decode_num_drafts_total{} many\n", "text/plain")
        if path == "/metrics":
            return self._plain(writer, 200, self._metrics(), "text/plain")
        if path != "/v1/completions" or method != "POST":
            return self._plain(writer, 404, "{}")
        req = json.loads(body)
        n = self.completions
        self.completions += 1
        fault = self.mode if n >= self.ok_first else "ok"
        if fault in STATUS:
            return self._plain(writer, STATUS[fault], '{"error": "fault"}')
        if fault == "timeout":
            await asyncio.sleep(3600)
            return None
        if self.mode == "refuse" and self.completions >= self.ok_first:
            # stop listening before this last good answer ends, so the client's next connection is refused
            self._server.close()
        await self._stream(req, fault, writer)
        return None

    def _metrics(self) -> str:
        out = [f'vllm:generation_tokens_total{{model_name="{MODEL}"}} {self.completions * 8}.0']
        if self.mode != "nometrics":
            out += [
                f'vllm:spec_decode_num_drafts_total{{model_name="{MODEL}"}} {self.drafts}.0',
                f'vllm:spec_decode_num_draft_tokens_total{{model_name="{MODEL}"}} {self.drafts * 2}.0',
                f'vllm:spec_decode_num_accepted_tokens_total{{model_name="{MODEL}"}} {self.drafts}.0',
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="{MODEL}",position="0"}} '
                f"{self.drafts}.0",
            ]
        return "\n".join(out) + "\n"

    async def _stream(self, req: dict, fault: str, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n"
        )
        prompt = req.get("prompt") or [0]
        n = int(req.get("max_tokens") or 8)

        def chunk(data: str) -> None:
            raw = f"data: {data}\n\n".encode()
            writer.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")

        for i in range(n):
            if fault == "drop" and i == 2:
                await writer.drain()
                writer.transport.abort()  # cut mid-stream: no terminating chunk
                return
            text = f" t{(int(prompt[i % len(prompt)]) + i) % 97}"  # deterministic per prompt
            good = json.dumps(
                {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": text}]}
            )
            if fault == "badsse" and i == 2:
                # one write, so the client reads the bad chunk with the next one: vLLM's load generator strips
                # each read before splitting messages, and a bad chunk read alone is silently glued to the
                # next read instead of failing the request
                raw = f"data: {{not json\n\ndata: {good}\n\n".encode()
                writer.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            else:
                chunk(good)
            await writer.drain()
            await asyncio.sleep(0.001)
        self.drafts += n // 2
        usage = {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}
        chunk(json.dumps({"id": "c", "object": "text_completion", "choices": [], "usage": usage}))
        chunk("[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
