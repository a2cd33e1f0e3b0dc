#!/usr/bin/env bash
# Clone WebShop into DIR and run its own setup for the small (1,000 products) or full (1.18 M) catalogue.
set -euo pipefail
usage() { echo "usage: bash envs/webshop/setup.sh DIR small|all   (needs network, Python 3.8 and Java)" >&2; exit 2; }
[ $# -eq 2 ] || usage
case "$2" in small|all) ;; *) usage ;; esac
[ -e "$1" ] || git clone https://github.com/princeton-nlp/WebShop.git "$1"
cd "$1"
./setup.sh -d "$2"
echo "WebShop set up in $1; start it with: bash envs/webshop/start.sh $1"
