#!/usr/bin/env bash
# Prepares here what benchmarks/main_command_device.sh needs to time the README's main command on the CPU of a
# lent GPU machine (a Xeon with AVX512-BF16 and AMX, so bf16 by its hardware), which reaches no package registry:
#   .whl/               the wheels its image lacks, the ALFWorld engine's two compiled packages
#                       (ctypes_packages.tar.gz) and the embedded model's checksum
#   .device_model.1-3   the embedded model's GGUF file (93 MiB), in three parts
# A call carries at most 64 MiB together with the checkout, so the parts travel in three calls one after the
# other (the machine keeps what a call carried while it stays warm); docs/distributed.md gives the calls. All of
# it is git-ignored.
set -euo pipefail
cd "$(dirname "$0")/.."

# The versions installed here by `pip install -e ".[dev]"` (`pip list`): the ALFWorld engine and what it and
# TRL need beyond the image's packages.
PINS=(
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 accelerate==1.15.0 peft==0.21.2 gguf==0.19.0
  textworld==1.7.0 alfworld==0.4.2 tatsu==5.8.3 mementos==1.3.1 hashids==1.3.1
  prompt_toolkit==3.0.52 wcwidth==0.7.0 termcolor==3.3.0 more_itertools==11.2.1
)

rm -rf .whl .device_model.*
mkdir -p .whl
source benchmarks/device_wheels.sh
download_device_wheels .whl "${PINS[@]}"

# fast-downward-textworld and jericho 3.3 publish only source archives. The compiled part of each is a library
# loaded through ctypes, the same for any Python version, so the copies installed here travel (the planner's
# without its debug symbols: 33 MB with them, about 1 MB without).
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
for package in fast_downward jericho; do
  cp -r "$(python3 -c "import $package, os; print(os.path.dirname($package.__file__))")" "$staging/$package"
done
find "$staging" -name __pycache__ -prune -exec rm -rf {} +
strip --strip-debug "$staging/fast_downward/libdownward.so"
tar -czf .whl/ctypes_packages.tar.gz -C "$staging" fast_downward jericho

# The model, cut so that every call stays under 64 MiB with the checkout (tracked files travel in each call).
model=$(python3 -c "from taspo_trl.models import _find_gguf_file; print(_find_gguf_file())")
tracked=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
per_call=$(( 64 * 1024 * 1024 - tracked - 1024 * 1024 ))  # a MiB to spare
split --bytes="$per_call" --numeric-suffixes=1 --suffix-length=1 "$model" .device_model.
parts=$(ls .device_model.* | wc -l)
(cd "$(dirname "$model")" && sha256sum "$(basename "$model")") > .whl/model.sha256  # "digest  file name"
last=$(( $(du -cb .device_model."$parts" .whl | tail -1 | cut -f1) ))
if [ "$parts" -ne 3 ] || [ "$last" -gt "$per_call" ]; then
  echo "the model needs $parts parts and the last call $last bytes (at most $per_call): change the calls" >&2
  exit 1
fi
ls -l .whl .device_model.*
echo "each call: checkout $(( tracked / 1024 / 1024 )) MiB + at most $(( per_call / 1024 / 1024 )) MiB carried; last call $(( last / 1024 / 1024 )) MiB"
