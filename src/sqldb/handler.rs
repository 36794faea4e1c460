//! The request side of the database gateway: the content handler, nginx
//! upstream callbacks, the peer wrapper around the balancer, and the event
//! handlers that drive database connections.
//!
//! Flow: the content handler picks the template, evaluates it and starts
//! nginx's upstream. The balancer picks a server; `peer_get` asks the pool
//! for a connection to it (idle, shared in pipeline mode, or new) and gives
//! nginx's upstream code a stand-in connection of the request's own, so
//! that a database connection can serve several requests. `attach` queues
//! the query; `conn_event` runs on every readiness of a database socket:
//! connect, send, read results and hand each request its own.

use std::ffi::{c_void, CString};
use std::mem;
use std::ptr;

use gateway_core::sql::has_several_statements;

use super::cancel::{Canceller, Progress};
use super::conf::{find_upstream, sqldb_srv_conf, LocConf, SrvConf, Template, TemplatePiece};
use super::conn::{Conn, Mode, Pending, Pick, State};
use super::output::{self, Output};
use super::pq::{Flush, PgConn, PgResult, Poll, ResultKind};
use super::stream::Streaming;
use super::vars;
use crate::ffi::*;
use crate::ngx_http_gateway_module as MODULE;
use gateway_core::formats::StreamFormat;

/// The connection nginx's upstream code sees for one request: it sets its
/// handlers, log and a connect timer on it, none of which may touch a
/// database connection that other requests share.
#[repr(C)]
struct StandIn {
    c: ngx_connection_t,
    read: ngx_event_t,
    write: ngx_event_t,
}

impl StandIn {
    /// Timers, posted events and the pool nginx may have given it.
    fn clear(&mut self) {
        // SAFETY: the events are ours; the pool was created by nginx for it.
        unsafe {
            for ev in [&mut self.read as *mut ngx_event_t, &mut self.write] {
                if (*ev).timer_set() != 0 {
                    ngx_del_timer(ev);
                }
                if (*ev).posted() != 0 {
                    ngx_delete_posted_event(ev);
                }
            }
            if !self.c.pool.is_null() {
                ngx_destroy_pool(self.c.pool);
                self.c.pool = ptr::null_mut();
            }
        }
    }
}

/// Per-request peer data: the balancer's own and the stand-in connection.
pub struct PeerData {
    srv: *mut SrvConf,
    balancer_data: *mut c_void,
    balancer_get: ngx_event_get_peer_pt,
    balancer_free: ngx_event_free_peer_pt,
    /// The balancer picked the current peer (not so for an idle connection
    /// taken in single mode): it must be told when it is freed.
    balancer_used: bool,
    ctx: *mut Ctx,
    standin: StandIn,
}

impl Drop for PeerData {
    fn drop(&mut self) {
        // Safety net for the request pool: no timer of ours outlives it and
        // no connection keeps pointing at its request.
        // SAFETY: ctx is the request's Ctx, dropped after this (same pool,
        // allocated earlier, cleaned up later).
        unsafe {
            if let Some(ctx) = self.ctx.as_mut() {
                detach(ctx);
            }
        }
        self.standin.clear();
    }
}

/// Per-request state.
pub struct Ctx {
    r: *mut ngx_http_request_t,
    query: CString,
    /// Values of the typed parameters, as text.
    params: Vec<CString>,
    template: *const Template,
    /// The query holds several statements: simple protocol only.
    several: bool,
    /// The database connection this request is queued on (or connecting).
    conn: *mut Conn,
    /// The connection was opened for this request (not pooled nor shared).
    fresh: bool,
    /// The prepared statement had vanished once and was prepared again.
    reprepared: bool,
    last: Option<PgResult>,
    error: Option<PgResult>,
    done: bool,
    /// Set by peer_init: the peer data of this request.
    peer: *mut PeerData,
    /// `sqldb_stream on` applies: rows go out as they arrive.
    stream_format: Option<StreamFormat>,
    streaming: Option<Streaming>,
    /// Sending the rows failed mid-way (the request ends without its end).
    stream_failed: bool,
    /// The client write handler nginx's upstream had set, while paused.
    saved_write_handler: ngx_http_event_handler_pt,
}

unsafe fn ctx_of<'a>(r: *mut ngx_http_request_t) -> Option<&'a mut Ctx> {
    // SAFETY: r->ctx has a slot per http module; ours holds a Ctx or null.
    unsafe {
        let p = *(*r).ctx.add((*ptr::addr_of!(MODULE)).ctx_index) as *mut Ctx;
        p.as_mut()
    }
}

unsafe fn loc_conf<'a>(r: *mut ngx_http_request_t) -> &'a LocConf {
    // SAFETY: r is live; every location has our LocConf.
    unsafe { &*request_loc_conf::<LocConf>(r, ptr::addr_of!(MODULE)) }
}

// ---------------------------------------------------------------- peer ----

/// Wraps the balancer's per-request init (round robin, least_conn, hash ...).
pub(crate) unsafe extern "C" fn peer_init(
    r: *mut ngx_http_request_t,
    us: *mut ngx_http_upstream_srv_conf_t,
) -> ngx_int_t {
    // SAFETY: nginx calls this with a live request that has an upstream,
    // for an upstream block that postconfiguration found to be ours.
    guard(unsafe { client_log(r) }, "peer_init", ERROR, || unsafe {
        let Some(srv) = sqldb_srv_conf(us) else { return ERROR };
        let Some(init) = srv.balancer_init else { return ERROR };
        let Some(ctx) = ctx_of(r) else { return ERROR };
        if init(r, us) != OK {
            return ERROR;
        }
        let u = (*r).upstream;
        let pd = PeerData {
            srv,
            balancer_data: (*u).peer.data,
            balancer_get: (*u).peer.get,
            balancer_free: (*u).peer.free,
            balancer_used: false,
            ctx,
            standin: mem::zeroed(),
        };
        let Some(pd) = pool_alloc((*r).pool, pd) else {
            return ERROR;
        };
        let pd = pd.as_ptr();
        let s = &mut (*pd).standin;
        s.c.read = &mut s.read;
        s.c.write = &mut s.write;
        s.c.fd = -1;
        s.read.data = (&mut s.c as *mut ngx_connection_t).cast();
        s.write.data = (&mut s.c as *mut ngx_connection_t).cast();
        s.write.set_write(1);
        ctx.peer = pd;
        (*u).peer.data = pd.cast();
        (*u).peer.get = Some(peer_get);
        (*u).peer.free = Some(peer_free);
        // TLS session hooks of the balancer would receive our data: nginx never
        // calls them for us (u->ssl stays off), but clear them to be sure.
        (*u).peer.set_session = None;
        (*u).peer.save_session = None;
        OK
    })
}

