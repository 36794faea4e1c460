//! `sqldb_listen CHANNEL`: the request subscribes to a channel of the
//! upstream's listening connection (driver::listen) and gets each NOTIFY on
//! it as a server-sent event while it stays; a comment line every
//! `sqldb_listen_heartbeat`; `event: reconnect` when the listening
//! connection was lost and made again. The request ends when its client
//! leaves, when it falls too far behind, or when nginx exits.

use std::cell::{Cell, RefCell};
use std::ptr::NonNull;

use gateway_core::metrics::Id;
use gateway_core::sse;

use super::registry;
use crate::ffi::*;
use crate::sqldb::config::{LocConf, SrvConf};
use crate::sqldb::driver::{ListenSink, Listener, ReqToken};
use crate::{log, metrics};

/// Bytes that may wait for a slow subscriber before it is dropped.
const BEHIND_MAX: usize = 1 << 20;

/// A subscription, in the request's pool (dropped with it).
struct Sub {
    r: *mut ngx_http_request_t,
    token: ReqToken,
    channel: String,
    listener: NonNull<Listener>,
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
        // The listener may be what ended the request (a write that failed
        // while it fanned out): it hears of the leave after the handler.
        LEAVING.with(|l| {
            l.borrow_mut()
                .push((self.listener, std::mem::take(&mut self.channel), self.token))
        });
        event::defer_on(&LEAVE_EVENT, Some(apply_leaving));
        metrics::add(Id::Subscribers, &["sqldb_listen"], -1);
    }
}

thread_local! {
    /// Subscriptions that ended, for their listener.
    static LEAVING: RefCell<Vec<(NonNull<Listener>, String, ReqToken)>> = const { RefCell::new(Vec::new()) };
    static LEAVE_EVENT: Cell<*mut ngx_event_t> = const { Cell::new(std::ptr::null_mut()) };
}

extern "C" fn apply_leaving(_ev: *mut ngx_event_t) {
    guard(Log::cycle(), "sqldb listen leave", (), || {
        for (listener, channel, token) in LEAVING.with(|l| std::mem::take(&mut *l.borrow_mut())) {
            // SAFETY: a listener lives in its upstream's configuration for
            // the worker's life; nothing else uses it while a posted event's
            // handler runs.
            unsafe { &mut *listener.as_ptr() }.unsubscribe(&channel, token);
        }
    })
}

/// Why a subscription cannot start.
pub enum ListenError {
    /// The channel is not an identifier (the client's mistake).
    BadChannel(String),
    NotAllowed,
    Nginx,
}

/// Starts a subscription; what the content handler returns.
pub fn subscribe(r: &mut Req, lcf: &LocConf, srv: &mut SrvConf) -> Result<ngx_int_t, ListenError> {
    if r.method() & (NGX_HTTP_GET | NGX_HTTP_HEAD) == 0 {
        return Err(ListenError::NotAllowed);
    }
    let Some(cv) = lcf.listen else {
        return Err(ListenError::Nginx);
    };
    let channel = r.complex_value(cv).ok_or(ListenError::Nginx)?.to_vec();
    if !sse::valid_channel(&channel) {
        return Err(ListenError::BadChannel(String::from_utf8_lossy(&channel).into_owned()));
    }
    let channel = String::from_utf8_lossy(&channel).into_owned();
    let rc = r.discard_body();
    if rc != OK {
        return Ok(rc);
    }
    r.set_content_type("text/event-stream");
    r.set_status(200);
    r.set_content_length(-1);
    if !r.add_header("Cache-Control", "no-cache") || !r.add_header("X-Accel-Buffering", "no") {
        return Err(ListenError::Nginx);
    }
    if r.method() & NGX_HTTP_HEAD != 0 {
        r.set_header_only();
        return Ok(r.send_header());
    }
    let rc = r.send_header();
    if rc == ERROR || rc > OK {
        return Ok(rc);
    }
    let listener = srv.listener(&SINK).ok_or(ListenError::Nginx)?;
    let token = registry::register(r);
    let sub = Sub {
        r: r.as_ptr(),
        token,
        channel: channel.clone(),
        listener,
        every: lcf.listen_heartbeat,
        // SAFETY: all-zero is the initial state of an event.
        heartbeat: unsafe { std::mem::zeroed() },
    };
    let Some(mut sub) = r.pool().alloc(sub) else {
        registry::unregister(token);
        return Err(ListenError::Nginx);
    };
    // SAFETY: just allocated in the request's pool; nothing else refers to it.
    let s = unsafe { sub.as_mut() };
    s.heartbeat.handler = Some(heartbeat);
    s.heartbeat.data = sub.as_ptr().cast();
    s.heartbeat.log = r.log().as_ptr();
    // SAFETY: as above.
    unsafe { &mut *listener.as_ptr() }.subscribe(&channel, token);
    metrics::add(Id::Subscribers, &["sqldb_listen"], 1);
    // A first line, so that the client sees the stream is open.
    if !write(r, b": subscribed\n\n") {
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
    guard(r.log(), "sqldb listen heartbeat", (), || {
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

/// Notifications and reconnects, to the subscribers of this worker.
struct Fanout;

static SINK: Fanout = Fanout;

impl Fanout {
    /// Runs `f` on each subscriber of `to` that is still there.
    fn each(&self, to: &[ReqToken], entry: &str, mut f: impl FnMut(&mut Req)) {
        for &t in to {
            let Some(r) = registry::lookup(t) else { continue };
            // SAFETY: a registered request is live (it leaves the registry
            // when its pool is destroyed).
            let r = unsafe { Req::from_raw(r.as_ptr()) };
            guard(r.log(), entry, (), || f(r));
        }
    }

    fn send(&self, to: &[ReqToken], bytes: &[u8]) {
        let mut sent = 0;
        self.each(to, "sqldb listen notify", |r| {
            if write(r, bytes) {
                sent += 1;
            } else {
                log!(
                    NGX_LOG_INFO,
                    r.log(),
                    "sqldb: a subscriber that cannot take events (gone, or more than {BEHIND_MAX} bytes behind) is dropped"
                );
                end(r, ERROR);
            }
        });
        // Once per fan-out, not once per subscriber.
        metrics::add(Id::EventsSent, &["sqldb_listen"], sent);
    }
}

impl ListenSink for Fanout {
    fn notify(&self, to: &[ReqToken], channel: &str, payload: &[u8]) {
        self.send(to, &sse::event(channel, payload));
    }

    fn reconnected(&self, to: &[ReqToken]) {
        self.send(to, &sse::reconnect());
    }

    fn closing(&self, to: &[ReqToken]) {
        self.each(to, "sqldb listen closing", |r| end(r, OK));
    }
}
