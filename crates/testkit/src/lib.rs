//! What weir's integration tests share: real `redis-server` processes and a
//! Redis Cluster on free loopback ports, a small HTTP client, and a fake LLM
//! upstream that says how many tokens each answer used.
//!
//! Tests panic on purpose here (a fixture that cannot start is a failed
//! test), always with a message that says what to do.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod http_client;
pub mod llm;
mod redis;
pub mod tls;

pub use http_client::{Reply, send};
pub use llm::Llm;
pub use redis::{Cluster, RedisServer, Sentinels, free_port, require};
pub use tls::Certs;
