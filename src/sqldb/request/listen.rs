//! `sqldb_listen CHANNEL`: the request subscribes to a channel of the
//! upstream's listening connection (driver::listen) and gets each NOTIFY on
//! it as a server-sent event while it stays (crate::common::sse). With
//! `sqldb_listen_replay`, events carry ids and a client that comes back
//! with its last id gets what it missed first (replay.rs).

use gateway_core::sse as format;

use super::replay;
use crate::common::hub::{HubRef, HubSink};
use crate::common::sse::{self, Fanout, Refused, Resume};
use crate::common::token::ReqToken;
use crate::ffi::*;
use crate::sqldb::config::{LocConf, Sqldb, SrvConf};

/// The fan-out of `sqldb_listen`'s events.
pub static FANOUT: Fanout = Fanout::new("sqldb_listen", 0, "sqldb_listen_buffers_max", "sqldb", || {
    <Sqldb as ngx::http::HttpModule>::module()
});

/// What the listening connections tell: events and ends go to the
/// fan-out; a reconnect, to the replays of subscriptions that resume.
struct Heard;

static HEARD: Heard = Heard;

impl HubSink for Heard {
    fn notify(&self, to: &[ReqToken], channel: &str, payload: &[u8]) {
        FANOUT.notify(to, channel, payload);
    }

    fn reconnected(&self, to: &[ReqToken]) {
        // Subscriptions with ids get what they missed (one replay per
        // channel and location, from the lowest last id among them); the
        // others hear that something may be lost.
        let mut told = Vec::new();
        let mut groups: Vec<(String, usize, Vec<u8>, Vec<ReqToken>)> = Vec::new();
        for &t in to {
            let Some(st) = FANOUT.state(t) else {
                told.push(t);
                continue;
            };
            if st.holding {
                // Its replay runs: it goes on once the channel is listened
                // to again.
                continue;
            }
            let Some(last) = st.last else {
                told.push(t);
                continue;
            };
            match groups.iter_mut().find(|g| g.0 == st.channel && g.1 == st.tag) {
                Some(g) => {
                    if format::compare_ids(&last, &g.2).is_lt() {
                        g.2 = last;
                    }
                    g.3.push(t);
                }
                None => groups.push((st.channel, st.tag, last, vec![t])),
            }
        }
        for (channel, tag, from, subs) in groups {
            FANOUT.hold(&subs);
            replay::start(&FANOUT, subs, channel, tag, from, false);
        }
        FANOUT.reconnected(&told);
    }

    fn subscribed(&self, to: &[ReqToken]) {
        FANOUT.subscribed(to);
    }

    fn closing(&self, to: &[ReqToken]) {
        FANOUT.closing(to);
    }

    fn unavailable(&self, to: &[ReqToken]) {
        FANOUT.unavailable(to);
    }

    fn listening(&self, channel: &str) {
        replay::listening(channel);
    }

    fn left(&self, who: ReqToken) {
        replay::left(who);
    }
}

/// This worker's listening connection of the upstream (to its first
/// server: notifications are a server's own), made on first use.
fn listener(srv: &'static SrvConf) -> Option<HubRef> {
    let first = srv.addrs.first()?;
    crate::sqldb::driver::worker::listener(
        super::key_of(srv),
        || super::new_pool(srv),
        || (first.conninfo.clone(), first.name_text()),
        &HEARD,
    )
}

/// Starts a subscription; what the content handler returns.
pub fn subscribe(
    r: &mut Req,
    lcf: &'static LocConf,
    block: &'static ngx_http_upstream_srv_conf_t,
    srv: &'static SrvConf,
) -> Result<ngx_int_t, Refused> {
    let Some((cv, _)) = &lcf.listen else {
        return Err(Refused::Nginx);
    };
    let channel = r.complex_value(*cv).ok_or(Refused::Nginx)?.to_vec();
    let buffers_max = r.main_conf::<Sqldb>().listen_buffers_max;
    let source = sse::Source {
        block: Some(block),
        every: lcf.listen_heartbeat,
        buffers_max,
        retry: lcf.listen_retry,
    };
    let Some(replay) = &lcf.listen_replay else {
        return sse::start(r, &channel, format::valid_channel, source, &FANOUT, |_| listener(srv));
    };
    // The client's last id: the header EventSource sends, else the query
    // argument (for clients that cannot set headers).
    let mut from = r.complex_value(replay.header).ok_or(Refused::Nginx)?.to_vec();
    if from.is_empty() {
        from = r.complex_value(replay.arg).ok_or(Refused::Nginx)?.to_vec();
    }
    let from = (!from.is_empty()).then_some(from);
    let tag = replay::tag_of(lcf, block);
    let resume = Resume {
        from: from.clone(),
        tag,
        kind: replay.id_kind,
    };
    let (rc, token) = sse::start_resuming(
        r,
        &channel,
        format::valid_channel,
        source,
        &FANOUT,
        |_| listener(srv),
        Some(resume),
    )?;
    if let (Some(token), Some(from)) = (token, from) {
        let channel = String::from_utf8_lossy(&channel).into_owned();
        replay::start(&FANOUT, vec![token], channel, tag, from, true);
    }
    Ok(rc)
}
