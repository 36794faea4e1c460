//! `cache_cluster on`: an upstream block whose `server` lines are seeds of
//! a Redis Cluster. The block's balancer is wrapped: nginx's round robin
//! over the seeds stays underneath, for the requests that have no node to
//! go to yet; every other request goes to the master that serves its key's
//! slot, from the worker's map of the cluster (core's `cluster::Topology`).
//!
//! The map is learned in the requests' own round trips (`CLUSTER SLOTS`
//! before the command, when the map is missing or out of date), always
//! from a seed (a `server` of the block: only the configuration is
//! trusted to say what the cluster is), corrected by `-MOVED`, and marked
//! out of date when a node fails or answers garbage. `-MOVED` and `-ASK`
//! send the request again through nginx's own next-upstream step
//! (process_header returns an invalid header), to the node they name when
//! the map trusts it; a node it does not know sends the request to a seed
//! first, for a new map, and is refused when that map does not name it
//! either. The peer's free does not count these steps as the server's
//! failure.

use std::cell::RefCell;
use std::ffi::{c_char, c_void};
use std::net::SocketAddr;
use std::ptr::NonNull;

use gateway_core::cluster::{RedirectKind, Topology};
use gateway_core::redis::ClusterSteps;

use super::config::{Cache, CacheMainConf};
use super::request::{build_request, ctx_of, Ctx};
use crate::ffi::conf::{conf_step, directive, socket_addr, upstream_server_addrs, ConfError};
use crate::ffi::*;
use crate::log;

/// How many times a request may go to a node: the first try, and
/// redirections or failed nodes after it.
pub const TRIES: ngx_uint_t = 8;

/// How many redirections a request follows before it gives up (502).
pub const MAX_REDIRECTS: u32 = 5;

/// An upstream block with `cache_cluster`: its map of the cluster, one per
/// worker (the configuration's memory is each worker's own after fork).
pub struct Cluster {
    pub uscf: *const ngx_http_upstream_srv_conf_t,
    pub on: bool,
    /// Its peer init is in place (a balancing method read after
    /// `cache_cluster` would have replaced it).
    initialized: bool,
    pub topology: RefCell<Topology>,
}

impl Cluster {
    fn name(&self) -> String {
        // SAFETY: the upstream block lives as long as the configuration.
        unsafe { self.uscf.as_ref() }
            .map_or_else(String::new, |u| String::from_utf8_lossy(u.host.as_bytes()).into_owned())
    }
}

/// The cluster of an upstream block, when it has `cache_cluster on`.
pub fn cluster_of(mcf: &CacheMainConf, uscf: *const ngx_http_upstream_srv_conf_t) -> Option<&Cluster> {
    mcf.clusters.iter().map(|c| &**c).find(|c| c.on && c.uscf == uscf)
}

/// `cache_cluster on | off` (upstream).
pub(crate) extern "C" fn cmd_cache_cluster(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    let body = |cf: Conf, mcf: &mut CacheMainConf| {
        let value = cf.args()[1].to_ascii_lowercase();
        let on = match value.as_slice() {
            b"on" => true,
            b"off" => false,
            _ => {
                return Err(format!(
                    "invalid value \"{}\" in \"cache_cluster\" directive, it must be \"on\" or \"off\"",
                    String::from_utf8_lossy(cf.args()[1])
                )
                .into())
            }
        };
        let uscf = cf.upstream_block();
        let ptr: *const ngx_http_upstream_srv_conf_t = &*uscf;
        if mcf.clusters.iter().any(|c| c.uscf == ptr) {
            return Err("\"cache_cluster\" directive is duplicate".to_owned().into());
        }
        if on && uscf.peer.init_upstream.is_some() {
            // keepalive wraps the balancer that is set when it is read:
            // it must find ours. Any balancing method would be replaced.
            return Err(
                "\"cache_cluster\" must come before \"keepalive\" in its upstream block, and takes no balancing method (\"hash\", \"least_conn\", ...)"
                    .to_owned()
                    .into(),
            );
        }
        if on {
            uscf.peer.init_upstream = Some(init_upstream);
        }
        mcf.clusters.push(Box::new(Cluster {
            uscf: ptr,
            on,
            initialized: false,
            topology: RefCell::new(Topology::new()),
        }));
        Ok(())
    };
    // SAFETY: nginx passes the configuration being read and this module's
    // CacheMainConf (the directive's configuration is the main one).
    unsafe { directive(cf, conf, "cmd_cache_cluster", body) }
}

