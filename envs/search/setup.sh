#!/usr/bin/env bash
# Clone Search-R1 into DIR and download its e5 index and wiki-18 corpus with its own script; record checksums.
set -euo pipefail
usage() { echo "usage: bash envs/search/setup.sh DIR   (needs network; about 130 GB of disk)" >&2; exit 2; }
[ $# -eq 1 ] || usage
case "$1" in -h|--help) usage ;; esac
[ -e "$1" ] || git clone https://github.com/PeterGriffinJin/Search-R1.git "$1"
mkdir -p "$1/data"
cd "$1"
python scripts/download.py --save_path data
cat data/part_* > data/e5_Flat.index
gzip -d data/wiki-18.jsonl.gz
(cd data && sha256sum e5_Flat.index wiki-18.jsonl > SHA256SUMS)
echo "index and corpus in $1/data; start the server with: bash envs/search/start.sh $1"
