//! What weir's integration tests share: real `redis-server` processes and a
//! Redis Cluster on free loopback ports, and a small HTTP client.
//!
//! Tests panic on purpose here (a fixture that cannot start is a failed
//! test), always with a message that says what to do.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod http_client;
mod redis;

pub use http_client::{Reply, send};
pub use redis::{Cluster, RedisServer, free_port, require};
