//! The database gateway: PostgreSQL behind nginx locations.

pub mod cancel;
pub mod conf;
pub mod conn;
pub mod handler;
pub mod output;
pub mod pq;
pub mod stream;
pub mod vars;