unsafe extern "C" fn peer_get(pc: *mut ngx_peer_connection_t, data: *mut c_void) -> ngx_int_t {
    // SAFETY: data is the PeerData installed by peer_init; pc is the request's peer.
    guard(cycle_log(), "peer_get", ERROR, || unsafe {
        let pd = &mut *(data as *mut PeerData);
        let srv = &mut *pd.srv;
        let ctx = &mut *pd.ctx;
        let pipelinable = !ctx.several;
        pd.balancer_used = false;
        if srv.pool.single {
            if let Pick::Idle(conn) = srv.pool.pick(None, false) {
                let a = &mut srv.addrs[(*conn).addr];
                (*pc).sockaddr = a.sockaddr.as_mut_ptr().cast();
                (*pc).socklen = a.sockaddr.len() as socklen_t;
                (*pc).name = &mut a.name;
                return use_conn(pc, pd, conn, false);
            }
        }
        let Some(get) = pd.balancer_get else { return ERROR };
        let rc = get(pc, pd.balancer_data);
        if rc != OK {
            return rc;
        }
        pd.balancer_used = true;
        let sockaddr = std::slice::from_raw_parts((*pc).sockaddr as *const u8, (*pc).socklen as usize);
        let name = || String::from_utf8_lossy(bytes(&*(*pc).name)).into_owned();
        let Some(addr) = srv.addr_index(sockaddr) else {
            log!(NGX_LOG_ALERT, (*pc).log, "sqldb: no sqldb_server for peer {}", name());
            return ERROR;
        };
        match srv.pool.pick(Some(addr), pipelinable) {
            Pick::Idle(conn) | Pick::Share(conn) => use_conn(pc, pd, conn, false),
            Pick::Reject => {
                log!(NGX_LOG_ERR, (*pc).log, "sqldb: no connection to spare for {}", name());
                BUSY
            }
            Pick::New => {
                let pg = match PgConn::start(&srv.addrs[addr].conninfo) {
                    Ok(pg) => pg,
                    Err(msg) => {
                        log!(NGX_LOG_ERR, (*pc).log, "sqldb: connecting to {} failed: {msg}", name());
                        return DECLINED;
                    }
                };
                // On failure nginx has logged why ("worker_connections are not enough").
                let Some(conn) = srv.pool.add(pg, addr, name(), (*pc).log) else {
                    return ERROR;
                };
                use_conn(pc, pd, conn, true)
            }
        }
    })
}

/// Gives the request a database connection; `attach` queues its query.
unsafe fn use_conn(pc: *mut ngx_peer_connection_t, pd: &mut PeerData, conn: *mut Conn, fresh: bool) -> ngx_int_t {
    // SAFETY: pc is the request's live peer; ctx and the stand-in are in the request pool.
    unsafe {
        let ctx = &mut *pd.ctx;
        ctx.conn = conn;
        ctx.fresh = fresh;
        if fresh {
            (*conn).creator = ctx;
            // Several statements need the connection alone; a streamed
            // request lets nothing queue behind it.
            (*conn).exclusive = ctx.several || ctx.stream_format.is_some();
        }
        pd.standin.clear();
        (*pc).set_cached((!fresh) as u32);
        (*pc).connection = &mut pd.standin.c;
    }
    AGAIN
}

unsafe extern "C" fn peer_free(pc: *mut ngx_peer_connection_t, data: *mut c_void, state: ngx_uint_t) {
    // SAFETY: data is our PeerData.
    guard(cycle_log(), "peer_free", (), || unsafe {
        let pd = &mut *(data as *mut PeerData);
        detach(&mut *pd.ctx);
        pd.standin.clear();
        (*pc).connection = ptr::null_mut();
        if pd.balancer_used {
            pd.balancer_used = false;
            if let Some(free) = pd.balancer_free {
                free(pc, pd.balancer_data, state);
            }
        }
    })
}

/// The request leaves its database connection before its results are in
/// (client gone, timeout, failure). Its results, if they come, are read and
/// dropped; when no request is left waiting on the connection, the queries
/// still running are cancelled on the server (see `begin_drain`).
unsafe fn detach(ctx: &mut Ctx) {
    let conn = mem::replace(&mut ctx.conn, ptr::null_mut());
    if conn.is_null() {
        return;
    }
    let me: *mut Ctx = ctx;
    // SAFETY: a request's conn pointer is cleared whenever its connection closes.
    unsafe {
        let cn = &mut *conn;
        let pool = &mut *cn.pool;
        if cn.creator == me {
            cn.creator = ptr::null_mut();
        }
        cn.waiting.retain(|&c| c != me);
        let was_head = cn.queue.front().is_some_and(|p| p.ctx == me);
        for p in cn.queue.iter_mut().filter(|p| p.ctx == me) {
            p.ctx = ptr::null_mut();
        }
        let nobody_waits = cn.creator.is_null() && cn.waiting.is_empty();
        if cn.state == State::Connecting {
            if nobody_waits {
                fail_all(conn, None);
                pool.close(conn);
            }
            return;
        }
        // A streamed request whose client stopped reading: reading resumes,
        // for what comes after it.
        if was_head && cn.paused && !cn.pause_reading(false) {
            fail_all(conn, None);
            pool.close(conn);
            return;
        }
        if cn.queue.is_empty() && !cn.draining {
            // Picked but never used (nginx failed the request in between).
            pool.settle(conn);
        } else if cn.live() == 0 && !cn.queue.is_empty() {
            begin_drain(conn);
        }
    }
}

/// How long the queries of requests that are gone may take to end once
/// cancelled; then the connection is closed.
const DRAIN_TIMEOUT: ngx_msec_t = 5_000;
/// How long a cancel request may take.
const CANCEL_TIMEOUT: ngx_msec_t = 5_000;

/// Every request queued on the connection has gone while queries of theirs
/// still run: cancel them on the server and read their results, so that
/// the connection comes back clean. It stays in the pool meanwhile,
/// counted against `max`, and new requests wait on it.
unsafe fn begin_drain(conn: *mut Conn) {
    // SAFETY: conn is a live connection of its pool.
    unsafe {
        let cn = &mut *conn;
        if cn.draining {
            return;
        }
        cn.draining = true;
        cn.set_timer(Some(DRAIN_TIMEOUT));
        cancel_running(conn);
    }
}

/// Sends a cancel request for the query running now on a draining
/// connection (one of a request that is gone: no other is on it), once per
/// query: the one at the head of the queue.
unsafe fn cancel_running(conn: *mut Conn) {
    // SAFETY: conn is a live connection of its pool; the canceller is closed
    // before the connection is freed (Pool::close).
    unsafe {
        let cn = &mut *conn;
        let Some(head) = cn.queue.front().map(|p| p.seq) else {
            return;
        };
        if !cn.draining || cn.canceller.is_some() || cn.cancelled_seq == Some(head) {
            return;
        }
        cn.cancelled_seq = Some(head);
        let log = cycle_log();
        let pid = cn.pg.backend_pid();
        let Some(key) = cn.cancel_key.as_ref() else {
            log!(
                NGX_LOG_INFO,
                log,
                "sqldb: a query of a request that is gone runs on {} (backend {pid}); it cannot be cancelled, its results are read and dropped",
                cn.name
            );
            return;
        };
        match Canceller::start(key, Some(cancel_event), conn.cast(), CANCEL_TIMEOUT) {
            Ok(c) => {
                log!(
                    NGX_LOG_INFO,
                    log,
                    "sqldb: cancelling the query of a request that is gone on {} (backend {pid})",
                    cn.name
                );
                cn.canceller = Some(c);
            }
            Err(e) => log!(
                NGX_LOG_WARN,
                log,
                "sqldb: cancel request to {} (backend {pid}) failed: {e}",
                cn.name
            ),
        }
    }
}

/// A draining connection whose queue has emptied: once its cancel request
/// is through, the requests that waited on it go out, or it goes back to
/// the pool.
unsafe fn finish_drain(conn: *mut Conn, out: &mut Vec<Outcome>) {
    // SAFETY: conn is a live connection of its pool.
    unsafe {
        let cn = &mut *conn;
        if !cn.draining || !cn.queue.is_empty() || cn.canceller.is_some() {
            return;
        }
        cn.draining = false;
        cn.set_timer(None);
        let waiting = mem::take(&mut cn.waiting);
        send_all(conn, waiting, false, out);
    }
}

