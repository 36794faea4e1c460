//! Why a cache request fails: one error for the gateway, its kind and its
//! cause (as tokio-postgres's `Error`). Its Display is the request's log
//! line, without the `cache: ` before it and the server's name after it,
//! which the request adds; `Failure` gives its status and log level.

use std::fmt;

use gateway_core::pubsub;
use gateway_core::redis::{self, ReplyError};

use crate::common::failure::{self, Failure};
use crate::ffi::*;

/// A failure of a cache request.
pub type Error = failure::Error<Kind>;

/// What failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    // Starting the request.
    NotAllowed,
    EmptyKey,
    EmptyStreamKey,
    /// A `cache_stream` key that is too long (longer than the second) or
    /// not UTF-8.
    BadStreamKey(String, usize),
    /// A `Last-Event-ID` (or `last_event_id`) that is not an entry ID, or
    /// is the highest one (Redis reads nothing after it).
    BadLastEventId(String),
    BadChannel(String),
    BadDb(String),
    BadExptime(String),
    ClusterDb(u32),
    NoBackend(String),
    /// An upstream another gateway owns (its value, and the owner's lines).
    ForeignUpstream(String, &'static str),
    /// See FILTER_REDIRECT.
    AnswerUnderWay,
    /// Redis refused the `cache_auth` password less than a second ago.
    AuthRefused,
    /// nginx could not do something (memory); it has said why.
    Nginx,
    // A shared connection.
    /// The connect did not start: nginx has logged why, on the request's log.
    ConnectLogged,
    /// The connect failed (the cause says why).
    Connect,
    /// Redis answered the command with an error reply (`WRONGTYPE` ...;
    /// the cause is core's `ReplyError`): the connection goes on.
    Answered,
    /// The connection broke while the request was on it (the cause says
    /// why).
    Broken(Broken),
}

/// How a connection broke, and where the request's exchange was then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Broken {
    pub how: How,
    /// Some of the request's bytes had gone out.
    pub sent: bool,
    /// The connection had served requests before this one.
    pub reused: bool,
    /// It never connected.
    pub connecting: bool,
}

impl Broken {
    /// A connection that broke before any of the request's commands went
    /// on it.
    pub fn before(how: How) -> Broken {
        Broken {
            how,
            sent: false,
            reused: false,
            connecting: false,
        }
    }
}

/// Why a connection broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// Closed, by the server or the worker.
    Closed,
    /// Replies that cannot be read.
    Invalid,
    /// It timed out connecting (or in the TLS handshake).
    TimedOut,
    /// Redis refused the password (`cache_auth`).
    PasswordRefused,
}

impl Error {
    /// Redis's error reply to the command.
    pub fn answered(e: ReplyError) -> Error {
        Error::new(Kind::Answered, Some(Box::new(e)))
    }

    /// Redis's error reply, when that is what the request got.
    pub fn reply(&self) -> Option<&ReplyError> {
        self.cause()?.downcast_ref()
    }
}

impl Kind {
    /// A value of the request that does not fit: 400, logged at `info`.
    fn client_mistake(&self) -> bool {
        matches!(
            self,
            Kind::EmptyKey
                | Kind::EmptyStreamKey
                | Kind::BadStreamKey(..)
                | Kind::BadLastEventId(_)
                | Kind::BadChannel(_)
                | Kind::BadDb(_)
                | Kind::BadExptime(_)
                | Kind::ClusterDb(_)
        )
    }
}

impl failure::Kind for Kind {
    fn text(&self, f: &mut fmt::Formatter<'_>) -> Option<fmt::Result> {
        Some(match self {
            Kind::NotAllowed => f.write_str("method not allowed"),
            Kind::Nginx => f.write_str("nginx could not set the request up"),
            Kind::AuthRefused => f.write_str("redis refused the password less than a second ago"),
            Kind::EmptyKey => f.write_str("the \"$cache_key\" variable is empty"),
            Kind::EmptyStreamKey => f.write_str("the stream's key is empty"),
            Kind::BadStreamKey(v, max) => write!(
                f,
                "stream key \"{}\" is not 1 to {max} bytes of UTF-8",
                v.escape_default()
            ),
            Kind::BadLastEventId(v) => write!(
                f,
                "the last event id \"{}\" (Last-Event-ID, or the argument last_event_id) is not a stream entry ID (ms-seq, below the highest one)",
                v.escape_default()
            ),
            Kind::BadChannel(v) => write!(
                f,
                "channel \"{}\" is not 1 to {} visible ASCII characters",
                v.escape_default(),
                pubsub::CHANNEL_MAX
            ),
            Kind::BadDb(v) => write!(
                f,
                "\"$cache_db\" is not a database number (0 to {}): \"{v}\"",
                redis::MAX_DB
            ),
            Kind::ClusterDb(n) => write!(f, "\"$cache_db\" is {n}, but a Redis Cluster has database 0 only"),
            Kind::BadExptime(v) => write!(f, "\"$cache_exptime\" is not a number of seconds: \"{v}\""),
            Kind::NoBackend(v) => write!(f, "\"cache_pass\" value \"{v}\" names no known backend"),
            Kind::AnswerUnderWay => f.write_str(crate::ffi::FILTER_REDIRECT),
            Kind::ForeignUpstream(v, lines) => {
                write!(f, "\"cache_pass\" value \"{v}\" names an upstream of \"{lines}\" lines")
            }
            Kind::ConnectLogged => f.write_str("the connect did not start"),
            Kind::Connect | Kind::Answered | Kind::Broken(_) => return None,
        })
    }
}

impl Failure for Error {
    fn status(&self) -> ngx_int_t {
        match *self.kind() {
            Kind::NotAllowed => HTTP_NOT_ALLOWED,
            _ if self.kind().client_mistake() => HTTP_BAD_REQUEST,
            Kind::AuthRefused | Kind::Connect | Kind::ConnectLogged | Kind::Answered | Kind::Broken(_) => {
                HTTP_BAD_GATEWAY
            }
            _ => HTTP_INTERNAL_SERVER_ERROR,
        }
    }

    fn level(&self) -> Option<u32> {
        match *self.kind() {
            // (nginx answers 405 itself; nginx said why it failed; the
            // refusal was logged, once a minute at most.)
            Kind::NotAllowed | Kind::Nginx | Kind::AuthRefused | Kind::ConnectLogged => None,
            _ if self.kind().client_mistake() => Some(NGX_LOG_INFO),
            _ => Some(NGX_LOG_ERR),
        }
    }
}
