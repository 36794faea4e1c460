//! A cache request on a shared, pipelined connection (driver::pipe): the
//! balancer of its upstream chooses the server (round robin, `hash`,
//! `max_fails`, `backup`, as for any upstream), the request queues its
//! commands on one of the worker's connections to that server, and its
//! response goes out as its replies come. nginx's upstream code is not
//! started; its `$upstream_*` states are kept the same way, and a failure
//! goes to the next server by the rules of `cache_next_upstream`.

use std::rc::Rc;

use gateway_core::redis;

use super::sentinel::Route;
use super::{ctx_of, tls_of_location};
use crate::cache::config::{Cache, CacheLocConf};
use crate::cache::driver::{self, authfail, next_ping, DbStep, Endpoint, Handle, Outcome, PipeId, Sink};
use crate::cache::error::{Broken, Error, How, Kind};
use crate::common::token::{self, ReqToken};
use crate::ffi::buf::Reuse;
use crate::ffi::net::TlsClient;
use crate::ffi::*;
use crate::log;
use replies::{failed, release_held, REQUEST_SIDE};

mod replies;

/// Buffers a client may have pending before it is behind.
const MAX_PENDING: usize = 8;
/// Bytes of values the worker holds for clients that are behind, so that
/// the requests queued after theirs on a shared connection are not held
/// up. Past it, reading such a connection pauses until the client catches
/// up (a value of any size then takes its client's pace).
const HOLD_MAX: usize = 64 * 1024 * 1024;

thread_local! {
    /// The bytes held (HOLD_MAX), the worker's.
    static HELD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}
/// The smallest buffer made for value bytes (exactly their size: a small
/// value takes the request pool's memory, not an allocation of its own).
const BATCH: usize = 0;

/// The request's part in the shared path.
pub struct SharedReq {
    handle: Rc<Handle>,
    /// The connection its commands are on.
    conn: Option<PipeId>,
    /// Its own timer (an event in the request's pool): the reply is late.
    timer: Option<Timer>,
    /// The request body (SET, PUBLISH), read once.
    body: Vec<u8>,
    /// `cache_ssl`: TLS to the server.
    tls: Option<TlsClient>,
    /// The status and headers went out.
    started: bool,
    /// HEAD, or the header could not go out: value bytes are dropped.
    discard: bool,
    /// The status a header filter answered with instead (the range
    /// filter's 416): nginx's page for it goes out once every reply is in.
    refused_head: Option<ngx_int_t>,
    /// A 404 that goes to the next server (`cache_next_upstream not_found`).
    retry_404: bool,
    /// The body made of the reply (PUBLISH's receivers, XADD's ID).
    made: Option<Vec<u8>>,
    bufs: Reuse,
    /// The client is behind: the connection waits for it.
    paused: bool,
    /// The client is behind (its write handler is ours).
    behind: bool,
    /// Bytes held for it (HOLD_MAX).
    held: usize,
    /// A status nginx answers itself (its page, or the location's
    /// `error_page`), once every reply is in.
    intercept: Option<ngx_int_t>,
    /// The answer's status, length, and whether it has a value: its header
    /// waits for the value's first bytes.
    head: Option<(u16, off_t, bool)>,
    saved_write_handler: ngx_http_event_handler_pt,
    /// The balancer's server is held (to be given back).
    peer_held: bool,
    /// Its timer runs for a connection being made (cache_connect_timeout).
    timer_connecting: bool,
    /// Connections it moved to, in this try (MAX_MOVES).
    moves: u8,
    /// The request has ended (finalized, or nginx ended it).
    done: bool,
    /// It waits for a Sentinel set's master to be confirmed.
    parked: bool,
    /// Value bytes read in this try (`$upstream_response_length`).
    length: u64,
    /// The value's length, as its reply says.
    value_len: Option<u64>,
    /// The value's last bytes, held to go out with the end of the response
    /// in one pass through the output filters (a short value: all of it).
    tail: Option<crate::ffi::buf::ReuseLink>,
}

