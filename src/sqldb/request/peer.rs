//! nginx's upstream and balancer around the driver: a request's peer asks
//! the balancer for a server and the driver's pool for a connection to it,
//! and gives nginx's upstream code a stand-in connection of the request's
//! own (a database connection serves several requests at once). The
//! request's timers live on the stand-in. When a connection fails the
//! request tries the next server, as nginx's upstreams do.

use std::ptr::NonNull;

use super::error::{log_failure, Error, Failure, Kind};
use super::{ctx_of, deliver_later, pool_of, with_pool, Ctx, SINK};
use crate::ffi::balancer::{self, Inner, Wrapper};
use crate::ffi::*;
use crate::sqldb::config::upstream::sqldb_srv_conf;
use crate::sqldb::config::{LocConf, Sqldb, SrvConf};
use crate::sqldb::driver::{ConnId, Pick, Sink, Submitted, RECHECK};
use crate::{debug, log};
use gateway_core::target::{Target, Verdict};

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
    /// `pool`: the request's, which nginx's upstream code finds on the
    /// stand-in and so does not create one of its own for it on each
    /// connect (it only sets its log, the request connection's already;
    /// the stand-in is never closed by nginx: the peer's free takes it
    /// back first).
    fn link(&mut self, pool: *mut ngx_pool_t) {
        self.c.pool = pool;
        self.c.read = &mut self.read;
        self.c.write = &mut self.write;
        self.c.fd = -1;
        self.read.data = (&mut self.c as *mut ngx_connection_t).cast();
        self.write.data = (&mut self.c as *mut ngx_connection_t).cast();
        self.write.set_write(1);
    }

    fn timer(&mut self) -> Event<'_> {
        // SAFETY: the read event is part of the stand-in, in the request's pool.
        unsafe { Event::from_raw(&mut self.read) }.expect("an event")
    }

    /// Its timers and posted events.
    fn clear(&mut self) {
        for ev in [&mut self.read as *mut ngx_event_t, &mut self.write] {
            // SAFETY: the events are the stand-in's own.
            unsafe { Event::from_raw(ev) }.expect("an event").clear();
        }
    }
}

/// Per-request peer data: the balancer's own and the stand-in connection.
pub struct PeerData {
    srv: &'static SrvConf,
    /// The block's balancer. It picked the current peer or not (an idle
    /// connection taken in single mode): it is told when it is freed.
    balancer: Inner,
    ctx: NonNull<Ctx>,
    standin: StandIn,
    /// The upstream's name (for the log).
    host: ngx_str_t,
    /// `sqldb_target`: the servers found not to meet this request's target.
    unfit: Vec<usize>,
    /// Those whose old role was checked again for it.
    rechecked: Vec<usize>,
    /// `prefer-standby`: a server skipped because a standby might be had
    /// elsewhere, which serves the request when none can.
    fallback: Option<usize>,
}

impl Drop for PeerData {
    fn drop(&mut self) {
        // The request's pool is being destroyed: no timer of its outlives
        // it, and its connection lets it go.
        // SAFETY: the Ctx is in the same pool, allocated before and so
        // dropped after this.
        detach(unsafe { self.ctx.as_mut() });
        self.standin.clear();
    }
}

peer_init_handler! {
    /// Wraps the balancer's per-request init (round robin, least_conn, hash ...).
    pub(crate) fn peer_init(r, us) = "peer_init", {
        init(r, us)
    }
}

