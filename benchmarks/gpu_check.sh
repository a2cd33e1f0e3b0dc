#!/usr/bin/env bash
# Runs benchmarks/gpu_check.py on a lent GPU machine: installs the wheels carried in .whl/ (made here by
# benchmarks/gpu_wheels.sh) beside the image's own packages, then runs the check. Arguments go to gpu_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
# The carried wheels win over the image's copies; nothing may reach the network; DeepSpeed must not guess the
# accelerator from its build machine's (CPU) torch.
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda
exec python3 benchmarks/gpu_check.py "$@"