impl SharedReq {
    /// `who`: the request's token (registered; it leaves the registry
    /// with the SharedReq).
    pub fn new(who: ReqToken) -> SharedReq {
        SharedReq {
            handle: Handle::new(who),
            conn: None,
            timer: None,
            body: Vec::new(),
            tls: None,
            started: false,
            discard: false,
            refused_head: None,
            retry_404: false,
            made: None,
            bufs: Reuse::new(<Cache as ngx::http::HttpModule>::module()),
            paused: false,
            behind: false,
            held: 0,
            intercept: None,
            head: None,
            saved_write_handler: None,
            peer_held: false,
            timer_connecting: false,
            moves: 0,
            parked: false,
            done: false,
            length: 0,
            value_len: None,
            tail: None,
        }
    }
}

fn shared_of(r: &mut Req) -> Option<&mut SharedReq> {
    ctx_of(r)?.shared.as_mut()
}

impl Drop for SharedReq {
    fn drop(&mut self) {
        if let Some(t) = self.handle.who.get() {
            token::unregister(t);
        }
        self.handle.leave();
    }
}

/// Starts the request (the content handler's part): the balancer, the
/// body, the first server. What the content handler returns.
pub fn start(r: &mut Req, block: Option<&ngx_http_upstream_srv_conf_t>) -> Option<ngx_int_t> {
    if !r.init_upstream_peer(block) {
        return None;
    }
    // The name TLS verifies and sends: the host part of cache_pass, as
    // proxy_pass's is for proxy_ssl_name.
    let host = r
        .upstream()
        .and_then(|u| u.resolved_host())
        .or_else(|| block.map(|us| us.host))
        .unwrap_or_default();
    let lcf: &CacheLocConf = r.loc_conf::<Cache>();
    let tls = tls_of_location(r, lcf, host.as_bytes())?;
    let ev = r.new_timer(Some(timer_event))?;
    let s = shared_of(r)?;
    s.timer = Some(ev);
    s.tls = tls;
    if !r.add_request_cleanup(cleanup) {
        return None;
    }
    let command = ctx_of(r)?.command;
    if command.sends_body() {
        let rc = r.read_body(Some(body_read));
        return Some(if rc >= NGX_HTTP_SPECIAL_RESPONSE as ngx_int_t {
            rc
        } else {
            DONE
        });
    }
    let rc = r.discard_body();
    if rc != OK {
        return Some(rc);
    }
    if !r.set_content_type_by_extension() {
        return None;
    }
    r.count_up();
    r.set_read_handler_test_reading();
    dispatch(r);
    Some(DONE)
}

request_handler! {
    /// The request body is read: the request goes to its server.
    fn body_read(r) = ("cache body_read", panic: |r: &mut Req| end(r, HTTP_INTERNAL_SERVER_ERROR), posted) {
        let Some(body) = r.body_bytes() else {
            return end(r, HTTP_INTERNAL_SERVER_ERROR);
        };
        let Some(s) = shared_of(r) else { return };
        s.body = body;
        r.set_read_handler_test_reading();
        dispatch(r);
    }
}

/// Runs the body of an entry point for one request; a panic ends the
/// request with 500.
fn guard_request(r: &mut Req, entry: &str, body: impl FnOnce(&mut Req)) {
    let ok = guard(r.log(), entry, false, || {
        body(r);
        true
    });
    if !ok {
        end(r, HTTP_INTERNAL_SERVER_ERROR);
    }
}

/// Asks the balancer for a server and queues the request on one of its
/// connections. To a Sentinel set with no master confirmed now, the
/// request waits for one first (under `cache_connect_timeout`).
fn dispatch(r: &mut Req) {
    if !sentinel_ready(r) {
        return;
    }
    if !r.begin_upstream_try() {
        return end(r, HTTP_INTERNAL_SERVER_ERROR);
    }
    let Some(u) = r.upstream() else { return };
    let rc = u.get_peer();
    u.note_peer();
    match rc {
        OK => {}
        BUSY => {
            log!(
                NGX_LOG_ERR,
                r.log(),
                "cache: no live upstreams while connecting to upstream"
            );
            return end(r, HTTP_BAD_GATEWAY);
        }
        DECLINED => return next(r, NGX_HTTP_UPSTREAM_FT_ERROR, false, false, Verdict::Failed),
        _ => return end(r, HTTP_INTERNAL_SERVER_ERROR),
    }
    let has_addr = u.peer_addr().is_some();
    if let Some(s) = shared_of(r) {
        s.peer_held = true;
    }
    if !has_addr {
        return end(r, HTTP_INTERNAL_SERVER_ERROR);
    }
    again(r);
}

