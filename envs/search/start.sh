#!/usr/bin/env bash
# Serve Search-R1's e5 + wiki-18 retriever from DIR on port 8000 and wait until /retrieve answers (600 s at most).
set -euo pipefail
usage() { echo "usage: bash envs/search/start.sh DIR" >&2; exit 2; }
[ $# -eq 1 ] || usage
here=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$1/data/e5_Flat.index" ] || { echo "$1/data/e5_Flat.index is missing: run envs/search/setup.sh $1 first" >&2; exit 1; }
(cd "$1" && nohup python search_r1/search/retrieval_server.py --index_path data/e5_Flat.index \
  --corpus_path data/wiki-18.jsonl --topk 3 --retriever_name e5 --retriever_model intfloat/e5-base-v2 \
  --faiss_gpu > retrieval_server.log 2>&1 &)
for _ in $(seq 120); do
  python "$here/check_setup.py" search --url http://127.0.0.1:8000 2>/dev/null && exit 0
  sleep 5
done
echo "the retriever did not answer within 600 s; see $1/retrieval_server.log" >&2
exit 1
