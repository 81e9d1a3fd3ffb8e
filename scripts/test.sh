#!/usr/bin/env bash
# The project's one test command (the README's, and what .ci/run calls): set up, lint, test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# The report test renders the HTML in headless Chromium (Debian's package). Installed here when running
# as root on Debian; elsewhere that one test skips and says why.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "test: installing Debian's chromium for the report render test"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) ||
    echo "test: warning: chromium install failed; the render test will skip"
fi
.venv/bin/ruff check src tests benchmarks
.venv/bin/ruff format --check src tests benchmarks
.venv/bin/python -m pytest -q "$@"
