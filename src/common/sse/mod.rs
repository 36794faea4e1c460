//! Subscriptions as server-sent events, for both gateways: `sqldb_listen`
//! (PostgreSQL's LISTEN/NOTIFY) and `cache_subscribe` (Redis's SUBSCRIBE).
//! A request subscribes to a channel of a hub (the worker's one shared
//! connection that listens for the upstream) and gets each event of it as
//! `event: CHANNEL` / `data:` lines while it stays; a comment line every
//! heartbeat; `event: reconnect` when the hub's connection was lost and
//! made again; `event: unavailable` once when its server cannot be reached
//! (common::hub::Outage). The request ends when its client leaves, when it falls too
//! far behind, or when nginx exits.
//!
//! Events may carry ids (resume.rs): a subscription that comes with the
//! client's last id gets the events after it (replayed by its gateway)
//! before the live ones, none twice.

mod resume;
mod stream;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use gateway_core::metrics::Id;
use gateway_core::sse;

use super::hub::{HubRef, HubSink};
use super::token::{self, Registry, ReqToken};
use crate::ffi::buf::Outbox;
use crate::ffi::*;
use crate::{log, metrics};

/// The comment line that tells a client its subscription is in effect.
const SUBSCRIBED: &[u8] = b": subscribed\n\n";

/// Bytes that may wait for a subscriber that takes none of them: one that
/// has had more waiting for `STALL_MS` without taking any when the next
/// event comes is dropped. A subscriber that reads may fall further behind
/// in a burst (up to `BEHIND_HARD`). An event is never cut: a subscriber
/// that keeps up gets events of any size.
const BEHIND_MAX: usize = 1 << 20;
const STALL_MS: ngx_msec_t = 1000;
/// What may wait for any subscriber, reading or not.
const BEHIND_HARD: usize = 16 << 20;

/// What may wait for all the subscribers of one source on a worker, unless
/// `sqldb_listen_buffers_max` / `cache_subscribe_buffers_max` say.
pub const BUFFERS_MAX: usize = 64 << 20;

pub use resume::{Resume, SubState};
pub use stream::StreamSink;

/// A subscription, in the request's pool (dropped with it).
struct Sub {
    r: *mut ngx_http_request_t,
    /// The request, as common::token knows it.
    req: ReqToken,
    token: ReqToken,
    /// What waits for the client: a stream that lasts holds no more than
    /// that, and an event costs the same however much waits.
    out: Outbox,
    /// Ended here: no event goes to it any more; its request is going.
    ended: bool,
    /// The bytes it has waiting, as its source's total counts them.
    counted: usize,
    /// The client connection's bytes sent, and when that last grew.
    sent: i64,
    progress_at: ngx_msec_t,
    channel: String,
    hub: HubRef,
    fan: &'static Fanout,
    every: ngx_msec_t,
    heartbeat: ngx_event_t,
    /// The response header has gone out (a subscription that resumes sends
    /// it once its first replayed events are in: `Fanout::open`); what is
    /// written before waits.
    header_out: bool,
    /// Its events carry ids (resume.rs).
    ids: Option<resume::Ids>,
}

impl Sub {
    /// The request's log.
    fn log(&self) -> Log {
        // SAFETY: a Sub is in its live request's pool.
        unsafe { Req::from_raw(self.r) }.log()
    }
}

impl Drop for Sub {
    fn drop(&mut self) {
        // SAFETY: the event is the Sub's own.
        if let Some(ev) = unsafe { Event::from_raw(&mut self.heartbeat) } {
            ev.clear();
        }
        if !self.ended {
            LIVE.with(|l| l.unregister(self.token));
            BY_REQUEST.with(|b| b.borrow_mut().remove(&(self.r as usize)));
        }
        self.fan.count(std::mem::take(&mut self.counted), 0);
        token::unregister(self.req);
        // The hub may be what ended the request (a write that failed while
        // it fanned out): it hears of the leave after the handler.
        LEAVING.with(|l| {
            l.borrow_mut()
                .push((self.hub, std::mem::take(&mut self.channel), self.token))
        });
        LEAVE_EVENT.with(|slot| event::defer_on(slot, Some(apply_leaving)));
        metrics::add(Id::Subscribers, &[self.fan.source], -1);
    }
}

