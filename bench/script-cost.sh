#!/usr/bin/env bash
# Redis's time per call of weir.lua on keys that hold many entries (see
# bench/script-cost.py), for the script of this checkout and, given a git
# revision, for that revision's beside it:
#
#   bench/script-cost.sh [REVISION]
#
# Needs redis-server and Python's redis package (pip install redis).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c 'import redis' 2>/dev/null || pip3 install --quiet redis
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --save '' --appendonly no --daemonize no >/dev/null &
server=$!
trap 'kill $server' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
echo "| script | call | Redis time per call |"
echo "|---|---|---|"
if [ $# -gt 0 ]; then
  old=$(mktemp)
  git show "$1:crates/redis/src/weir.lua" > "$old"
  python3 bench/script-cost.py "$port" "$old" "$1"
  rm -f "$old"
fi
python3 bench/script-cost.py "$port" crates/redis/src/weir.lua "this checkout"