/// Events of a cancel request's connection (its data is the database connection).
pub(crate) unsafe extern "C" fn cancel_event(ev: *mut ngx_event_t) {
    guard(cycle_log(), "sqldb cancel event", (), || {
        // SAFETY: the cancel connection's data is the live Conn that owns it.
        unsafe {
            let c = (*ev).data as *mut ngx_connection_t;
            let conn = (*c).data as *mut Conn;
            let timed_out = (*ev).timedout() != 0;
            (*ev).set_timedout(0);
            let cn = &mut *conn;
            let Some(canceller) = cn.canceller.as_mut() else { return };
            match canceller.on_event(timed_out) {
                Progress::Pending => return,
                Progress::Done => {}
                Progress::Failed(why) => log!(
                    NGX_LOG_WARN,
                    cycle_log(),
                    "sqldb: cancel request to {} (backend {}) failed: {why}",
                    cn.name,
                    cn.pg.backend_pid()
                ),
            }
            if let Some(canceller) = cn.canceller.take() {
                canceller.close();
            }
            // The next query of a request that is gone may run by now.
            cancel_running(conn);
            let mut out = Vec::new();
            finish_drain(conn, &mut out);
            deliver(out);
        }
    })
}

/// The queries of requests that are gone did not end in time: the
/// connection goes; requests that waited on it try again.
unsafe fn drain_expired(conn: *mut Conn, out: &mut Vec<Outcome>) {
    // SAFETY: conn is live.
    unsafe {
        let cn = &*conn;
        log!(
            NGX_LOG_WARN,
            cycle_log(),
            "sqldb: queries of requests that are gone did not end within {DRAIN_TIMEOUT} ms on {} (backend {}): closing the connection",
            cn.name,
            cn.pg.backend_pid()
        );
        fail_all(conn, Some(out));
        (*cn.pool).close(conn);
    }
}

// ------------------------------------------------------------- request ----

// nginx's upstream calls these; the query goes out on our own connections,
// so there is no request to create and no header to read here.
unsafe extern "C" fn create_request(_r: *mut ngx_http_request_t) -> ngx_int_t {
    OK
}

unsafe extern "C" fn reinit_request(_r: *mut ngx_http_request_t) -> ngx_int_t {
    OK
}

unsafe extern "C" fn process_header(_r: *mut ngx_http_request_t) -> ngx_int_t {
    ERROR // never reached: nginx's reader is never installed on our connections
}

unsafe extern "C" fn abort_request(_r: *mut ngx_http_request_t) {}

unsafe extern "C" fn finalize_request(r: *mut ngx_http_request_t, _rc: ngx_int_t) {
    // SAFETY: called by nginx's upstream with a live request.
    guard(unsafe { client_log(r) }, "finalize_request", (), || {
        if let Some(ctx) = unsafe { ctx_of(r) } {
            ctx.done = true;
        }
    })
}

/// Runs the body of an entry point that serves one request; a panic ends
/// the request with 500 (and never crosses into nginx).
unsafe fn guard_request(r: *mut ngx_http_request_t, entry: &str, body: impl FnOnce()) {
    // SAFETY: r is live.
    let log = unsafe { client_log(r) };
    if !guard(log, entry, false, || {
        body();
        true
    }) {
        // SAFETY: r is live; fail() does nothing for a request already ended.
        unsafe { fail(r, HTTP_INTERNAL_SERVER_ERROR, false) };
    }
}

/// The location's content handler (set by `sqldb_pass`).
pub(crate) unsafe extern "C" fn content_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls the content handler with a live request.
    guard(
        unsafe { client_log(r) },
        "content_handler",
        HTTP_INTERNAL_SERVER_ERROR,
        || unsafe { start(r) },
    )
}

unsafe fn start(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: r is live; every pointer below comes from it or its configuration.
    unsafe {
        let log = client_log(r);
        let lcf = &*request_loc_conf::<LocConf>(r, ptr::addr_of!(MODULE));
        if lcf.queries.is_empty() {
            log!(
                NGX_LOG_ERR,
                log,
                "sqldb: no \"sqldb_query\" is configured for this location"
            );
            return HTTP_INTERNAL_SERVER_ERROR;
        }
        if lcf.queries.select((*r).method as u32).is_none() {
            let method = String::from_utf8_lossy(bytes(&(*r).method_name));
            log!(NGX_LOG_INFO, log, "sqldb: no query for method \"{method}\"");
            return HTTP_NOT_ALLOWED;
        }
        // The body first, so that $request_body is there for the template.
        // (Reading it counts the request as in use until it is finalized.)
        let rc = ngx_http_read_client_request_body(r, Some(body_read));
        if rc >= NGX_HTTP_SPECIAL_RESPONSE as ngx_int_t {
            return rc;
        }
        DONE
    }
}

/// The request body is in: run the query (or answer with an error).
unsafe extern "C" fn body_read(r: *mut ngx_http_request_t) {
    // SAFETY: nginx calls this with the live request whose body was read.
    unsafe {
        let rc = guard(client_log(r), "body_read", HTTP_INTERNAL_SERVER_ERROR, || run(r));
        if rc != DONE {
            ngx_http_finalize_request(r, rc);
        }
    }
}

/// A body that nginx wrote to a temporary file is read back into memory,
/// so that $request_body sees it.
unsafe fn body_into_memory(r: *mut ngx_http_request_t) -> bool {
    // SAFETY: r is live; the temporary file is open and its size known.
    unsafe {
        let rb = (*r).request_body;
        if rb.is_null() || (*rb).temp_file.is_null() {
            return true;
        }
        let file = &mut (*(*rb).temp_file).file;
        let size = file.offset as usize;
        let data = ngx_pnalloc((*r).pool, size.max(1)) as *mut u8;
        if data.is_null() || ngx_read_file(file, data, size, 0) != size as isize {
            return false;
        }
        let b = ngx_pcalloc((*r).pool, mem::size_of::<ngx_buf_t>()) as *mut ngx_buf_t;
        let cl = ngx_alloc_chain_link((*r).pool);
        if b.is_null() || cl.is_null() {
            return false;
        }
        (*b).start = data;
        (*b).pos = data;
        (*b).last = data.add(size);
        (*b).end = (*b).last;
        (*b).set_memory(1);
        (*b).set_last_buf(1);
        (*cl).buf = b;
        (*cl).next = ptr::null_mut();
        (*rb).bufs = cl;
        (*rb).buf = b;
        // The file is still deleted with the request pool.
        (*rb).temp_file = ptr::null_mut();
        true
    }
}

