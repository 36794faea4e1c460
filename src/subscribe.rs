//! Subscriptions as server-sent events, for both gateways: `sqldb_listen`
//! (PostgreSQL's LISTEN/NOTIFY) and `cache_subscribe` (Redis's SUBSCRIBE).
//! A request subscribes to a channel of a hub (the worker's one shared
//! connection that listens for the upstream) and gets each event of it as
//! `event: CHANNEL` / `data:` lines while it stays; a comment line every
//! heartbeat; `event: reconnect` when the hub's connection was lost and
//! made again. The request ends when its client leaves, when it falls too
//! far behind, or when nginx exits.

use std::cell::{Cell, RefCell};
use std::ptr::NonNull;

use gateway_core::metrics::Id;
use gateway_core::sse;

use crate::ffi::*;
use crate::sqldb::driver::{Hub, ListenSink, ReqToken};
use crate::sqldb::request::registry;
use crate::{log, metrics};

/// The comment line that tells a client its subscription is in effect.
const SUBSCRIBED: &[u8] = b": subscribed\n\n";

/// Bytes that may wait for a slow subscriber before it is dropped.
const BEHIND_MAX: usize = 1 << 20;

/// A subscription, in the request's pool (dropped with it).
struct Sub {
    r: *mut ngx_http_request_t,
    token: ReqToken,
    channel: String,
    hub: NonNull<dyn Hub>,
    fan: &'static Fanout,
    every: ngx_msec_t,
    heartbeat: ngx_event_t,
}

impl Drop for Sub {
    fn drop(&mut self) {
        // SAFETY: the event is the Sub's own.
        if let Some(ev) = unsafe { Event::from_raw(&mut self.heartbeat) } {
            ev.clear();
        }
        registry::unregister(self.token);
        // The hub may be what ended the request (a write that failed while
        // it fanned out): it hears of the leave after the handler.
        LEAVING.with(|l| {
            l.borrow_mut()
                .push((self.hub, std::mem::take(&mut self.channel), self.token))
        });
        event::defer_on(&LEAVE_EVENT, Some(apply_leaving));
        metrics::add(Id::Subscribers, &[self.fan.source], -1);
    }
}

/// A subscription that ended: its hub, channel and request.
type Leaving = (NonNull<dyn Hub>, String, ReqToken);

thread_local! {
    /// Subscriptions that ended, for their hub.
    static LEAVING: RefCell<Vec<Leaving>> = const { RefCell::new(Vec::new()) };
    static LEAVE_EVENT: Cell<*mut ngx_event_t> = const { Cell::new(std::ptr::null_mut()) };
}

extern "C" fn apply_leaving(_ev: *mut ngx_event_t) {
    guard(Log::cycle(), "subscription leave", (), || {
        for (hub, channel, token) in LEAVING.with(|l| std::mem::take(&mut *l.borrow_mut())) {
            // SAFETY: a hub lives for the worker's life; nothing else uses
            // it while a posted event's handler runs.
            unsafe { &mut *hub.as_ptr() }.unsubscribe(&channel, token);
        }
    })
}

/// Why a subscription cannot start.
pub enum Refused {
    /// The channel is not one the hub takes (the client's mistake).
    BadChannel(String),
    NotAllowed,
    Nginx,
}

/// Starts a subscription to `channel` (checked by `valid`) of the hub that
/// `hub` gives; what the content handler returns.
pub fn start(
    r: &mut Req,
    channel: &[u8],
    valid: fn(&[u8]) -> bool,
    every: ngx_msec_t,
    fan: &'static Fanout,
    hub: impl FnOnce(&mut Req) -> Option<NonNull<dyn Hub>>,
) -> Result<ngx_int_t, Refused> {
    if r.method() & (NGX_HTTP_GET | NGX_HTTP_HEAD) == 0 {
        return Err(Refused::NotAllowed);
    }
    if !valid(channel) {
        return Err(Refused::BadChannel(String::from_utf8_lossy(channel).into_owned()));
    }
    let channel = String::from_utf8_lossy(channel).into_owned();
    let rc = r.discard_body();
    if rc != OK {
        return Ok(rc);
    }
    r.set_content_type("text/event-stream");
    r.set_status(200);
    r.set_content_length(-1);
    if !r.add_header("Cache-Control", "no-cache") || !r.add_header("X-Accel-Buffering", "no") {
        return Err(Refused::Nginx);
    }
    if r.method() & NGX_HTTP_HEAD != 0 {
        r.set_header_only();
        return Ok(r.send_header());
    }
    let rc = r.send_header();
    if rc == ERROR || rc > OK {
        return Ok(rc);
    }
    let hub = hub(r).ok_or(Refused::Nginx)?;
    let token = registry::register(r);
    let sub = Sub {
        r: r.as_ptr(),
        token,
        channel: channel.clone(),
        hub,
        fan,
        every,
        // SAFETY: all-zero is the initial state of an event.
        heartbeat: unsafe { std::mem::zeroed() },
    };
    let Some(mut sub) = r.pool().alloc(sub) else {
        registry::unregister(token);
        return Err(Refused::Nginx);
    };
    // SAFETY: just allocated in the request's pool; nothing else refers to it.
    let s = unsafe { sub.as_mut() };
    s.heartbeat.handler = Some(heartbeat);
    s.heartbeat.data = sub.as_ptr().cast();
    s.heartbeat.log = r.log().as_ptr();
    // SAFETY: a hub lives for the worker's life; nothing else uses it now.
    let now = unsafe { &mut *hub.as_ptr() }.subscribe(&channel, token);
    metrics::add(Id::Subscribers, &[fan.source], 1);
    // The header now; a first line once the server has the subscription
    // (events reach the client from then on).
    let rc = if now {
        write(r, SUBSCRIBED)
    } else {
        r.send_flush() != ERROR
    };
    if !rc {
        return Ok(ERROR);
    }
    // SAFETY: the event is the Sub's own, in the request's pool.
    if let Some(ev) = unsafe { Event::from_raw(&mut s.heartbeat) } {
        ev.add_timer(s.every);
    }
    // The request stays until the client leaves (nginx's check of the
    // client connection finalizes it) or it is ended here.
    r.count_up();
    r.set_read_handler_test_reading();
    Ok(DONE)
}

