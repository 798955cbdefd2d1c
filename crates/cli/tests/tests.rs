//! Integration tests of the `weir` binary, run as a real process.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod abuse;
mod cluster;
mod crawler;
mod deploy;
mod envoy;
mod envoy_ratelimit;
mod faults;
mod fleet;
mod forward_auth;
mod quotas;
mod redis;
mod resp;
mod serve;
mod simulate;
mod telemetry;
mod ui;

/// Sends the signal `name` (`STOP`, `CONT`, …) to `pid`.
pub(crate) fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}
