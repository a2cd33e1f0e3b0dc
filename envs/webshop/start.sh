#!/usr/bin/env bash
# Start the WebShop site in DIR on PORT (default 3000) and wait until it serves a goal, or fail after 300 s.
set -euo pipefail
usage() { echo "usage: bash envs/webshop/start.sh DIR [PORT]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
here=$(cd "$(dirname "$0")/.." && pwd)
port=${2:-3000}
[ -f "$1/run_dev.sh" ] || { echo "$1 is not a WebShop checkout: run envs/webshop/setup.sh first" >&2; exit 1; }
(cd "$1" && nohup ./run_dev.sh > webshop_server.log 2>&1 &)
for _ in $(seq 60); do
  python "$here/check_setup.py" webshop --url "http://127.0.0.1:$port" 2>/dev/null && exit 0
  sleep 5
done
echo "WebShop did not answer on port $port within 300 s; see $1/webshop_server.log" >&2
exit 1
