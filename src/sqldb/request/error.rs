//! Why a database request fails: one enum per stage (starting it, its
//! connection, its result), each mapped here, in one place, to the HTTP
//! status and the error-log line (client mistakes at `info`, as nginx logs
//! them).

use std::fmt;

use gateway_core::pipeline::Lost;

pub use crate::common::failure::Failure;
use crate::ffi::*;

/// Building the query and finding where it goes.
#[derive(Debug)]
pub enum StartError {
    NoQuery,
    MethodNotAllowed(String),
    BodyFile,
    ParamNul(usize),
    QueryNul,
    EmptyQuery,
    ParamsInSeveral,
    NoUpstream(String),
    /// `sqldb_jwt_key`: no usable token. `invalid`: one was given.
    Unauthorized {
        why: String,
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
}

/// The connection of a request.
#[derive(Debug)]
pub enum ConnError {
    /// Lost, with what libpq or the server said.
    Lost(Lost, String),
    ConnectTimeout(ngx_msec_t),
    ResultTimeout(ngx_msec_t),
    /// No server to try (the balancer says so).
    NoLiveUpstreams,
    /// `overflow=reject` and no connection to spare.
    NoConnection(String),
}

/// The result of a request's query.
#[derive(Debug)]
pub enum ResultError {
    /// PostgreSQL's error (message and SQLSTATE).
    Query(String),
    /// A typed parameter's value the server refused for its type.
    BadParameter(String),
    NoResult,
    NoStatement,
    /// The query started a COPY.
    Refused(String),
    /// The request's role may not run the query (insufficient privilege,
    /// a row-level security check): 403.
    Forbidden(String),
    /// The request's role cannot be set (it does not exist, or the login
    /// role may not switch to it): 403.
    RoleDenied {
        role: String,
        why: String,
    },
    ValueShape {
        rows: usize,
        columns: usize,
    },
    ValueNull,
    ValueEmpty,
    Encode(String),
    RequiredSet {
        name: String,
        row: usize,
        what: &'static str,
    },
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::NoQuery => f.write_str("no \"sqldb_query\" is configured for this location"),
            StartError::MethodNotAllowed(m) => write!(f, "no query for method \"{m}\""),
            StartError::BodyFile => f.write_str("cannot read the request body back from its temporary file"),
            StartError::ParamNul(n) => write!(f, "parameter ${n} contains a NUL byte"),
            StartError::QueryNul => f.write_str("the query contains a NUL byte"),
            StartError::EmptyQuery => f.write_str("the query is empty after variable substitution"),
            StartError::ParamsInSeveral => f.write_str("typed parameters need a query of one statement"),
            StartError::NoUpstream(name) => {
                write!(
                    f,
                    "\"sqldb_pass\" value \"{name}\" names no upstream with \"sqldb_server\""
                )
            }
            StartError::Busy { upstream, max } => {
                write!(f, "all {max} connections to upstream \"{upstream}\" are busy")
            }
            StartError::Nginx => f.write_str("nginx could not set the request up"),
            StartError::AnswerUnderWay => f.write_str(crate::ffi::FILTER_REDIRECT),
            StartError::Unauthorized { why, .. } => write!(f, "401: {why}"),
            StartError::SeveralWithRole => f.write_str(
                "the query holds several statements, which cannot run with \"sqldb_jwt_key\" or \"sqldb_setting\"",
            ),
            StartError::SettingNul(name) => write!(f, "the value of \"sqldb_setting {name}\" contains a NUL byte"),
            StartError::RoleNone => {
                f.write_str("the request's role \"none\" cannot be used: PostgreSQL takes it for the login role itself")
            }
        }
    }
}

impl Failure for StartError {
    fn status(&self) -> ngx_int_t {
        match self {
            StartError::MethodNotAllowed(_) => HTTP_NOT_ALLOWED,
            StartError::ParamNul(_) | StartError::QueryNul | StartError::SettingNul(_) => HTTP_BAD_REQUEST,
            StartError::Unauthorized { .. } => HTTP_UNAUTHORIZED,
            StartError::RoleNone => HTTP_FORBIDDEN,
            StartError::Busy { .. } => HTTP_SERVICE_UNAVAILABLE,
            _ => HTTP_INTERNAL_SERVER_ERROR,
        }
    }

