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

use gateway_core::cluster::RedirectKind;
use gateway_core::redis::ClusterSteps;

use super::cluster::TRIES;
use super::ctx_of;
use super::upstream::build_request;
use crate::cache::config::{Cache, CacheMainConf};
use crate::cache::driver;
use crate::ffi::balancer::{self, Inner, Wrapper};
use crate::ffi::conf::socket_addr;
use crate::ffi::*;

/// What the cluster's peer keeps for a request (in its pool).
struct PeerData {
    /// Round robin over the seeds. The current try is its pick (a seed):
    /// it is told of its end; a node of the map is not its business.
    rr: Inner,
    /// Its request (the PeerData is in the request's pool).
    r: *mut ngx_http_request_t,
}

/// The request of a peer's callback.
///
/// # Safety
/// `r` must be the PeerData's request: nginx calls a peer's callbacks
/// while its request is live, from its own code (no code of the module
/// holds the request meanwhile).
unsafe fn request<'a>(r: *mut ngx_http_request_t) -> &'a mut Req {
    // SAFETY: see above.
    unsafe { Req::from_raw(r) }
}

peer_init_handler! {
    pub(crate) fn init_peer(r, us) = "cache_cluster peer init", {
        let Some(rr) = Inner::init(r, us, None) else { return ERROR };
        let mcf: &CacheMainConf = r.main_conf::<Cache>();
        let Some(cluster) = mcf.cluster_of(us) else {
            return ERROR;
        };
        // A request of another module (proxy_pass to this block): round robin.
        let Some(cr) = ctx_of(r).and_then(|c| c.cluster.as_mut()) else { return OK };
        let seeds = || cluster.seeds.clone();
        cr.map = Some(driver::cluster_map(us as *const _ as usize, seeds));
        let (pool, rp) = (r.pool(), r.as_ptr());
        let Some(u) = r.upstream() else { return ERROR };
        let peer = u.peer();
        let sessions = rr.sessions();
        let pd = PeerData { rr, r: rp };
        let Some(pd) = pool.alloc(pd) else { return ERROR };
        balancer::install(peer, pd, sessions);
        peer.tries = TRIES;
        OK
    }
}

impl Wrapper for PeerData {
    const GET: &'static str = "cache_cluster peer get";
    const FREE: &'static str = "cache_cluster peer free";
    const SET_SESSION: &'static str = "cache_cluster set_session";
    const SAVE_SESSION: &'static str = "cache_cluster save_session";

    fn get(&mut self, pc: &mut ngx_peer_connection_t, _log: Log) -> ngx_int_t {
        // SAFETY: the PeerData's request, in a peer callback.
        let r = unsafe { request(self.r) };
        let pool = r.pool();
        let Some(cr) = ctx_of(r).and_then(|c| c.cluster.as_mut()) else {
            return ERROR;
        };
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
        self.rr.set_unused();
        match target {
            Some(addr) => {
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
                let rc = self.rr.get(pc);
                if rc != OK {
                    return rc;
                }
            }
        }
        cr.current = socket_addr(balancer::chosen(pc));
        cr.steps = steps;
        cr.spoke = false;
        if !build_request(r) {
            return ERROR;
        }
        OK
    }

    fn free(&mut self, pc: &mut ngx_peer_connection_t, state: ngx_uint_t) {
        // SAFETY: as in get.
        let r = unsafe { request(self.r) };
        let Some(cr) = ctx_of(r).and_then(|c| c.cluster.as_mut()) else {
            return;
        };
        // (A redirection, or a request sent to a seed for a new map.)
        let redirected = cr.redirect.is_some() || cr.refresh;
        let failed = state & NGX_PEER_FAILED as ngx_uint_t != 0 && !redirected;
        // A node that does not connect or answer: the map may be out of date.
        let silent = failed && !cr.spoke;
        // Round robin counts tries its own way (0 with one seed): ours are
        // kept.
        let tries = pc.tries;
        self.rr
            .free(pc, if redirected { NGX_PEER_NEXT as ngx_uint_t } else { state });
        pc.tries = tries;
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
    }

    /// TLS sessions are round robin's, for its seeds; a node of the map
    /// starts a new one.
    fn set_session(&mut self, pc: &mut ngx_peer_connection_t) -> ngx_int_t {
        self.rr.set_session(pc)
    }

    fn save_session(&mut self, pc: &mut ngx_peer_connection_t) {
        self.rr.save_session(pc)
    }
}