/// Writes and flushes bytes to the subscriber; false when it cannot take
/// them (gone, or too far behind): the request is then ended.
fn write(r: &mut Req, bytes: &[u8]) -> bool {
    let Some(chain) = memory_chain(r.pool(), bytes.to_vec(), None) else {
        return false;
    };
    // SAFETY: a chain built in the request's pool; mark it to be sent now.
    unsafe { (*(*chain).buf).set_flush(1) };
    // SAFETY: as above.
    let rc = unsafe { r.output_filter(chain) };
    rc != ERROR && r.pending_output() <= BEHIND_MAX
}

/// Ends a subscription: the last buffer, then the request.
fn end(r: &mut Req, rc: ngx_int_t) {
    let rc = if rc == OK { r.send_last() } else { rc };
    r.finalize(rc);
}

extern "C" fn heartbeat(ev: *mut ngx_event_t) {
    // SAFETY: the heartbeat event's data is its Sub, in the live request's pool.
    let sub = unsafe { &mut *((*ev).data as *mut Sub) };
    // SAFETY: the Sub's request is live while its pool (and so the Sub) is.
    let r = unsafe { Req::from_raw(sub.r) };
    guard(r.log(), "subscription heartbeat", (), || {
        // SAFETY: as above.
        if let Some(e) = unsafe { Event::from_raw(ev) } {
            e.take_timedout();
        }
        if exiting() {
            // nginx is exiting (a reload, a quit): the stream ends, and the
            // client's EventSource comes back to a new worker.
            return end(r, OK);
        }
        if !write(r, sse::HEARTBEAT) {
            return end(r, ERROR);
        }
        // SAFETY: as above.
        if let Some(e) = unsafe { Event::from_raw(ev) } {
            e.add_timer(sub.every);
        }
    })
}

/// Events and reconnects of a hub, to the subscribers of this worker.
pub struct Fanout {
    /// The metrics' `source` label.
    source: &'static str,
    /// The gateway, as the log names it.
    gateway: &'static str,
}

/// The fan-out of `sqldb_listen`.
pub static SQLDB: Fanout = Fanout {
    source: "sqldb_listen",
    gateway: "sqldb",
};
/// The fan-out of `cache_subscribe`.
pub static CACHE: Fanout = Fanout {
    source: "cache_subscribe",
    gateway: "cache",
};

impl Fanout {
    /// Runs `f` on each subscriber of `to` that is still there.
    fn each(&self, to: &[ReqToken], mut f: impl FnMut(&mut Req)) {
        for &t in to {
            let Some(r) = registry::lookup(t) else { continue };
            // SAFETY: a registered request is live (it leaves the registry
            // when its pool is destroyed).
            let r = unsafe { Req::from_raw(r.as_ptr()) };
            guard(r.log(), "subscription event", (), || f(r));
        }
    }

    /// Writes `bytes` to each subscriber of `to`: how many took them (one
    /// that cannot is dropped).
    fn write_all(&self, to: &[ReqToken], bytes: &[u8]) -> i64 {
        let mut sent = 0;
        self.each(to, |r| {
            if write(r, bytes) {
                sent += 1;
            } else {
                log!(
                    NGX_LOG_INFO,
                    r.log(),
                    "{}: a subscriber that cannot take events (gone, or more than {BEHIND_MAX} bytes behind) is dropped",
                    self.gateway
                );
                end(r, ERROR);
            }
        });
        sent
    }

    fn send(&self, to: &[ReqToken], bytes: &[u8]) {
        let sent = self.write_all(to, bytes);
        // Once per fan-out, not once per subscriber.
        metrics::add(Id::EventsSent, &[self.source], sent);
    }
}

impl ListenSink for Fanout {
    fn notify(&self, to: &[ReqToken], channel: &str, payload: &[u8]) {
        self.send(to, &sse::event(channel, payload));
    }

    fn reconnected(&self, to: &[ReqToken]) {
        self.send(to, &sse::reconnect());
    }

    fn subscribed(&self, to: &[ReqToken]) {
        self.write_all(to, SUBSCRIBED);
    }

    fn closing(&self, to: &[ReqToken]) {
        self.each(to, |r| end(r, OK));
    }
}