/// A subscription that ended: its hub, channel and token.
type Leaving = (HubRef, String, ReqToken);

thread_local! {
    /// This worker's subscriptions, by token (each leaves when it ends or
    /// its request's pool goes).
    static LIVE: Registry<Sub> = Registry::default();
    /// The token of each live subscription, by its request (for the
    /// request's write handler).
    static BY_REQUEST: RefCell<HashMap<usize, ReqToken>> = RefCell::new(HashMap::new());
    /// Subscriptions that ended, for their hub.
    static LEAVING: RefCell<Vec<Leaving>> = const { RefCell::new(Vec::new()) };
    static LEAVE_EVENT: Cell<*mut ngx_event_t> = const { Cell::new(std::ptr::null_mut()) };
    /// Bytes waiting for the subscribers of each source (`Fanout::slot`)
    /// on this worker, and the bound of each.
    static WAITING: [Cell<usize>; 2] = const { [Cell::new(0), Cell::new(0)] };
    static BOUND: [Cell<usize>; 2] = const { [Cell::new(BUFFERS_MAX), Cell::new(BUFFERS_MAX)] };
}

event_handler! {
    fn apply_leaving(_ev) = "subscription leave", {
        for (hub, channel, token) in LEAVING.with(|l| std::mem::take(&mut *l.borrow_mut())) {
            // (One that panics does not keep the others from their hubs.)
            guard(Log::cycle(), "subscription leave", (), || hub.with(|h| h.unsubscribe(&channel, token)));
        }
    }
}

/// Why a subscription cannot start.
pub enum Refused {
    /// The channel is not one the hub takes (the client's mistake).
    BadChannel(String),
    NotAllowed,
    Nginx,
}

/// Where a subscription comes from, as its location configures it.
pub struct Source {
    /// The upstream block (for the metrics and `$upstream_*`).
    pub block: Option<&'static ngx_http_upstream_srv_conf_t>,
    /// The heartbeat's period.
    pub every: ngx_msec_t,
    /// The worker's bound (`*_buffers_max`; unset: the default).
    pub buffers_max: usize,
    /// The `retry:` field sent first, in ms (CONF_UNSET_MSEC: none).
    pub retry: ngx_msec_t,
}

/// Starts a subscription to `channel` (checked by `valid`) of the hub that
/// `hub` gives; what the content handler returns.
pub fn start(
    r: &mut Req,
    channel: &[u8],
    valid: fn(&[u8]) -> bool,
    source: Source,
    fan: &'static Fanout,
    hub: impl FnOnce(&mut Req) -> Option<HubRef>,
) -> Result<ngx_int_t, Refused> {
    start_resuming(r, channel, valid, source, fan, hub, None).map(|(rc, _)| rc)
}

