//! The layer in front of a real axum server, called by a real HTTP client.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod http;
