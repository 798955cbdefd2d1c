#!/usr/bin/env bash
# Decisions per second of `weir bench --store` on a Redis Cluster of $1
# masters (the slots split evenly), started here on ports 32000… and
# stopped after. docs/RELIABILITY.md, "Scale", has the figures.
# Usage: cargo build --release && tools/cluster-scale.sh 3
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
n=${1:?how many masters}
base=32000
ports=(); for i in $(seq 0 $((n-1))); do ports+=($((base+i))); done
for p in "${ports[@]}"; do mkdir -p "$work/$p"; (cd "$work/$p" && redis-server --port $p --cluster-enabled yes --cluster-config-file nodes.conf --save "" --appendonly no --daemonize yes --logfile log); done
sleep 0.5
per=$((16384 / n))
for i in $(seq 0 $((n-1))); do
  s=$((i*per)); e=$(( i==n-1 ? 16383 : (i+1)*per-1 ))
  redis-cli -p ${ports[$i]} cluster addslotsrange $s $e >/dev/null
  if [ "$i" -gt 0 ]; then redis-cli -p ${ports[$i]} cluster meet 127.0.0.1 ${ports[0]} >/dev/null; fi
done
for t in $(seq 1 50); do redis-cli -p ${ports[0]} cluster info | grep -q cluster_state:ok && break; sleep 0.2; done
sleep 1
url="redis-cluster://$(IFS=,; echo "${ports[*]/#/127.0.0.1:}")"
target/release/weir bench --algorithm token-bucket --capacity 100 --rate 100/s --keys 100000 --duration 5s --concurrency 200 --store "$url"
for p in "${ports[@]}"; do redis-cli -p $p shutdown nosave >/dev/null 2>&1 || true; done
