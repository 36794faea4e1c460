//! The request side of the database gateway: the content handler, nginx
//! upstream callbacks, the peer wrapper around the balancer, and the
//! connection state machine driven by nginx events and timers.
//!
//! Flow: the content handler picks the template, evaluates it and starts
//! nginx's upstream. The balancer picks a server; our `peer_get` opens a
//! nonblocking libpq connection and hands its socket to nginx as the peer
//! connection. From then on `pg_event` runs on every read/write readiness or
//! timer of that socket: connect -> send -> read results -> respond.

use std::ffi::{c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, NonNull};

use super::conf::{find_upstream, sqldb_srv_conf, LocConf, SrvConf};
use super::output;
use super::pq::{Flush, PgConn, PgResult, Poll, ResultKind};
use crate::ffi::*;
use crate::ngx_http_gateway_module as MODULE;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connecting,
    Sending,
    Reading,
}

/// A libpq connection and the nginx connection that watches its socket.
pub struct Conn {
    pg: PgConn,
    c: NonNull<ngx_connection_t>,
    phase: Phase,
    write_watched: bool,
}

impl Conn {
    /// Stops watching the socket, frees the nginx connection, then closes
    /// the libpq connection (which closes the socket).
    fn close(self) {
        let c = self.c.as_ptr();
        // SAFETY: c is the live connection made for this socket in peer_get.
        unsafe {
            for ev in [(*c).read, (*c).write] {
                if (*ev).timer_set() != 0 {
                    ngx_del_timer(ev);
                }
                if (*ev).posted() != 0 {
                    ngx_delete_posted_event(ev);
                }
            }
            if (*(*c).read).active() != 0 {
                del_event((*c).read, READ_EVENT, NGX_CLOSE_EVENT as ngx_uint_t);
            }
            if (*(*c).write).active() != 0 {
                del_event((*c).write, WRITE_EVENT, NGX_CLOSE_EVENT as ngx_uint_t);
            }
            if !(*c).pool.is_null() {
                ngx_destroy_pool((*c).pool);
                (*c).pool = ptr::null_mut();
            }
            ngx_free_connection(c);
            (*c).fd = -1;
        }
        drop(self.pg);
    }

    /// Watches the socket for writability only while libpq has bytes to send.
    fn want_write(&mut self, on: bool) -> bool {
        if on == self.write_watched {
            return true;
        }
        // SAFETY: c is live; events are level-triggered so none is lost.
        let ok = unsafe {
            let wev = (*self.c.as_ptr()).write;
            if on {
                add_event(wev, WRITE_EVENT, LEVEL_EVENT)
            } else {
                del_event(wev, WRITE_EVENT, 0)
            }
        };
        if ok {
            self.write_watched = on;
        }
        ok
    }

    fn set_timer(&mut self, ms: ngx_msec_t) {
        // SAFETY: c is live; one timer on the read event serves every phase.
        unsafe {
            let c = self.c.as_ptr();
            if (*(*c).write).timer_set() != 0 {
                ngx_del_timer((*c).write);
            }
            ngx_add_timer((*c).read, ms);
        }
    }
}

/// Per-request peer data: the balancer's own, and the connection in use.
pub struct PeerData {
    srv: *const SrvConf,
    balancer_data: *mut c_void,
    balancer_get: ngx_event_get_peer_pt,
    balancer_free: ngx_event_free_peer_pt,
    conn: Option<Conn>,
}

impl Drop for PeerData {
    fn drop(&mut self) {
        // Safety net: a request pool never takes an open connection with it.
        if let Some(conn) = self.conn.take() {
            conn.close();
        }
    }
}

/// Per-request state.
pub struct Ctx {
    query: CString,
    last: Option<PgResult>,
    error: Option<PgResult>,
    done: bool,
    /// Set by peer_init: the peer data of this request.
    peer: *mut PeerData,
}

// ---------------------------------------------------------------- peer ----

