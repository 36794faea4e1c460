//! The database gateway: PostgreSQL behind nginx locations.

pub mod config;
pub mod driver;
pub mod error;
pub mod request;