/// Builds the query and starts nginx's upstream; DONE, or an error status.
unsafe fn run(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: r is live; every pointer below comes from it or its configuration.
    unsafe {
        let log = client_log(r);
        let lcf = &mut *request_loc_conf::<LocConf>(r, ptr::addr_of!(MODULE));
        let Some(&template) = lcf.queries.select((*r).method as u32) else {
            return HTTP_NOT_ALLOWED;
        };
        if !body_into_memory(r) {
            log!(
                NGX_LOG_ERR,
                log,
                "sqldb: cannot read the request body back from its temporary file"
            );
            return HTTP_INTERNAL_SERVER_ERROR;
        }
        let tmpl = &*template;
        let (sql, params) = match build_query(r, tmpl) {
            Ok(q) => q,
            Err(status) => return status,
        };
        let several = if tmpl.constant {
            tmpl.several
        } else {
            has_several_statements(sql.as_bytes())
        };
        if several && !params.is_empty() {
            log!(
                NGX_LOG_ERR,
                log,
                "sqldb: typed parameters need a query of one statement"
            );
            return HTTP_INTERNAL_SERVER_ERROR;
        }
        let query = sql;
        vars::store_own(r, vars::QUERY, query.as_bytes());
        let streamable = lcf.stream == 1 && !several && lcf.sets.is_empty() && lcf.rewrites.is_empty();
        let stream_format = if streamable {
            Output::from_code(lcf.output).stream_format()
        } else {
            None
        };

        // The upstream: named in the configuration, or by a variable now.
        let mut uscf = lcf.upstream.upstream;
        let mut by_variable = ngx_str_t {
            len: 0,
            data: ptr::null_mut(),
        };
        if !lcf.pass_var.is_null() {
            if ngx_http_complex_value(r, lcf.pass_var, &mut by_variable) != OK {
                return HTTP_INTERNAL_SERVER_ERROR;
            }
            let umcf = *(*r).main_conf.add(ngx_http_upstream_module.ctx_index) as *mut ngx_http_upstream_main_conf_t;
            match find_upstream(umcf, bytes(&by_variable)) {
                Some(found) => uscf = found,
                None => {
                    let name = String::from_utf8_lossy(bytes(&by_variable));
                    log!(
                        NGX_LOG_ERR,
                        log,
                        "sqldb: \"sqldb_pass\" value \"{name}\" names no upstream with \"sqldb_server\""
                    );
                    return HTTP_INTERNAL_SERVER_ERROR;
                }
            }
        }
        if let Some(srv) = sqldb_srv_conf(uscf) {
            if srv.pool.full() {
                let name = String::from_utf8_lossy(bytes(&(*uscf).host));
                let max = srv.pool.max;
                log!(
                    NGX_LOG_ERR,
                    log,
                    "sqldb: all {max} connections to upstream \"{name}\" are busy"
                );
                return HTTP_SERVICE_UNAVAILABLE;
            }
        }

        if ngx_http_upstream_create(r) != OK {
            return HTTP_INTERNAL_SERVER_ERROR;
        }
        let u = (*r).upstream;
        if !lcf.pass_var.is_null() {
            let resolved = ngx_pcalloc((*r).pool, mem::size_of::<ngx_http_upstream_resolved_t>())
                as *mut ngx_http_upstream_resolved_t;
            if resolved.is_null() {
                return HTTP_INTERNAL_SERVER_ERROR;
            }
            (*resolved).host = by_variable;
            (*resolved).no_port = 1;
            (*u).resolved = resolved;
        }
        (*u).conf = &mut lcf.upstream;
        (*u).schema = static_str("postgres://");
        (*u).output.tag = ptr::addr_of_mut!(MODULE).cast();
        (*u).create_request = Some(create_request);
        (*u).reinit_request = Some(reinit_request);
        (*u).process_header = Some(process_header);
        (*u).abort_request = Some(abort_request);
        (*u).finalize_request = Some(finalize_request);

        let ctx = Ctx {
            r,
            query,
            params,
            template,
            several,
            conn: ptr::null_mut(),
            fresh: false,
            reprepared: false,
            last: None,
            error: None,
            done: false,
            peer: ptr::null_mut(),
            stream_format,
            streaming: None,
            stream_failed: false,
            saved_write_handler: None,
        };
        let Some(ctx) = pool_alloc((*r).pool, ctx) else {
            return HTTP_INTERNAL_SERVER_ERROR;
        };
        *(*r).ctx.add((*ptr::addr_of!(MODULE)).ctx_index) = ctx.as_ptr().cast();

        ngx_http_upstream_init(r);
        // A connection was picked, unless the upstream already failed.
        let ctx = &mut *ctx.as_ptr();
        if !ctx.done && !ctx.conn.is_null() {
            attach(r);
        }
        DONE
    }
}

/// The SQL text and the values of its typed parameters for this request.
unsafe fn build_query(r: *mut ngx_http_request_t, tmpl: &Template) -> Result<(CString, Vec<CString>), ngx_int_t> {
    // SAFETY: r is live; the template's values were compiled for this configuration.
    unsafe {
        let log = client_log(r);
        let mut sql = Vec::new();
        let mut params = Vec::with_capacity(tmpl.params);
        for piece in &tmpl.pieces {
            let (cv, placeholder) = match piece {
                TemplatePiece::Text(cv) => (*cv, None),
                TemplatePiece::Param(cv, ph) => (*cv, Some(ph)),
            };
            let mut v = ngx_str_t {
                len: 0,
                data: ptr::null_mut(),
            };
            if ngx_http_complex_value(r, cv, &mut v) != OK {
                return Err(HTTP_INTERNAL_SERVER_ERROR);
            }
            match placeholder {
                None => sql.extend_from_slice(bytes(&v)),
                Some(ph) => {
                    sql.extend_from_slice(ph);
                    let Ok(value) = CString::new(bytes(&v)) else {
                        log!(
                            NGX_LOG_INFO,
                            log,
                            "sqldb: parameter ${} contains a NUL byte",
                            params.len() + 1
                        );
                        return Err(HTTP_BAD_REQUEST);
                    };
                    params.push(value);
                }
            }
        }
        if sql.is_empty() {
            log!(
                NGX_LOG_ERR,
                log,
                "sqldb: the query is empty after variable substitution"
            );
            return Err(HTTP_INTERNAL_SERVER_ERROR);
        }
        match CString::new(sql) {
            Ok(sql) => Ok((sql, params)),
            Err(_) => {
                log!(NGX_LOG_ERR, log, "sqldb: the query contains a NUL byte");
                Err(HTTP_BAD_REQUEST)
            }
        }
    }
}

/// Takes the request over from nginx's upstream code once a connection is
/// picked: its own timer on the stand-in, and its query queued.
unsafe fn attach(r: *mut ngx_http_request_t) {
    // SAFETY: r is live with our ctx and peer data; ctx.conn is a live connection.
    unsafe {
        let Some(ctx) = ctx_of(r) else { return };
        let Some(pd) = ctx.peer.as_mut() else { return };
        let lcf = loc_conf(r);
        pd.standin.clear(); // nginx's connect timer
        pd.standin.read.handler = Some(request_timer);
        pd.standin.read.log = client_log(r);
        pd.standin.c.data = r.cast();
        let conn = &mut *ctx.conn;
        if conn.holds_requests() {
            if !ptr::eq(conn.creator, ctx) {
                conn.waiting.push(ctx);
            }
            let wait = if conn.state == State::Connecting {
                lcf.connect_timeout
            } else {
                lcf.result_timeout
            };
            ngx_add_timer(&mut pd.standin.read, wait);
            return;
        }
        let u = (*r).upstream;
        if !(*u).state.is_null() {
            (*(*u).state).connect_time = 0;
        }
        ngx_add_timer(&mut pd.standin.read, lcf.result_timeout);
        let conn = ctx.conn;
        if !send(conn, ctx, lcf) {
            let msg = format!("sending the query failed: {}", (*conn).pg.error_message());
            broken(conn, &msg);
        }
    }
}

/// Queues the request's query on a ready connection, choosing the protocol:
/// a constant single-statement template is prepared once per connection and
/// executed by name; another single statement runs as the unnamed statement;
/// both in pipeline mode, each request ended by its own sync point. Several
/// statements need the simple protocol, outside pipeline mode.
///
/// The request is queued first: if sending fails, the caller closes the
/// connection and every request queued on it, this one included, is failed.
unsafe fn send(conn: *mut Conn, ctx: &mut Ctx, lcf: &LocConf) -> bool {
    // SAFETY: conn is live; the template lives in the configuration.
    let (cn, tmpl) = unsafe { (&mut *conn, &*ctx.template) };
    let prepare = !ctx.several && lcf.prepare == 1 && tmpl.constant;
    let by_name = prepare && (cn.is_prepared(tmpl.id) || cn.can_prepare_more());
    let preparing = by_name && !cn.is_prepared(tmpl.id);
    let binary = Output::from_code(lcf.output).binary();
    let mode = if ctx.several {
        Mode::Simple
    } else {
        Mode::Pipelined { preparing }
    };
    cn.last_seq += 1;
    cn.queue.push_back(Pending {
        ctx,
        mode,
        stage: 0,
        again: false,
        single: false,
        streaming: ctx.stream_format.is_some(),
        seq: cn.last_seq,
    });
    // SAFETY: r is live.
    unsafe { set_action(ctx.r, c"reading result from PostgreSQL") };
    if ctx.several {
        if cn.pipeline {
            if !cn.pg.exit_pipeline() {
                return false;
            }
            cn.pipeline = false;
        }
        if !cn.pg.send_query(&ctx.query) {
            return false;
        }
    } else {
        if !cn.pipeline {
            if !cn.pg.enter_pipeline() {
                return false;
            }
            cn.pipeline = true;
        }
        let sent = if by_name {
            let name = &tmpl.statement;
            if preparing {
                cn.add_prepared(tmpl.id);
                if !cn.pg.send_prepare(name, &ctx.query) {
                    return false;
                }
            }
            cn.pg.send_prepared(name, &ctx.params, binary)
        } else {
            cn.pg.send_unnamed(&ctx.query, &ctx.params, binary)
        };
        if !sent || !cn.pg.pipeline_sync() {
            return false;
        }
    }
    flush(cn)
}

