//! The cache gateway: `cache_pass` to Redis through nginx's upstream
//! (config: the directives; request: the requests).
//!
//! GET and HEAD read (`GET key`), PUT and POST store the request body
//! (`SET key body [EX n]`), DELETE deletes (`DEL key`). `$cache_db` selects
//! the database and `cache_auth` authenticates, in the same round trip, and
//! the connection is put back the way it was before it is kept.

pub mod authfail;
pub mod cluster;
pub mod config;
pub mod link;
pub mod pipe;
pub mod request;
pub mod shared;
pub mod subscriber;

pub(crate) use request::content_handler;
