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
use std::ptr;

use super::conf::{find_upstream, sqldb_srv_conf, LocConf, SrvConf, Template};
use super::conn::{statement_name, Conn, Phase};
use super::output;
use super::pq::{Flush, PgConn, PgResult, Poll, ResultKind};
use crate::ffi::*;
use crate::ngx_http_gateway_module as MODULE;
use gateway_core::sql::has_several_statements;

/// Per-request peer data: the balancer's own, and the connection in use.
pub struct PeerData {
    srv: *mut SrvConf,
    balancer_data: *mut c_void,
    balancer_get: ngx_event_get_peer_pt,
    balancer_free: ngx_event_free_peer_pt,
    /// The balancer picked the current peer (not so for a pooled
    /// connection taken in single mode): it must be told when it is freed.
    balancer_used: bool,
    conn: Option<Box<Conn>>,
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
    template: *const Template,
    /// The query holds several statements: simple protocol only.
    several: bool,
    /// The current round trip prepares the statement (the execution follows).
    preparing: bool,
    /// The current round trip executes a named prepared statement.
    executing_prepared: bool,
    /// Some result (or error) of this request's query has arrived.
    got_result: bool,
    /// The prepared statement had vanished (DEALLOCATE, DISCARD, a schema
    /// change): prepare it again and run it once more, once.
    reprepare: bool,
    reprepared: bool,
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
            balancer_used: false,
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
        let srv = &mut *pd.srv;
        pd.balancer_used = false;
        if srv.pool.single {
            if let Some(conn) = srv.pool.take(None) {
                let a = &mut srv.addrs[conn.addr];
                (*pc).sockaddr = a.sockaddr.as_mut_ptr().cast();
                (*pc).socklen = a.sockaddr.len() as socklen_t;
                (*pc).name = &mut a.name;
                return use_conn(pc, pd, conn);
            }
        }
        let Some(get) = pd.balancer_get else { return ERROR };
        let rc = get(pc, pd.balancer_data);
        if rc != OK {
            return rc;
        }
        pd.balancer_used = true;
        let name = String::from_utf8_lossy(bytes(&*(*pc).name)).into_owned();
        let sockaddr = std::slice::from_raw_parts((*pc).sockaddr as *const u8, (*pc).socklen as usize);
        let Some(addr) = srv.addr_index(sockaddr) else {
            log!(NGX_LOG_ALERT, (*pc).log, "sqldb: no sqldb_server for peer {name}");
            return ERROR;
        };
        if let Some(conn) = srv.pool.take(Some(addr)) {
            return use_conn(pc, pd, conn);
        }
        let pg = match PgConn::start(&srv.addrs[addr].conninfo) {
            Ok(pg) => pg,
            Err(msg) => {
                log!(NGX_LOG_ERR, (*pc).log, "sqldb: connecting to {name} failed: {msg}");
                return DECLINED;
            }
        };
        // On failure nginx has logged why ("worker_connections are not enough").
        let Some(conn) = Conn::wrap(pg, addr, (*pc).log, &mut srv.pool) else {
            return ERROR;
        };
        (*pc).set_cached(0);
        (*pc).connection = conn.raw();
        pd.conn = Some(conn);
        AGAIN
    }
}

/// Hands a pooled connection to the request; `attach` starts the query.
unsafe fn use_conn(pc: *mut ngx_peer_connection_t, pd: &mut PeerData, conn: Box<Conn>) -> ngx_int_t {
    // SAFETY: pc is the request's live peer connection.
    unsafe {
        (*pc).set_cached(1);
        (*pc).connection = conn.raw();
    }
    pd.conn = Some(conn);
    AGAIN
}