    fn level(&self) -> Option<u32> {
        Some(match self {
            StartError::MethodNotAllowed(_)
            | StartError::ParamNul(_)
            | StartError::SettingNul(_)
            | StartError::Unauthorized { .. } => NGX_LOG_INFO,
            _ => NGX_LOG_ERR,
        })
    }
}

impl fmt::Display for ConnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnError::Lost(_, why) => f.write_str(why),
            ConnError::ConnectTimeout(ms) => write!(f, "timed out ({ms} ms) connecting"),
            ConnError::ResultTimeout(ms) => write!(f, "timed out ({ms} ms) waiting for the result"),
            ConnError::NoLiveUpstreams => f.write_str("no live upstreams"),
            ConnError::NoConnection(name) => write!(f, "no connection to spare for {name}"),
        }
    }
}

impl Failure for ConnError {
    fn status(&self) -> ngx_int_t {
        match self {
            ConnError::ConnectTimeout(_) | ConnError::ResultTimeout(_) => HTTP_GATEWAY_TIME_OUT,
            ConnError::NoConnection(_) => HTTP_SERVICE_UNAVAILABLE,
            _ => HTTP_BAD_GATEWAY,
        }
    }

    fn level(&self) -> Option<u32> {
        Some(match self {
            // Tried again elsewhere: not a failure of the request yet.
            ConnError::Lost(Lost::NotSent, _) => NGX_LOG_INFO,
            _ => NGX_LOG_ERR,
        })
    }
}

impl fmt::Display for ResultError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResultError::Query(s) => write!(f, "query failed: {s}"),
            ResultError::BadParameter(s) => write!(f, "a parameter was rejected: {s}"),
            ResultError::NoResult => f.write_str("the server returned no result"),
            ResultError::NoStatement => f.write_str("the query holds no statement"),
            ResultError::Refused(s) => f.write_str(s),
            ResultError::Forbidden(s) => write!(f, "the request's role may not run the query: {s}"),
            ResultError::RoleDenied { role, why } => {
                // (The server's message quotes the role: no control
                // character of it reaches the log as it is.)
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
                write!(
                    f,
                    "the request's role \"{}\" cannot be used: {why}",
                    role.escape_default()
                )
            }
            ResultError::ValueShape { rows, columns } => write!(
                f,
                "\"sqldb_output value\" needs one value, the query returned {rows} rows of {columns} columns"
            ),
            ResultError::ValueNull => f.write_str("\"sqldb_output value\" got NULL"),
            ResultError::ValueEmpty => f.write_str("\"sqldb_output value\" got an empty value"),
            ResultError::Encode(e) => write!(f, "cannot encode the result: {e}"),
            ResultError::RequiredSet { name, row, what } => {
                write!(
                    f,
                    "\"sqldb_set {name}\" is required, the result has {what} at row {row}"
                )
            }
        }
    }
}

impl Failure for ResultError {
    fn status(&self) -> ngx_int_t {
        match self {
            ResultError::BadParameter(_) => HTTP_BAD_REQUEST,
            ResultError::NoResult => HTTP_BAD_GATEWAY,
            ResultError::RoleDenied { .. } | ResultError::Forbidden(_) => HTTP_FORBIDDEN,
            _ => HTTP_INTERNAL_SERVER_ERROR,
        }
    }

    fn level(&self) -> Option<u32> {
        Some(match self {
            ResultError::BadParameter(_) => NGX_LOG_INFO,
            _ => NGX_LOG_ERR,
        })
    }
}

/// The error-log line of a failure of a database request.
pub fn log_failure(log: Log, f: &dyn Failure) {
    crate::common::failure::log_failure(log, "sqldb", f);
}

/// SQLSTATEs of a value from the request that does not fit: invalid text
/// representation, numeric out of range, datetime format and overflow,
/// characters not valid in the encoding, string too long, bad escape, and
/// values past a limit of the server (program limit exceeded, statement
/// too complex).
pub const BAD_PARAMETER: &[&str] = &[
    "22P02", "22003", "22007", "22008", "22021", "22P05", "22001", "22025", "54000", "54001",
];

/// SQLSTATEs of `set_config('role', ...)` for a role that cannot be used:
/// invalid parameter value (no such role) and insufficient privilege.
pub const ROLE_DENIED: &[&str] = &["22023", "42501"];
