//! Integration tests of weir-core: the algorithms against a naive exact
//! model written straight from docs/SPEC.md, over random traces.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod grants;
mod leases;
mod model;
mod props;
