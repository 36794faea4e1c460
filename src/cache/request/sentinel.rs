//! The balancer of a Sentinel set (`cache_sentinel NAME`,
//! config::sentinel): the block's balancer is wrapped. Each try goes to
//! the master the worker's watch of the set has confirmed
//! (driver::sentinel); nginx's round robin underneath only keeps the
//! Sentinels' addresses, and no request goes to a Sentinel.
//!
//! A try that finds no connection or no reply, or a server that cannot
//! take the command (`READONLY`), takes the confirmation back: the
//! Sentinels are asked again, and the request's next try (nginx's
//! next-upstream step) goes to the master they name once it is confirmed.
//! Requests on shared connections wait for it (pipelined::dispatch);
//! those with `cache_pipeline off` get 502 while there is none.
//!
//! A read (GET, HEAD) of a location with `cache_target replica` or
//! `prefer-replica` goes to a replica the set's probes find usable (its
//! lag within `cache_replica_max_lag`), in turn; with none, `replica`
//! answers 503 (502 with `cache_pipeline off`) and `prefer-replica` goes to
//! the master. A replica that fails a try is left out until its next
//! probe, and the try goes on through nginx's next-upstream step.

use std::net::SocketAddr;

use super::ctx_of;
use crate::cache::config::sentinel::Sentinel;
use crate::cache::config::target::Target;
use crate::cache::config::{Cache, CacheLocConf, CacheMainConf};
use crate::cache::driver::sentinel::{self as watch, SetConf};
use crate::ffi::balancer::{self, Inner, Wrapper};
use crate::ffi::conf::socket_addr;
use crate::ffi::*;

/// How many servers a request tries: the first, and masters after it.
const TRIES: ngx_uint_t = 4;

/// A request's part in a Sentinel set (in its Ctx).
pub struct SentinelReq {
    set: *const Sentinel,
    /// The server of the current try.
    current: Option<SocketAddr>,
    /// The current try's server said it cannot take the command
    /// (`READONLY`): it is not the master.
    pub not_now: bool,
    /// A read that may go to a replica: the location's target, and its
    /// `cache_replica_max_lag`.
    reads: Option<(Target, ngx_msec_t)>,
    /// The current try goes to a replica.
    on_replica: bool,
}

/// Where a request goes now.
pub enum Route {
    Replica(SocketAddr),
    /// `cache_target replica`, and no replica is usable now.
    NoReplica,
    Master,
}

impl SentinelReq {
    pub fn new(set: &Sentinel, reads: Option<(Target, ngx_msec_t)>) -> SentinelReq {
        SentinelReq {
            set,
            current: None,
            not_now: false,
            reads,
            on_replica: false,
        }
    }

    /// A replica, when the request is a read that may go to one (`take`:
    /// the try goes there).
    pub fn route(&self, take: bool) -> Route {
        let Some((target, max_lag)) = self.reads else {
            return Route::Master;
        };
        let s = self.set();
        match (watch::replica(s.key(), || conf_of(s), max_lag, take), target) {
            (Some(a), _) => Route::Replica(a),
            (None, Target::Replica) => Route::NoReplica,
            (None, _) => Route::Master,
        }
    }

    fn set(&self) -> &Sentinel {
        // SAFETY: the configuration's Sentinel, which outlives its requests.
        unsafe { &*self.set }
    }

    /// The set, for a log line: `sentinel set "NAME" of upstream "UP"`.
    pub fn describe(&self) -> String {
        let s = self.set();
        format!(
            "sentinel set \"{}\" of upstream \"{}\"",
            String::from_utf8_lossy(&s.name),
            s.upstream()
        )
    }

    /// The confirmed master (None: none now).
    pub fn master(&self) -> Option<SocketAddr> {
        let s = self.set();
        watch::view(s.key(), || conf_of(s)).master
    }

    /// Waits for a confirmed master: `resume` runs with the request once
    /// there is one.
    pub fn wait(&self, who: crate::common::token::ReqToken, resume: watch::Resume) {
        let s = self.set();
        watch::wait(s.key(), || conf_of(s), who, resume);
    }
}

/// The worker's settings of a set, from the configuration.
pub(super) fn conf_of(s: &Sentinel) -> SetConf {
    SetConf {
        key: s.key(),
        upstream: s.upstream(),
        name: s.name.clone(),
        sentinels: s.sentinels.clone(),
        auth: s.auth.clone(),
        data_auth: s.data_auth.clone(),
        connect_timeout: s.connect_timeout,
        tls: s.tls.clone(),
        replicas: s.replicas,
    }
}

/// What the peer keeps for a request (in its pool).
struct PeerData {
    /// Round robin over the Sentinels: never asked for a peer, kept for
    /// the block's state.
    rr: Inner,
    r: *mut ngx_http_request_t,
}