/// `start`, for a subscription whose events carry ids: what the content
/// handler returns, and the subscription's token once it is on.
pub fn start_resuming(
    r: &mut Req,
    channel: &[u8],
    valid: fn(&[u8]) -> bool,
    source: Source,
    fan: &'static Fanout,
    hub: impl FnOnce(&mut Req) -> Option<HubRef>,
    resume: Option<Resume>,
) -> Result<(ngx_int_t, Option<ReqToken>), Refused> {
    if r.method() & (NGX_HTTP_GET | NGX_HTTP_HEAD) == 0 {
        return Err(Refused::NotAllowed);
    }
    if !valid(channel) {
        return Err(Refused::BadChannel(String::from_utf8_lossy(channel).into_owned()));
    }
    let channel = String::from_utf8_lossy(channel).into_owned();
    let rc = r.discard_body();
    if rc != OK {
        return Ok((rc, None));
    }
    r.set_content_type("text/event-stream");
    r.set_status(200);
    r.set_content_length(-1);
    if !r.add_header("Cache-Control", "no-cache") || !r.add_header("X-Accel-Buffering", "no") {
        return Err(Refused::Nginx);
    }
    if r.method() & NGX_HTTP_HEAD != 0 {
        r.set_header_only();
        return Ok((r.send_header(), None));
    }
    // A client that resumes gets the header with its first replayed events
    // (a replay that cannot run is still an error status).
    let from = resume.as_ref().and_then(|r| r.from.clone());
    let ids = resume.map(resume::Ids::new);
    let header_out = !ids.as_ref().is_some_and(resume::Ids::holding);
    if header_out {
        let rc = r.send_header();
        if rc == ERROR || rc > OK {
            return Ok((rc, None));
        }
    }
    let hub = hub(r).ok_or(Refused::Nginx)?;
    // The metrics and `$upstream_*` name the upstream and its servers.
    let servers = hub.with(|h| h.servers());
    if !r.set_stream_upstream(source.block, fan.tag(), &servers) {
        return Err(Refused::Nginx);
    }
    fan.set_bound(if source.buffers_max == CONF_UNSET_SIZE {
        BUFFERS_MAX
    } else {
        source.buffers_max
    });
    let sub = Sub {
        r: r.as_ptr(),
        req: token::register(r),
        token: LIVE.with(Registry::next),
        out: Outbox::new(fan.tag()),
        ended: false,
        counted: 0,
        sent: 0,
        progress_at: current_msec(),
        channel: channel.clone(),
        hub,
        fan,
        every: source.every,
        // (All-zero: an event's initial state.)
        heartbeat: crate::ffi::pool::zeroed(),
        header_out,
        ids,
    };
    let mut sub = r.pool().alloc(sub).ok_or(Refused::Nginx)?;
    let token = LIVE.with(|l| l.register(sub));
    BY_REQUEST.with(|b| b.borrow_mut().insert(r.as_ptr() as usize, token));
    // SAFETY: just allocated in the request's pool; nothing else uses it now.
    let s = unsafe { sub.as_mut() };
    s.token = token;
    s.heartbeat.handler = Some(heartbeat);
    s.heartbeat.data = sub.as_ptr().cast();
    s.heartbeat.log = r.log().as_ptr();
    let now = hub.with(|h| h.subscribe_from(&channel, token, from.as_deref()));
    metrics::add(Id::Subscribers, &[fan.source], 1);
    // The header now (`retry:` first); a first line once the server has the
    // subscription (events reach the client from then on).
    let mut written = source.retry == CONF_UNSET_MSEC || write(s, &sse::retry(source.retry as u64)).is_ok();
    if written && now {
        written = write(s, SUBSCRIBED).is_ok();
    } else if written && hub.with(|h| h.unavailable()) {
        // The server is down now: the client hears it as the others did.
        written = write(s, &sse::unavailable()).is_ok();
    } else if written && header_out {
        written = r.send_flush() != ERROR;
    }
    if !written {
        return Ok((ERROR, None));
    }
    // SAFETY: the event is the Sub's own, in the request's pool.
    if let Some(ev) = unsafe { Event::from_raw(&mut s.heartbeat) } {
        ev.add_timer(s.every);
    }
    // The request stays until the client leaves (nginx's check of the
    // client connection finalizes it) or it is ended here; what the
    // client could not take yet goes out as it can.
    r.count_up();
    r.set_read_handler_test_reading();
    r.set_write_handler(Some(flush_pending));
    Ok((DONE, Some(token)))
}

/// Why a subscriber cannot take more.
#[derive(Debug, Clone, Copy)]
enum Cannot {
    /// Too far behind already (`too_far_behind`).
    Behind,
    /// Gone, or nginx failed.
    Error,
}

impl Cannot {
    fn reason(self) -> &'static str {
        match self {
            Cannot::Behind => "behind",
            Cannot::Error => "error",
        }
    }
}