/// Pushes out what libpq has buffered; watches writability while it cannot.
fn flush(cn: &mut Conn) -> bool {
    match cn.pg.flush() {
        Flush::Done => cn.want_write(false),
        Flush::Again => cn.want_write(true),
        Flush::Failed => false,
    }
}

/// A request's own timer (on its stand-in): connect or result timeout.
unsafe extern "C" fn request_timer(ev: *mut ngx_event_t) {
    // SAFETY: the stand-in's data is its live request.
    unsafe {
        let c = (*ev).data as *mut ngx_connection_t;
        let r = (*c).data as *mut ngx_http_request_t;
        let client = (*r).connection;
        set_log_request((*client).log, r);
        (*ev).set_timedout(0);
        guard_request(r, "request_timer", || {
            let Some(ctx) = ctx_of(r) else { return };
            if ctx.done || ctx.conn.is_null() {
                return;
            }
            let lcf = loc_conf(r);
            let connecting = (*ctx.conn).state == State::Connecting;
            detach(ctx);
            if connecting {
                log!(
                    NGX_LOG_ERR,
                    (*client).log,
                    "sqldb: timed out ({} ms) connecting",
                    lcf.connect_timeout
                );
                next(r, HTTP_GATEWAY_TIME_OUT, NGX_HTTP_UPSTREAM_FT_TIMEOUT);
            } else {
                let ms = lcf.result_timeout;
                log!(
                    NGX_LOG_ERR,
                    (*client).log,
                    "sqldb: timed out ({ms} ms) waiting for the result"
                );
                fail(r, HTTP_GATEWAY_TIME_OUT, true);
            }
        });
        ngx_http_run_posted_requests(client);
    }
}

// ---------------------------------------------------------- connection ----

/// What a connection's results mean for one request.
enum Outcome {
    Complete(*mut Ctx),
    Failed {
        ctx: *mut Ctx,
        lost: Lost,
    },
    /// The query cannot be served (COPY): 500.
    Refused(*mut Ctx),
}

/// Read/write readiness or a timer on a database connection.
pub(crate) unsafe extern "C" fn conn_event(ev: *mut ngx_event_t) {
    // SAFETY: ev belongs to a connection of a pool; its data is the Conn.
    guard(cycle_log(), "conn_event", (), || unsafe {
        let c = (*ev).data as *mut ngx_connection_t;
        let conn = (*c).data as *mut Conn;
        let timed_out = (*ev).timedout() != 0;
        (*ev).set_timedout(0);
        let readable = (*ev).write() == 0;
        let mut out = Vec::new();
        let handled = guard((*c).log, "database connection event", false, || {
            on_conn_event(conn, timed_out, readable, &mut out);
            true
        });
        if !handled {
            // The connection's state is unknown after a panic: give up on it.
            fail_all(conn, Some(&mut out));
            (*(*conn).pool).close(conn);
        }
        deliver(out);
    })
}

unsafe fn on_conn_event(conn: *mut Conn, timed_out: bool, readable: bool, out: &mut Vec<Outcome>) {
    // SAFETY: conn is a live connection of its pool.
    unsafe {
        let cn = &mut *conn;
        let pool = &mut *cn.pool;
        let c = cn.raw();
        match cn.state {
            State::Connecting => {
                let ready = match cn.pg.poll_connect() {
                    Poll::Reading => cn.want_write(false),
                    Poll::Writing => cn.want_write(true),
                    Poll::Failed => {
                        connect_failed(conn, &format!("connecting failed: {}", cn.pg.error_message()), out);
                        return;
                    }
                    Poll::Ready => {
                        if cn.pg.socket() != (*c).fd {
                            connect_failed(conn, "libpq replaced its socket while connecting", out);
                            return;
                        }
                        cn.state = State::Ready;
                        cn.pg.set_nonblocking()
                    }
                };
                if !ready {
                    connect_failed(conn, "event error", out);
                    return;
                }
                if cn.state == State::Ready {
                    connected(conn, out);
                }
            }
            State::Ready if cn.draining && timed_out => drain_expired(conn, out),
            State::Ready if cn.draining && cn.queue.is_empty() => {
                // Its queries are done, its cancel request not yet: only the
                // server closing the connection matters.
                if readable && (!cn.pg.consume_input() || cn.pg.is_bad()) {
                    let msg = format!("connection lost: {}", cn.pg.error_message());
                    broken_into(conn, &msg, out);
                }
            }
            State::Ready if cn.queue.is_empty() => {
                // Idle: only the idle timeout, nginx shutting down, or the
                // server closing the connection (restart, pg_terminate_backend).
                if !readable && !timed_out && (*c).close() == 0 {
                    return;
                }
                let gone = !timed_out && (*c).close() == 0 && (!cn.pg.consume_input() || cn.pg.is_bad());
                if gone {
                    log!(
                        NGX_LOG_INFO,
                        (*c).log,
                        "sqldb: idle connection closed by the server: {}",
                        cn.pg.error_message()
                    );
                }
                if timed_out || (*c).close() != 0 || gone || cn.pg.is_busy() {
                    pool.close(conn);
                }
            }
            State::Ready if cn.paused => {
                if !flush(cn) {
                    broken_into(
                        conn,
                        &format!("sending to PostgreSQL failed: {}", cn.pg.error_message()),
                        out,
                    );
                }
            }
            State::Ready => {
                if !flush(cn) {
                    broken_into(
                        conn,
                        &format!("sending to PostgreSQL failed: {}", cn.pg.error_message()),
                        out,
                    );
                    return;
                }
                // When reading fails, what arrived before (the server's
                // reason for closing, results) is still read first.
                if readable {
                    let _ = cn.pg.consume_input();
                }
                read_results(conn, out);
            }
        }
    }
}

/// The connection is up: the queries of the request that opened it and of
/// those queued behind it go out.
unsafe fn connected(conn: *mut Conn, out: &mut Vec<Outcome>) {
    // SAFETY: conn is live; its creator and waiting requests are live requests.
    unsafe {
        let cn = &mut *conn;
        cn.cancel_key = cn.pg.cancel_key();
        let creator = mem::replace(&mut cn.creator, ptr::null_mut());
        let mut ready: Vec<*mut Ctx> = mem::take(&mut cn.waiting);
        if !creator.is_null() {
            ready.insert(0, creator);
        }
        send_all(conn, ready, true, out);
    }
}

