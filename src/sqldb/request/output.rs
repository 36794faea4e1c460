//! A whole result as the response, in the location's format.

use std::cell::RefCell;

use gateway_core::formats::{self, StreamFormat};
use gateway_core::rds::{self, Body, Header, ResultSet};

use super::error::{Error, Kind};
use crate::ffi::*;
use crate::sqldb::config::Output;
use crate::sqldb::driver::{PgResult, ResultKind};

/// The row-by-row format of an output, if it has one.
pub fn stream_format(output: Output) -> Option<StreamFormat> {
    match output {
        Output::Rds => Some(StreamFormat::Rds),
        Output::Json => Some(StreamFormat::Json),
        Output::Csv => Some(StreamFormat::Csv),
        Output::Text => Some(StreamFormat::Text),
        _ => None,
    }
}

/// Answers with the result in the location's format; what to finalize
/// the request with.
pub fn send(r: &mut Req, res: &PgResult, output: Output, status: ngx_uint_t) -> Result<ngx_int_t, Error> {
    let rows = res.kind() == ResultKind::Tuples;
    let mut body = Vec::new();
    match output {
        Output::Rds => {
            let pool = r.pool();
            let copy = RDS_OUT.with_borrow_mut(|out| {
                rds_bytes(res, out)?;
                let copy = pool.str(out);
                // What a large result grew it to is not kept.
                if out.capacity() > RDS_OUT_KEEP {
                    *out = Vec::new();
                }
                Ok::<_, Error>(copy)
            })?;
            let Some(body) = copy else { return Ok(ERROR) };
            set_content_type(r, output.content_type());
            return Ok(r.send_pooled_body(status, body));
        }
        Output::Text if rows => formats::text(res, &mut body),
        Output::Json if rows => formats::json(res, &mut body),
        Output::Json => formats::json_affected(res.affected_rows(), &mut body),
        Output::Csv if rows => formats::csv(res, &mut body),
        Output::Text | Output::Csv => {}
        Output::Value | Output::BinaryValue => {
            let (nrows, ncols) = if rows { (res.rows(), res.columns()) } else { (0, 0) };
            if nrows != 1 || ncols != 1 {
                return Err(Error::from(Kind::ValueShape {
                    rows: nrows,
                    columns: ncols,
                }));
            }
            match res.value(0, 0) {
                Some([]) => return Err(Kind::ValueEmpty.into()),
                Some(v) => body.extend_from_slice(v),
                None => return Err(Kind::ValueNull.into()),
            }
        }
        Output::None => {
            r.set_status(status);
            r.set_content_length(0);
            r.set_header_only();
            return Ok(r.send_header());
        }
    }
    Ok(send_body(r, status, output.content_type(), body))
}

thread_local! {
    /// The worker's buffer a whole result is encoded in (the response
    /// takes a copy in the request's pool): no allocation per result.
    static RDS_OUT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The capacity RDS_OUT keeps between results.
const RDS_OUT_KEEP: usize = 64 * 1024;

/// The result in RDS, in `out` (emptied first).
fn rds_bytes(res: &PgResult, out: &mut Vec<u8>) -> Result<(), Error> {
    out.clear();
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
    rds::encode(&header, &body, out).map_err(|e| Error::because(Kind::Encode, e.to_string()))?;
    Ok(())
}

/// Sets the Content-Type: the output's own, or the location's `default_type`.
pub fn set_content_type(r: &mut Req, content_type: Option<&'static str>) {
    match content_type {
        Some(t) => r.set_content_type(t),
        // The location's default_type, whatever the URI's extension.
        None => r.set_default_type(),
    }
}

/// Sends status, headers and `body` (moved into the request's pool); what
/// to finalize the request with.
pub fn send_body(r: &mut Req, status: ngx_uint_t, content_type: Option<&'static str>, body: Vec<u8>) -> ngx_int_t {
    set_content_type(r, content_type);
    r.send_body(status, body)
}
