//! What a failed request answers and logs, for both gateways. Each
//! gateway's error (`sqldb::error::Error`, `cache::error::Error`: why
//! starting a request, its connection or its result failed) is an
//! `Error<Kind>` of its own kind, in tokio-postgres's form (a kind, an
//! optional boxed cause, a Display that is one log line), mapped to the
//! HTTP status and the error-log line in one place by implementing
//! `Failure`.

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

/// Why an error happened: the server's message, libpq's, Redis's error
/// reply.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// A gateway's kinds of failure.
pub trait Kind: fmt::Debug {
    /// The kind's own text for the log line, when it has one (some kinds
    /// are told by their cause alone).
    fn text(&self, f: &mut fmt::Formatter<'_>) -> Option<fmt::Result>;
}

/// A failed request: what failed (its gateway's kind) and why, when
/// something else said so.
#[derive(Debug)]
pub struct Error<K> {
    kind: K,
    cause: Option<Cause>,
}

impl<K: Kind> Error<K> {
    pub fn new(kind: K, cause: Option<Cause>) -> Error<K> {
        Error { kind, cause }
    }

    /// An error whose cause is a message.
    pub fn because(kind: K, why: impl Into<String>) -> Error<K> {
        Error::new(kind, Some(why.into().into()))
    }

    pub fn kind(&self) -> &K {
        &self.kind
    }

    pub fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.cause.as_deref()
    }
}

impl<K> From<K> for Error<K> {
    fn from(kind: K) -> Error<K> {
        Error { kind, cause: None }
    }
}

/// The kind's text, then the cause's (`kind: cause`), or either alone.
impl<K: Kind> fmt::Display for Error<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.kind.text(f), &self.cause) {
            (Some(r), None) => r,
            (Some(r), Some(cause)) => r.and_then(|()| write!(f, ": {cause}")),
            (None, Some(cause)) => write!(f, "{cause}"),
            (None, None) => Ok(()),
        }
    }
}

impl<K: Kind> std::error::Error for Error<K> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause.as_deref().map(|c| c as &(dyn std::error::Error + 'static))
    }
}