/// How the request went onto its connection.
enum Placed {
    /// Its commands, or the question about its database, are queued.
    On { connecting: bool },
    /// The connection closed meanwhile.
    Gone,
    /// It closed on replies that were wrong.
    Broken(String),
}

/// How often a request whose connection closed before its commands went
/// on it takes another one to the same server.
const MAX_MOVES: u8 = 4;

/// Queues the request's commands on connection `id` (or asks about its
/// database first), and starts its timer.
fn place(r: &mut Req, id: PipeId) {
    let lcf: &CacheLocConf = r.loc_conf::<Cache>();
    let Some(ctx) = ctx_of(r) else { return };
    let Some(s) = ctx.shared.as_mut() else { return };
    let want = ctx.db.unwrap_or(0);
    let placed = driver::pipes().with(id, |c| {
        if let Some(why) = c.closed_invalid() {
            return Placed::Broken(why.to_owned());
        }
        if c.is_closed() {
            return Placed::Gone;
        }
        let connecting = c.is_connecting();
        let select = match c.select_for(want) {
            DbStep::Probe => {
                c.probe(s.handle.clone(), want);
                return Placed::On { connecting };
            }
            DbStep::Wait => {
                c.follow(s.handle.clone(), want);
                return Placed::On { connecting };
            }
            DbStep::Stay => None,
            DbStep::Select(db) => Some(db),
        };
        let plan = redis::plan_pipelined(
            &redis::Request {
                command: ctx.command,
                key: &ctx.key,
                auth: None,
                db: select,
                exptime: ctx.exptime,
                maxlen: ctx.maxlen,
                event: ctx.event.as_deref(),
                ping: next_ping(),
                cluster: None,
            },
            s.body.len(),
        );
        c.submit(s.handle.clone(), plan, &s.body, select);
        Placed::On { connecting }
    });
    let connecting = match placed.unwrap_or(Placed::Gone) {
        // Not the server's failure: another connection to it (a few times).
        Placed::Gone if s.moves < MAX_MOVES => {
            s.moves += 1;
            return again(r);
        }
        Placed::Gone => {
            return failed(
                r,
                Error::because(
                    Kind::Broken(Broken::before(How::Closed)),
                    "the connections to redis keep closing",
                ),
            )
        }
        // (After its probe: the connection broke on the replies after it.)
        Placed::Broken(why) => return failed(r, Error::because(Kind::Broken(Broken::before(How::Invalid)), why)),
        Placed::On { connecting } => connecting,
    };
    s.conn = Some(id);
    if let Some(t) = &s.timer {
        if !t.timer_set() {
            s.timer_connecting = connecting;
            t.add_timer(if connecting {
                lcf.upstream.connect_timeout
            } else {
                lcf.upstream.read_timeout
            });
        }
    }
}