/// Wraps the balancer's per-request init (round robin, least_conn, hash ...).
pub(crate) unsafe extern "C" fn peer_init(
    r: *mut ngx_http_request_t,
    us: *mut ngx_http_upstream_srv_conf_t,
) -> ngx_int_t {
    // SAFETY: nginx calls this with a live request that has an upstream,
    // for an upstream block that postconfiguration found to be ours.
    unsafe {
        let Some(srv) = sqldb_srv_conf(us) else { return ERROR };
        let Some(init) = srv.balancer_init else { return ERROR };
        if init(r, us) != OK {
            return ERROR;
        }
        let u = (*r).upstream;
        let pd = PeerData {
            srv,
            balancer_data: (*u).peer.data,
            balancer_get: (*u).peer.get,
            balancer_free: (*u).peer.free,
            conn: None,
        };
        let Some(pd) = pool_alloc((*r).pool, pd) else {
            return ERROR;
        };
        (*u).peer.data = pd.as_ptr().cast();
        match ctx_of(r) {
            Some(ctx) => ctx.peer = pd.as_ptr(),
            None => return ERROR,
        }
        (*u).peer.get = Some(peer_get);
        (*u).peer.free = Some(peer_free);
        // TLS session hooks of the balancer would receive our data: nginx never
        // calls them for us (u->ssl stays off), but clear them to be sure.
        (*u).peer.set_session = None;
        (*u).peer.save_session = None;
        OK
    }
}

unsafe extern "C" fn peer_get(pc: *mut ngx_peer_connection_t, data: *mut c_void) -> ngx_int_t {
    // SAFETY: data is the PeerData installed by peer_init; pc is the request's peer.
    unsafe {
        let pd = &mut *(data as *mut PeerData);
        let Some(get) = pd.balancer_get else { return ERROR };
        let rc = get(pc, pd.balancer_data);
        if rc != OK {
            return rc;
        }
        let name = String::from_utf8_lossy(bytes(&*(*pc).name)).into_owned();
        let sockaddr = std::slice::from_raw_parts((*pc).sockaddr as *const u8, (*pc).socklen as usize);
        let Some(conninfo) = (*pd.srv).conninfo_for(sockaddr) else {
            log!(NGX_LOG_ALERT, (*pc).log, "sqldb: no sqldb_server for peer {name}");
            return ERROR;
        };
        let pg = match PgConn::start(conninfo) {
            Ok(pg) => pg,
            Err(msg) => {
                log!(NGX_LOG_ERR, (*pc).log, "sqldb: connecting to {name} failed: {msg}");
                return DECLINED;
            }
        };
        let fd = pg.socket();
        let c = ngx_get_connection(fd, (*pc).log);
        let Some(c) = NonNull::new(c) else {
            return ERROR; // nginx logged "worker_connections are not enough"; pg drops here
        };
        let cp = c.as_ptr();
        (*(*cp).read).log = (*pc).log;
        (*(*cp).write).log = (*pc).log;
        let mut conn = Conn {
            pg,
            c,
            phase: Phase::Connecting,
            write_watched: false,
        };
        // libpq starts as if it had asked for writability.
        if !add_event((*cp).read, READ_EVENT, LEVEL_EVENT) || !conn.want_write(true) {
            conn.close();
            return ERROR;
        }
        (*pc).connection = cp;
        pd.conn = Some(conn);
        AGAIN
    }
}

unsafe extern "C" fn peer_free(pc: *mut ngx_peer_connection_t, data: *mut c_void, state: ngx_uint_t) {
    // SAFETY: data is our PeerData; the connection, if any, is ours to close.
    unsafe {
        let pd = &mut *(data as *mut PeerData);
        if let Some(conn) = pd.conn.take() {
            conn.close();
        }
        (*pc).connection = ptr::null_mut();
        if let Some(free) = pd.balancer_free {
            free(pc, pd.balancer_data, state);
        }
    }
}