/// The block's balancer, at the end of the http block: nginx's round robin
/// over the seeds, and our per-request init in front of it.
extern "C" fn init_upstream(cf: *mut ngx_conf_t, us: *mut ngx_http_upstream_srv_conf_t) -> ngx_int_t {
    let body = |cf: Conf| {
        // SAFETY: nginx passes the block being initialized and the configuration.
        if unsafe { ngx_http_upstream_init_round_robin(cf.raw_ptr(), us) } != OK {
            return Err(ConfError::Logged);
        }
        // SAFETY: as above; the block lives as long as the configuration.
        let uscf = unsafe { &mut *us };
        uscf.peer.init = Some(init_peer);
        let seeds = upstream_server_addrs(uscf);
        let mcf = cf.main_conf::<Cache>();
        for c in mcf.clusters.iter_mut().filter(|c| c.uscf == us.cast_const()) {
            c.initialized = true;
            c.topology.borrow_mut().set_seeds(seeds.clone());
        }
        Ok(())
    };
    // SAFETY: nginx passes the configuration being initialized.
    unsafe { conf_step(cf, "cache_cluster init_upstream", body) }
}

/// Every `cache_cluster on` kept its balancer, and names a block of
/// `server` lines.
pub fn check(mcf: &CacheMainConf) -> Result<(), ConfError> {
    for c in mcf.clusters.iter().filter(|c| c.on) {
        // SAFETY: the upstream block lives as long as the configuration.
        let Some(u) = (unsafe { c.uscf.as_ref() }) else {
            continue;
        };
        let where_ = || {
            // SAFETY: nginx keeps the block's file name, NUL-terminated.
            let file = unsafe { std::ffi::CStr::from_ptr(u.file_name as *const c_char) }.to_string_lossy();
            format!("{file}:{}", u.line)
        };
        if let Some(owner) = mcf.foreign_owner(u) {
            return Err(format!(
                "\"cache_cluster\" in upstream \"{}\", which has \"{}\" lines, in {}",
                c.name(),
                owner.server,
                where_()
            )
            .into());
        }
        if !c.initialized {
            return Err(format!(
                "a balancing method after \"cache_cluster\" replaced it in upstream \"{}\" in {}",
                c.name(),
                where_()
            )
            .into());
        }
    }
    Ok(())
}

/// What the cluster's peer keeps for a request (in its pool).
struct PeerData {
    rr_data: *mut c_void,
    rr_get: ngx_event_get_peer_pt,
    rr_free: ngx_event_free_peer_pt,
    rr_set_session: ngx_event_set_peer_session_pt,
    rr_save_session: ngx_event_save_peer_session_pt,
    /// The current try is round robin's (a seed): round robin is told of
    /// its end; a node of the map is not round robin's business.
    rr_used: bool,
    ctx: NonNull<Ctx>,
    cluster: NonNull<Cluster>,
}

extern "C" fn init_peer(r: *mut ngx_http_request_t, us: *mut ngx_http_upstream_srv_conf_t) -> ngx_int_t {
    // SAFETY: nginx calls this with a live request that has an upstream,
    // for a block whose init_upstream was ours.
    let r = unsafe { Req::from_raw(r) };
    guard(r.log(), "cache_cluster peer init", ERROR, || {
        // SAFETY: as above.
        if unsafe { ngx_http_upstream_init_round_robin_peer(r.as_ptr(), us) } != OK {
            return ERROR;
        }
        let mcf: &CacheMainConf = r.main_conf::<Cache>();
        let Some(cluster) = cluster_of(mcf, us) else {
            return ERROR;
        };
        // A request of another module (proxy_pass to this block): round robin.
        let Some(ctx) = ctx_of(r) else { return OK };
        let Some(cr) = ctx.cluster.as_mut() else { return OK };
        cr.cluster = Some(NonNull::from(cluster));
        let pool = r.pool();
        let Some(u) = r.upstream() else { return ERROR };
        let peer = u.peer();
        let pd = PeerData {
            rr_data: peer.data,
            rr_get: peer.get,
            rr_free: peer.free,
            rr_set_session: peer.set_session,
            rr_save_session: peer.save_session,
            rr_used: false,
            ctx: NonNull::from(&mut *ctx),
            cluster: NonNull::from(cluster),
        };
        let Some(pd) = pool.alloc(pd) else { return ERROR };
        peer.data = pd.as_ptr().cast();
        peer.get = Some(peer_get);
        peer.free = Some(peer_free);
        if peer.set_session.is_some() {
            peer.set_session = Some(set_session);
        }
        if peer.save_session.is_some() {
            peer.save_session = Some(save_session);
        }
        peer.tries = TRIES;
        OK
    })
}

