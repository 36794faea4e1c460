//! A request's part in a Redis Cluster (`cache_cluster on`,
//! config::cluster): the key's slot, the node of each try, the
//! redirections it followed, and the worker's map (core's
//! `cluster::Topology`, driver::cluster_map). The balancer (balancer.rs)
//! and process_header (upstream.rs) read and change it.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;

use gateway_core::cluster::{RedirectKind, Topology};
use gateway_core::redis::ClusterSteps;

use crate::ffi::*;
use crate::log;

/// How many times a request may go to a node: the first try, and
/// redirections or failed nodes after it.
pub const TRIES: ngx_uint_t = 8;

/// How many redirections a request follows before it gives up (502).
pub const MAX_REDIRECTS: u32 = 5;

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
    /// The worker's map of the request's cluster.
    pub map: Option<Rc<RefCell<Topology>>>,
}

impl ClusterReq {
    pub fn topology(&self) -> Option<&RefCell<Topology>> {
        self.map.as_deref()
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