// ------------------------------------------------------------- request ----

unsafe fn ctx_of<'a>(r: *mut ngx_http_request_t) -> Option<&'a mut Ctx> {
    // SAFETY: r->ctx has a slot per http module; ours holds a Ctx or null.
    unsafe {
        let p = *(*r).ctx.add((*ptr::addr_of!(MODULE)).ctx_index) as *mut Ctx;
        p.as_mut()
    }
}

unsafe fn peer_data<'a>(r: *mut ngx_http_request_t) -> Option<&'a mut PeerData> {
    // SAFETY: ctx.peer is set by peer_init to PeerData in the request pool.
    unsafe { ctx_of(r).and_then(|ctx| ctx.peer.as_mut()) }
}

unsafe extern "C" fn create_request(_r: *mut ngx_http_request_t) -> ngx_int_t {
    OK
}

unsafe extern "C" fn reinit_request(_r: *mut ngx_http_request_t) -> ngx_int_t {
    OK
}

unsafe extern "C" fn process_header(_r: *mut ngx_http_request_t) -> ngx_int_t {
    ERROR // never reached: our event handler replaces nginx's reader
}

unsafe extern "C" fn abort_request(_r: *mut ngx_http_request_t) {}

unsafe extern "C" fn finalize_request(r: *mut ngx_http_request_t, _rc: ngx_int_t) {
    // SAFETY: called by nginx's upstream with a live request.
    if let Some(ctx) = unsafe { ctx_of(r) } {
        ctx.done = true;
    }
}

/// Runs `f`, turning a panic into a 500 so that none crosses into nginx.
fn guarded(r: *mut ngx_http_request_t, f: impl FnOnce() -> ngx_int_t) -> ngx_int_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(rc) => rc,
        Err(_) => {
            // SAFETY: r is the live request the closure worked on.
            let log = unsafe { (*(*r).connection).log };
            log!(
                NGX_LOG_ALERT,
                log,
                "sqldb: internal error (panic) while handling the request"
            );
            HTTP_INTERNAL_SERVER_ERROR
        }
    }
}

/// The location's content handler (set by `sqldb_pass`).
pub(crate) unsafe extern "C" fn content_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls the content handler with a live request.
    guarded(r, || unsafe { start(r) })
}