extern "C" fn peer_get(pc: *mut ngx_peer_connection_t, data: *mut c_void) -> ngx_int_t {
    // SAFETY: the peer's log is the request's.
    let log = unsafe { Log::from_raw((*pc).log) };
    guard(log, "cache_cluster peer get", ERROR, || {
        // SAFETY: data is the PeerData init_peer installed, in the
        // request's pool; its Ctx and Cluster outlive the request's peer.
        let pd = unsafe { &mut *(data as *mut PeerData) };
        // SAFETY: as above.
        let (ctx, cluster) = unsafe { (&mut *pd.ctx.as_ptr(), pd.cluster.as_ref()) };
        let Some(cr) = ctx.cluster.as_mut() else { return ERROR };
        let topo = cluster.topology.borrow();
        // A map is asked of seeds only. A request that needs one (none yet,
        // out of date, a redirection to a node the map does not know) goes
        // to a seed: the slot's master when that is one, else round robin's.
        let refresh = std::mem::take(&mut cr.refresh) || topo.needs_refresh();
        let mut steps = ClusterSteps::default();
        let target = match cr.redirect.take() {
            // (A node the map trusts: process_header checked.)
            Some((addr, kind)) => {
                steps.asking = kind == RedirectKind::Ask;
                Some(addr)
            }
            None => topo
                .owner(cr.slot)
                .filter(|a| !cr.failed.contains(a) && (!refresh || topo.is_seed(*a))),
        };
        steps.slots = refresh && target.is_none_or(|a| topo.is_seed(a));
        drop(topo);
        // SAFETY: the request's live peer (the request's upstream's).
        let pc = unsafe { &mut *pc };
        pd.rr_used = false;
        match target {
            Some(addr) => {
                // SAFETY: the Ctx's request is live while its peer is.
                let pool = unsafe { Req::from_raw(ctx.r) }.pool();
                let Some((sa, len, name)) = pool.peer_addr(addr) else {
                    return ERROR;
                };
                pc.sockaddr = sa;
                pc.socklen = len;
                pc.name = name;
                pc.set_cached(0);
                pc.connection = std::ptr::null_mut();
            }
            None => {
                // No map yet: a seed, by round robin.
                steps.slots = true;
                let Some(get) = pd.rr_get else { return ERROR };
                // SAFETY: round robin's own function, with its data.
                let rc = unsafe { get(pc, pd.rr_data) };
                if rc != OK {
                    return rc;
                }
                pd.rr_used = true;
            }
        }
        // SAFETY: the balancer set the address; socklen is its length.
        cr.current = socket_addr(unsafe { std::slice::from_raw_parts(pc.sockaddr as *const u8, pc.socklen as usize) });
        cr.steps = steps;
        cr.spoke = false;
        // SAFETY: as above.
        let r = unsafe { Req::from_raw(ctx.r) };
        if !build_request(r, ctx) {
            return ERROR;
        }
        OK
    })
}

extern "C" fn peer_free(pc: *mut ngx_peer_connection_t, data: *mut c_void, state: ngx_uint_t) {
    // SAFETY: the peer's log is the request's.
    let log = unsafe { Log::from_raw((*pc).log) };
    guard(log, "cache_cluster peer free", (), || {
        // SAFETY: as in peer_get.
        let (pc, pd) = unsafe { (&mut *pc, &mut *(data as *mut PeerData)) };
        // SAFETY: as in peer_get.
        let (ctx, cluster) = unsafe { (&mut *pd.ctx.as_ptr(), pd.cluster.as_ref()) };
        let Some(cr) = ctx.cluster.as_mut() else { return };
        // (A redirection, or a request sent to a seed for a new map.)
        let redirected = cr.redirect.is_some() || cr.refresh;
        let failed = state & NGX_PEER_FAILED as ngx_uint_t != 0 && !redirected;
        // A node that does not connect or answer: the map may be out of date.
        let silent = failed && !cr.spoke;
        if std::mem::take(&mut pd.rr_used) {
            if let Some(free) = pd.rr_free {
                // Round robin counts tries its own way (0 with one seed):
                // ours are kept.
                let tries = pc.tries;
                let state = if redirected { NGX_PEER_NEXT as ngx_uint_t } else { state };
                // SAFETY: round robin's own function, with its data.
                unsafe { free(pc, pd.rr_data, state) };
                pc.tries = tries;
            }
        }
        if silent {
            if let Some(a) = cr.current {
                if cr.failed.contains(&a) {
                    // The same node failed twice for this request (it is
                    // the only one the request can go to): no more tries,
                    // so that a node that does not answer costs at most two
                    // timeouts, not one per try.
                    cr.stop = true;
                } else {
                    cr.failed.push(a);
                }
            }
            cluster.topology.borrow_mut().mark_stale();
        }
        pc.tries = pc.tries.saturating_sub(1);
        if cr.stop {
            pc.tries = 0;
        }
    })
}

