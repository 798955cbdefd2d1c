#!/usr/bin/env bash
# Holds many slow connections against `weir serve` while timing normal
# requests: half the connections idle, half sending a request head one byte
# a second (MODE=head) or, MODE=body, a whole head announcing a 65,000-byte
# decision API body and then that body one byte a second — inside each
# piece's `body_timeout`, cut off by the whole body's `body_deadline`.
# Loopback only, bounded in count and time; not run in CI.
#
#   cargo build --release && tools/slowloris.sh [CONNECTIONS=10000] [SECONDS=30] [MODE=head|body]
#
# WEIR=target/debug/weir runs another build.
#
# Prints, every 5 s, the slow connections still open, the normal requests'
# p50/p99 latency and failures, and weir's resident memory.
set -euo pipefail
connections=${1:-10000}
seconds=${2:-30}
mode=${3:-head}
root=$(cd "$(dirname "$0")/.." && pwd)
weir_bin=${WEIR:-$root/target/release/weir}
dir=$(mktemp -d)
port=$((20000 + RANDOM % 10000))
cat > "$dir/weir.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
max_connections = 20000
max_connections_per_ip = 20000
[policies.api]
algorithm = "token-bucket"
capacity = 1000000
rate = "1000000/s"
TOML
ulimit -n "$(ulimit -Hn)"
"$weir_bin" serve --config "$dir/weir.toml" 2>"$dir/weir.log" &
weir=$!
trap 'kill $weir 2>/dev/null; rm -rf "$dir"' EXIT
sleep 1
python3 - "$port" "$connections" "$seconds" "$weir" "$mode" <<'PY'
import resource, socket, sys, threading, time, urllib.request
port, total, seconds, pid = (int(a) for a in sys.argv[1:5])
mode = sys.argv[5]
resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)[1:] * 2)
held, lock, stop = [], threading.Lock(), time.time() + seconds

def hold(slow):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        with lock:
            held.append((s, slow))
    except OSError:
        pass

for i in range(total):
    hold(i % 2 == 1)

def drip():
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100000
    body_head = b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 65000\r\n\r\n"
    i = 0
    while time.time() < stop:
        with lock:
            alive = list(held)
        for s, slow in alive:
            if slow:
                piece = head[i:i + 1]
                if mode == "body":
                    piece = body_head if i == 0 else b"{"
                try:
                    s.send(piece)
                except OSError:
                    with lock:
                        if (s, slow) in held:
                            held.remove((s, slow))
        i += 1
        time.sleep(1)

threading.Thread(target=drip, daemon=True).start()
url = f"http://127.0.0.1:{port}/v1/check"
body = b'{"policy":"api","key":"normal"}'
window = []
failures = 0
next_report = time.time() + 5
while time.time() < stop:
    started = time.time()
    try:
        urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=5).read()
        window.append(time.time() - started)
    except Exception:
        failures += 1
    if time.time() >= next_report:
        window.sort()
        p = lambda q: window[min(len(window) - 1, int(q * len(window)))] * 1000 if window else float("nan")
        rss = int(open(f"/proc/{pid}/status").read().split("VmRSS:")[1].split()[0]) // 1024
        print(f"slow connections open {len(held):6d}  normal requests {len(window):5d}  "
              f"p50 {p(0.5):6.2f} ms  p99 {p(0.99):6.2f} ms  failures {failures}  weir RSS {rss} MB",
              flush=True)
        window, next_report = [], time.time() + 5
PY
