//! `cache_sentinel NAME`: an upstream block whose `server` lines are Redis
//! Sentinels watching the master set NAME. The block's balancer is wrapped
//! (request::sentinel): requests go to the master the Sentinels name, as
//! the worker's watcher of the set (driver::sentinel) has confirmed it.

use std::net::SocketAddr;

use super::{Cache, CacheLocConf, CacheMainConf, PendingPass};
use crate::ffi::conf::{upstream_server_addrs, ConfError, Position};
use crate::ffi::net::TlsClient;
use crate::ffi::*;

/// An upstream block with `cache_sentinel`.
pub struct Sentinel {
    pub uscf: *const ngx_http_upstream_srv_conf_t,
    /// The master set's name, as the Sentinels know it.
    pub name: Vec<u8>,
    /// `cache_sentinel_auth`: the Sentinels' password.
    pub auth: Option<Vec<u8>>,
    /// The password of the data servers: the `cache_auth` of the locations
    /// that pass to the block (a literal, the same in each).
    pub data_auth: Option<Vec<u8>>,
    /// The connect timeout the watcher uses (the locations' smallest
    /// `cache_connect_timeout`).
    pub connect_timeout: ngx_msec_t,
    /// TLS to the Sentinels and the servers (the locations' `cache_ssl`,
    /// the same in each).
    pub tls: Option<TlsClient>,
    /// A location's reads may go to its replicas (`cache_target`).
    pub replicas: bool,
    /// Its peer init is in place (a balancing method read after it would
    /// have replaced it).
    initialized: bool,
    /// The block's servers: the Sentinels.
    pub sentinels: Vec<SocketAddr>,
    /// Where the directive was written.
    at: Position,
    /// Where `cache_sentinel_auth` was written, when before `cache_sentinel`
    /// (it is kept until `cache_sentinel` comes).
    auth_at: Option<Position>,
}

impl Sentinel {
    pub fn upstream(&self) -> String {
        // SAFETY: the upstream block lives as long as the configuration.
        unsafe { self.uscf.as_ref() }
            .map_or_else(String::new, |u| String::from_utf8_lossy(u.host.as_bytes()).into_owned())
    }

    /// The block's address: the key of its state in each worker.
    pub fn key(&self) -> usize {
        self.uscf as usize
    }

    fn err(&self, m: String) -> ConfError {
        ConfError::At(m, self.at.clone())
    }
}

impl CacheMainConf {
    /// The Sentinel set of an upstream block, when it has `cache_sentinel`.
    pub fn sentinel_of(&self, uscf: *const ngx_http_upstream_srv_conf_t) -> Option<&Sentinel> {
        self.sentinels
            .iter()
            .map(|s| &**s)
            .find(|s| s.uscf == uscf && !s.name.is_empty())
    }

    fn sentinel_entry(&mut self, uscf: *const ngx_http_upstream_srv_conf_t, at: Position) -> &mut Sentinel {
        let i = match self.sentinels.iter().position(|s| s.uscf == uscf) {
            Some(i) => i,
            None => {
                self.sentinels.push(Box::new(Sentinel {
                    uscf,
                    name: Vec::new(),
                    auth: None,
                    data_auth: None,
                    connect_timeout: 0,
                    tls: None,
                    replicas: false,
                    initialized: false,
                    sentinels: Vec::new(),
                    at,
                    auth_at: None,
                }));
                self.sentinels.len() - 1
            }
        };
        &mut self.sentinels[i]
    }
}

directive_handler! {
    /// `cache_sentinel NAME` (upstream).
    pub(crate) fn cmd_cache_sentinel<E: super::Entries> = "cmd_cache_sentinel",
    |cf: Conf, mcf: &mut CacheMainConf| {
        let name = cf.args()[1];
        if name.is_empty() || name.iter().any(|b| !b.is_ascii_graphic()) {
            return Err(format!(
                "invalid master set name \"{}\" in \"cache_sentinel\" directive (visible ASCII characters)",
                String::from_utf8_lossy(name)
            )
            .into());
        }
        let ptr = cf.with_upstream_block(|uscf| {
            let ptr: *const ngx_http_upstream_srv_conf_t = &*uscf;
            if mcf.sentinel_of(ptr).is_some() {
                return Err(crate::ffi::conf::duplicate("cache_sentinel"));
            }
            if mcf.cluster_of(ptr).is_some() {
                return Err("\"cache_sentinel\" and \"cache_cluster on\" in one upstream block".to_owned().into());
            }
            if uscf.peer.init_upstream.is_some() {
                return Err(
                    "\"cache_sentinel\" must come before \"keepalive\" in its upstream block, and takes no balancing method (\"hash\", \"least_conn\", ...)"
                        .to_owned()
                        .into(),
                );
            }
            uscf.peer.init_upstream = Some(init_upstream::<E>);
            Ok(ptr)
        })?;
        let s = mcf.sentinel_entry(ptr, cf.position());
        s.at = cf.position();
        s.name = name.to_vec();
        Ok(())
    }
}

directive_handler! {
    /// `cache_sentinel_auth password` (upstream): the Sentinels' password.
    pub(crate) fn cmd_cache_sentinel_auth = "cmd_cache_sentinel_auth",
    |cf: Conf, mcf: &mut CacheMainConf| {
        let pw = cf.args()[1];
        if cf.has_variables(pw) {
            return Err("\"cache_sentinel_auth\" takes no variables (the Sentinels are asked for no request)"
                .to_owned()
                .into());
        }
        let ptr = cf.with_upstream_block(|uscf| -> *const ngx_http_upstream_srv_conf_t { &*uscf });
        let s = mcf.sentinel_entry(ptr, cf.position());
        if s.auth_at.is_some() {
            return Err(crate::ffi::conf::duplicate("cache_sentinel_auth"));
        }
        s.auth_at = Some(cf.position());
        // An empty password is none (as for cache_auth).
        s.auth = Some(pw.to_vec()).filter(|p| !p.is_empty());
        Ok(())
    }
}

