"""Server mode of the bench (`speclab bench SWEEP --server`): each engine configuration behind `vllm serve` on
loopback, driven by vLLM's own load generator (`vllm bench serve`) at request rates and concurrency levels,
with the spec-decode counters scraped from the server's /metrics. Details: docs/server.md.

- the sweep's `[server]` table (`ServerSpec`) is parsed with the sweep, in `speclab.bench.server_spec`.
- `speclab.server.cells`: server cells (method x workload x load) and their ids.
- `speclab.server.metrics`: Prometheus text -> spec-decode counters.
- `speclab.server.process`: start `vllm serve` with the worker's settings, wait for health, stop it.
- `speclab.server.loadgen`: `vllm bench serve` fed the bench's own token-id prompts.
- `speclab.server.rows`: a bench-serve result + counters -> a results.jsonl row.
- `speclab.server.runner`: the resumable loop over engines and cells.
- `speclab.server.endpoint`: the same cells against servers that already run (`--endpoint URL`, A/B).
- `speclab.server.faults`: a remote server's failures as one-line causes; speclab's own requests to it.
- `speclab.server.crosscheck`: /metrics acceptance vs the offline worker's counters for the same requests.
"""