fn init(r: &mut Req, us: &mut ngx_http_upstream_srv_conf_t) -> ngx_int_t {
    let Some(srv) = sqldb_srv_conf(us) else { return ERROR };
    if srv.balancer_init.is_none() {
        return ERROR;
    }
    let Some(balancer) = Inner::init(r, us, srv.balancer_init) else {
        return ERROR;
    };
    let pool = r.pool();
    let Some(ctx) = ctx_of(r).map(NonNull::from) else {
        return ERROR;
    };
    let pd = PeerData {
        srv,
        balancer,
        ctx,
        // (All-zero: the initial state of nginx's connection and events.)
        standin: StandIn {
            c: crate::ffi::pool::zeroed(),
            read: crate::ffi::pool::zeroed(),
            write: crate::ffi::pool::zeroed(),
        },
        host: us.host,
        unfit: Vec::new(),
        rechecked: Vec::new(),
        fallback: None,
    };
    let Some(mut pd) = pool.alloc(pd) else { return ERROR };
    // SAFETY: just allocated in the request's pool; nothing else refers to it yet.
    let pdm = unsafe { pd.as_mut() };
    pdm.standin.link(pool.as_ptr());
    let srv = pdm.srv;
    let Some(ctx) = ctx_of(r) else { return ERROR };
    ctx.peer = Some(pd);
    ctx.srv = Some(srv);
    let Some(u) = r.upstream() else { return ERROR };
    let peer = u.peer();
    // (No TLS session hooks: nginx never calls them for us, u->ssl stays off.)
    balancer::install(peer, pd, (false, false));
    OK
}

impl Wrapper for PeerData {
    const GET: &'static str = "peer_get";
    const FREE: &'static str = "peer_free";

    fn get(&mut self, pc: &mut ngx_peer_connection_t, log: Log) -> ngx_int_t {
        get(pc, self, log)
    }

    fn free(&mut self, pc: &mut ngx_peer_connection_t, state: ngx_uint_t) {
        // SAFETY: the Ctx outlives its request's peer.
        detach(unsafe { self.ctx.as_mut() });
        self.standin.clear();
        pc.connection = std::ptr::null_mut();
        self.balancer.free(pc, state);
    }
}

fn get(pc: &mut ngx_peer_connection_t, pd: &mut PeerData, log: Log) -> ngx_int_t {
    let srv = pd.srv;
    // SAFETY: the Ctx outlives its request's peer; no other reference to
    // it is used meanwhile.
    let ctx = unsafe { &mut *pd.ctx.as_ptr() };
    let target = ctx.query.target.get();
    pd.balancer.set_unused();
    if !target.is_any() {
        pool_of(srv, |p| p.track_roles());
    }
    if srv.settings.single {
        let idle = pool_of(srv, |p| match p.pick(None, &ctx.query) {
            Pick::Idle(id) => Some((id, p.addr_of(id).unwrap_or(0))),
            _ => None,
        });
        if let Some((id, addr)) = idle {
            set_peer(pc, srv, addr);
            return use_conn(pc, pd, ctx, id, false);
        }
    }
    let (addr, recheck) = if target.is_any() {
        match balance(pc, pd, srv, log) {
            Ok(addr) => (addr, false),
            Err(rc) => return rc,
        }
    } else {
        match choose(pc, pd, srv, target, log) {
            Ok(Some(Chosen::Server(addr))) => (addr, false),
            Ok(Some(Chosen::Recheck(addr))) => (addr, true),
            Ok(Some(Chosen::Fallback(addr))) => {
                // No standby to be had: from now on any server serves it
                // (its connection does not send it on again).
                ctx.query.target.set(Target::Any);
                (addr, false)
            }
            Ok(None) => {
                // Servers the balancer did not offer are down, or failed
                // within their fail_timeout (max_fails): say so, since the
                // server wanted may be one of them.
                let offered = pd.unfit.len();
                let missing = srv.addrs.len().saturating_sub(offered);
                let why = if missing > 0 {
                    format!(
                        "; {missing} of its {} servers not tried (down, or failed within fail_timeout)",
                        srv.addrs.len()
                    )
                } else {
                    String::new()
                };
                ctx.unmet = Some(format!(
                    "no server of upstream \"{}\" is {} (target \"{target}\"){why}",
                    String::from_utf8_lossy(pd.host.as_bytes()),
                    target.wanted()
                ));
                return use_standin(pc, pd, ctx);
            }
            Err(rc) => return rc,
        }
    };
    let pick = if recheck {
        // Its role may have changed since it was learned: a new session
        // says what it is now.
        pool_of(srv, |p| p.make_room(addr));
        Pick::New
    } else {
        pool_of(srv, |p| p.pick(Some(addr), &ctx.query))
    };
    match pick {
        Pick::Idle(id) | Pick::Share(id) | Pick::Behind(id) => use_conn(pc, pd, ctx, id, false),
        Pick::Reject => {
            // A full pool is no failure of the server: the balancer takes
            // its pick back as unused, and the request gets 503 (attach),
            // not nginx's "no live upstreams".
            let name = balancer::chosen_name(pc);
            pd.balancer.free(pc, 0);
            ctx.rejected = Some(name);
            use_standin(pc, pd, ctx)
        }
        Pick::New => {
            let exclusive = ctx.query.alone();
            let name = balancer::chosen_name(pc);
            match pool_of(srv, |p| {
                p.open(addr, &srv.addrs[addr].conninfo, name, ctx.token, exclusive)
            }) {
                Ok(id) => use_conn(pc, pd, ctx, id, true),
                Err(e) if *e.kind() == Kind::Connect => {
                    log!(NGX_LOG_ERR, log, "sqldb: {e}");
                    DECLINED
                }
                // nginx has logged why ("worker_connections are not enough").
                Err(_) => ERROR,
            }
        }
    }
}