unsafe fn start(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: r is live; every pointer below comes from it or its configuration.
    unsafe {
        let log = (*(*r).connection).log;
        let lcf = &mut *request_loc_conf::<LocConf>(r, ptr::addr_of!(MODULE));
        if lcf.queries.is_empty() {
            log!(
                NGX_LOG_ERR,
                log,
                "sqldb: no \"sqldb_query\" is configured for this location"
            );
            return HTTP_INTERNAL_SERVER_ERROR;
        }
        let Some(&template) = lcf.queries.select((*r).method as u32) else {
            log!(
                NGX_LOG_INFO,
                log,
                "sqldb: no query for method \"{}\"",
                String::from_utf8_lossy(bytes(&(*r).method_name))
            );
            return HTTP_NOT_ALLOWED;
        };
        let rc = ngx_http_discard_request_body(r);
        if rc != OK {
            return rc;
        }
        let mut sql = ngx_str_t {
            len: 0,
            data: ptr::null_mut(),
        };
        if ngx_http_complex_value(r, template, &mut sql) != OK {
            return HTTP_INTERNAL_SERVER_ERROR;
        }
        let sql = bytes(&sql);
        if sql.is_empty() {
            log!(
                NGX_LOG_ERR,
                log,
                "sqldb: the query is empty after variable substitution"
            );
            return HTTP_INTERNAL_SERVER_ERROR;
        }
        let Ok(query) = CString::new(sql) else {
            log!(NGX_LOG_ERR, log, "sqldb: the query contains a NUL byte");
            return HTTP_BAD_REQUEST;
        };

        if ngx_http_upstream_create(r) != OK {
            return HTTP_INTERNAL_SERVER_ERROR;
        }
        let u = (*r).upstream;
        if !lcf.pass_var.is_null() {
            let mut name = ngx_str_t {
                len: 0,
                data: ptr::null_mut(),
            };
            if ngx_http_complex_value(r, lcf.pass_var, &mut name) != OK {
                return HTTP_INTERNAL_SERVER_ERROR;
            }
            let umcf = *(*r).main_conf.add(ngx_http_upstream_module.ctx_index) as *mut ngx_http_upstream_main_conf_t;
            if find_upstream(umcf, bytes(&name)).is_none() {
                log!(
                    NGX_LOG_ERR,
                    log,
                    "sqldb: \"sqldb_pass\" value \"{}\" names no upstream with \"sqldb_server\"",
                    String::from_utf8_lossy(bytes(&name))
                );
                return HTTP_INTERNAL_SERVER_ERROR;
            }
            let resolved = ngx_pcalloc((*r).pool, std::mem::size_of::<ngx_http_upstream_resolved_t>())
                as *mut ngx_http_upstream_resolved_t;
            if resolved.is_null() {
                return HTTP_INTERNAL_SERVER_ERROR;
            }
            (*resolved).host = name;
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
            query,
            last: None,
            error: None,
            done: false,
            peer: ptr::null_mut(),
        };
        let Some(ctx) = pool_alloc((*r).pool, ctx) else {
            return HTTP_INTERNAL_SERVER_ERROR;
        };
        *(*r).ctx.add((*ptr::addr_of!(MODULE)).ctx_index) = ctx.as_ptr().cast();

        let main = (*r).main;
        (*main).set_count((*main).count() + 1);
        ngx_http_upstream_init(r);
        // A connection is now being opened, unless the upstream already failed.
        if !(*ctx.as_ptr()).done && !(*u).peer.connection.is_null() && peer_data(r).is_some_and(|pd| pd.conn.is_some())
        {
            attach(r);
        }
        DONE
    }
}

/// Takes over a freshly opened peer connection from nginx's upstream code.
unsafe fn attach(r: *mut ngx_http_request_t) {
    // SAFETY: r is live and u->peer.connection is the connection of our Conn.
    unsafe {
        let u = (*r).upstream;
        let lcf = &*request_loc_conf::<LocConf>(r, ptr::addr_of!(MODULE));
        let c = (*u).peer.connection;
        (*c).data = r.cast();
        (*c).log = (*(*r).connection).log;
        (*(*c).read).log = (*c).log;
        (*(*c).write).log = (*c).log;
        (*(*c).read).handler = Some(pg_event);
        (*(*c).write).handler = Some(pg_event);
        if let Some(pd) = peer_data(r) {
            if let Some(conn) = pd.conn.as_mut() {
                conn.set_timer(lcf.connect_timeout);
            }
        }
    }
}

/// Read/write readiness or a timer on a database connection.
unsafe extern "C" fn pg_event(ev: *mut ngx_event_t) {
    // SAFETY: ev belongs to a connection attached to a live request.
    unsafe {
        let c = (*ev).data as *mut ngx_connection_t;
        let r = (*c).data as *mut ngx_http_request_t;
        let client = (*r).connection;
        set_log_request((*client).log, r);
        let timed_out = (*ev).timedout() != 0;
        (*ev).set_timedout(0);
        let rc = guarded(r, || {
            drive(r, timed_out);
            OK
        });
        if rc != OK {
            fail(r, HTTP_INTERNAL_SERVER_ERROR, false);
        }
        ngx_http_run_posted_requests(client);
    }
}

/// What the state machine decided.
enum Step {
    Wait,
    Failed {
        status: ngx_int_t,
        connecting: bool,
        msg: String,
    },
    Complete,
}

