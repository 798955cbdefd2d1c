//! Integration tests of the `weir` binary, run as a real process.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod crawler;
mod redis;
mod serve;
mod simulate;