/// The balancer's next server, as the index of its address.
fn balance(pc: &mut ngx_peer_connection_t, pd: &mut PeerData, srv: &SrvConf, log: Log) -> Result<usize, ngx_int_t> {
    let rc = pd.balancer.get(pc);
    if rc != OK {
        return Err(rc);
    }
    let sockaddr = balancer::chosen(pc);
    srv.addr_index(pc.sockaddr as usize, sockaddr).ok_or_else(|| {
        let name = balancer::chosen_name(pc);
        log!(NGX_LOG_ALERT, log, "sqldb: no sqldb_server for peer {name}");
        ERROR
    })
}

/// Gives the balancer its server back, not failed (it was not used).
fn release(pc: &mut ngx_peer_connection_t, pd: &mut PeerData) {
    pd.balancer.free(pc, 0);
}

/// Points the peer at a server chosen without the balancer.
fn set_peer(pc: &mut ngx_peer_connection_t, srv: &SrvConf, addr: usize) {
    let Some(a) = srv.addrs.get(addr) else { return };
    pc.sockaddr = a.sockaddr.as_ptr() as *mut sockaddr;
    pc.socklen = a.sockaddr.len() as socklen_t;
    pc.name = std::ptr::addr_of!(a.name).cast_mut();
}

/// The server `choose` found for a request.
enum Chosen {
    /// It meets the target, or its role is to be learned.
    Server(usize),
    /// Its role was learned long ago: a new connection asks again.
    Recheck(usize),
    /// `prefer-standby` and no standby to be had: the server skipped.
    Fallback(usize),
}