/// Sends the queries of requests that waited on the connection (while it
/// was connecting or draining); with none, the connection goes back to the pool.
unsafe fn send_all(conn: *mut Conn, ready: Vec<*mut Ctx>, connecting: bool, out: &mut Vec<Outcome>) {
    // SAFETY: conn is live; the waiting requests are live requests.
    unsafe {
        let cn = &mut *conn;
        if ready.is_empty() {
            (*cn.pool).settle(conn); // its requests went away: keep it for the next
            return;
        }
        for (i, &ctx) in ready.iter().enumerate() {
            let ctx = &mut *ctx;
            let r = ctx.r;
            let u = (*r).upstream;
            if !(*u).state.is_null() {
                (*(*u).state).connect_time = if connecting {
                    current_msec().wrapping_sub((*u).start_time)
                } else {
                    0
                };
            }
            if let Some(pd) = ctx.peer.as_mut() {
                ngx_add_timer(&mut pd.standin.read, loc_conf(r).result_timeout);
            }
            if !send(conn, ctx, loc_conf(r)) {
                // Those not sent yet fail with the rest (and may try again).
                cn.waiting.extend_from_slice(&ready[i + 1..]);
                let msg = format!("sending the query failed: {}", cn.pg.error_message());
                broken_into(conn, &msg, out);
                return;
            }
        }
    }
}

/// Reads every result that has arrived and hands each request its own.
unsafe fn read_results(conn: *mut Conn, out: &mut Vec<Outcome>) {
    // SAFETY: conn is live; queued ctx pointers are live requests or null.
    unsafe {
        let cn = &mut *conn;
        let mut again = Vec::new();
        let mut forget = false;
        // Why the connection is going away, when the server said so.
        let mut lost: Option<String> = None;
        // A streamed request whose client is behind: reading stops there.
        let mut paused: Option<*mut Ctx> = None;
        while let Some(head) = cn.queue.front_mut() {
            if cn.paused {
                break;
            }
            // Single-row mode for a streamed request's query, asked before
            // libpq parses any of its results.
            if let (false, Some(ctx), Mode::Pipelined { preparing }) = (head.single, head.ctx.as_ref(), head.mode) {
                if ctx.stream_format.is_some() && head.stage == preparing as u32 {
                    head.single = true;
                    cn.pg.set_single_row_mode();
                }
            }
            if cn.pg.is_busy() {
                break;
            }
            let res = cn.pg.get_result();
            let ctx = head.ctx.as_mut();
            if res.is_none() && cn.pg.is_bad() {
                lost.get_or_insert_with(|| cn.pg.error_message());
                break;
            }
            match (res, head.mode) {
                (None, Mode::Simple) => {
                    let p = cn.queue.pop_front();
                    finish_pending(cn, p, &mut again, out);
                }
                // A request sends two queries at most: more ends means confusion.
                (None, Mode::Pipelined { .. }) if head.stage >= 2 => {
                    lost = Some("unexpected results".into());
                    break;
                }
                (None, Mode::Pipelined { .. }) => head.stage += 1,
                (Some(res), _) if res.kind() == ResultKind::Error && connection_gone(&res.sqlstate()) => {
                    // The server is closing the session (shutdown,
                    // pg_terminate_backend): not an answer to the query.
                    lost = Some(res.error_summary());
                }
                (Some(res), mode) => {
                    let kind = res.kind();
                    if kind == ResultKind::Sync {
                        let p = cn.queue.pop_front();
                        finish_pending(cn, p, &mut again, out);
                        continue;
                    }
                    if kind == ResultKind::Unsupported {
                        // COPY: the protocol state is not one we can carry on from.
                        let status = res.status_name();
                        if let Some(ctx) = ctx {
                            log!(
                                NGX_LOG_ERR,
                                client_log(ctx.r),
                                "sqldb: the query started a COPY ({status}), which the gateway cannot serve"
                            );
                            ctx.conn = ptr::null_mut();
                            out.push(Outcome::Refused(ctx));
                            head.ctx = ptr::null_mut();
                        }
                        broken_into(conn, "COPY is not supported", out);
                        return;
                    }
                    let Some(ctx) = ctx else { continue };
                    if kind == ResultKind::Row {
                        let (format, r) = (ctx.stream_format.unwrap_or(StreamFormat::Rds), ctx.r);
                        let s = ctx
                            .streaming
                            .get_or_insert_with(|| Streaming::new(format, Output::from_code(loc_conf(r).output)));
                        match s.row(ctx.r, &res) {
                            Ok(false) => {}
                            Ok(true) => {
                                paused = Some(ctx);
                                break;
                            }
                            Err(_) => {
                                s.discard = true;
                                ctx.stream_failed = true;
                            }
                        }
                        continue;
                    }
                    let preparing = mode == Mode::Pipelined { preparing: true } && head.stage == 0;
                    match kind {
                        ResultKind::Error => {
                            let vanished = !preparing && matches!(res.sqlstate().as_str(), "26000" | "0A000");
                            if vanished && !ctx.reprepared {
                                head.again = true;
                                forget = true;
                                continue;
                            }
                            forget |= vanished;
                            if ctx.error.is_none() {
                                ctx.error = Some(res);
                            }
                        }
                        ResultKind::Aborted => {}
                        _ if preparing => {}
                        _ => ctx.last = Some(res),
                    }
                }
            }
        }
        if forget {
            // DEALLOCATE, DISCARD or a schema change: prepare afresh.
            cn.forget_prepared();
        }
        if let Some(ctx) = paused {
            pause(conn, &mut *ctx);
        }
        // The end of the session may be announced (a FATAL message) before it
        // is here: then the next read event finds it.
        let gone = cn.pg.is_bad() || (lost.is_some() && (!cn.pg.consume_input() || cn.pg.is_bad()));
        if gone {
            let why = lost.unwrap_or_else(|| cn.pg.error_message());
            broken_into(conn, &format!("connection lost: {why}"), out);
            return;
        }
        for ctx in again {
            let ctx: &mut Ctx = &mut *ctx;
            ctx.reprepared = true;
            if !send(conn, ctx, loc_conf(ctx.r)) {
                broken_into(
                    conn,
                    &format!("sending the query failed: {}", cn.pg.error_message()),
                    out,
                );
                return;
            }
        }
        if cn.queue.is_empty() {
            if cn.draining {
                finish_drain(conn, out);
            } else {
                (*cn.pool).settle(conn);
            }
        } else if cn.live() == 0 {
            // Only requests that are gone are left: cancel what runs.
            begin_drain(conn);
            cancel_running(conn);
        }
    }
}

/// A streamed request's client is behind: stop reading the connection
/// until the client has taken what is pending.
unsafe fn pause(conn: *mut Conn, ctx: &mut Ctx) {
    // SAFETY: conn is live; ctx is its live head request.
    unsafe {
        let r = ctx.r;
        if !(*conn).pause_reading(true) {
            return;
        }
        // The client's pace now, not the database's.
        if let Some(pd) = ctx.peer.as_mut() {
            if pd.standin.read.timer_set() != 0 {
                ngx_del_timer(&mut pd.standin.read);
            }
        }
        ctx.saved_write_handler = (*r).write_event_handler;
        (*r).write_event_handler = Some(stream_resume);
        wait_for_client(r);
    }
}

/// Arms the client's write event and nginx's send_timeout.
unsafe fn wait_for_client(r: *mut ngx_http_request_t) {
    // SAFETY: r is live.
    unsafe {
        let wev = (*(*r).connection).write;
        let clcf = &*request_loc_conf::<ngx_http_core_loc_conf_t>(r, ptr::addr_of!(ngx_http_core_module));
        ngx_handle_write_event(wev, clcf.send_lowat);
        ngx_add_timer(wev, clcf.send_timeout);
    }
}