/// A connection to the balancer's server (again, when the connection the
/// request was to use closed before its commands went on it: not the
/// server's failure).
fn again(r: &mut Req) {
    // (A copy on the stack: a socket address is at most 128 bytes.)
    let mut room = [0u8; 128];
    let Some(len) = r.upstream().and_then(|u| u.peer_addr()).and_then(|(a, _)| {
        let to = room.get_mut(..a.len())?;
        to.copy_from_slice(a);
        Some(a.len())
    }) else {
        return end(r, HTTP_INTERNAL_SERVER_ERROR);
    };
    let lcf: &CacheLocConf = r.loc_conf::<Cache>();
    let log = r.log();
    let Some(ctx) = ctx_of(r) else { return };
    // (A password Redis refused meanwhile: no new connection for it.)
    if ctx.auth_key.is_some_and(authfail::blocked) {
        return end(r, HTTP_BAD_GATEWAY);
    }
    let Some(s) = ctx.shared.as_ref() else { return };
    let to = Endpoint {
        addr: &room[..len],
        auth: ctx.auth.as_deref(),
        tls: s.tls.as_ref(),
        connect_timeout: lcf.upstream.connect_timeout,
        db: ctx.db.unwrap_or(0),
        so_keepalive: lcf.upstream.socket_keepalive == 1,
        log,
    };
    match driver::pipes().pick(&to, &REQUEST_SIDE) {
        Ok(id) => place(r, id),
        Err(e) => {
            // (nginx's line for a connect that did not start names the
            // request already.)
            if *e.kind() == Kind::Connect {
                log!(NGX_LOG_ERR, r.log(), "cache: {e} while connecting to upstream");
            }
            next(r, NGX_HTTP_UPSTREAM_FT_ERROR, false, false, Verdict::Failed)
        }
    }
}

/// The balancer's server of the current try, for the log.
fn server_name(r: &mut Req) -> String {
    r.upstream()
        .and_then(|u| u.peer_addr())
        .map(|(_, n)| String::from_utf8_lossy(n.as_bytes()).into_owned())
        .unwrap_or_default()
}

/// Leaves the connection (its replies will be dropped) and stops the timer.
fn leave(r: &mut Req) {
    let Some(s) = shared_of(r) else { return };
    if let Some(id) = s.conn.take() {
        let h = s.handle.clone();
        driver::pipes().with(id, |c| c.leave(&h));
    }
    if let Some(t) = &s.timer {
        t.clear();
    }
}

/// The try's `$upstream_*` state, and the server back to the balancer.
fn finish_try(r: &mut Req, status: ngx_int_t, peer_state: ngx_uint_t) {
    let (held, started, sent, received, length) = match shared_of(r) {
        Some(s) => (
            std::mem::take(&mut s.peer_held),
            s.started,
            s.handle.sent.take(),
            s.handle.received.take(),
            std::mem::take(&mut s.length),
        ),
        None => (false, false, 0, 0, 0),
    };
    let Some(u) = r.upstream() else { return };
    let elapsed = u.elapsed();
    if let Some(st) = u.state() {
        // (A try may end twice, at its failure and at the request's end:
        // what the first counted stays.)
        st.bytes_sent += sent as off_t;
        st.bytes_received += received as off_t;
        st.response_length += length as off_t;
        // The status Redis answered stays (as nginx's upstreams keep it:
        // not a range filter's 206, a 500 of the location's, a client's
        // 499). A try that got no answer, or failed before its answer went
        // out to the client, takes the failure's (502, 504). (NGX_ERROR
        // keeps it too: $upstream_status has room for 3 digits a try.)
        let failure = status == HTTP_BAD_GATEWAY || status == HTTP_GATEWAY_TIME_OUT;
        let client_closed = status == NGX_HTTP_CLIENT_CLOSED_REQUEST as ngx_int_t;
        if status > 0 && !client_closed && (st.status == 0 || (failure && !started)) {
            st.status = status as ngx_uint_t;
        }
        if st.response_time == ngx_msec_t::MAX {
            st.response_time = elapsed;
        }
    }
    if held {
        u.free_peer(peer_state);
    }
}

/// Ends the request with a status (nginx's error page), or cut short
/// once its header went out.
fn end(r: &mut Req, status: ngx_int_t) {
    let Some(s) = shared_of(r) else {
        r.finalize(status);
        return;
    };
    if s.done {
        return;
    }
    let started = s.started;
    // (No server could take it now: when to ask again.)
    let status = if started || super::tell_retry(r, status) {
        status
    } else {
        HTTP_INTERNAL_SERVER_ERROR
    };
    leave(r);
    finish_try(r, status, 0);
    if let Some(s) = shared_of(r) {
        s.done = true;
        s.paused = false;
        release_held(s);
        if std::mem::take(&mut s.behind) {
            let saved = s.saved_write_handler;
            r.set_write_handler(saved);
        }
    }
    r.finalize(if started { ERROR } else { status });
}