/// A server for a request with a `sqldb_target`: the balancer's servers in
/// its order, past those known not to meet the target; one whose role is
/// not known is tried (its connection learns the role before the query
/// goes out). With none left: for `prefer-standby`, a server skipped only
/// because a standby might be had (now, or on an earlier try of the
/// request); else the server whose role was learned longest ago (at least
/// RECHECK), asked again with a new connection. Ok(None): no server meets
/// the target.
fn choose(
    pc: &mut ngx_peer_connection_t,
    pd: &mut PeerData,
    srv: &'static SrvConf,
    target: Target,
    log: Log,
) -> Result<Option<Chosen>, ngx_int_t> {
    let now = current_msec();
    let mut oldest: Option<(usize, ngx_msec_t)> = None;
    for _ in 0..=srv.addrs.len() {
        let addr = match balance(pc, pd, srv, log) {
            Ok(addr) => addr,
            Err(rc) if rc == ERROR => return Err(rc),
            // No server left to offer.
            Err(_) => break,
        };
        if pd.unfit.contains(&addr) {
            // The balancer offers again what did not fit (it has one server).
            release(pc, pd);
            break;
        }
        match pool_of(srv, |p| p.verdict(addr, target)) {
            (Verdict::Meets | Verdict::Unknown, _) => return Ok(Some(Chosen::Server(addr))),
            (Verdict::Fails { fallback: usable }, learned) => {
                pd.unfit.push(addr);
                if usable && pd.fallback.is_none() {
                    pd.fallback = Some(addr);
                }
                let age = now.wrapping_sub(learned);
                if age >= RECHECK && !pd.rechecked.contains(&addr) && oldest.is_none_or(|(_, a)| age > a) {
                    oldest = Some((addr, age));
                }
                release(pc, pd);
            }
        }
    }
    if let Some(addr) = pd.fallback.take() {
        set_peer(pc, srv, addr);
        return Ok(Some(Chosen::Fallback(addr)));
    }
    if let Some((addr, _)) = oldest {
        pd.rechecked.push(addr);
        set_peer(pc, srv, addr);
        return Ok(Some(Chosen::Recheck(addr)));
    }
    Ok(None)
}

/// No server for the request: nginx's upstream gets the stand-in, and
/// `attach` answers 502 with the reason.
fn use_standin(pc: &mut ngx_peer_connection_t, pd: &mut PeerData, ctx: &mut Ctx) -> ngx_int_t {
    ctx.conn = None;
    pd.standin.clear();
    pc.set_cached(0);
    pc.connection = &mut pd.standin.c;
    AGAIN
}

/// Gives the request a database connection; `attach` queues its query.
fn use_conn(pc: &mut ngx_peer_connection_t, pd: &mut PeerData, ctx: &mut Ctx, id: ConnId, fresh: bool) -> ngx_int_t {
    ctx.conn = Some(id);
    ctx.fresh = fresh;
    pd.standin.clear();
    pc.set_cached((!fresh) as u32);
    pc.connection = &mut pd.standin.c;
    AGAIN
}

request_handler! {
    /// nginx's upstream finalizes the request (a client that left, say).
    pub(super) fn finalize_request(r, _rc) = ("finalize_request") {
        if let Some(ctx) = ctx_of(r) {
            ctx.done = true;
        }
    }
}

/// Takes the request over from nginx's upstream code once a connection is
/// picked: its own timer on the stand-in, and its query on the connection.
pub fn attach(r: &mut Req) {
    attach_with(r, true)
}

/// `attach`; `fresh_timer`: the request's timer starts now (else a timer
/// already running goes on: a request that moves keeps its deadline).
fn attach_with(r: &mut Req, fresh_timer: bool) {
    let (log, rp) = (r.log(), r.as_ptr());
    let lcf: &LocConf = r.loc_conf::<Sqldb>();
    let Some(ctx) = ctx_of(r) else { return };
    if ctx.done {
        return;
    }
    if let Some(why) = ctx.unmet.take() {
        log!(NGX_LOG_ERR, log, "sqldb: {why}");
        fail(r, HTTP_BAD_GATEWAY, false);
        return;
    }
    if let Some(name) = ctx.rejected.take() {
        let e = Error::from(Kind::NoConnection(name));
        log_failure(log, &e);
        return fail(r, e.status(), false);
    }
    let (Some(conn), false) = (ctx.conn, ctx.done) else {
        return;
    };
    let Some(mut pd) = ctx.peer else { return };
    // SAFETY: the peer data lives in the request's pool; nothing else uses it now.
    let pd = unsafe { pd.as_mut() };
    let keep = !fresh_timer && pd.standin.timer().timer_set();
    if !keep {
        pd.standin.clear(); // nginx's connect timer
    }
    pd.standin.c.data = rp.cast();
    let timer = pd.standin.timer();
    timer.set_handler(Some(request_timer));
    timer.set_log(log);
    let Some(submitted) = with_pool(ctx, |pool| pool.submit(conn, ctx.token, ctx.query.clone())) else {
        return;
    };
    match submitted {
        Ok(Submitted::Sent) => {
            if let Some(st) = r.upstream().and_then(|u| u.state()) {
                st.connect_time = 0;
            }
            r.set_log_action(c"reading result from PostgreSQL");
            if !keep {
                timer.add_timer(lcf.result_timeout);
            }
        }
        Ok(Submitted::Waiting { connecting }) if !keep => {
            timer.add_timer(if connecting {
                lcf.connect_timeout
            } else {
                lcf.result_timeout
            });
        }
        Ok(Submitted::Waiting { .. }) => {}
        Err(mut out) => SINK.deliver(&mut out),
    }
}