/// Writes and flushes bytes to the subscriber; why it cannot take them
/// (it is then to be ended).
fn write(sub: &mut Sub, bytes: &[u8]) -> Result<(), Cannot> {
    // SAFETY: the Sub's request is live while its pool (and so the Sub) is.
    let r = unsafe { Req::from_raw(sub.r) };
    if sub.ended {
        return Err(Cannot::Error);
    }
    if too_far_behind(sub, r) {
        return Err(Cannot::Behind);
    }
    sub.out.push(bytes);
    let sent = send(sub, r);
    recount(sub);
    if sent {
        Ok(())
    } else {
        Err(Cannot::Error)
    }
}

/// Hands what is queued to the output filters, unless what was handed
/// before is still going out (the write handler hands it then); false
/// when the connection failed.
fn send(sub: &mut Sub, r: &mut Req) -> bool {
    if !sub.header_out {
        // (It goes with the header: Fanout::open.)
        return true;
    }
    let cl = match sub.out.next(&r.pool()) {
        Ok(Some(cl)) => cl,
        Ok(None) => return true,
        Err(_) => return false,
    };
    // SAFETY: a chain of the request's pool over the Sub's own buffer.
    let rc = unsafe { r.output_filter(cl) };
    rc != ERROR && (rc != AGAIN || r.watch_writable())
}

/// Brings the source's total up to date with what waits for the subscriber.
fn recount(sub: &mut Sub) {
    let behind = sub.out.waiting();
    sub.fan.count(sub.counted, behind);
    sub.counted = behind;
}

/// The subscriber has more than `BEHIND_HARD` waiting, or more than
/// `BEHIND_MAX` and has taken nothing for `STALL_MS`.
fn too_far_behind(sub: &mut Sub, r: &Req) -> bool {
    let now = current_msec();
    let sent = r.bytes_sent();
    if sent != sub.sent {
        sub.sent = sent;
        sub.progress_at = now;
    }
    let behind = sub.out.waiting();
    // (Before the header, nothing could be taken yet.)
    let stalled = sub.header_out && now.wrapping_sub(sub.progress_at) >= STALL_MS;
    behind > BEHIND_HARD || (behind > BEHIND_MAX && stalled)
}

request_handler! {
    /// The client's connection can take more: what waits goes out.
    fn flush_pending(r) = ("subscription write") {
        let sub = BY_REQUEST
            .with(|b| b.borrow().get(&(r.as_ptr() as usize)).copied())
            .and_then(|t| LIVE.with(|l| l.lookup(t)))
            // SAFETY: a live Sub is in its live request's pool; nothing
            // else uses it while the handler runs.
            .map(|s| unsafe { &mut *s.as_ptr() });
        if sub.as_ref().is_some_and(|s| !s.header_out) {
            // (Nothing goes before the header: Fanout::open.)
            return;
        }
        // SAFETY: no new output, only what the filters hold.
        let rc = unsafe { r.output_filter(std::ptr::null_mut()) };
        let ok = match sub {
            // What the filters held is out: what is queued goes next.
            Some(sub) if rc == OK => {
                let sent = send(sub, r);
                recount(sub);
                sent
            }
            Some(sub) => {
                recount(sub);
                rc != ERROR && r.watch_writable()
            }
            None => rc != ERROR && (rc != AGAIN || r.watch_writable()),
        };
        if !ok {
            // (nginx runs the end of the request after this handler; the
            // Sub leaves with the request's pool.)
            r.finalize(ERROR);
        }
    }
}