/// Answers with a status and an empty body, as Redis's own answers go out
/// (the client's connection is kept).
fn respond_empty(r: &mut Req, status: ngx_int_t) {
    let Some(s) = shared_of(r) else { return };
    if s.done {
        return;
    }
    leave(r);
    finish_try(r, status, 0);
    if let Some(s) = shared_of(r) {
        s.done = true;
    }
    r.set_status(status as ngx_uint_t);
    r.set_content_length(0);
    let rc = r.send_header();
    if rc == ERROR || rc > OK || r.header_only() {
        r.finalize(rc);
        return;
    }
    let rc = r.send_last();
    r.finalize(rc);
}

/// What a try that does not answer the request says of its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// It failed (counted against `max_fails`): no connection, no reply in
    /// time, a reply stream that broke.
    Failed,
    /// It answered (a miss, an error reply): not its failure.
    Answered,
    /// It cannot take the command now (a replica's `READONLY`, `LOADING`):
    /// not its failure, and the command has not run, so the next server
    /// takes it whatever `cache_next_upstream` says (a POST too).
    NotNow,
}

/// The try failed: the next server when `cache_next_upstream` and the
/// balancer allow it, else the status.
fn next(r: &mut Req, ft: u32, sent: bool, reused: bool, verdict: Verdict) {
    if shared_of(r).is_none_or(|s| s.done) {
        return;
    }
    let status = if ft == NGX_HTTP_UPSTREAM_FT_TIMEOUT {
        HTTP_GATEWAY_TIME_OUT
    } else if ft == NGX_HTTP_UPSTREAM_FT_HTTP_404 {
        NGX_HTTP_NOT_FOUND as ngx_int_t
    } else {
        HTTP_BAD_GATEWAY
    };
    leave(r);
    if verdict == Verdict::NotNow {
        if let Some(sr) = ctx_of(r).and_then(|c| c.sentinel.as_mut()) {
            sr.not_now = true;
        }
    }
    let peer_state = if verdict == Verdict::Failed {
        NGX_PEER_FAILED
    } else {
        NGX_PEER_NEXT
    };
    finish_try(r, status, peer_state as ngx_uint_t);
    let lcf: &CacheLocConf = r.loc_conf::<Cache>();
    let conf = &lcf.upstream;
    let method = r.method();
    let client_error = r.client_error();
    let Some(u) = r.upstream() else { return };
    if reused && ft == NGX_HTTP_UPSTREAM_FT_ERROR {
        // A kept connection that failed is no sign of the server's: one
        // more try, as nginx gives its kept connections.
        *u.tries() += 1;
    }
    let timeout = conf.next_upstream_timeout;
    let non_idempotent = method & (NGX_HTTP_POST | NGX_HTTP_LOCK | NGX_HTTP_PATCH) != 0
        && conf.next_upstream & NGX_HTTP_UPSTREAM_FT_NON_IDEMPOTENT as ngx_uint_t == 0;
    let any = verdict == Verdict::NotNow;
    let give_up = *u.tries() == 0
        || (conf.next_upstream & ft as ngx_uint_t == 0 && !any)
        || (sent && non_idempotent && !any)
        || (timeout != 0 && current_msec().wrapping_sub(u.first_start()) >= timeout)
        || client_error;
    if give_up {
        if any && !client_error {
            log!(
                NGX_LOG_ERR,
                r.log(),
                "cache: no other server of the upstream to take the command"
            );
        }
        return end(r, status);
    }
    if let Some(s) = shared_of(r) {
        s.started = false;
        s.discard = false;
        s.retry_404 = false;
        s.made = None;
        s.head = None;
        s.intercept = None;
        s.moves = 0;
    }
    dispatch(r);
}