peer_init_handler! {
    pub(crate) fn init_peer(r, us) = "cache_sentinel peer init", {
        let Some(rr) = Inner::init(r, us, None) else { return ERROR };
        let mcf: &CacheMainConf = r.main_conf::<Cache>();
        let Some(set) = mcf.sentinel_of(us) else { return ERROR };
        let lcf: &CacheLocConf = r.loc_conf::<Cache>();
        let Some(ctx) = ctx_of(r) else {
            // A request of another module (proxy_pass to this block): it
            // would go to a Sentinel.
            crate::log!(
                NGX_LOG_ERR,
                r.log(),
                "cache: upstream \"{}\" has \"cache_sentinel\": its servers are Sentinels, and only \"cache_pass\" can pass to it",
                set.upstream()
            );
            return ERROR;
        };
        if ctx.sentinel.is_none() {
            // (Reads only: a write goes to the master whatever the target.)
            let read = ctx.command == gateway_core::redis::Command::Get;
            let reads = lcf
                .target
                .filter(|t| read && lcf.reads_replicas() && *t != Target::Master)
                .map(|t| (t, lcf.replica_max_lag));
            ctx.sentinel = Some(SentinelReq::new(set, reads));
        }
        let (pool, rp) = (r.pool(), r.as_ptr());
        let Some(u) = r.upstream() else { return ERROR };
        let peer = u.peer();
        let sessions = rr.sessions();
        let Some(pd) = pool.alloc(PeerData { rr, r: rp }) else { return ERROR };
        balancer::install(peer, pd, sessions);
        peer.tries = TRIES;
        OK
    }
}

impl Wrapper for PeerData {
    const GET: &'static str = "cache_sentinel peer get";
    const FREE: &'static str = "cache_sentinel peer free";
    const SET_SESSION: &'static str = "cache_sentinel set_session";
    const SAVE_SESSION: &'static str = "cache_sentinel save_session";

    fn get(&mut self, pc: &mut ngx_peer_connection_t, log: Log) -> ngx_int_t {
        // SAFETY: the PeerData's request, in a peer callback (nginx calls
        // them while the request is live, from its own code).
        let r = unsafe { Req::from_raw(self.r) };
        let pool = r.pool();
        let Some(ctx) = ctx_of(r) else { return ERROR };
        let Some(sr) = ctx.sentinel.as_mut() else {
            return ERROR;
        };
        self.rr.set_unused();
        let replica = match sr.route(true) {
            Route::Replica(a) => Some(a),
            Route::NoReplica => {
                crate::log!(
                    NGX_LOG_ERR,
                    log,
                    "cache: no replica of sentinel set \"{}\" is usable now",
                    String::from_utf8_lossy(&sr.set().name)
                );
                ctx.retry_after = true;
                return BUSY;
            }
            Route::Master => None,
        };
        sr.on_replica = replica.is_some();
        let Some(addr) = replica.or_else(|| sr.master()) else {
            crate::log!(
                NGX_LOG_ERR,
                log,
                "cache: no master of sentinel set \"{}\" is confirmed now",
                String::from_utf8_lossy(&sr.set().name)
            );
            ctx.retry_after = true;
            return BUSY;
        };
        let Some((sa, len, name)) = pool.peer_addr(addr) else {
            return ERROR;
        };
        pc.sockaddr = sa;
        pc.socklen = len;
        pc.name = name;
        pc.set_cached(0);
        pc.connection = std::ptr::null_mut();
        sr.current = socket_addr(balancer::chosen(pc));
        sr.not_now = false;
        ctx.retry_after = false;
        OK
    }

    fn free(&mut self, pc: &mut ngx_peer_connection_t, state: ngx_uint_t) {
        // SAFETY: as in get.
        let r = unsafe { Req::from_raw(self.r) };
        let tries = pc.tries;
        self.rr.free(pc, state);
        pc.tries = tries.saturating_sub(1);
        let Some(ctx) = ctx_of(r) else { return };
        let Some(sr) = ctx.sentinel.as_mut() else {
            return;
        };
        let failed = state & NGX_PEER_FAILED as ngx_uint_t != 0;
        if std::mem::take(&mut sr.on_replica) {
            if let Some(addr) = sr.current.take().filter(|_| failed) {
                let s = sr.set();
                watch::replica_failed(s.key(), || conf_of(s), addr);
            }
            return;
        }
        let why = if sr.not_now {
            "it cannot take writes (READONLY)"
        } else if failed {
            "no connection or no reply"
        } else {
            // A try that ended well on a master the set has left since it
            // began: nginx's keepalive has just kept its connection, which
            // no request is to use again.
            if let Some(addr) = sr.current.take().filter(|&a| sr.master() != Some(a)) {
                crate::ffi::net::close_idle_outbound_to(addr);
            }
            return;
        };
        ctx.retry_after = true;
        if let Some(addr) = sr.current.take() {
            let s = sr.set();
            watch::suspect(s.key(), || conf_of(s), addr, why);
        }
    }

    fn set_session(&mut self, pc: &mut ngx_peer_connection_t) -> ngx_int_t {
        self.rr.set_session(pc)
    }

    fn save_session(&mut self, pc: &mut ngx_peer_connection_t) {
        self.rr.save_session(pc)
    }
}

cycle_handler! {
    /// Each worker starts the watch of every Sentinel set at once: the
    /// first requests find the master confirmed, and every worker follows
    /// the switches whether it has served requests or not.
    pub(crate) fn init_process(cycle, _log) = "cache init_process", {
        use ngx::http::HttpModuleMainConf;
        if let Some(mcf) = Cache::main_conf(cycle) {
            for s in mcf.sentinels.iter().filter(|s| !s.name.is_empty()) {
                watch::view(s.key(), || conf_of(s));
            }
        }
        OK
    }
}
