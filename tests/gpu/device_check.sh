#!/usr/bin/env bash
# GPU checks for a device session (a lent H200: Python 3.12, torch CUDA, nothing to download there).
#   here, once:      tests/gpu/device_check.sh fetch     (wheels the device lacks -> .whl/, git-ignored)
#   on the device:   run(command="tests/gpu/device_check.sh run", carry=[".whl"])
# The run prints the pytest summary and leaves the log in $OUT/gpu_check.log. The colocated sleep check
# (test_colocated_sleep_on_gpu.py: memory freed for the train step, by torch.cuda.mem_get_info) needs vLLM
# for CUDA on the machine, which the fetch cannot bring (it pins its own torch): without it, it skips, saying so.
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=(megatron-core==0.16.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection)
case "${1:-}" in
  fetch)
    grep -qx '/.whl/' .git/info/exclude || echo '/.whl/' >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl "${WHEELS[@]}"
    ;;
  run)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, megatron.core; print('torch', torch.__version__, 'megatron-core', megatron.core.__version__)"
    python3 -c "import vllm; print('vllm', vllm.__version__)" 2>/dev/null || echo "vllm: not installed (the colocated sleep check skips)"
    python3 -m pytest -p no:cacheprovider -o addopts="" -m gpu -ra -q tests/gpu 2>&1 | tee "${OUT:-/tmp}/gpu_check.log"
    ;;
  *) echo "usage: $0 fetch|run" >&2; exit 2 ;;
esac