/// The query went out after waiting for its connection.
pub fn started(r: &mut Req, connecting: bool) {
    let lcf: &LocConf = r.loc_conf::<Sqldb>();
    if let Some(u) = r.upstream() {
        let elapsed = u.elapsed();
        if let Some(st) = u.state() {
            st.connect_time = if connecting { elapsed } else { 0 };
        }
    }
    r.set_log_action(c"reading result from PostgreSQL");
    if let Some(timer) = ctx_of(r).and_then(|c| timer_of(c)) {
        timer.add_timer(lcf.result_timeout);
    }
}

/// The request leaves its database connection before its results are in
/// (client gone, timeout, failure). Its results, if they come, are
/// dropped; with nobody left on the connection, its queries are cancelled.
pub fn detach(ctx: &mut Ctx) {
    let Some(conn) = ctx.conn.take() else { return };
    debug!(
        Log::cycle(),
        "sqldb: request {} leaves connection",
        ctx.token.0.as_u64()
    );
    if let Some(out) = with_pool(ctx, |pool| pool.abandon(conn, ctx.token)) {
        deliver_later(out);
    }
}

request_event_handler! {
    /// A request's own timer (on its stand-in, whose data is the request):
    /// connect or result timeout.
    fn request_timer(r, ev) = ("request_timer", panic: |r: &mut Req| fail(r, HTTP_INTERNAL_SERVER_ERROR, false), via connection) {
        ev.take_timedout();
        let Some(ctx) = ctx_of(r) else { return };
        let (Some(conn), false) = (ctx.conn, ctx.done) else {
            return;
        };
        let connecting = with_pool(ctx, |p| p.is_connecting(conn)).unwrap_or(false);
        detach(ctx);
        let lcf: &LocConf = r.loc_conf::<Sqldb>();
        if connecting {
            let e = Error::from(Kind::ConnectTimeout(lcf.connect_timeout));
            log_failure(r.log(), &e);
            next(r, e.status(), NGX_HTTP_UPSTREAM_FT_TIMEOUT);
        } else {
            let e = Error::from(Kind::ResultTimeout(lcf.result_timeout));
            log_failure(r.log(), &e);
            fail(r, e.status(), true);
        }
    }
}

/// Runs the body of an entry point that serves one request; a panic ends
/// the request with 500 (and never crosses into nginx).
pub fn guard_request(r: &mut Req, entry: &str, body: impl FnOnce(&mut Req)) {
    let ok = guard(r.log(), entry, false, || {
        body(r);
        true
    });
    if !ok {
        fail(r, HTTP_INTERNAL_SERVER_ERROR, false);
    }
}

/// Our end of the upstream, as nginx's static ngx_http_upstream_finalize_request
/// does it: timings, the peer back to the balancer, no further cleanup.
pub fn finish_upstream(r: &mut Req, status: ngx_int_t, peer_state: ngx_uint_t) {
    if let Some(ctx) = ctx_of(r) {
        ctx.done = true;
        detach(ctx);
    }
    if let Some(u) = r.upstream() {
        u.drop_cleanup();
        let elapsed = u.elapsed();
        if let Some(st) = u.state() {
            st.status = status as ngx_uint_t;
            if st.response_time == ngx_msec_t::MAX {
                st.response_time = elapsed;
            }
        }
        u.free_peer(peer_state);
    }
    r.block_reading();
}