request_event_handler! {
    /// The request's timer (the cleanup stops it before the request goes):
    /// its replies are late.
    fn timer_event(r, ev) = ("cache timer", panic: |r: &mut Req| end(r, HTTP_INTERNAL_SERVER_ERROR)) {
        ev.take_timedout();
        let Some(s) = shared_of(r) else { return };
        if s.done {
            return;
        }
        if std::mem::take(&mut s.parked) {
            return no_master(r);
        }
        let (conn, started) = (s.conn, s.started);
        if let Some(id) = conn {
            // Redis may be stuck: no new requests go to that connection.
            driver::pipes().with(id, |c| c.retire());
        }
        let lcf: &CacheLocConf = r.loc_conf::<Cache>();
        let name = server_name(r);
        log!(
            NGX_LOG_ERR,
            r.log(),
            "cache: upstream timed out (no reply within {} ms) while reading the reply from redis {name}",
            lcf.upstream.read_timeout
        );
        if started {
            return end(r, ERROR);
        }
        next(r, NGX_HTTP_UPSTREAM_FT_TIMEOUT, true, false, Verdict::Failed);
    }
}

request_cleanup_handler! {
    /// nginx ends the request (a client gone, say) or frees it.
    fn cleanup(r) = "cache cleanup", {
        let Some(s) = shared_of(r) else { return };
        let was_done = std::mem::replace(&mut s.done, true);
        if let Some(t) = s.handle.who.get() {
            token::unregister(t);
        }
        s.handle.leave();
        release_held(s);
        leave(r);
        if !was_done {
            finish_try(r, NGX_HTTP_CLIENT_CLOSED_REQUEST as ngx_int_t, 0);
        }
    }
}

/// A request to a Sentinel set: true when its master is confirmed (or it
/// is not to a set); else the request waits for one (false).
fn sentinel_ready(r: &mut Req) -> bool {
    let lcf: &CacheLocConf = r.loc_conf::<Cache>();
    let Some(ctx) = ctx_of(r) else { return true };
    let (Some(sr), Some(s)) = (ctx.sentinel.as_ref(), ctx.shared.as_mut()) else {
        return true;
    };
    match sr.route(false) {
        Route::Replica(_) => return true,
        Route::NoReplica => {
            let why = format!("no replica of {} is usable now (cache_target replica)", sr.describe());
            no_server(r, &why);
            return false;
        }
        Route::Master => {}
    }
    if sr.master().is_some() {
        return true;
    }
    let Some(who) = s.handle.who.get() else { return true };
    s.parked = true;
    if let Some(t) = &s.timer {
        if !t.timer_set() {
            t.add_timer(lcf.upstream.connect_timeout);
        }
    }
    sr.wait(who, resume_parked);
    false
}

/// A master is confirmed: the waiting request goes on.
fn resume_parked(r: &mut Req) {
    guard_request(r, "cache sentinel resume", |r| {
        let Some(s) = shared_of(r) else { return };
        if s.done || !std::mem::take(&mut s.parked) {
            return;
        }
        if let Some(t) = &s.timer {
            t.clear();
        }
        dispatch(r);
    });
}

/// No master was confirmed within `cache_connect_timeout`: 503, to be
/// asked again in a second.
fn no_master(r: &mut Req) {
    let lcf: &CacheLocConf = r.loc_conf::<Cache>();
    let set = ctx_of(r)
        .and_then(|c| c.sentinel.as_ref())
        .map_or_else(|| "the sentinel set".to_owned(), |sr| sr.describe());
    let why = format!(
        "no master of {set} was confirmed within {} ms (cache_connect_timeout)",
        lcf.upstream.connect_timeout
    );
    no_server(r, &why);
}

/// No server of the set can take the request now: 503, to be asked again
/// in a second.
fn no_server(r: &mut Req, why: &str) {
    log!(NGX_LOG_ERR, r.log(), "cache: {why}");
    if let Some(ctx) = ctx_of(r) {
        ctx.retry_after = true;
    }
    end(r, HTTP_SERVICE_UNAVAILABLE);
}