unsafe extern "C" fn peer_free(pc: *mut ngx_peer_connection_t, data: *mut c_void, state: ngx_uint_t) {
    // SAFETY: data is our PeerData; the connection, if any, is ours to keep or close.
    unsafe {
        let pd = &mut *(data as *mut PeerData);
        if let Some(conn) = pd.conn.take() {
            if state & NGX_PEER_FAILED as ngx_uint_t == 0 {
                (*pd.srv).pool.release(conn);
            } else {
                conn.close();
            }
        }
        (*pc).connection = ptr::null_mut();
        if pd.balancer_used {
            pd.balancer_used = false;
            if let Some(free) = pd.balancer_free {
                free(pc, pd.balancer_data, state);
            }
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
            let method = String::from_utf8_lossy(bytes(&(*r).method_name));
            log!(NGX_LOG_INFO, log, "sqldb: no query for method \"{method}\"");
            return HTTP_NOT_ALLOWED;
        };
        let rc = ngx_http_discard_request_body(r);
        if rc != OK {
            return rc;
        }
        let tmpl = &*template;
        let mut sql = ngx_str_t {
            len: 0,
            data: ptr::null_mut(),
        };
        if ngx_http_complex_value(r, tmpl.cv, &mut sql) != OK {
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
        let several = if tmpl.constant {
            tmpl.several
        } else {
            has_several_statements(sql)
        };
        let Ok(query) = CString::new(sql) else {
            log!(NGX_LOG_ERR, log, "sqldb: the query contains a NUL byte");
            return HTTP_BAD_REQUEST;
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
            let resolved = ngx_pcalloc((*r).pool, std::mem::size_of::<ngx_http_upstream_resolved_t>())
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
            query,
            template,
            several,
            preparing: false,
            executing_prepared: false,
            got_result: false,
            reprepare: false,
            reprepared: false,
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
        // A connection is now being opened or was taken from the pool,
        // unless the upstream already failed.
        if !(*ctx.as_ptr()).done && !(*u).peer.connection.is_null() && peer_data(r).is_some_and(|pd| pd.conn.is_some())
        {
            attach(r);
        }
        DONE
    }
}

/// Takes over the peer connection from nginx's upstream code. A new one
/// waits for libpq's connect events; a pooled one starts the query at once.
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
        let Some(conn) = peer_data(r).and_then(|pd| pd.conn.as_mut()) else {
            return;
        };
        if conn.phase == Phase::Connecting {
            conn.set_timer(lcf.connect_timeout);
        } else {
            conn.set_timer(lcf.result_timeout);
            if !(*u).state.is_null() {
                (*(*u).state).connect_time = 0;
            }
            ngx_post_event((*c).write, ptr::addr_of_mut!(ngx_posted_events));
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
            let msg = format!("timed out ({ms} ms) {what}");
            Step::Failed {
                status: HTTP_GATEWAY_TIME_OUT,
                connecting,
                msg,
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
                // A pooled connection that the server had closed before our
                // query reached it: try again on another, like nginx does
                // for its cached keepalive connections.
                let stale = !connecting && conn.reused && !ctx.got_result && conn.pg.is_bad();
                if stale {
                    log!(
                        NGX_LOG_INFO,
                        (*(*r).connection).log,
                        "sqldb: pooled connection was closed: {msg}"
                    );
                    (*u).peer.tries += 1;
                    next(r, HTTP_BAD_GATEWAY, NGX_HTTP_UPSTREAM_FT_ERROR);
                    return;
                }
                log!(NGX_LOG_ERR, (*(*r).connection).log, "sqldb: {msg}");
                if connecting {
                    let ft = if status == HTTP_GATEWAY_TIME_OUT {
                        NGX_HTTP_UPSTREAM_FT_TIMEOUT
                    } else {
                        NGX_HTTP_UPSTREAM_FT_ERROR
                    };
                    next(r, status, ft);
                } else {
                    fail(r, status, true);
                }
            }
        }
    }
}