/// Ends a subscription now: no event goes to it any more, the last buffer
/// (for a stream that ends well), then the request. nginx posts the end of
/// a request to its client connection, whose own events may not come for
/// long: it is run here, at once. The Sub is gone afterwards.
fn end(sub: &mut Sub, rc: ngx_int_t) {
    if std::mem::replace(&mut sub.ended, true) {
        return;
    }
    LIVE.with(|l| l.unregister(sub.token));
    BY_REQUEST.with(|b| b.borrow_mut().remove(&(sub.r as usize)));
    // What waits for it goes with its request's pool (now, or once nginx
    // has closed the connection): the source's total no longer counts it.
    sub.fan.count(std::mem::take(&mut sub.counted), 0);
    let rp = sub.r;
    let posted = {
        // SAFETY: the Sub's request is live while its pool (and so the Sub) is.
        let r = unsafe { Req::from_raw(rp) };
        r.posted()
    };
    let last = |r: &mut Req| {
        let rc = if rc == OK && !sub.header_out && !open_header(sub, r) {
            ERROR
        } else {
            rc
        };
        if rc == OK {
            // What is queued goes before the end.
            if let Some(cl) = sub.out.rest(&r.pool()) {
                // SAFETY: a chain of the request's pool.
                unsafe { r.output_filter(cl) };
            }
        }
        let rc = if rc == OK { r.send_last() } else { rc };
        r.finalize(rc);
    };
    // SAFETY: as above; it is lent to `last` only (the Sub, in its pool,
    // may be gone after it).
    unsafe { Req::hold(rp, last) };
    posted.run();
}

/// Sends the response header of a subscription that waited for it (what
/// was written meanwhile follows it); false when that failed.
fn open_header(sub: &mut Sub, r: &mut Req) -> bool {
    sub.header_out = true;
    sub.progress_at = current_msec();
    let rc = r.send_header();
    rc != ERROR && rc <= OK && !r.header_only()
}

event_handler! {
    /// A subscription's heartbeat.
    fn heartbeat(ev) = "subscription heartbeat", {
        ev.take_timedout();
        // SAFETY: the heartbeat event's data is its Sub, in the live
        // request's pool (its Drop takes the timer out).
        let sub = unsafe { &mut *(ev.data() as *mut Sub) };
        if exiting() {
            // nginx is exiting (a reload, a quit): the stream ends, and the
            // client's EventSource comes back to a new worker.
            return end(sub, OK);
        }
        if let Err(why) = write(sub, sse::HEARTBEAT) {
            sub.fan.dropped(sub.log(), why);
            return end(sub, ERROR);
        }
        ev.add_timer(sub.every);
    }
}

/// Events and reconnects of a hub, to the subscribers of this worker.
pub struct Fanout {
    /// The metrics' `source` label.
    source: &'static str,
    /// Its place in the worker's totals (`WAITING`, `BOUND`).
    slot: usize,
    /// The directive of its per-worker bound.
    bound_directive: &'static str,
    /// The gateway, as the log names it.
    gateway: &'static str,
    /// The module whose buffers the events are (its tag).
    module: fn() -> &'static ngx_module_t,
}

impl Fanout {
    /// The fan-out of a gateway's hubs: `source` is the metrics' label,
    /// `slot` its place in the worker's totals (0 or 1), `bound_directive`
    /// the directive of its per-worker bound, `gateway` the log's prefix,
    /// `module` the module whose buffers its events are.
    pub const fn new(
        source: &'static str,
        slot: usize,
        bound_directive: &'static str,
        gateway: &'static str,
        module: fn() -> &'static ngx_module_t,
    ) -> Fanout {
        Fanout {
            source,
            slot,
            bound_directive,
            gateway,
            module,
        }
    }

