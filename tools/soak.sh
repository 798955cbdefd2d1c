#!/usr/bin/env bash
# Soak: `weir serve` on a Redis of its own under a steady wrk load, printing
# per slice the throughput, latency, weir's resident memory and Redis's
# memory. Outside the default test run (minutes long).
#
#   cargo build --release && tools/soak.sh [MINUTES=10] [SLICE_SECONDS=60]
#
# Needs redis-server and wrk (Debian: apt-get install redis-server wrk).
set -euo pipefail
minutes=${1:-10}
slice=${2:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
redis_port=$((20000 + RANDOM % 10000))
weir_port=$((redis_port + 1))
cat > "$dir/weir.toml" <<TOML
[server]
listen = "127.0.0.1:$weir_port"
[store]
url = "redis://127.0.0.1:$redis_port"
[policies.api]
algorithm = "token-bucket"
capacity = 10
rate = "2/s"
TOML
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
redis=$!
sleep 0.5
"$root/target/release/weir" serve --config "$dir/weir.toml" 2>"$dir/weir.log" &
weir=$!
trap 'kill $weir $redis 2>/dev/null; rm -rf "$dir"' EXIT
sleep 1
slices=$(( minutes * 60 / slice ))
printf '%-6s %10s %9s %9s %10s %12s\n' slice req/s p50 p99 weir_rss redis_memory
for i in $(seq 1 "$slices"); do
  out=$(wrk -t2 -c32 -d"${slice}s" --latency -s "$root/docs/bench/api.lua" "http://127.0.0.1:$weir_port/")
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p50=$(echo "$out" | awk '$1 == "50%" {print $2}')
  p99=$(echo "$out" | awk '$1 == "99%" {print $2}')
  rss=$(awk '/VmRSS/ {print $2 " kB"}' "/proc/$weir/status")
  mem=$(redis-cli -p "$redis_port" info memory | awk -F: '/^used_memory_human/ {print $2}' | tr -d '\r')
  printf '%-6s %10s %9s %9s %10s %12s\n' "$i" "$rps" "$p50" "$p99" "$rss" "$mem"
done
curl -s "http://127.0.0.1:$weir_port/metrics" | grep -E '^weir_(store_errors_total|fallback_decisions_total)' || true
