//! Turning a result into the HTTP response.

use std::ptr;

use gateway_core::formats;
use gateway_core::rds::{self, Body, Header, ResultSet};

use super::pq::{PgResult, ResultKind};
use crate::ffi::*;

pub const RDS_CONTENT_TYPE: &str = "application/x-gateway-dbd-stream";

/// `sqldb_output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Rds,
    Text,
    Value,
    BinaryValue,
    Json,
    Csv,
    None,
}

impl Output {
    pub const ALL: [(&'static str, Output); 7] = [
        ("rds", Output::Rds),
        ("text", Output::Text),
        ("value", Output::Value),
        ("binary_value", Output::BinaryValue),
        ("json", Output::Json),
        ("csv", Output::Csv),
        ("none", Output::None),
    ];

    pub fn from_code(code: ngx_uint_t) -> Output {
        Output::ALL.get(code).map_or(Output::Rds, |&(_, o)| o)
    }

    /// The row-by-row format of this output, if it has one.
    pub fn stream_format(self) -> Option<formats::StreamFormat> {
        match self {
            Output::Rds => Some(formats::StreamFormat::Rds),
            Output::Json => Some(formats::StreamFormat::Json),
            Output::Csv => Some(formats::StreamFormat::Csv),
            Output::Text => Some(formats::StreamFormat::Text),
            _ => None,
        }
    }

    /// The Content-Type of the output (None: the location's default_type).
    pub fn content_type(self) -> Option<&'static str> {
        match self {
            Output::Rds => Some(RDS_CONTENT_TYPE),
            Output::Text => Some("text/plain"),
            Output::Json => Some("application/json"),
            Output::Csv => Some("text/csv"),
            _ => None,
        }
    }

    /// Results in PostgreSQL's binary format.
    pub fn binary(self) -> bool {
        self == Output::BinaryValue
    }
}

/// Answers with the result in the location's format; returns what to
/// finalize the request with.
///
/// # Safety
/// `r` must be a live request whose upstream is finished.
pub unsafe fn send(r: *mut ngx_http_request_t, res: &PgResult, output: Output, status: ngx_uint_t) -> ngx_int_t {
    let rows = res.kind() == ResultKind::Tuples;
    let mut body = Vec::new();
    // SAFETY: r is live.
    let log = unsafe { client_log(r) };
    let content_type = match output {
        // SAFETY: r is live.
        Output::Rds => return unsafe { send_rds(r, res, status) },
        Output::Text => {
            if rows {
                formats::text(res, &mut body);
            }
            Some("text/plain")
        }
        Output::Json => {
            if rows {
                formats::json(res, &mut body);
            } else {
                formats::json_affected(res.affected_rows(), &mut body);
            }
            Some("application/json")
        }
        Output::Csv => {
            if rows {
                formats::csv(res, &mut body);
            }
            Some("text/csv")
        }
        Output::Value | Output::BinaryValue => {
            let (nrows, ncols) = if rows { (res.rows(), res.columns()) } else { (0, 0) };
            if nrows != 1 || ncols != 1 {
                log!(
                    NGX_LOG_ERR,
                    log,
                    "sqldb: \"sqldb_output value\" needs one value, the query returned {nrows} rows of {ncols} columns"
                );
                return HTTP_INTERNAL_SERVER_ERROR;
            }
            match res.value(0, 0) {
                Some(v) if !v.is_empty() => body.extend_from_slice(v),
                Some(_) => {
                    log!(NGX_LOG_ERR, log, "sqldb: \"sqldb_output value\" got an empty value");
                    return HTTP_INTERNAL_SERVER_ERROR;
                }
                None => {
                    log!(NGX_LOG_ERR, log, "sqldb: \"sqldb_output value\" got NULL");
                    return HTTP_INTERNAL_SERVER_ERROR;
                }
            }
            None
        }
        Output::None => {
            // SAFETY: r is live.
            unsafe {
                (*r).headers_out.status = status;
                (*r).headers_out.content_length_n = 0;
                (*r).set_header_only(1);
                return ngx_http_send_header(r);
            }
        }
    };
    // SAFETY: r is live.
    unsafe { send_body(r, status, content_type, body) }
}