/// Ends the request with an error status (nginx's error page).
pub fn fail(r: &mut Req, status: ngx_int_t, peer_failed: bool) {
    let Some(ctx) = ctx_of(r) else {
        r.finalize(status);
        return;
    };
    if ctx.done {
        return;
    }
    // Once rows are out, no status can follow: the response is cut short.
    let streamed = ctx.streaming.as_ref().is_some_and(|s| s.started());
    let state = if peer_failed { NGX_PEER_FAILED as ngx_uint_t } else { 0 };
    finish_upstream(r, status, state);
    r.finalize(if streamed { ERROR } else { status });
}

/// A connection attempt failed: the next server if the balancer has one.
pub fn next(r: &mut Req, status: ngx_int_t, ft: u32) {
    next_peer(r, status, ft, false)
}

/// How often a request's query, never sent, may move to another
/// connection of the same server before it goes to the balancer's next
/// server. Each move waits for requests that were ahead of it, which end:
/// a request moves again only when another left its connection unfit, and
/// its own timer (not restarted by a move) bounds its wait.
const UNSENT_MOVES: u8 = 64;

/// The request's query was never sent: the connection it waited on turned
/// out unfit (left inside a transaction by the request before it, an
/// unsafe client encoding) or closed. Not the server's failure, nor a try
/// of the balancer's: it takes another connection to the same server from
/// the pool, as if it had just come (a few times; then the next server).
pub fn move_unsent(r: &mut Req) {
    let Some(ctx) = ctx_of(r) else { return };
    if ctx.done {
        return;
    }
    let (Some(_), Some(srv)) = (ctx.peer, ctx.srv) else {
        return;
    };
    ctx.unsent_moves += 1;
    if ctx.unsent_moves > UNSENT_MOVES {
        return next_after_stale(r);
    }
    let log = r.log();
    let Some((addr, name)) = r.upstream().and_then(|u| peer_server(u.peer(), srv)) else {
        return next_after_stale(r);
    };
    let Some(ctx) = ctx_of(r) else { return };
    let alone = ctx.query.alone();
    let (id, fresh) = match pool_of(srv, |p| p.pick(Some(addr), &ctx.query)) {
        Pick::Idle(id) | Pick::Share(id) | Pick::Behind(id) => (id, false),
        Pick::Reject => {
            let e = Error::from(Kind::NoConnection(name));
            log_failure(log, &e);
            return fail(r, e.status(), false);
        }
        Pick::New => match pool_of(srv, |p| p.open(addr, &srv.addrs[addr].conninfo, name, ctx.token, alone)) {
            Ok(id) => (id, true),
            Err(e) if *e.kind() == Kind::Connect => {
                log!(NGX_LOG_ERR, log, "sqldb: {e}");
                return next(r, HTTP_BAD_GATEWAY, NGX_HTTP_UPSTREAM_FT_ERROR);
            }
            Err(_) => return fail(r, HTTP_INTERNAL_SERVER_ERROR, false),
        },
    };
    debug!(
        log,
        "sqldb: request {} moves to another connection (not sent)",
        ctx.token.0.as_u64()
    );
    ctx.conn = Some(id);
    ctx.fresh = fresh;
    attach_with(r, false);
}

/// The server the peer points at (its address index), and its name.
fn peer_server(pc: &ngx_peer_connection_t, srv: &SrvConf) -> Option<(usize, String)> {
    if pc.sockaddr.is_null() || pc.name.is_null() {
        return None;
    }
    let sockaddr = balancer::chosen(pc);
    Some((
        srv.addr_index(pc.sockaddr as usize, sockaddr)?,
        balancer::chosen_name(pc),
    ))
}

/// The request waited on a connection that closed before its query was
/// sent: not the server's failure (the balancer is not told so), and one
/// more try, as nginx gives its cached keepalive connections.
pub fn next_after_stale(r: &mut Req) {
    next_peer(r, HTTP_BAD_GATEWAY, NGX_HTTP_UPSTREAM_FT_ERROR, true)
}