unsafe fn drive(r: *mut ngx_http_request_t, timed_out: bool) {
    // SAFETY: r is live with our upstream, ctx and peer data.
    unsafe {
        let u = (*r).upstream;
        let Some(ctx) = ctx_of(r) else { return };
        if ctx.done {
            return;
        }
        let Some(pd) = ctx.peer.as_mut() else { return };
        let Some(conn) = pd.conn.as_mut() else { return };
        let lcf = &*request_loc_conf::<LocConf>(r, ptr::addr_of!(MODULE));

        let step = if timed_out {
            let connecting = conn.phase == Phase::Connecting;
            let (what, ms) = if connecting {
                ("connecting", lcf.connect_timeout)
            } else {
                ("waiting for the result", lcf.result_timeout)
            };
            Step::Failed {
                status: HTTP_GATEWAY_TIME_OUT,
                connecting,
                msg: format!("timed out ({ms} ms) {what}"),
            }
        } else {
            advance(r, u, ctx, conn, lcf)
        };
        match step {
            Step::Wait => {}
            Step::Complete => complete(r),
            Step::Failed {
                status,
                connecting,
                msg,
            } => {
                log!(NGX_LOG_ERR, (*(*r).connection).log, "sqldb: {msg}");
                if connecting {
                    next(r, status);
                } else {
                    fail(r, status, true);
                }
            }
        }
    }
}

unsafe fn advance(
    r: *mut ngx_http_request_t,
    u: *mut ngx_http_upstream_t,
    ctx: &mut Ctx,
    conn: &mut Conn,
    lcf: &LocConf,
) -> Step {
    let broken = |conn: &Conn, what: &str| Step::Failed {
        status: HTTP_BAD_GATEWAY,
        connecting: false,
        msg: format!("{what}: {}", conn.pg.error_message()),
    };
    loop {
        match conn.phase {
            Phase::Connecting => match conn.pg.poll_connect() {
                Poll::Reading => {
                    return if conn.want_write(false) {
                        Step::Wait
                    } else {
                        broken(conn, "event error")
                    }
                }
                Poll::Writing => {
                    return if conn.want_write(true) {
                        Step::Wait
                    } else {
                        broken(conn, "event error")
                    }
                }
                Poll::Failed => {
                    return Step::Failed {
                        status: HTTP_BAD_GATEWAY,
                        connecting: true,
                        msg: format!("connecting failed: {}", conn.pg.error_message()),
                    }
                }
                Poll::Ready => {
                    // SAFETY: c is live for as long as conn.
                    if conn.pg.socket() != unsafe { (*conn.c.as_ptr()).fd } {
                        return Step::Failed {
                            status: HTTP_BAD_GATEWAY,
                            connecting: true,
                            msg: "libpq replaced its socket while connecting".into(),
                        };
                    }
                    if !conn.pg.set_nonblocking() {
                        return broken(conn, "setting nonblocking mode failed");
                    }
                    // SAFETY: u and its state are live.
                    unsafe {
                        if !(*u).state.is_null() {
                            (*(*u).state).connect_time = current_msec().wrapping_sub((*u).start_time);
                        }
                        set_action(r, c"sending query to PostgreSQL");
                    }
                    if !conn.pg.send_query(&ctx.query) {
                        return broken(conn, "sending the query failed");
                    }
                    conn.set_timer(lcf.result_timeout);
                    conn.phase = Phase::Sending;
                }
            },
            Phase::Sending => {
                if !conn.pg.consume_input() {
                    return broken(conn, "reading from PostgreSQL failed");
                }
                match conn.pg.flush() {
                    Flush::Done => {
                        if !conn.want_write(false) {
                            return broken(conn, "event error");
                        }
                        conn.phase = Phase::Reading;
                        // SAFETY: r is live.
                        unsafe { set_action(r, c"reading result from PostgreSQL") };
                    }
                    Flush::Again => {
                        return if conn.want_write(true) {
                            Step::Wait
                        } else {
                            broken(conn, "event error")
                        }
                    }
                    Flush::Failed => return broken(conn, "sending the query failed"),
                }
            }
            Phase::Reading => {
                if !conn.pg.consume_input() {
                    return broken(conn, "reading the result failed");
                }
                while !conn.pg.is_busy() {
                    let Some(res) = conn.pg.get_result() else {
                        return Step::Complete;
                    };
                    match res.kind() {
                        ResultKind::Error => {
                            if ctx.error.is_none() {
                                ctx.error = Some(res);
                            }
                        }
                        ResultKind::Unsupported => {
                            return Step::Failed {
                                status: HTTP_INTERNAL_SERVER_ERROR,
                                connecting: false,
                                msg: format!(
                                    "query returned \"{}\", which the gateway cannot serve",
                                    res.command_status()
                                ),
                            };
                        }
                        _ => ctx.last = Some(res),
                    }
                }
                return Step::Wait;
            }
        }
    }
}

