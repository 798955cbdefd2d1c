#!/usr/bin/env bash
# weir's release binary, linked statically (glibc with crt-static): it runs
# on any x86-64 Linux, in an empty root or a `scratch` image. Writes
# target/x86_64-unknown-linux-gnu/release/weir; arguments go to `cargo
# build` (for example --target-dir).
set -euo pipefail
cd "$(dirname "$0")/.."
# With an explicit --target, RUSTFLAGS reach weir's code and not the build
# scripts and procedural macros, which cannot be static.
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
  exec cargo build --release --locked --target x86_64-unknown-linux-gnu -p weir "$@"
