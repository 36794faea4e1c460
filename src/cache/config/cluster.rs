//! `cache_cluster on`: an upstream block whose `server` lines are seeds of
//! a Redis Cluster. The block's balancer is wrapped (request::cluster);
//! the worker's map of the cluster is the driver's (driver::cluster_map),
//! made from the seeds this block names.

use std::net::SocketAddr;

use super::{Cache, CacheMainConf};
use crate::ffi::conf::{block_position, on_off, upstream_server_addrs, ConfError};
use crate::ffi::*;

/// An upstream block with `cache_cluster`.
pub struct Cluster {
    pub uscf: *const ngx_http_upstream_srv_conf_t,
    pub on: bool,
    /// Its peer init is in place (a balancing method read after
    /// `cache_cluster` would have replaced it).
    initialized: bool,
    /// The block's servers: the only nodes trusted to say what the cluster is.
    pub seeds: Vec<SocketAddr>,
}

impl Cluster {
    fn name(&self) -> String {
        // SAFETY: the upstream block lives as long as the configuration.
        unsafe { self.uscf.as_ref() }
            .map_or_else(String::new, |u| String::from_utf8_lossy(u.host.as_bytes()).into_owned())
    }
}

impl CacheMainConf {
    /// The cluster of an upstream block, when it has `cache_cluster on`.
    pub fn cluster_of(&self, uscf: *const ngx_http_upstream_srv_conf_t) -> Option<&Cluster> {
        self.clusters.iter().map(|c| &**c).find(|c| c.on && c.uscf == uscf)
    }
}

directive_handler! {
    /// `cache_cluster on | off` (upstream).
    pub(crate) fn cmd_cache_cluster<E: super::Entries> = "cmd_cache_cluster",
    |cf: Conf, mcf: &mut CacheMainConf| {
        let on = on_off("cache_cluster", cf.args()[1])?;
        let ptr = cf.with_upstream_block(|uscf| {
            let ptr: *const ngx_http_upstream_srv_conf_t = &*uscf;
            if mcf.clusters.iter().any(|c| c.uscf == ptr) {
                return Err(crate::ffi::conf::duplicate("cache_cluster"));
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
                uscf.peer.init_upstream = Some(init_upstream::<E>);
            }
            Ok(ptr)
        })?;
        mcf.clusters.push(Box::new(Cluster {
            uscf: ptr,
            on,
            initialized: false,
            seeds: Vec::new(),
        }));
        Ok(())
    }
}

init_upstream_handler! {
    /// The block's balancer, at the end of the http block: nginx's round robin
    /// over the seeds, and our per-request init in front of it.
    fn init_upstream<E: super::Entries> = "cache_cluster init_upstream",
    |cf: Conf, uscf: &mut ngx_http_upstream_srv_conf_t| {
        cf.init_round_robin(uscf)?;
        uscf.peer.init = E::PEER_INIT;
        let seeds = upstream_server_addrs(uscf);
        let us: *const ngx_http_upstream_srv_conf_t = uscf;
        cf.with_main_conf::<Cache, _>(|mcf| {
            for c in mcf.clusters.iter_mut().filter(|c| c.uscf == us) {
                c.initialized = true;
                c.seeds = seeds.clone();
            }
        });
        Ok(())
    }
}

/// Every `cache_cluster on` kept its balancer, and names a block of
/// `server` lines.
pub fn check(mcf: &CacheMainConf) -> Result<(), ConfError> {
    for c in mcf.clusters.iter().filter(|c| c.on) {
        // SAFETY: the upstream block lives as long as the configuration.
        let Some(u) = (unsafe { c.uscf.as_ref() }) else {
            continue;
        };
        let where_ = || block_position(u);
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