/// What the error log says the request was doing ("... while reading result").
unsafe fn set_action(r: *mut ngx_http_request_t, action: &'static std::ffi::CStr) {
    // SAFETY: r and its connection's log are live; the text is static.
    unsafe { (*(*(*r).connection).log).action = action.as_ptr() as *mut _ };
}

/// Our end of the upstream, as nginx's static ngx_http_upstream_finalize_request
/// does it: timings, the peer back to the balancer, no further cleanup.
unsafe fn finish_upstream(r: *mut ngx_http_request_t, status: ngx_int_t, peer_state: ngx_uint_t) {
    // SAFETY: r is live with an upstream.
    unsafe {
        let u = (*r).upstream;
        if let Some(ctx) = ctx_of(r) {
            ctx.done = true;
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
        if (*u).peer.free.is_some() && !(*u).peer.sockaddr.is_null() {
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
        finish_upstream(r, status, state);
        ngx_http_finalize_request(r, status);
    }
}

/// A connection attempt failed: try the next server if the balancer has one.
unsafe fn next(r: *mut ngx_http_request_t, status: ngx_int_t) {
    // SAFETY: r is live with our upstream.
    unsafe {
        let u = (*r).upstream;
        if !(*u).state.is_null() {
            (*(*u).state).status = status as ngx_uint_t;
            (*(*u).state).response_time = current_msec().wrapping_sub((*u).start_time);
        }
        if let Some(free) = (*u).peer.free {
            free(&mut (*u).peer, (*u).peer.data, NGX_PEER_FAILED as ngx_uint_t);
        }
        (*u).peer.sockaddr = ptr::null_mut();
        (*u).peer.connection = ptr::null_mut();
        if (*u).peer.tries == 0 || (*(*r).connection).error() != 0 {
            fail(r, status, false);
            return;
        }
        reconnect(r, status);
    }
}

/// Asks the balancer for another server and opens a connection to it.
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
            AGAIN if !(*u).peer.connection.is_null() => attach(r),
            BUSY => {
                log!(NGX_LOG_ERR, (*(*r).connection).log, "no live upstreams");
                fail(r, status, false);
            }
            DECLINED => next(r, HTTP_BAD_GATEWAY),
            _ => fail(r, HTTP_INTERNAL_SERVER_ERROR, false),
        }
    }
}

/// All results are in: give the connection back and answer the client.
unsafe fn complete(r: *mut ngx_http_request_t) {
    // SAFETY: r is live with our ctx and upstream.
    unsafe {
        let Some(ctx) = ctx_of(r) else { return };
        let log = (*(*r).connection).log;
        if let Some(err) = ctx.error.take() {
            log!(NGX_LOG_ERR, log, "sqldb: query failed: {}", err.error_summary());
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
        let u = (*r).upstream;
        if !(*u).state.is_null() {
            (*(*u).state).header_time = current_msec().wrapping_sub((*u).start_time);
        }
        finish_upstream(r, HTTP_OK, 0);
        let rc = output::send_rds(r, &res);
        ngx_http_finalize_request(r, rc);
    }
}
