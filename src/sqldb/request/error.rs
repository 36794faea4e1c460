//! A failed database request's log line, and the SQLSTATEs that tell a
//! query's failure apart (the gateway's error is `crate::sqldb::error`).

pub use crate::common::failure::Failure;
use crate::ffi::*;
pub use crate::sqldb::error::{Error, Kind};

/// The error-log line of a failure of a database request.
pub fn log_failure(log: Log, f: &dyn Failure) {
    crate::common::failure::log_failure(log, "sqldb", f);
}

/// SQLSTATEs of a value from the request that does not fit: invalid text
/// representation, numeric out of range, datetime format and overflow,
/// characters not valid in the encoding, string too long, bad escape, a
/// row count LIMIT or OFFSET refuses (negative), and values past a limit
/// of the server (program limit exceeded, statement too complex).
pub const BAD_PARAMETER: &[&str] = &[
    "22P02", "22003", "22007", "22008", "22021", "22P05", "22001", "22025", "2201W", "2201X", "54000", "54001",
];

/// SQLSTATEs of `set_config('role', ...)` for a role that cannot be used:
/// invalid parameter value (no such role) and insufficient privilege.
pub const ROLE_DENIED: &[&str] = &["22023", "42501"];