/// The client can take more: push what is pending, and once it is caught
/// up, read the connection again.
unsafe extern "C" fn stream_resume(r: *mut ngx_http_request_t) {
    // SAFETY: nginx calls the write handler with a live request.
    guard_request(r, "stream_resume", || unsafe {
        let Some(ctx) = ctx_of(r) else { return };
        if ctx.done {
            return;
        }
        let c = (*r).connection;
        let wev = (*c).write;
        if (*wev).timedout() != 0 {
            (*c).set_timedout(1);
            log!(
                NGX_LOG_INFO,
                (*c).log,
                "sqldb: client timed out while rows were streamed"
            );
            fail(r, HTTP_REQUEST_TIME_OUT, false);
            return;
        }
        let Some(s) = ctx.streaming.as_mut() else { return };
        match s.flush(r, false) {
            Err(_) => {
                ctx.stream_failed = true;
                fail(r, HTTP_INTERNAL_SERVER_ERROR, false);
                return;
            }
            Ok(true) => {
                wait_for_client(r);
                return;
            }
            Ok(false) => {}
        }
        if (*wev).timer_set() != 0 {
            ngx_del_timer(wev);
        }
        (*r).write_event_handler = ctx.saved_write_handler;
        let conn = ctx.conn;
        if conn.is_null() {
            return;
        }
        if let Some(pd) = ctx.peer.as_mut() {
            ngx_add_timer(&mut pd.standin.read, loc_conf(r).result_timeout);
        }
        if !(*conn).pause_reading(false) {
            broken(conn, "event error");
            return;
        }
        // Results libpq already holds, then the socket's.
        let mut out = Vec::new();
        read_results(conn, &mut out);
        deliver(out);
    })
}

/// SQLSTATEs that end the session rather than answer the query:
/// connection exceptions and operator intervention (shutdown, terminate).
fn connection_gone(sqlstate: &str) -> bool {
    sqlstate.starts_with("08") || sqlstate.starts_with("57P")
}

/// One request's results are all in.
fn finish_pending(cn: &mut Conn, p: Option<Pending>, again: &mut Vec<*mut Ctx>, out: &mut Vec<Outcome>) {
    let Some(p) = p else { return };
    if p.ctx.is_null() {
        return;
    }
    if p.again {
        again.push(p.ctx);
        return;
    }
    cn.served += 1;
    // SAFETY: a queued non-null ctx is a live request.
    unsafe { (*p.ctx).conn = ptr::null_mut() };
    out.push(Outcome::Complete(p.ctx));
}

/// Why a request lost its connection, and so what it may do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lost {
    /// Connecting failed: the next server, counted as this one's failure.
    Connect,
    /// Its query was never sent (it waited on the connection): one more try.
    NotSent,
    /// Its query was sent and may have run: never sent again; 502.
    Sent,
}

/// Every request on the connection fails (it is about to be closed).
unsafe fn fail_all(conn: *mut Conn, out: Option<&mut Vec<Outcome>>) {
    // SAFETY: conn is live; its queued requests are live or null.
    unsafe {
        let cn = &mut *conn;
        let waited = if cn.state == State::Connecting {
            Lost::Connect
        } else {
            Lost::NotSent
        };
        let mut failed: Vec<(*mut Ctx, Lost)> = Vec::new();
        if let Some(ctx) = cn.creator.as_mut() {
            failed.push((ctx, Lost::Connect));
        }
        cn.creator = ptr::null_mut();
        failed.extend(cn.waiting.drain(..).map(|c| (c, waited)));
        failed.extend(
            cn.queue
                .drain(..)
                .map(|p| p.ctx)
                .filter(|c| !c.is_null())
                .map(|c| (c, Lost::Sent)),
        );
        let mut dropped = Vec::new();
        let out = match out {
            Some(o) => o,
            None => &mut dropped,
        };
        for (ctx, lost) in failed {
            (*ctx).conn = ptr::null_mut();
            out.push(Outcome::Failed { ctx, lost });
        }
    }
}

/// A connection attempt failed: its request tries the next server.
unsafe fn connect_failed(conn: *mut Conn, msg: &str, out: &mut Vec<Outcome>) {
    // SAFETY: conn is live.
    unsafe {
        let cn = &*conn;
        for &ctx in std::iter::once(&cn.creator)
            .chain(cn.waiting.iter())
            .filter(|c| !c.is_null())
        {
            log!(NGX_LOG_ERR, client_log((*ctx).r), "sqldb: {msg}");
        }
        fail_all(conn, Some(out));
        (*(*conn).pool).close(conn);
    }
}

/// The connection broke: every request on it fails (or, when it never got
/// a byte of its results from a pooled connection, tries again elsewhere).
unsafe fn broken_into(conn: *mut Conn, msg: &str, out: &mut Vec<Outcome>) {
    // SAFETY: conn is live.
    unsafe {
        let start = out.len();
        fail_all(conn, Some(out));
        for o in &out[start..] {
            if let Outcome::Failed { ctx, lost } = o {
                let level = if *lost == Lost::NotSent {
                    NGX_LOG_INFO
                } else {
                    NGX_LOG_ERR
                };
                log!(level, client_log((**ctx).r), "sqldb: {msg}");
            }
        }
        (*(*conn).pool).close(conn);
    }
}

/// `broken_into` from outside an event handler: delivers at once.
unsafe fn broken(conn: *mut Conn, msg: &str) {
    let mut out = Vec::new();
    // SAFETY: conn is live.
    unsafe {
        broken_into(conn, msg, &mut out);
        deliver(out);
    }
}

/// Answers the requests whose results are in or whose connection failed,
/// after the connection is settled (so no request touches it any more).
unsafe fn deliver(out: Vec<Outcome>) {
    for o in out {
        // SAFETY: each ctx is a live request, detached from its connection.
        unsafe {
            let ctx = match o {
                Outcome::Complete(ctx) | Outcome::Failed { ctx, .. } | Outcome::Refused(ctx) => &mut *ctx,
            };
            let r = ctx.r;
            let client = (*r).connection;
            set_log_request((*client).log, r);
            match o {
                Outcome::Complete(_) => complete(r),
                Outcome::Refused(_) => fail(r, HTTP_INTERNAL_SERVER_ERROR, false),
                Outcome::Failed {
                    lost: Lost::NotSent, ..
                } => next_after_stale(r),
                Outcome::Failed {
                    lost: Lost::Connect, ..
                } => next(r, HTTP_BAD_GATEWAY, NGX_HTTP_UPSTREAM_FT_ERROR),
                Outcome::Failed { lost: Lost::Sent, .. } => fail(r, HTTP_BAD_GATEWAY, true),
            }
            ngx_http_run_posted_requests(client);
        }
    }
}

/// What the error log says the request was doing ("... while reading result").
unsafe fn set_action(r: *mut ngx_http_request_t, action: &'static std::ffi::CStr) {
    // SAFETY: r and its connection's log are live; the text is static.
    unsafe { (*client_log(r)).action = action.as_ptr() as *mut _ };
}

/// Our end of the upstream, as nginx's static ngx_http_upstream_finalize_request
/// does it: timings, the peer back to the balancer, no further cleanup.
unsafe fn finish_upstream(r: *mut ngx_http_request_t, status: ngx_int_t, peer_state: ngx_uint_t) {
    // SAFETY: r is live with an upstream.
    unsafe {
        let u = (*r).upstream;
        if let Some(ctx) = ctx_of(r) {
            ctx.done = true;
            detach(ctx);
        }
        if !(*u).cleanup.is_null() {
            *(*u).cleanup = None;
            (*u).cleanup = ptr::null_mut();
        }
        if !(*u).state.is_null() {
            let st = &mut *(*u).state;
            st.status = status as ngx_uint_t;
            if st.response_time == ngx_msec_t::MAX {
                st.response_time = current_msec().wrapping_sub((*u).start_time);
            }
        }
        if !(*u).peer.sockaddr.is_null() {
            if let Some(free) = (*u).peer.free {
                free(&mut (*u).peer, (*u).peer.data, peer_state);
            }
            (*u).peer.sockaddr = ptr::null_mut();
        }
        (*u).peer.connection = ptr::null_mut();
        (*r).read_event_handler = Some(ngx_http_block_reading);
    }
}

