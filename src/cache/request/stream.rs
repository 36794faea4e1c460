//! `cache_stream KEY`: a GET is a server-sent event stream of the entries
//! of a Redis stream, read by the worker's stream hub for the location's
//! upstream (driver::streams); the stream itself is common::sse's. A client
//! that comes back with `Last-Event-ID` (or the query argument
//! `last_event_id`) first gets the entries after it still in the stream.

use gateway_core::streams;

use super::tls_of_location;
use crate::cache::config::{Cache, CacheLocConf};
use crate::cache::driver::{self, authfail, hub::Addr, sentinel::Follow, streams::StreamSettings};
use crate::common::hub::HubRef;
use crate::common::sse::{self, Fanout, Refused, Resume};
use crate::ffi::conf::upstream_servers;
use crate::ffi::*;
use crate::log;

/// The fan-out of `cache_stream`'s events (its subscribers count, with
/// `cache_subscribe`'s, against `cache_subscribe_buffers_max`).
pub static FANOUT: Fanout = Fanout::new("cache_stream", 1, "cache_subscribe_buffers_max", "cache", || {
    <Cache as ngx::http::HttpModule>::module()
});

/// The longest stream key taken.
pub const KEY_MAX: usize = 1024;

/// A key the hub reads: 1 to `KEY_MAX` bytes of UTF-8.
fn valid_key(k: &[u8]) -> bool {
    !k.is_empty() && k.len() <= KEY_MAX && std::str::from_utf8(k).is_ok()
}

/// Why a stream cannot start.
pub enum Refusal {
    Sse(Refused),
    /// The client's last id is not an entry ID that Redis reads after
    /// (its text).
    BadLastId(String),
}

impl From<Refused> for Refusal {
    fn from(r: Refused) -> Refusal {
        Refusal::Sse(r)
    }
}

/// Starts a stream; what the content handler returns.
pub fn start(r: &mut Req, lcf: &CacheLocConf) -> Result<ngx_int_t, Refusal> {
    let (Some(cv), Some(header)) = (lcf.stream, lcf.stream_last_id) else {
        return Err(Refused::Nginx.into());
    };
    if r.method() & (NGX_HTTP_GET | NGX_HTTP_HEAD) == 0 {
        return Err(Refused::NotAllowed.into());
    }
    let key = r.complex_value(cv).ok_or(Refused::Nginx)?.to_vec();
    // The client's last id: the header EventSource sends, else the query
    // argument (for clients that cannot set headers).
    let mut from = r.complex_value(header).ok_or(Refused::Nginx)?.to_vec();
    if from.is_empty() {
        from = streams::query_arg(r.args(), b"last_event_id").unwrap_or_default();
    }
    let from = (!from.is_empty()).then_some(from);
    if let Some(f) = &from {
        if streams::parse_last_id(f).is_none() {
            return Err(Refusal::BadLastId(String::from_utf8_lossy(f).into_owned()));
        }
    }
    let auth = match lcf.auth {
        None => None,
        Some(cv) => Some(r.complex_value(cv).ok_or(Refused::Nginx)?.to_vec()).filter(|p| !p.is_empty()),
    };
    let buffers_max = r.main_conf::<Cache>().subscribe_buffers_max;
    let (rc, _) = sse::start_resuming(
        r,
        &key,
        valid_key,
        sse::Source {
            block: crate::ffi::conf::block_of(&lcf.upstream),
            every: lcf.subscribe_heartbeat,
            buffers_max,
            retry: lcf.subscribe_retry,
        },
        &FANOUT,
        |r| hub(r, lcf, auth),
        // (A stream's live entries come with their ids: no live event's
        // first word is taken for one.)
        Some(Resume {
            from,
            tag: 0,
            kind: gateway_core::sse::IdKind::Any,
        }),
    )?;
    Ok(rc)
}

/// The worker's stream hub for the location's upstream and password, made
/// on first use.
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
                "cache: upstream \"{}\" has no address to read streams from",
                String::from_utf8_lossy(us.host.as_bytes())
            );
            return None;
        }
        let mut name = String::from_utf8_lossy(us.host.as_bytes()).into_owned();
        if us.port != 0 {
            name = format!("{name}:{}", us.port);
        }
        let tls = tls_of_location(r, lcf, us.host.as_bytes())?;
        let auth_key = auth
            .as_deref()
            .map(|pw| authfail::key(&authfail::block_scope(block), pw));
        // A cluster's keys are read on the masters of their slots, as the
        // worker's map says (the addresses are its seeds).
        let mcf = r.main_conf::<Cache>();
        let cluster = mcf
            .cluster_of(block)
            .map(|c| driver::cluster_map(block as usize, || c.seeds.clone()));
        // A Sentinel set's master (its servers are the Sentinels).
        let follow = mcf.sentinel_of(block).map(|s| Follow::new(super::sentinel::conf_of(s)));
        let addrs = if follow.is_some() {
            vec![Addr {
                sockaddr: Vec::new(),
                name: name.clone(),
            }]
        } else {
            addrs
        };
        Some(StreamSettings {
            cluster,
            upstream: name,
            addrs,
            auth: auth.clone(),
            auth_key,
            tls,
            connect_timeout: lcf.upstream.connect_timeout,
            follow,
        })
    };
    driver::stream_hub(block as usize, auth.clone(), &FANOUT, make)
}
