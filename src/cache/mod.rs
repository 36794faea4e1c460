//! The cache gateway: Redis behind nginx locations.
//!
//! - `config`: the directives (`cache_pass`, `cache_cluster`, ...).
//! - `driver`: the worker's own connections to Redis (pipelined requests,
//!   subscribing hubs) and its run-time state; no HTTP in it.
//! - `request`: requests, from the content handler to the response, through
//!   nginx's upstream (one connection per request) or the driver's
//!   pipelined connections, and `cache_subscribe` streams.
//!
//! GET and HEAD read (`GET key`), PUT and POST store the request body
//! (`SET key body [EX n]`), DELETE deletes (`DEL key`). `$cache_db` selects
//! the database and `cache_auth` authenticates, in the same round trip, and
//! the connection is put back the way it was before it is kept.

pub mod config;
pub mod driver;
pub mod error;
pub mod request;

pub(crate) use request::content_handler;
