//! Integration tests of weir-pacer: the pacer on tokio's paused clock against
//! docs/SPEC.md's leaky bucket, and the example crawler over real sockets.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod crawler;
mod pacer;
