#!/usr/bin/env bash
# The gateway's user-space instructions per request, counted by valgrind's
# callgrind over a 6 s wrk run: the admitted path (docs/bench/gateway.lua)
# and the 429 path (docs/bench/gateway-flood.lua). Unlike a rate on a shared
# machine, the count moves by about 2 % between runs (more on a busy host,
# where fewer requests share a wake-up), so a change to the forwarding path
# can be judged by it: run the builds before and after it alternately.
#
#   bench/instructions.sh [WEIR-BINARY]      (default: target/release/weir)
#   PATHS=admitted bench/instructions.sh …   (one path: admitted or refused)
#
# Needs valgrind, nginx (the upstream, started here when 127.0.0.1:19000 is
# free) and wrk; missing ones are installed from Debian's packages.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-target/compare}
mkdir -p "$OUT" /tmp/weir-bench
. bench/need.sh
need valgrind valgrind
need nginx nginx-light
need wrk wrk
need curl curl
# Without an argument, weir as built from this tree now (never a stale build).
[ $# -eq 0 ] && cargo build --release -q -p weir
weir=${1:-target/release/weir}
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
if ! curl -s -o /dev/null http://127.0.0.1:19000/; then
  nginx -c "$PWD/docs/bench/upstream.conf" -g 'daemon off;' &
  pids+=($!)
  sleep 0.5
fi
addr=127.0.0.1:19012
scripts=()
case ${PATHS:-admitted refused} in
  *admitted*) scripts+=(gateway.lua) ;;&
  *refused*) scripts+=(gateway-flood.lua) ;;
esac
[ ${#scripts[@]} -gt 0 ] || { echo "PATHS=${PATHS}: valid are admitted, refused or both" >&2; exit 2; }
for script in "${scripts[@]}"; do
  rm -f "$OUT"/callgrind.*
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$OUT/callgrind.%p" \
    "$weir" serve --config docs/bench/weir.toml --no-watch --listen $addr >"$OUT/callgrind.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do curl -s -o /dev/null "http://$addr/healthz" && break; sleep 0.3; done
  wrk -t1 -c8 -d3s -s "docs/bench/$script" "http://$addr/" >/dev/null # warm up
  callgrind_control -i on "$pid" >/dev/null 2>&1
  wrk -t1 -c8 -d6s -s "docs/bench/$script" "http://$addr/" >"$OUT/callgrind-wrk.txt"
  callgrind_control -i off "$pid" >/dev/null 2>&1
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  requests=$(awk '/requests in/ { print $1 }' "$OUT/callgrind-wrk.txt")
  total=$(awk '/^totals:/ { print $2 }' "$OUT"/callgrind.*.1)
  echo "$script: $((total / requests)) instructions per request ($requests requests)"
done
