//! The Redis store against a real `redis-server` (and a real three-node
//! Redis Cluster) started by the harness: the same decisions as the core.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod boundary;
mod cluster;
mod contract;
mod tls;