fn next_peer(r: &mut Req, status: ngx_int_t, ft: u32, stale: bool) {
    let Some(ctx) = ctx_of(r).filter(|c| !c.done) else {
        return;
    };
    // A prefer-standby request that skipped a server for a standby it could
    // not reach: that server serves it (whatever tries and
    // sqldb_next_upstream say: it was only skipped, never tried).
    // SAFETY: the peer data lives in the request's pool; nothing else uses it now.
    let fallback = ctx.peer.is_some_and(|pd| unsafe { pd.as_ref() }.fallback.is_some());
    let lcf: &LocConf = r.loc_conf::<Sqldb>();
    let client_error = r.client_error();
    let Some(u) = r.upstream() else { return };
    let elapsed = u.elapsed();
    if let Some(st) = u.state() {
        st.status = status as ngx_uint_t;
        st.response_time = elapsed;
    }
    u.free_peer(if stale { NGX_PEER_NEXT } else { NGX_PEER_FAILED } as ngx_uint_t);
    let peer = u.peer();
    if stale {
        peer.tries += 1;
    }
    let wanted = lcf.upstream.next_upstream & ft as ngx_uint_t != 0;
    if client_error || (!fallback && (peer.tries == 0 || !wanted)) {
        fail(r, status, false);
        return;
    }
    peer.tries = peer.tries.max(1);
    reconnect(r, status);
}

/// The request's connection came up to a server that does not meet its
/// `sqldb_target` (its query was not sent): another server. Not the
/// server's failure: the balancer is told it went well.
pub fn next_unfit(r: &mut Req) {
    let Some(ctx) = ctx_of(r).filter(|c| !c.done) else {
        return;
    };
    let prefer = ctx.query.target.get() == Target::PreferStandby;
    let (Some(mut pd), Some(srv)) = (ctx.peer, ctx.srv) else {
        return;
    };
    let Some(u) = r.upstream() else { return };
    if prefer {
        // Skipped while another server's role is still to be learned (it
        // may be the standby): this one serves when none is.
        // SAFETY: the peer data lives in the request's pool; nothing else
        // uses it now.
        let pd = unsafe { pd.as_mut() };
        if let Some((addr, _)) = peer_server(u.peer(), srv) {
            pd.fallback.get_or_insert(addr);
        }
    }
    let elapsed = u.elapsed();
    if let Some(st) = u.state() {
        st.response_time = elapsed;
    }
    u.free_peer(NGX_PEER_NEXT as ngx_uint_t);
    reconnect(r, HTTP_BAD_GATEWAY);
}

/// Asks the balancer for another server and a connection to it.
fn reconnect(r: &mut Req, status: ngx_int_t) {
    if !r.begin_upstream_try() {
        fail(r, HTTP_INTERNAL_SERVER_ERROR, false);
        return;
    }
    let Some(u) = r.upstream() else { return };
    let rc = u.connect_peer();
    u.note_peer();
    match rc {
        AGAIN if ctx_of(r).is_some_and(|c| c.conn.is_some() || c.unmet.is_some() || c.rejected.is_some()) => attach(r),
        BUSY => {
            log_failure(r.log(), &Error::from(Kind::NoLiveUpstreams));
            fail(r, status, false);
        }
        DECLINED => next(r, HTTP_BAD_GATEWAY, NGX_HTTP_UPSTREAM_FT_ERROR),
        _ => fail(r, HTTP_INTERNAL_SERVER_ERROR, false),
    }
}

/// The request's own timer (connect or result timeout), once its peer is set up.
pub fn timer_of(ctx: &Ctx) -> Option<Event<'_>> {
    let mut pd = ctx.peer?;
    // SAFETY: the peer data lives in the request's pool; nothing else uses it now.
    Some(unsafe { pd.as_mut() }.standin.timer())
}
