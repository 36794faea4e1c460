//! Why a database request fails: one error for the gateway, its kind and
//! its cause (as tokio-postgres's `Error`): starting the request, its
//! connection, its result. Its Display is the request's log line (after
//! `sqldb: `); `Failure` maps it, in one place, to the HTTP status and the
//! line's level (client mistakes at `info`, as nginx logs them).

use std::fmt;

use gateway_core::pipeline::Lost;

use crate::common::failure::{self, Failure};
use crate::ffi::*;

/// A failure of a database request.
pub type Error = failure::Error<Kind>;

/// What failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    // Building the query and finding where it goes.
    NoQuery,
    MethodNotAllowed(String),
    BodyFile,
    ParamNul(usize),
    QueryNul,
    EmptyQuery,
    ParamsInSeveral,
    NoUpstream(String),
    /// `sqldb_jwt_key`: no usable token (the cause says why). `invalid`:
    /// one was given.
    Unauthorized {
        invalid: bool,
    },
    /// A query of several statements with a role or settings (its text
    /// came from variables).
    SeveralWithRole,
    /// A `sqldb_setting` value with a NUL byte.
    SettingNul(String),
    /// The token's role is `none`, which PostgreSQL takes for the login
    /// role itself: 403.
    RoleNone,
    Busy {
        upstream: String,
        max: usize,
    },
    /// An output filter's error page brought the request here while a
    /// first answer to it is still being sent (Req::answer_under_way).
    AnswerUnderWay,
    /// nginx could not do something (memory); it has said why.
    Nginx,

    // The connection.
    /// Lost (the cause: what libpq or the server said).
    Lost(Lost),
    ConnectTimeout(ngx_msec_t),
    ResultTimeout(ngx_msec_t),
    /// No server to try (the balancer says so).
    NoLiveUpstreams,
    /// `overflow=reject` and no connection to spare.
    NoConnection(String),
    /// A connection could not be opened: libpq could not start (the next
    /// server may do better); the cause says why.
    Connect,
    /// nginx has no connection or event to spare for a new connection
    /// (the cause says why).
    NoResources,

    // The result of the query.
    /// PostgreSQL's error (the cause: its message and SQLSTATE).
    Query,
    /// A typed parameter's value the server refused for its type.
    BadParameter,
    NoResult,
    NoStatement,
    /// The connection refused the query (it started a COPY; the cause
    /// says so).
    Refused,
    /// The request's role may not run the query (insufficient privilege,
    /// a row-level security check): 403.
    Forbidden,
    /// The request's role cannot be set (it does not exist, or the login
    /// role may not switch to it; the cause is the server's message): 403.
    RoleDenied(String),
    ValueShape {
        rows: usize,
        columns: usize,
    },
    ValueNull,
    ValueEmpty,
    /// The result cannot be written in the location's format.
    Encode,
    RequiredSet {
        name: String,
        row: usize,
        what: &'static str,
    },
}

impl Error {
    /// The request's role cannot be set: the server's message, with its
    /// control characters escaped (it quotes the role).
    pub fn role_denied(role: String, why: &str) -> Error {
        let why: String = why
            .chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect();
        Error::because(Kind::RoleDenied(role), why)
    }
}

