//! The balancer of a Redis Cluster (`cache_cluster on`, config::cluster):
//! the block's balancer is wrapped. nginx's round robin over the seeds stays
//! underneath, for the requests that have no node to go to yet; every
//! other request goes to the master that serves its key's slot, from the
//! worker's map of the cluster (core's `cluster::Topology`, driver::cluster_map).
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

use std::ffi::c_void;
use std::ptr::NonNull;

use gateway_core::cluster::RedirectKind;
use gateway_core::redis::ClusterSteps;

use super::cluster::TRIES;
use super::upstream::build_request;
use super::{ctx_of, Ctx};
use crate::cache::config::{Cache, CacheMainConf};
use crate::cache::driver;
use crate::ffi::conf::socket_addr;
use crate::ffi::*;

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
}

pub(crate) extern "C" fn init_peer(r: *mut ngx_http_request_t, us: *mut ngx_http_upstream_srv_conf_t) -> ngx_int_t {
    // SAFETY: nginx calls this with a live request that has an upstream,
    // for a block whose init_upstream was ours.
    let r = unsafe { Req::from_raw(r) };
    guard(r.log(), "cache_cluster peer init", ERROR, || {
        // SAFETY: as above.
        if unsafe { ngx_http_upstream_init_round_robin_peer(r.as_ptr(), us) } != OK {
            return ERROR;
        }
        let mcf: &CacheMainConf = r.main_conf::<Cache>();
        let Some(cluster) = mcf.cluster_of(us) else {
            return ERROR;
        };
        // A request of another module (proxy_pass to this block): round robin.
        let Some(ctx) = ctx_of(r) else { return OK };
        let Some(cr) = ctx.cluster.as_mut() else { return OK };
        let seeds = || cluster.seeds.clone();
        cr.map = Some(driver::cluster_map(us as usize, seeds));
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
        let ctx = unsafe { &mut *pd.ctx.as_ptr() };
        let Some(cr) = ctx.cluster.as_mut() else { return ERROR };
        let Some(map) = cr.map.clone() else { return ERROR };
        let topo = map.borrow();
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
        let ctx = unsafe { &mut *pd.ctx.as_ptr() };
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
            if let Some(map) = &cr.map {
                map.borrow_mut().mark_stale();
            }
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
