#!/usr/bin/env bash
# Download the official ALFWorld data into DIR with the alfworld package's own downloader, then record checksums.
set -euo pipefail
usage() { echo "usage: bash envs/alfworld/download.sh DIR   (needs network and 'pip install alfworld')" >&2; exit 2; }
[ $# -eq 1 ] || usage
case "$1" in -h|--help) usage ;; esac
command -v alfworld-download >/dev/null || { echo "alfworld-download not found: pip install \"taspo-trl[alfworld]\"" >&2; exit 1; }
mkdir -p "$1"
export ALFWORLD_DATA="$1"
alfworld-download
(cd "$1" && find . -type f ! -name SHA256SUMS -print0 | sort -z | xargs -0 sha256sum > SHA256SUMS)
echo "ALFWorld data in $1 ($(wc -l < "$1/SHA256SUMS") files, SHA256SUMS written); export ALFWORLD_DATA=$1"