impl failure::Kind for Kind {
    fn text(&self, f: &mut fmt::Formatter<'_>) -> Option<fmt::Result> {
        Some(match self {
            Kind::NoQuery => f.write_str("no \"sqldb_query\" is configured for this location"),
            Kind::MethodNotAllowed(m) => write!(f, "no query for method \"{m}\""),
            Kind::BodyFile => f.write_str("cannot read the request body back from its temporary file"),
            Kind::ParamNul(n) => write!(f, "parameter ${n} contains a NUL byte"),
            Kind::QueryNul => f.write_str("the query contains a NUL byte"),
            Kind::EmptyQuery => f.write_str("the query is empty after variable substitution"),
            Kind::ParamsInSeveral => f.write_str("typed parameters need a query of one statement"),
            Kind::NoUpstream(name) => write!(
                f,
                "\"sqldb_pass\" value \"{name}\" names no upstream with \"sqldb_server\""
            ),
            Kind::Busy { upstream, max } => write!(f, "all {max} connections to upstream \"{upstream}\" are busy"),
            Kind::Nginx => f.write_str("nginx could not set the request up"),
            Kind::AnswerUnderWay => f.write_str(crate::ffi::FILTER_REDIRECT),
            Kind::Unauthorized { .. } => f.write_str("401"),
            Kind::SeveralWithRole => f.write_str(
                "the query holds several statements, which cannot run with \"sqldb_jwt_key\" or \"sqldb_setting\"",
            ),
            Kind::SettingNul(name) => write!(f, "the value of \"sqldb_setting {name}\" contains a NUL byte"),
            Kind::RoleNone => {
                f.write_str("the request's role \"none\" cannot be used: PostgreSQL takes it for the login role itself")
            }
            Kind::ConnectTimeout(ms) => write!(f, "timed out ({ms} ms) connecting"),
            Kind::ResultTimeout(ms) => write!(f, "timed out ({ms} ms) waiting for the result"),
            Kind::NoLiveUpstreams => f.write_str("no live upstreams"),
            Kind::NoConnection(name) => write!(f, "no connection to spare for {name}"),
            Kind::Query => f.write_str("query failed"),
            Kind::BadParameter => f.write_str("a parameter was rejected"),
            Kind::NoResult => f.write_str("the server returned no result"),
            Kind::NoStatement => f.write_str("the query holds no statement"),
            Kind::Forbidden => f.write_str("the request's role may not run the query"),
            // (The server's message, the cause, quotes the role: no control
            // character of it reaches the log as it is.)
            Kind::RoleDenied(role) => write!(f, "the request's role \"{}\" cannot be used", role.escape_default()),
            Kind::ValueShape { rows, columns } => write!(
                f,
                "\"sqldb_output value\" needs one value, the query returned {rows} rows of {columns} columns"
            ),
            Kind::ValueNull => f.write_str("\"sqldb_output value\" got NULL"),
            Kind::ValueEmpty => f.write_str("\"sqldb_output value\" got an empty value"),
            Kind::Encode => f.write_str("cannot encode the result"),
            Kind::RequiredSet { name, row, what } => write!(
                f,
                "\"sqldb_set {name}\" is required, the result has {what} at row {row}"
            ),
            Kind::Lost(_) | Kind::Connect | Kind::NoResources | Kind::Refused => return None,
        })
    }
}

impl Failure for Error {
    fn status(&self) -> ngx_int_t {
        match *self.kind() {
            Kind::MethodNotAllowed(_) => HTTP_NOT_ALLOWED,
            Kind::ParamNul(_) | Kind::QueryNul | Kind::SettingNul(_) | Kind::BadParameter => HTTP_BAD_REQUEST,
            Kind::Unauthorized { .. } => HTTP_UNAUTHORIZED,
            Kind::RoleNone | Kind::RoleDenied(_) | Kind::Forbidden => HTTP_FORBIDDEN,
            Kind::Busy { .. } | Kind::NoConnection(_) => HTTP_SERVICE_UNAVAILABLE,
            Kind::ConnectTimeout(_) | Kind::ResultTimeout(_) => HTTP_GATEWAY_TIME_OUT,
            Kind::Lost(_) | Kind::NoLiveUpstreams | Kind::Connect | Kind::NoResult => HTTP_BAD_GATEWAY,
            _ => HTTP_INTERNAL_SERVER_ERROR,
        }
    }

    fn level(&self) -> Option<u32> {
        Some(match *self.kind() {
            Kind::MethodNotAllowed(_)
            | Kind::ParamNul(_)
            | Kind::SettingNul(_)
            | Kind::Unauthorized { .. }
            | Kind::BadParameter => NGX_LOG_INFO,
            // Tried again elsewhere: not a failure of the request yet.
            Kind::Lost(Lost::NotSent) => NGX_LOG_INFO,
            _ => NGX_LOG_ERR,
        })
    }
}
