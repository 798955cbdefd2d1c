//! Integration tests of weir-core: the algorithms against a naive exact
//! model written straight from SPEC.md, over random traces.

mod model;
mod props;