init_upstream_handler! {
    /// The block's balancer, at the end of the http block: nginx's round
    /// robin over the Sentinels (for their addresses), and our per-request
    /// init in front of it.
    fn init_upstream<E: super::Entries> = "cache_sentinel init_upstream",
    |cf: Conf, uscf: &mut ngx_http_upstream_srv_conf_t| {
        cf.init_round_robin(uscf)?;
        uscf.peer.init = E::SENTINEL_PEER_INIT;
        let addrs = upstream_server_addrs(uscf);
        let us: *const ngx_http_upstream_srv_conf_t = uscf;
        cf.with_main_conf::<Cache, _>(|mcf| {
            for s in mcf.sentinels.iter_mut().filter(|s| s.uscf == us) {
                s.initialized = true;
                s.sentinels = addrs.clone();
            }
        });
        Ok(())
    }
}

/// Every `cache_sentinel` kept its balancer and names Sentinels; its
/// locations agree on one literal password (and on TLS: tls.rs); no
/// `cache_sentinel_auth` is alone. The data servers' password, the connect
/// timeout and TLS are taken from the locations.
pub(super) fn check(mcf: &mut CacheMainConf, pending: &[PendingPass]) -> Result<(), ConfError> {
    let owner_of = mcf.owner_of;
    for s in mcf.sentinels.iter_mut() {
        if s.name.is_empty() {
            let at = s.auth_at.clone().unwrap_or_else(|| s.at.clone());
            return Err(ConfError::At(
                "\"cache_sentinel_auth\" without \"cache_sentinel\" in its upstream block".to_owned(),
                at,
            ));
        }
        // SAFETY: the upstream block lives as long as the configuration.
        let Some(u) = (unsafe { s.uscf.as_ref() }) else {
            continue;
        };
        if let Some(owner) = owner_of.and_then(|f| f(u)) {
            return Err(s.err(format!(
                "\"cache_sentinel\" in upstream \"{}\", which has \"{}\" lines",
                s.upstream(),
                owner.server
            )));
        }
        if !s.initialized {
            return Err(s.err(format!(
                "a balancing method after \"cache_sentinel\" replaced it in upstream \"{}\"",
                s.upstream()
            )));
        }
        if s.sentinels.is_empty() {
            let what = if crate::ffi::conf::upstream_servers(u, true).is_empty() {
                "no \"server\" lines"
            } else {
                "no \"server\" lines of an IP address"
            };
            return Err(s.err(format!(
                "\"cache_sentinel\" in upstream \"{}\" with {what} (the Sentinels, by IP address and port)",
                s.upstream()
            )));
        }
        if let Some((server, which)) = crate::ffi::conf::weighed_server(u) {
            return Err(s.err(format!(
                "\"{which}\" in the \"server {server}\" line of upstream \"{}\", an upstream of \"cache_sentinel\" (its servers are the Sentinels, all watched alike)",
                s.upstream()
            )));
        }
        let mut first: Option<&PendingPass> = None;
        for p in pending.iter().filter(|p| p.upstream.cast_const() == s.uscf) {
            // SAFETY: locations' configurations live as long as the
            // configuration; merging is over.
            let lcf: &CacheLocConf = unsafe { &*p.lcf };
            let at = || format!("{}:{}", p.claim.file(), p.claim.line());
            let tls = match (&lcf.ssl_name_text, lcf.upstream.ssl.is_null()) {
                (_, true) => None,
                (Some((_, false)), _) => {
                    return Err(format!(
                        "\"cache_ssl_name\" with variables and \"cache_pass\" to \"{}\", an upstream of \"cache_sentinel\" (the Sentinels and the servers are reached for no request), in {}",
                        s.upstream(),
                        at()
                    )
                    .into())
                }
                (name, false) => Some(TlsClient {
                    ssl: lcf.upstream.ssl,
                    verify: lcf.upstream.ssl_verify == 1,
                    server_name: lcf.upstream.ssl_server_name == 1,
                    name: name.as_ref().map_or_else(|| s.upstream().into_bytes(), |(n, _)| n.clone()),
                }),
            };
            let auth = lcf.auth_literal().ok_or_else(|| {
                format!(
                    "\"cache_auth\" with variables and \"cache_pass\" to \"{}\", an upstream of \"cache_sentinel\" (the master is checked for no request), in {}",
                    s.upstream(),
                    at()
                )
            })?;
            match first {
                None => {
                    s.data_auth = auth;
                    s.connect_timeout = lcf.upstream.connect_timeout;
                    s.tls = tls;
                    first = Some(p);
                }
                Some(f) if s.data_auth != auth => {
                    return Err(format!(
                        "\"cache_pass\" to \"{}\", an upstream of \"cache_sentinel\", in {}:{} and in {} with different \"cache_auth\" passwords",
                        s.upstream(),
                        f.claim.file(),
                        f.claim.line(),
                        at()
                    )
                    .into());
                }
                Some(_) => s.connect_timeout = s.connect_timeout.min(lcf.upstream.connect_timeout),
            }
        }
        if s.connect_timeout == 0 {
            s.connect_timeout = 60_000;
        }
    }
    Ok(())
}
