//! `sqldb_stream on`: rows go to the client as they arrive (libpq's
//! single-row mode), in batches through a few reused buffers. When the
//! client reads slower than the database answers, reading from the database
//! pauses, so the worker's memory stays flat whatever the result's size.

use std::ptr;

use gateway_core::formats::{Stream, StreamFormat};

use super::output::Output;
use super::pq::PgResult;
use crate::ffi::*;
use crate::ngx_http_gateway_module as MODULE;

/// Bytes gathered before they go out.
const BATCH: usize = 16 * 1024;
/// Buffers the client may have pending before reading from the database pauses.
const MAX_PENDING: usize = 4;

/// The response cannot be completed (the client is gone, a buffer could
/// not be had, a value does not fit the format).
#[derive(Debug)]
pub struct CutShort;

pub struct Streaming {
    enc: Stream,
    output: Output,
    /// The response header is out.
    pub started: bool,
    /// HEAD, or the client went away: rows are read and dropped.
    pub discard: bool,
    out: Vec<u8>,
    /// Rows in the buffers handed to nginx so far.
    sent: u64,
    free: *mut ngx_chain_t,
    busy: *mut ngx_chain_t,
}

impl Streaming {
    pub fn new(format: StreamFormat, output: Output) -> Streaming {
        Streaming {
            enc: Stream::new(format),
            output,
            started: false,
            discard: false,
            out: Vec::new(),
            sent: 0,
            free: ptr::null_mut(),
            busy: ptr::null_mut(),
        }
    }

    pub fn rows(&self) -> u64 {
        self.enc.rows()
    }

    /// Rows whose bytes have been handed to the client connection.
    pub fn rows_sent(&self) -> u64 {
        self.sent
    }

    /// The client has more than MAX_PENDING buffers to read.
    pub fn backed_up(&self) -> bool {
        let mut n = 0;
        let mut cl = self.busy;
        while !cl.is_null() {
            n += 1;
            // SAFETY: busy is a chain this stream built.
            cl = unsafe { (*cl).next };
        }
        n > MAX_PENDING
    }

    /// One row (a single-row result): the header first if need be. Ok(true)
    /// when reading should pause for the client.
    ///
    /// # Safety
    /// `r` must be a live request.
    pub unsafe fn row(&mut self, r: *mut ngx_http_request_t, res: &PgResult) -> Result<bool, CutShort> {
        if self.discard {
            return Ok(false);
        }
        if !self.started {
            // SAFETY: r is live.
            unsafe { self.start(r, res)? };
            if self.discard {
                return Ok(false);
            }
        }
        self.enc.rows_of(res, &mut self.out).map_err(|_| CutShort)?;
        if self.out.len() < BATCH {
            return Ok(false);
        }
        // SAFETY: r is live.
        unsafe { self.flush(r, false) }
    }

    /// Status, headers, and the format's opening bytes (the RDS header and columns).
    unsafe fn start(&mut self, r: *mut ngx_http_request_t, res: &PgResult) -> Result<(), CutShort> {
        self.started = true;
        // SAFETY: r is live; its upstream exists while the query runs.
        unsafe {
            let ho = &mut (*r).headers_out;
            ho.status = HTTP_OK as ngx_uint_t;
            ho.content_length_n = -1;
            match self.output.content_type() {
                Some(t) => {
                    ho.content_type = static_str(t);
                    ho.content_type_len = t.len();
                    ho.content_type_lowcase = ptr::null_mut();
                }
                None => super::output::set_default_type(r),
            }
            let u = (*r).upstream;
            if !u.is_null() {
                (*u).set_header_sent(1);
            }
            let rc = ngx_http_send_header(r);
            if rc == ERROR || rc > OK {
                return Err(CutShort);
            }
            if (*r).header_only() != 0 {
                self.discard = true;
                return Ok(());
            }
        }
        self.enc.begin(res, &mut self.out).map_err(|_| CutShort)
    }

    /// Sends what is gathered (and, at the end, the last buffer). Ok(true)
    /// when the client is behind.
    ///
    /// # Safety
    /// `r` must be a live request whose header was sent.
    pub unsafe fn flush(&mut self, r: *mut ngx_http_request_t, last: bool) -> Result<bool, CutShort> {
        // SAFETY: r is live; buffers come from its pool and are reused once sent.
        unsafe {
            let pool = (*r).pool;
            let tag = ptr::addr_of_mut!(MODULE) as ngx_buf_tag_t;
            let mut out: *mut ngx_chain_t = ptr::null_mut();
            if !self.out.is_empty() || last {
                let cl = ngx_chain_get_free_buf(pool, &mut self.free);
                if cl.is_null() {
                    return Err(CutShort);
                }
                let b = (*cl).buf;
                let need = self.out.len();
                let have = if (*b).start.is_null() {
                    0
                } else {
                    (*b).end.offset_from((*b).start) as usize
                };
                if have < need.max(1) {
                    let size = need.max(BATCH);
                    let data = ngx_palloc(pool, size) as *mut u8;
                    if data.is_null() {
                        return Err(CutShort);
                    }
                    (*b).start = data;
                    (*b).end = data.add(size);
                }
                ptr::copy_nonoverlapping(self.out.as_ptr(), (*b).start, need);
                (*b).pos = (*b).start;
                (*b).last = (*b).start.add(need);
                (*b).set_temporary(1);
                (*b).set_flush(1);
                (*b).tag = tag;
                if last {
                    (*b).set_last_buf((r == (*r).main) as u32);
                    (*b).set_last_in_chain(1);
                }
                (*cl).next = ptr::null_mut();
                out = cl;
                self.out.clear();
            }
            let rc = ngx_http_output_filter(r, out);
            ngx_chain_update_chains(pool, &mut self.free, &mut self.busy, &mut out, tag);
            if rc == ERROR {
                return Err(CutShort);
            }
            self.sent = self.enc.rows();
            Ok(self.backed_up())
        }
    }

    /// The last bytes and the last buffer; what to finalize the request with.
    ///
    /// # Safety
    /// `r` must be a live request whose header was sent.
    pub unsafe fn finish(&mut self, r: *mut ngx_http_request_t) -> ngx_int_t {
        if self.discard {
            return OK;
        }
        self.enc.end(&mut self.out);
        // SAFETY: see above.
        match unsafe { self.flush(r, true) } {
            Ok(_) => OK,
            Err(CutShort) => ERROR,
        }
    }
}
