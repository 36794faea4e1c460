//! What a failed request answers and logs, for both gateways: each stage's
//! error (starting the request, its connection, its result) is an enum of
//! its gateway's, mapped to the HTTP status and the error-log line in one
//! place by implementing `Failure`.

use std::fmt;

use crate::ffi::*;

/// A failure of a request: its status, and its log line (Display).
pub trait Failure: fmt::Display {
    fn status(&self) -> ngx_int_t;

    /// The level of its error-log line: client mistakes at `info`, as nginx
    /// logs them. None: no line of its own (nginx has said why, or the
    /// line is written elsewhere, once).
    fn level(&self) -> Option<u32> {
        Some(NGX_LOG_ERR)
    }
}

/// The error-log line of a failure, with its gateway's prefix.
pub fn log_failure(log: Log, gateway: &str, f: &dyn Failure) {
    if let Some(level) = f.level() {
        crate::log!(level, log, "{gateway}: {f}");
    }
}
