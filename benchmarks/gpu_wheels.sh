#!/usr/bin/env bash
# Prepares here what benchmarks/gpu_check.sh needs on a lent GPU machine, which reaches no package registry:
#   .whl/         the wheels its image lacks (it has torch, transformers, sentence-transformers, pyarrow, ...)
#   .gpu_assets/  the offline tokenizer and sentence encoder (gpu_check.py --export-assets)
# Both folders are git-ignored; a device run carries them. Together with the checkout they must stay under the
# 64 MiB a run can carry: the script prints the total.
set -euo pipefail
cd "$(dirname "$0")/.."

# What CI installs: setup.cfg pins trl; the others are the versions `pip install -e ".[dev]"` resolves (`pip list`
# here). hjson and pydantic (with pydantic-core, annotated-types, typing-inspection) are DeepSpeed's needs that
# the GPU image lacks. DeepSpeed is not in CI; this is its newest release.
PINS=(
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 accelerate==1.15.0 peft==0.21.2
  hjson==3.1.0 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
)
DEEPSPEED=0.19.8

rm -rf .whl .gpu_assets
mkdir -p .whl .gpu_assets
source benchmarks/device_wheels.sh
download_device_wheels .whl "${PINS[@]}"

# DeepSpeed publishes only a source archive. Its build without precompiled ops is a pure-Python wheel; ZeRO-2/3
# with the Trainer's own torch AdamW needs no compiled op.
sdist=$(mktemp -d)
trap 'rm -rf "$sdist"' EXIT
python3 -m pip download --quiet --no-deps --no-binary=:all: -d "$sdist" "deepspeed==$DEEPSPEED"
DS_BUILD_OPS=0 DS_ACCELERATOR=cuda python3 -m pip wheel --quiet --no-deps --no-build-isolation -w .whl "$sdist"/deepspeed-*.tar.gz

python3 benchmarks/gpu_check.py --export-assets .gpu_assets
ls .whl
du -sh .whl .gpu_assets
git ls-files -z | du -cb --files0-from=- | tail -1 | awk '{printf "tracked files: %.1f MB\n", $1 / 1e6}'
