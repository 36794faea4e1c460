//! Byte-level parts of ngx_gateway that do not touch nginx: the RDS encoder
//! (and a decoder used to check it), query-template method selection, and the
//! libpq connection-string builder. Kept apart from the module so that `cargo
//! test` can link them: the module itself only links inside an nginx binary.

pub mod authfail;
pub mod cluster;
pub mod conninfo;
pub mod formats;
pub mod jwt;
pub mod method;
pub mod metrics;
pub mod pgwire;
pub mod pipeline;
pub mod pubsub;
pub mod rds;
pub mod redis;
pub mod resp;
pub mod rewrite;
pub mod slab;
pub mod sql;
pub mod sse;
pub mod streams;
pub mod target;
pub mod template;
#[cfg(any(test, feature = "testrng"))]
pub mod testrng;