/// TLS sessions are round robin's, for its seeds; a node of the map
/// starts a new one.
extern "C" fn set_session(pc: *mut ngx_peer_connection_t, data: *mut c_void) -> ngx_int_t {
    // SAFETY: the peer's log is the request's.
    let log = unsafe { Log::from_raw((*pc).log) };
    guard(log, "cache_cluster set_session", OK, || {
        // SAFETY: as in peer_get.
        let pd = unsafe { &mut *(data as *mut PeerData) };
        match (pd.rr_used, pd.rr_set_session) {
            // SAFETY: round robin's own function, with its data.
            (true, Some(f)) => unsafe { f(pc, pd.rr_data) },
            _ => OK,
        }
    })
}

extern "C" fn save_session(pc: *mut ngx_peer_connection_t, data: *mut c_void) {
    // SAFETY: the peer's log is the request's.
    let log = unsafe { Log::from_raw((*pc).log) };
    guard(log, "cache_cluster save_session", (), || {
        // SAFETY: as in peer_get.
        let pd = unsafe { &mut *(data as *mut PeerData) };
        if let (true, Some(f)) = (pd.rr_used, pd.rr_save_session) {
            // SAFETY: round robin's own function, with its data.
            unsafe { f(pc, pd.rr_data) }
        }
    })
}

/// A request's part in the cluster (in its Ctx).
#[derive(Default)]
pub struct ClusterReq {
    /// The key's hash slot.
    pub slot: u16,
    /// The node the next try goes to, named by `-MOVED` or `-ASK` (one
    /// the map trusts).
    pub redirect: Option<(SocketAddr, RedirectKind)>,
    /// The next try goes to a seed, with `CLUSTER SLOTS` (a redirection
    /// named a node the map does not know).
    pub refresh: bool,
    /// A seed gave this request a new map: a node that map does not know is
    /// refused.
    pub refreshed: bool,
    pub redirects: u32,
    /// What goes before the command on the current try.
    pub steps: ClusterSteps,
    /// No further try (a broken reply, too many redirections).
    pub stop: bool,
    /// Nodes that failed during this request.
    pub failed: Vec<SocketAddr>,
    /// The node of the current try.
    pub current: Option<SocketAddr>,
    /// The node of the current try sent bytes: a failure of this try
    /// (an error reply, a broken one) says nothing of the map.
    pub spoke: bool,
    /// `cache_next_upstream invalid_response`: the user's own choice for
    /// broken replies (redirections are always followed).
    pub retry_invalid: bool,
    pub cluster: Option<NonNull<Cluster>>,
}

impl ClusterReq {
    pub fn topology(&self) -> Option<&RefCell<Topology>> {
        // SAFETY: the Cluster lives in the configuration, which outlives requests.
        self.cluster.map(|c| unsafe { &c.as_ref().topology })
    }

    /// The current node, for log lines.
    pub fn node(&self) -> String {
        self.current.map_or_else(|| "?".to_owned(), |a| a.to_string())
    }
}

/// Logged once per request that cannot be sent on.
pub fn log_stop(log: Log, what: std::fmt::Arguments<'_>) {
    log!(NGX_LOG_ERR, log, "cache: {what}");
}

/// The most addresses of refused redirections a worker remembers (to log
/// each once); past it, one more line says that further ones are not logged.
const REFUSED_LOGGED: usize = 64;

/// A redirection to a node that not even a new map from a seed names:
/// refused (the request gets 502). Logged once per address per worker, not
/// once per request: a hostile node could otherwise fill the log.
pub fn log_refused(log: Log, addr: SocketAddr, what: std::fmt::Arguments<'_>) {
    thread_local! {
        static SEEN: RefCell<Vec<SocketAddr>> = const { RefCell::new(Vec::new()) };
    }
    let first = SEEN.with(|seen| {
        let mut seen = seen.borrow_mut();
        if seen.contains(&addr) {
            return None;
        }
        if seen.len() > REFUSED_LOGGED {
            return None;
        }
        seen.push(addr);
        Some(seen.len() > REFUSED_LOGGED)
    });
    match first {
        Some(false) => log!(
            NGX_LOG_ERR,
            log,
            "cache: refused to follow {what}: {addr} is not a node of the cluster map that the upstream's servers give (logged once per address)"
        ),
        Some(true) => log!(
            NGX_LOG_ERR,
            log,
            "cache: refused to follow {what}: {addr} is not a node of the cluster map that the upstream's servers give (more than {REFUSED_LOGGED} addresses refused: further ones are not logged)"
        ),
        None => {}
    }
}
