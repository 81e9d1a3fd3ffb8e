#!/usr/bin/env bash
# The project's one test command (the README's, and what .ci/run calls): set up, lint, test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/ruff check src tests benchmarks
.venv/bin/ruff format --check src tests benchmarks
.venv/bin/python -m pytest -q "$@"