/// Ends the request with an error status (nginx's error page).
unsafe fn fail(r: *mut ngx_http_request_t, status: ngx_int_t, peer_failed: bool) {
    // SAFETY: r is live.
    unsafe {
        if ctx_of(r).is_some_and(|c| c.done) {
            return;
        }
        let state = if peer_failed { NGX_PEER_FAILED as ngx_uint_t } else { 0 };
        // Once rows are out, no status can follow: the response is cut short.
        let streamed = ctx_of(r).and_then(|c| c.streaming.as_ref()).is_some_and(|s| s.started);
        finish_upstream(r, status, state);
        ngx_http_finalize_request(r, if streamed { ERROR } else { status });
    }
}

/// A connection attempt failed: try the next server if the balancer has one.
unsafe fn next(r: *mut ngx_http_request_t, status: ngx_int_t, ft: u32) {
    // SAFETY: r is live.
    unsafe { next_peer(r, status, ft, false) }
}

/// The request waited on a connection that closed before its query was
/// sent: not the server's failure (the balancer is not told so), and one
/// more try, as nginx gives its cached keepalive connections.
unsafe fn next_after_stale(r: *mut ngx_http_request_t) {
    // SAFETY: r is live.
    unsafe { next_peer(r, HTTP_BAD_GATEWAY, NGX_HTTP_UPSTREAM_FT_ERROR, true) }
}

unsafe fn next_peer(r: *mut ngx_http_request_t, status: ngx_int_t, ft: u32, stale: bool) {
    // SAFETY: r is live with our upstream.
    unsafe {
        if ctx_of(r).is_some_and(|c| c.done) {
            return;
        }
        let u = (*r).upstream;
        let lcf = loc_conf(r);
        if !(*u).state.is_null() {
            (*(*u).state).status = status as ngx_uint_t;
            (*(*u).state).response_time = current_msec().wrapping_sub((*u).start_time);
        }
        let state = if stale { NGX_PEER_NEXT } else { NGX_PEER_FAILED };
        if let Some(free) = (*u).peer.free {
            free(&mut (*u).peer, (*u).peer.data, state as ngx_uint_t);
        }
        (*u).peer.sockaddr = ptr::null_mut();
        (*u).peer.connection = ptr::null_mut();
        if stale {
            (*u).peer.tries += 1;
        }
        let wanted = lcf.upstream.next_upstream & ft as ngx_uint_t != 0;
        if (*u).peer.tries == 0 || !wanted || (*(*r).connection).error() != 0 {
            fail(r, status, false);
            return;
        }
        reconnect(r, status);
    }
}

/// Asks the balancer for another server and a connection to it.
unsafe fn reconnect(r: *mut ngx_http_request_t, status: ngx_int_t) {
    // SAFETY: r is live with our upstream; the state array exists since the first connect.
    unsafe {
        let u = (*r).upstream;
        let st = ngx_array_push((*r).upstream_states) as *mut ngx_http_upstream_state_t;
        if st.is_null() {
            fail(r, HTTP_INTERNAL_SERVER_ERROR, false);
            return;
        }
        ptr::write_bytes(st, 0, 1);
        (*u).state = st;
        (*u).start_time = current_msec();
        (*st).response_time = ngx_msec_t::MAX;
        (*st).connect_time = ngx_msec_t::MAX;
        (*st).header_time = ngx_msec_t::MAX;
        let rc = ngx_event_connect_peer(&mut (*u).peer);
        (*st).peer = (*u).peer.name;
        match rc {
            AGAIN if ctx_of(r).is_some_and(|c| !c.conn.is_null()) => attach(r),
            BUSY => {
                log!(NGX_LOG_ERR, client_log(r), "no live upstreams");
                fail(r, status, false);
            }
            DECLINED => next(r, HTTP_BAD_GATEWAY, NGX_HTTP_UPSTREAM_FT_ERROR),
            _ => fail(r, HTTP_INTERNAL_SERVER_ERROR, false),
        }
    }
}

/// SQLSTATEs of a parameter value that does not fit its type: invalid text
/// representation, numeric out of range, datetime format and overflow,
/// characters not valid in the encoding, string too long, bad escape.
const BAD_PARAMETER: &[&str] = &["22P02", "22003", "22007", "22008", "22021", "22P05", "22001", "22025"];

/// All results are in: answer the client.
unsafe fn complete(r: *mut ngx_http_request_t) {
    // SAFETY: r is live with our ctx and upstream.
    unsafe {
        let Some(ctx) = ctx_of(r) else { return };
        if ctx.done {
            return;
        }
        let log = client_log(r);
        if let Some(s) = ctx.streaming.as_mut().filter(|s| s.started) {
            let (rows, sent) = (s.rows(), s.rows_sent());
            vars::store_own(r, vars::ROWS, rows.to_string().as_bytes());
            let failed = match ctx.error.take() {
                Some(err) => Some(err.error_summary()),
                None if ctx.stream_failed => Some("sending the rows to the client failed".to_owned()),
                None => None,
            };
            if let Some(why) = failed {
                vars::store_own(r, vars::ERROR_TEXT, why.as_bytes());
                log!(
                    NGX_LOG_ERR,
                    log,
                    "sqldb: the response was cut short after {sent} rows had gone out: {why}"
                );
                finish_upstream(r, HTTP_OK, 0);
                ngx_http_finalize_request(r, ERROR);
                return;
            }
            finish_upstream(r, HTTP_OK, 0);
            let rc = s.finish(r);
            ngx_http_finalize_request(r, rc);
            return;
        }
        if let Some(err) = ctx.error.take() {
            let summary = err.error_summary();
            vars::store_own(r, vars::ERROR_TEXT, summary.as_bytes());
            // A value the server cannot read as its parameter's type is the
            // client's mistake: 400, logged as client errors are.
            if !ctx.params.is_empty() && BAD_PARAMETER.contains(&err.sqlstate().as_str()) {
                log!(NGX_LOG_INFO, log, "sqldb: a parameter was rejected: {summary}");
                fail(r, HTTP_BAD_REQUEST, false);
                return;
            }
            log!(NGX_LOG_ERR, log, "sqldb: query failed: {summary}");
            fail(r, HTTP_INTERNAL_SERVER_ERROR, false);
            return;
        }
        let Some(res) = ctx.last.take() else {
            log!(NGX_LOG_ERR, log, "sqldb: the server returned no result");
            fail(r, HTTP_BAD_GATEWAY, false);
            return;
        };
        if res.kind() == ResultKind::Empty {
            log!(NGX_LOG_ERR, log, "sqldb: the query holds no statement");
            fail(r, HTTP_INTERNAL_SERVER_ERROR, false);
            return;
        }
        let lcf = loc_conf(r);
        vars::store_counts(r, &res);
        let u = (*r).upstream;
        if !(*u).state.is_null() {
            (*(*u).state).header_time = current_msec().wrapping_sub((*u).start_time);
        }
        // The rewrite first: a code of 300 or more without "=" answers with
        // nginx's own page for it (`error_page` applies), before sqldb_set.
        let rewritten = vars::rewrite(r, lcf, &res);
        if let Some((status, false)) = rewritten.filter(|&(s, _)| s >= 300) {
            finish_upstream(r, HTTP_OK, 0);
            ngx_http_finalize_request(r, status as ngx_int_t);
            return;
        }
        if let Err(status) = vars::apply_sets(r, lcf, &res) {
            fail(r, status, false);
            return;
        }
        finish_upstream(r, HTTP_OK, 0);
        // `=code`, or a code below 300: the result with that status.
        let status = rewritten.map_or(HTTP_OK as ngx_uint_t, |(s, _)| s);
        let rc = output::send(r, &res, Output::from_code(lcf.output), status);
        ngx_http_finalize_request(r, rc);
    }
}
