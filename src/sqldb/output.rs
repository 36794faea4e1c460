//! Turning a result into the HTTP response.

use std::ptr;

use gateway_core::rds::{self, Body, Header};

use super::pq::{PgResult, ResultKind};
use crate::ffi::*;

pub const RDS_CONTENT_TYPE: &str = "application/x-gateway-dbd-stream";

/// Encodes the result as RDS and sends status, headers and body.
/// Returns what to finalize the request with.
///
/// # Safety
/// `r` must be a live request whose upstream is finished.
pub unsafe fn send_rds(r: *mut ngx_http_request_t, res: &PgResult) -> ngx_int_t {
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
        let log = unsafe { (*(*r).connection).log };
        log!(NGX_LOG_ERR, log, "sqldb: cannot encode the result: {e}");
        return HTTP_INTERNAL_SERVER_ERROR;
    }
    // SAFETY: r is live.
    unsafe { send_body(r, RDS_CONTENT_TYPE, out) }
}

/// Sends a 200 response whose body is `body`, handed to the request pool.
///
/// # Safety
/// `r` must be a live request.
pub unsafe fn send_body(r: *mut ngx_http_request_t, content_type: &'static str, body: Vec<u8>) -> ngx_int_t {
    // SAFETY: r is live; the body Vec is owned by the request pool until the
    // pool is destroyed, after the response has gone out.
    unsafe {
        let len = body.len();
        let ho = &mut (*r).headers_out;
        ho.status = HTTP_OK as ngx_uint_t;
        ho.content_type = static_str(content_type);
        ho.content_type_len = content_type.len();
        ho.content_type_lowcase = ptr::null_mut();
        ho.content_length_n = len as off_t;

        let rc = ngx_http_send_header(r);
        if rc == ERROR || rc > OK || (*r).header_only() != 0 || len == 0 {
            return rc;
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