    fn tag(&self) -> &'static ngx_module_t {
        (self.module)()
    }

    /// Runs `f` on each subscription of `to` that is still there.
    fn each(&self, to: &[ReqToken], mut f: impl FnMut(&mut Sub)) {
        for &t in to {
            let Some(sub) = LIVE.with(|l| l.lookup(t)) else {
                continue;
            };
            // SAFETY: a live Sub is in its live request's pool (it leaves
            // LIVE when it ends or its pool goes).
            let sub = unsafe { &mut *sub.as_ptr() };
            let log = sub.log();
            guard(log, "subscription event", (), || f(sub));
        }
    }

    /// One info line for a subscriber that is dropped, and the count.
    fn dropped(&self, log: Log, why: Cannot) {
        log!(
            NGX_LOG_INFO,
            log,
            "{}: a subscriber that cannot take events (gone, or more than {BEHIND_MAX} bytes behind) is dropped",
            self.gateway
        );
        metrics::add(Id::SubscribersDropped, &[self.source, why.reason()], 1);
    }

    /// The bound of what may wait for this source's subscribers on the worker.
    fn set_bound(&self, bytes: usize) {
        BOUND.with(|b| b[self.slot].set(bytes));
    }

    /// What waits for this source's subscribers on the worker.
    fn waiting(&self) -> usize {
        WAITING.with(|w| w[self.slot].get())
    }

    /// A subscriber that had `was` bytes waiting has `now`.
    fn count(&self, was: usize, now: usize) {
        WAITING.with(|w| {
            let t = &w[self.slot];
            t.set(t.get().saturating_sub(was).saturating_add(now));
        });
    }

    /// Past the worker's bound, the subscribers furthest behind are
    /// dropped until what waits is back under it.
    fn shed(&self) {
        let bound = BOUND.with(|b| b[self.slot].get());
        if self.waiting() <= bound {
            return;
        }
        let mut behind: Vec<(usize, ReqToken)> = LIVE
            .with(Registry::all)
            .into_iter()
            // SAFETY: a live Sub is in its live request's pool.
            .map(|(k, s)| (unsafe { s.as_ref() }, k))
            .filter(|(s, _)| std::ptr::eq(s.fan, self) && s.counted > 0)
            .map(|(s, k)| (s.counted, k))
            .collect();
        behind.sort_unstable_by_key(|&(n, _)| std::cmp::Reverse(n));
        for (_, key) in behind {
            if self.waiting() <= bound {
                break;
            }
            let Some(sub) = LIVE.with(|l| l.lookup(key)) else {
                continue;
            };
            // SAFETY: a live Sub is in its live request's pool.
            let sub = unsafe { &mut *sub.as_ptr() };
            let log = sub.log();
            guard(log, "subscription drop", (), || {
                log!(
                    NGX_LOG_INFO,
                    log,
                    "{}: a subscriber {} bytes behind is dropped: {} ({bound}) is reached on this worker",
                    self.gateway,
                    sub.counted,
                    self.bound_directive
                );
                metrics::add(Id::SubscribersDropped, &[self.source, "buffers_max"], 1);
                end(sub, ERROR);
            });
        }
    }

    /// Writes `bytes` to each subscriber of `to`: how many took them (one
    /// that cannot is dropped, and so are those furthest behind past the
    /// worker's bound).
    fn write_all(&self, to: &[ReqToken], bytes: &[u8]) -> i64 {
        let mut sent = 0;
        self.each(to, |sub| sent += i64::from(self.put(sub, bytes)));
        self.shed();
        sent
    }

    /// Writes `bytes` to one subscriber; one that cannot take them is
    /// dropped (false).
    fn put(&self, sub: &mut Sub, bytes: &[u8]) -> bool {
        match write(sub, bytes) {
            Ok(()) => true,
            Err(why) => {
                self.dropped(sub.log(), why);
                end(sub, ERROR);
                false
            }
        }
    }

    fn send(&self, to: &[ReqToken], bytes: &[u8]) {
        let sent = self.write_all(to, bytes);
        // Once per fan-out, not once per subscriber.
        metrics::add(Id::EventsSent, &[self.source], sent);
    }
}

impl HubSink for Fanout {
    fn notify(&self, to: &[ReqToken], channel: &str, payload: &[u8]) {
        let sent = self.live_event(to, channel, payload);
        metrics::add(Id::EventsSent, &[self.source], sent);
    }

    fn reconnected(&self, to: &[ReqToken]) {
        self.send(to, &sse::reconnect());
    }

    fn subscribed(&self, to: &[ReqToken]) {
        self.write_all(to, SUBSCRIBED);
    }

    fn closing(&self, to: &[ReqToken]) {
        self.each(to, |sub| end(sub, OK));
    }

    fn unavailable(&self, to: &[ReqToken]) {
        self.send(to, &sse::unavailable());
    }
}