/// Sends the request's query on an idle connection, choosing the protocol:
/// a constant single-statement template is prepared once per connection and
/// executed by name; another single statement runs as the unnamed statement;
/// several statements go through the simple protocol.
fn send_query(ctx: &mut Ctx, conn: &mut Conn, lcf: &LocConf) -> bool {
    // SAFETY: the template lives in the configuration for the cycle.
    let tmpl = unsafe { &*ctx.template };
    ctx.preparing = false;
    ctx.executing_prepared = false;
    if ctx.several {
        return conn.pg.send_query(&ctx.query);
    }
    if lcf.prepare == 1 && tmpl.constant {
        let name = statement_name(tmpl.id);
        if conn.is_prepared(tmpl.id) {
            ctx.executing_prepared = true;
            return conn.pg.send_prepared(&name);
        }
        if conn.can_prepare_more() {
            ctx.preparing = true;
            return conn.pg.send_prepare(&name, &ctx.query);
        }
    }
    conn.pg.send_unnamed(&ctx.query)
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
    let event_error = |conn: &Conn| broken(conn, "event error");
    loop {
        match conn.phase {
            Phase::Connecting => match conn.pg.poll_connect() {
                Poll::Reading => {
                    return if conn.want_write(false) {
                        Step::Wait
                    } else {
                        event_error(conn)
                    }
                }
                Poll::Writing => {
                    return if conn.want_write(true) {
                        Step::Wait
                    } else {
                        event_error(conn)
                    }
                }
                Poll::Failed => {
                    let msg = format!("connecting failed: {}", conn.pg.error_message());
                    return Step::Failed {
                        status: HTTP_BAD_GATEWAY,
                        connecting: true,
                        msg,
                    };
                }
                Poll::Ready => {
                    // SAFETY: c is live for as long as conn.
                    if conn.pg.socket() != unsafe { (*conn.raw()).fd } {
                        let msg = "libpq replaced its socket while connecting".into();
                        return Step::Failed {
                            status: HTTP_BAD_GATEWAY,
                            connecting: true,
                            msg,
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
                    }
                    conn.set_timer(lcf.result_timeout);
                    conn.phase = Phase::Idle;
                }
            },
            Phase::Idle => {
                if ctx.got_result && !ctx.preparing {
                    return Step::Complete;
                }
                // SAFETY: r is live.
                unsafe { set_action(r, c"sending query to PostgreSQL") };
                if !send_query(ctx, conn, lcf) {
                    return broken(conn, "sending the query failed");
                }
                conn.phase = Phase::Sending;
            }
            Phase::Sending => {
                if !conn.pg.consume_input() {
                    return broken(conn, "reading from PostgreSQL failed");
                }
                match conn.pg.flush() {
                    Flush::Done => {
                        if !conn.want_write(false) {
                            return event_error(conn);
                        }
                        conn.phase = Phase::Reading;
                        // SAFETY: r is live.
                        unsafe { set_action(r, c"reading result from PostgreSQL") };
                    }
                    Flush::Again => {
                        return if conn.want_write(true) {
                            Step::Wait
                        } else {
                            event_error(conn)
                        }
                    }
                    Flush::Failed => return broken(conn, "sending the query failed"),
                }
            }
            Phase::Reading => {
                if !conn.pg.consume_input() {
                    return broken(conn, "reading the result failed");
                }
                loop {
                    if conn.pg.is_busy() {
                        return Step::Wait;
                    }
                    let Some(res) = conn.pg.get_result() else { break };
                    ctx.got_result = true;
                    match res.kind() {
                        ResultKind::Error => {
                            let vanished = ctx.executing_prepared && matches!(res.sqlstate().as_str(), "26000" | "0A000");
                            if vanished {
                                conn.forget_prepared();
                                if !ctx.reprepared {
                                    ctx.reprepare = true;
                                    continue;
                                }
                            }
                            if ctx.error.is_none() {
                                ctx.error = Some(res);
                            }
                        }
                        ResultKind::Unsupported => {
                            let tag = res.command_status();
                            let msg = format!("query returned \"{tag}\", which the gateway cannot serve");
                            return Step::Failed {
                                status: HTTP_INTERNAL_SERVER_ERROR,
                                connecting: false,
                                msg,
                            };
                        }
                        _ if ctx.preparing => {}
                        _ => ctx.last = Some(res),
                    }
                }
                // Every result of this round trip is in: the connection is idle again.
                conn.phase = Phase::Idle;
                if ctx.reprepare {
                    ctx.reprepare = false;
                    ctx.reprepared = true;
                    ctx.got_result = false;
                    continue;
                }
                if ctx.preparing {
                    if ctx.error.is_some() {
                        return Step::Complete;
                    }
                    // SAFETY: the template lives in the configuration.
                    conn.add_prepared(unsafe { (*ctx.template).id });
                    ctx.preparing = false;
                    ctx.executing_prepared = true;
                    if !conn.pg.send_prepared(&statement_name(unsafe { (*ctx.template).id })) {
                        return broken(conn, "sending the query failed");
                    }
                    conn.phase = Phase::Sending;
                    continue;
                }
                return Step::Complete;
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
unsafe fn next(r: *mut ngx_http_request_t, status: ngx_int_t, ft: u32) {
    // SAFETY: r is live with our upstream.
    unsafe {
        let u = (*r).upstream;
        let lcf = &*request_loc_conf::<LocConf>(r, ptr::addr_of!(MODULE));
        if !(*u).state.is_null() {
            (*(*u).state).status = status as ngx_uint_t;
            (*(*u).state).response_time = current_msec().wrapping_sub((*u).start_time);
        }
        if let Some(free) = (*u).peer.free {
            free(&mut (*u).peer, (*u).peer.data, NGX_PEER_FAILED as ngx_uint_t);
        }
        (*u).peer.sockaddr = ptr::null_mut();
        (*u).peer.connection = ptr::null_mut();
        let wanted = lcf.upstream.next_upstream & ft as ngx_uint_t != 0;
        if (*u).peer.tries == 0 || !wanted || (*(*r).connection).error() != 0 {
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
            DECLINED => next(r, HTTP_BAD_GATEWAY, NGX_HTTP_UPSTREAM_FT_ERROR),
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
