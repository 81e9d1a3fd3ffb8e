#!/usr/bin/env bash
# The `speclab bench --ray` check on one machine, with real engines:
#   1. a serial run of the sweep;
#   2. the same sweep on a local two-worker Ray cluster on 127.0.0.1 (one speclab_engine slot: one engine at
#      a time), where the Ray worker running an engine is killed after KILL_WORKER_AT finished cells (the
#      driver resubmits its remaining cells) and the driver itself is killed after KILL_DRIVER_AT cells;
#   3. a rerun of the Ray run (resumes), then: every cell recorded exactly once across the attempts, and
#      `speclab bench compare` serial vs Ray (same cells, token-exact outputs, throughput ratios).
# Usage: benchmarks/ray_bench_check.sh [bench overrides...]   e.g. --batch-sizes 1,4 --num-prompts 4
# Env: OUT (runs/raycheck), PORT (6390), KILL_WORKER_AT (3), KILL_DRIVER_AT (9), SWEEP_ARGS (--preset demo-cpu
# --repeats 1). Bounded: every wait has a deadline; the cluster (its own process group) is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} RAY_USAGE_STATS_ENABLED=0
# loopback only: keep the node address 127.0.0.1, so every Ray server binds to it (speclab.raycluster); the
# cluster and its drivers share a fresh token (Ray's token authentication)
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$("$PY" -c "import secrets; print(secrets.token_hex(32))")
export RAY_AUTH_TOKEN
OUT=${OUT:-runs/raycheck}
PORT=${PORT:-6390}
KILL_WORKER_AT=${KILL_WORKER_AT:-3}
KILL_DRIVER_AT=${KILL_DRIVER_AT:-9}
read -r -a SWEEP <<<"${SWEEP_ARGS:---preset demo-cpu --repeats 1}"
SPECLAB=("$PY" -c "from speclab.cli import main; main()")  # this checkout's speclab (PYTHONPATH=src)
BENCH=("${SPECLAB[@]}" bench "${SWEEP[@]}" "$@" --no-progress)
RAY="$(dirname "$PY")/ray"
[ -x "$RAY" ] || RAY=ray
ADDR=127.0.0.1:$PORT
mkdir -p "$OUT"

rows() { [ -f "$1/results.jsonl" ] && wc -l <"$1/results.jsonl" || echo 0; }
wait_rows() { # run dir, count, deadline seconds, pid that must stay alive
  local end=$((SECONDS + $3))
  while [ "$(rows "$1")" -lt "$2" ]; do
    kill -0 "$4" 2>/dev/null || { echo "check: the driver ended before $2 cells"; return 1; }
    [ $SECONDS -lt $end ] || { echo "check: no $2 cells within $3 s"; return 1; }
    sleep 1
  done
}

echo "== 1. serial run -> $OUT/serial"
timeout 3600 "${BENCH[@]}" --out "$OUT/serial"

echo "== 2. local Ray cluster on $ADDR: 2 CPU workers, 1 speclab_engine"
tmp=$(mktemp -d -t rayXXXX)
setsid "$RAY" start --head --block --node-ip-address 127.0.0.1 --port "$PORT" --num-cpus 2 \
  --resources '{"speclab_engine": 1}' --include-dashboard false --disable-usage-stats --temp-dir "$tmp" \
  >"$OUT/ray-start.log" 2>&1 &
head_pid=$!
drv=
stop_cluster() {
  [ -z "$drv" ] || kill -KILL "$drv" 2>/dev/null || true  # a driver left behind by a failed check
  kill -TERM -- "-$head_pid" 2>/dev/null || true
  for _ in $(seq 30); do kill -0 "$head_pid" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$head_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap stop_cluster EXIT
for i in $(seq 120); do  # bounded: 120 tries
  timeout 60 "$RAY" health-check --address "$ADDR" >/dev/null 2>&1 && break
  [ "$i" -lt 120 ] || { echo "check: the cluster did not come up"; exit 1; }
  sleep 1
done

echo "check: the cluster listens on: $(ss -ltnpH | grep -E "pid=($(ps -o pid= -g "$head_pid" | xargs | tr ' ' '|'))," \
  | awk '{print $4}' | sort -u | xargs)"
echo "== 2a. Ray run; kill the engine's Ray worker after $KILL_WORKER_AT cells, the driver after $KILL_DRIVER_AT"
"${BENCH[@]}" --out "$OUT/ray" --ray "$ADDR" &  # no `timeout` wrapper: $! must be the driver itself
drv=$!
wait_rows "$OUT/ray" "$KILL_WORKER_AT" 1800 "$drv"
eng=$(pgrep -f "speclab.engine.worker --job .*speclab-ray-" | head -1)
victim=$(ps -o ppid= -p "$eng" | tr -d ' ')
echo "check: killing Ray worker $victim (parent of engine worker $eng)"
kill -KILL "$victim"
wait_rows "$OUT/ray" "$KILL_DRIVER_AT" 1800 "$drv"
echo "check: killing the driver $drv"
kill -KILL "$drv"
wait "$drv" 2>/dev/null || true
sleep 5
echo "== 2b. rerun (resume)"
timeout 3600 "${BENCH[@]}" --out "$OUT/ray" --ray "$ADDR"

echo "== 3. every cell recorded once; serial vs Ray"
"$PY" - "$OUT/ray" <<'EOF'
import collections, sys
from pathlib import Path
from speclab.bench.attempts import attempt_dirs
from speclab.bench.results import parse_rows
from speclab.engine.protocol import read_results
run = Path(sys.argv[1])
seen = collections.Counter(r.cell_id for ad in attempt_dirs(run) for r in read_results(ad / "cells.jsonl"))
rows = parse_rows(run / "results.jsonl")
twice = sorted(c for c, n in seen.items() if n > 1)
missing = sorted(set(rows) - set(seen))
print(f"check: {len(rows)} rows, {sum(seen.values())} cell results streamed; run twice: {twice or 'none'}; "
      f"lost: {missing or 'none'}; attempts: {len(attempt_dirs(run))}")
sys.exit(1 if twice or missing else 0)
EOF
"${SPECLAB[@]}" bench compare "$OUT/serial" "$OUT/ray"
