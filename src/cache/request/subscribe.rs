//! `cache_subscribe CHANNEL`: a GET is a server-sent event stream of a
//! Redis channel, heard through the worker's hub for the location's
//! upstream (driver::hub); the stream itself is common::sse's.

use gateway_core::pubsub;

use super::tls_of_location;
use crate::cache::config::{Cache, CacheLocConf};
use crate::cache::driver::{self, authfail, hub::Addr, hub::HubSettings, sentinel::Follow};
use crate::common::hub::HubRef;
use crate::common::sse::{self, Fanout, Refused};
use crate::ffi::conf::upstream_servers;
use crate::ffi::*;
use crate::log;

/// The fan-out of `cache_subscribe`'s events.
pub static FANOUT: Fanout = Fanout::new("cache_subscribe", 1, "cache_subscribe_buffers_max", "cache", || {
    <Cache as ngx::http::HttpModule>::module()
});

/// Starts a subscription; what the content handler returns.
pub fn start(r: &mut Req, lcf: &CacheLocConf) -> Result<ngx_int_t, Refused> {
    let Some(cv) = lcf.subscribe else {
        return Err(Refused::Nginx);
    };
    let channel = r.complex_value(cv).ok_or(Refused::Nginx)?.to_vec();
    let auth = match lcf.auth {
        None => None,
        Some(cv) => Some(r.complex_value(cv).ok_or(Refused::Nginx)?.to_vec()),
    };
    let buffers_max = r.main_conf::<Cache>().subscribe_buffers_max;
    sse::start(
        r,
        &channel,
        pubsub::valid_channel,
        sse::Source {
            block: crate::ffi::conf::block_of(&lcf.upstream),
            every: lcf.subscribe_heartbeat,
            buffers_max,
            retry: lcf.subscribe_retry,
        },
        &FANOUT,
        |r| hub(r, lcf, auth),
    )
}

/// The worker's hub for the location's upstream and password, made on first use.
fn hub(r: &mut Req, lcf: &CacheLocConf, auth: Option<Vec<u8>>) -> Option<HubRef> {
    let block = lcf.upstream.upstream;
    let make = || {
        // SAFETY: the upstream block lives as long as the configuration.
        let us = unsafe { block.as_ref() }?;
        let addrs: Vec<Addr> = upstream_servers(us, false)
            .into_iter()
            .map(|(sockaddr, name)| Addr { sockaddr, name })
            .collect();
        if addrs.is_empty() {
            log!(
                NGX_LOG_ERR,
                r.log(),
                "cache: upstream \"{}\" has no address to subscribe to",
                String::from_utf8_lossy(us.host.as_bytes())
            );
            return None;
        }
        // (An address written in cache_pass is an upstream of its own, its
        // port apart.)
        let mut name = String::from_utf8_lossy(us.host.as_bytes()).into_owned();
        if us.port != 0 {
            name = format!("{name}:{}", us.port);
        }
        let tls = tls_of_location(r, lcf, us.host.as_bytes())?;
        let auth_key = auth
            .as_deref()
            .map(|pw| authfail::key(&authfail::block_scope(block), pw));
        // A cluster delivers every PUBLISH on each node: one connection, to
        // its nodes in turn; a Sentinel set's master: one connection, there
        // (its servers are the Sentinels). Otherwise one connection to each
        // address.
        let mcf = r.main_conf::<Cache>();
        let follow = mcf.sentinel_of(block).map(|s| Follow::new(super::sentinel::conf_of(s)));
        let groups = if follow.is_some() {
            vec![vec![Addr {
                sockaddr: Vec::new(),
                name: name.clone(),
            }]]
        } else if mcf.cluster_of(block).is_some() {
            vec![addrs]
        } else {
            addrs.into_iter().map(|a| vec![a]).collect()
        };
        Some(HubSettings {
            upstream: name,
            groups,
            auth: auth.clone(),
            auth_key,
            tls,
            connect_timeout: lcf.upstream.connect_timeout,
            follow,
        })
    };
    driver::hub(block as usize, auth.clone(), &FANOUT, make)
}
