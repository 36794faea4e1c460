//! `sqldb_stream on`: rows go to the client as they arrive (libpq's
//! single-row mode), in batches through a few reused buffers. When the
//! client reads slower than the database answers, reading from the database
//! pauses, so the worker's memory stays flat whatever the result's size.

use gateway_core::formats::{Stream, StreamFormat};

use super::peer::{fail, finish_upstream, timer_of};
use super::{ctx_of, vars, with_pool, SINK};
use crate::ffi::buf::Reuse;
use crate::ffi::*;
use crate::log;
use crate::sqldb::config::{LocConf, Output, Sqldb, Var};
use crate::sqldb::driver::{PgResult, RowVerdict, Sink};

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
    /// Rows are gathered: the status and headers are set, and the
    /// format's opening bytes written.
    begun: bool,
    /// The response header went to nginx (with the first batch of rows,
    /// or at the end): the status cannot change any more. Until then an
    /// error still gets its own status (and the location's error_page).
    started: bool,
    /// HEAD, or the client went away: rows are read and dropped.
    discard: bool,
    out: Vec<u8>,
    /// Rows in the buffers handed to nginx so far.
    /// Rows that have gone out to the client.
    pub sent: u64,
    bufs: Reuse,
}

impl Streaming {
    pub fn new(format: StreamFormat, output: Output) -> Streaming {
        Streaming {
            enc: Stream::new(format),
            output,
            begun: false,
            started: false,
            discard: false,
            out: Vec::new(),
            sent: 0,
            bufs: Reuse::new(<Sqldb as ngx::http::HttpModule>::module()),
        }
    }

    pub fn begun(&self) -> bool {
        self.begun
    }

    pub fn started(&self) -> bool {
        self.started
    }

    /// One row (a single-row result), the opening bytes first if need be.
    /// Ok(true) when reading should pause for the client.
    fn row(&mut self, r: &mut Req, res: &PgResult) -> Result<bool, CutShort> {
        if self.discard {
            return Ok(false);
        }
        if !self.begun {
            self.begin(r, res)?;
        }
        self.enc.rows_of(res, &mut self.out).map_err(|_| CutShort)?;
        if self.out.len() < BATCH {
            return Ok(false);
        }
        self.flush(r, false)
    }

    /// Status, headers, and the format's opening bytes (the RDS header and
    /// columns); the header goes out with the first batch.
    fn begin(&mut self, r: &mut Req, res: &PgResult) -> Result<(), CutShort> {
        self.begun = true;
        r.set_status(HTTP_OK as ngx_uint_t);
        r.set_content_length(-1);
        super::output::set_content_type(r, self.output.content_type());
        self.enc.begin(res, &mut self.out).map_err(|_| CutShort)
    }

    /// The header, before the first batch.
    fn send_header(&mut self, r: &mut Req) -> Result<(), CutShort> {
        self.started = true;
        if let Some(u) = r.upstream() {
            u.set_header_sent();
        }
        let rc = r.send_header();
        if rc == ERROR || rc > OK {
            return Err(CutShort);
        }
        if r.header_only() {
            self.discard = true;
            self.out.clear();
        }
        Ok(())
    }

    /// Sends what is gathered (and, at the end, the last buffer). Ok(true)
    /// when the client is behind.
    fn flush(&mut self, r: &mut Req, last: bool) -> Result<bool, CutShort> {
        if !self.started {
            self.send_header(r)?;
            if self.discard {
                return Ok(false);
            }
        }
        let pool = r.pool();
        let mut out = None;
        if !self.out.is_empty() || last {
            let main = last.then(|| r.is_main());
            out = Some(self.bufs.fill(&pool, &self.out, main, BATCH).ok_or(CutShort)?);
            self.out.clear();
        }
        // SAFETY: null, or the chain fill built in the request's pool.
        let rc = unsafe { r.output_filter(out.as_ref().map_or(std::ptr::null_mut(), |o| o.as_ptr())) };
        self.bufs.update(&pool, out);
        if rc == ERROR {
            return Err(CutShort);
        }
        self.sent = self.enc.rows();
        Ok(self.bufs.busy() > MAX_PENDING)
    }

    /// The last bytes and the last buffer; what to finalize the request with.
    fn finish(&mut self, r: &mut Req) -> ngx_int_t {
        if self.discard {
            return OK;
        }
        self.enc.end(&mut self.out);
        match self.flush(r, true) {
            Ok(_) => OK,
            Err(CutShort) => ERROR,
        }
    }

    /// Rows that were gathered and had not gone out: dropped, for the
    /// error's own status.
    pub fn drop_gathered(&mut self) {
        self.out.clear();
        self.begun = false;
    }
}

