//! Integration tests of weir-limiter: the store against the pure core, under
//! threads, and under a flood of identities.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod concurrency;
mod contract;
mod memory;