/// Encodes the result as RDS and sends status, headers and body.
/// Returns what to finalize the request with.
///
/// # Safety
/// `r` must be a live request whose upstream is finished.
pub unsafe fn send_rds(r: *mut ngx_http_request_t, res: &PgResult, status: ngx_uint_t) -> ngx_int_t {
    let header = Header {
        driver_errcode: res.status_code(),
        affected_rows: res.affected_rows(),
        insert_id: res.insert_oid(),
        ..Header::default()
    };
    let body = if res.kind() == ResultKind::Tuples {
        Body::Rows(res)
    } else {
        Body::NoRows
    };
    let mut out = Vec::new();
    if let Err(e) = rds::encode(&header, &body, &mut out) {
        // SAFETY: r is live.
        let log = unsafe { client_log(r) };
        log!(NGX_LOG_ERR, log, "sqldb: cannot encode the result: {e}");
        return HTTP_INTERNAL_SERVER_ERROR;
    }
    // SAFETY: r is live.
    unsafe { send_body(r, status, Some(RDS_CONTENT_TYPE), out) }
}

/// Content-Type: the location's `default_type`.
///
/// # Safety
/// `r` must be a live request.
pub unsafe fn set_default_type(r: *mut ngx_http_request_t) {
    // SAFETY: r is live; the core module's location configuration outlives it.
    unsafe {
        let clcf = &*request_loc_conf::<ngx_http_core_loc_conf_t>(r, ptr::addr_of!(ngx_http_core_module));
        let ho = &mut (*r).headers_out;
        ho.content_type = clcf.default_type;
        ho.content_type_len = clcf.default_type.len;
        ho.content_type_lowcase = ptr::null_mut();
    }
}

/// Sends a response whose body is `body`, handed to the request pool;
/// without a content type, the location's `default_type`.
///
/// # Safety
/// `r` must be a live request.
pub unsafe fn send_body(
    r: *mut ngx_http_request_t,
    status: ngx_uint_t,
    content_type: Option<&'static str>,
    body: Vec<u8>,
) -> ngx_int_t {
    // SAFETY: r is live; the body Vec is owned by the request pool until the
    // pool is destroyed, after the response has gone out.
    unsafe {
        let len = body.len();
        match content_type {
            Some(t) => {
                let ho = &mut (*r).headers_out;
                ho.content_type = static_str(t);
                ho.content_type_len = t.len();
                ho.content_type_lowcase = ptr::null_mut();
            }
            // The location's default_type, whatever the URI's extension.
            None => set_default_type(r),
        }
        let ho = &mut (*r).headers_out;
        ho.status = status;
        ho.content_length_n = len as off_t;

        let rc = ngx_http_send_header(r);
        if rc == ERROR || rc > OK || (*r).header_only() != 0 {
            return rc;
        }
        if len == 0 {
            // The header waits in nginx's buffer until the last buffer
            // goes out: an empty body still ends the response.
            return ngx_http_send_special(r, NGX_HTTP_LAST as ngx_uint_t);
        }
        let Some(owned) = pool_alloc((*r).pool, body) else {
            return ERROR;
        };
        let data = (*owned.as_ptr()).as_ptr() as *mut u8;
        let b = ngx_pcalloc((*r).pool, std::mem::size_of::<ngx_buf_t>()) as *mut ngx_buf_t;
        let cl = ngx_alloc_chain_link((*r).pool);
        if b.is_null() || cl.is_null() {
            return ERROR;
        }
        (*b).start = data;
        (*b).pos = data;
        (*b).last = data.add(len);
        (*b).end = data.add(len);
        (*b).set_memory(1);
        if r == (*r).main {
            (*b).set_last_buf(1);
        }
        (*b).set_last_in_chain(1);
        (*cl).buf = b;
        (*cl).next = ptr::null_mut();
        ngx_http_output_filter(r, cl)
    }
}