/// A row of the request's query (the driver is reading): streamed, and
/// whether the driver should pause for the client.
pub fn row(r: &mut Req, res: &PgResult) -> RowVerdict {
    let lcf: &LocConf = r.loc_conf::<Sqldb>();
    let Some(ctx) = ctx_of(r) else {
        return RowVerdict::Continue;
    };
    let format = ctx.stream_format.unwrap_or(StreamFormat::Rds);
    // Taken out while the row goes to the client, and put back.
    let mut s = ctx
        .streaming
        .take()
        .unwrap_or_else(|| Streaming::new(format, lcf.output()));
    let sent = s.row(r, res);
    if sent.is_err() {
        s.discard = true;
    }
    let Some(ctx) = ctx_of(r) else {
        return RowVerdict::Continue;
    };
    ctx.streaming = Some(s);
    match sent {
        Ok(false) => RowVerdict::Continue,
        Ok(true) => {
            pause(r);
            RowVerdict::Pause
        }
        Err(CutShort) => {
            ctx.stream_failed = true;
            RowVerdict::Continue
        }
    }
}

/// The client is behind: its pace now, not the database's (the request's
/// timer stops; nginx's send_timeout runs on the client's write event).
fn pause(r: &mut Req) {
    let saved = r.write_handler();
    let Some(ctx) = ctx_of(r) else { return };
    if let Some(timer) = timer_of(ctx) {
        timer.del_timer();
    }
    ctx.saved_write_handler = saved;
    r.set_write_handler(Some(stream_resume));
    r.wait_client_writable();
}

request_handler! {
    /// The client can take more: push what is pending, and once it is caught
    /// up, read the database connection again.
    fn stream_resume(r) = ("stream_resume", panic: |r: &mut Req| fail(r, HTTP_INTERNAL_SERVER_ERROR, false)) {
        resume(r)
    }
}

fn resume(r: &mut Req) {
    let lcf: &LocConf = r.loc_conf::<Sqldb>();
    if ctx_of(r).is_none_or(|c| c.done) {
        return;
    }
    let wev = r.client_write();
    if wev.take_timedout() {
        r.set_client_timed_out();
        log!(
            NGX_LOG_INFO,
            r.log(),
            "sqldb: client timed out while rows were streamed"
        );
        fail(r, HTTP_REQUEST_TIME_OUT, false);
        return;
    }
    // Taken out while what is pending goes to the client, and put back.
    let Some(mut s) = ctx_of(r).and_then(|c| c.streaming.take()) else {
        return;
    };
    let flushed = s.flush(r, false);
    let Some(ctx) = ctx_of(r) else { return };
    ctx.streaming = Some(s);
    match flushed {
        Err(CutShort) => {
            ctx.stream_failed = true;
            fail(r, HTTP_INTERNAL_SERVER_ERROR, false);
            return;
        }
        Ok(true) => {
            r.wait_client_writable();
            return;
        }
        Ok(false) => {}
    }
    let saved = ctx.saved_write_handler;
    r.client_caught_up();
    r.set_write_handler(saved);
    let Some(ctx) = ctx_of(r) else { return };
    let Some(conn) = ctx.conn else { return };
    if let Some(timer) = timer_of(ctx) {
        timer.add_timer(lcf.result_timeout);
    }
    // Results libpq already holds, then the socket's.
    if let Some(mut out) = with_pool(ctx, |pool| pool.resume(conn)) {
        SINK.deliver(&mut out);
    }
}

/// Every row is in (or the query failed after rows went out).
pub fn complete(r: &mut Req) {
    let Some(ctx) = ctx_of(r) else { return };
    // Taken out: the steps below take the context anew.
    let Some(mut s) = ctx.streaming.take() else { return };
    let (rows, sent) = (s.enc.rows(), s.sent);
    // A client that could not take the rows (it left) is the client's
    // doing: info, as nginx logs those.
    let failed = match ctx.error.take() {
        Some(err) => Some((err.error_summary(), NGX_LOG_ERR)),
        None if ctx.stream_failed => Some(("sending the rows to the client failed".to_owned(), NGX_LOG_INFO)),
        None => None,
    };
    vars::store(r, Var::Rows, gateway_core::formats::Decimal::of(rows).bytes());
    if let Some((why, level)) = failed {
        vars::store(r, Var::Error, why.as_bytes());
        log_cut_short(r.log(), level, sent, &why);
        finish_upstream(r, HTTP_OK, 0);
        r.finalize(ERROR);
        return;
    }
    finish_upstream(r, HTTP_OK, 0);
    let rc = s.finish(r);
    r.finalize(rc);
}

/// The line of a streamed response cut short, counting the rows that had
/// gone out to the client.
pub fn log_cut_short(log: Log, level: u32, sent: u64, why: &dyn std::fmt::Display) {
    log!(
        level,
        log,
        "sqldb: the response was cut short after {sent} rows had gone out: {why}"
    );
}
