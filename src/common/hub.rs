//! Subscription hubs: one shared connection per worker and upstream that
//! subscribers come to and leave, by channel (`sqldb_listen`'s listener,
//! `cache_subscribe`'s subscribing connections). The hub speaks to its
//! server; what it hears goes to the subscribers through a `HubSink`
//! (common::sse's fan-out).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ptr::NonNull;

use super::token::ReqToken;
use std::fmt;

use crate::ffi::{current_msec, ngx_msec_t, Log, NGX_LOG_DEBUG, NGX_LOG_ERR, NGX_LOG_NOTICE};
use crate::log;

/// How long after a lost connection another is tried (ms).
pub const RETRY: ngx_msec_t = 1000;

/// An outage of one of a hub's connections: from its first failure (lost,
/// or an attempt to connect that failed) to the next time it is up. The
/// error log has one line when it begins, and one for a connection made in
/// between and lost for another reason (the attempts every `RETRY` ms that
/// fail are debug lines), and a notice when it ends; the subscribers
/// are told once, at the first attempt that fails (a connection lost and
/// made again at once is no outage for them: they get `event: reconnect`).
#[derive(Default)]
pub struct Outage {
    /// The failures of this outage (0: none is going on).
    failures: u32,
    since: ngx_msec_t,
    /// Its subscribers were told.
    told: bool,
    /// The reason of the last failure.
    why: String,
}

/// What a failure asks of the hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed {
    /// The first of its outage: the one error-log line.
    pub log: bool,
    /// The first attempt of the outage that failed: the subscribers are to
    /// hear that the server is unavailable.
    pub tell: bool,
}

impl Outage {
    /// A failure of the connection `what` names ("sqldb: the listening
    /// connection to ..."), logged: an error line for the first of the
    /// outage (and for a connection lost for another reason), a debug line
    /// for the others. `was_up`: the connection was up (it is lost), else
    /// an attempt to make it failed.
    pub fn failed_logged(&mut self, was_up: bool, why: &str, what: fmt::Arguments<'_>) -> Failed {
        let failed = self.failed(!was_up, why);
        log!(
            if failed.log { NGX_LOG_ERR } else { NGX_LOG_DEBUG },
            Log::cycle(),
            "{what} {}: {why}; trying again every {RETRY} ms",
            if was_up { "was lost" } else { "failed" }
        );
        failed
    }

    /// The connection `what` names is up: the notice that ends its outage,
    /// if one was going on.
    pub fn up(&mut self, what: fmt::Arguments<'_>) {
        if let Some((failures, ms)) = self.ended() {
            log!(
                NGX_LOG_NOTICE,
                Log::cycle(),
                "{what} is up again, after {failures} failure{} in {ms} ms",
                if failures == 1 { "" } else { "s" }
            );
        }
    }

    /// A failure, and why: `attempt` when an attempt to connect failed
    /// (not a connection that was up and is lost).
    fn failed(&mut self, attempt: bool, why: &str) -> Failed {
        self.failures = self.failures.saturating_add(1);
        if self.failures == 1 {
            self.since = current_msec();
        }
        let log = self.failures == 1 || (!attempt && self.why != why);
        if self.why != why {
            why.clone_into(&mut self.why);
        }
        let tell = attempt && !self.told;
        self.told |= tell;
        Failed { log, tell }
    }

    /// The connection is up: the failures and milliseconds of the outage
    /// it ends, if one was going on.
    fn ended(&mut self) -> Option<(u32, ngx_msec_t)> {
        let failures = std::mem::take(&mut self.failures);
        self.told = false;
        self.why.clear();
        (failures > 0).then(|| (failures, current_msec().wrapping_sub(self.since)))
    }

    /// Its subscribers have been told the server is unavailable (and it
    /// is not up again).
    pub fn told(&self) -> bool {
        self.told
    }

    /// Nobody is subscribed any more: no outage is followed.
    pub fn forget(&mut self) {
        *self = Outage::default();
    }
}

/// A shared connection that subscribers come to and leave, by channel
/// (this listener, and the cache gateway's subscribing connection).
pub trait Hub {
    /// True when the subscription is in effect now; else the sink's
    /// `subscribed` tells when it is.
    fn subscribe(&mut self, channel: &str, who: ReqToken) -> bool;
    /// `subscribe`, for a subscriber that comes with its last id (a hub
    /// that replays by itself starts there; the others leave the replay to
    /// the request's side).
    fn subscribe_from(&mut self, channel: &str, who: ReqToken, _from: Option<&[u8]>) -> bool {
        self.subscribe(channel, who)
    }
    fn unsubscribe(&mut self, channel: &str, who: ReqToken);
    /// The servers it hears (for `$upstream_addr`).
    fn servers(&self) -> Vec<String>;
    /// Its subscribers have been told that a server is unavailable, and it
    /// is not back yet: a new subscriber is told at once.
    fn unavailable(&self) -> bool;
    /// The server it hears moved (a Sentinel set's master switched): its
    /// connections go to the new one.
    fn follow(&mut self) {}
}

/// A hub, as a subscription keeps it: the hubs live for the worker's life
/// (each gateway keeps its own, boxed, and never drops one while the worker
/// runs). It is used through `with`, for the call only.
#[derive(Clone, Copy)]
pub struct HubRef(NonNull<dyn Hub>);

thread_local! {
    /// The hub lent now (`lend`: no second loan of it is made).
    static LENT: Cell<*const ()> = const { Cell::new(std::ptr::null()) };
}

/// A loan of a hub, marked in `LENT` while it lasts; its end, a return or
/// a panic that unwinds through it, gives the mark back (a panic caught
/// inside a hub call leaves the hub usable).
struct Loan {
    outer: *const (),
}

impl Loan {
    fn take(at: *const ()) -> Loan {
        assert!(LENT.get() != at, "a hub lent twice");
        Loan {
            outer: LENT.replace(at),
        }
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        LENT.set(self.outer);
    }
}

/// Runs `f` with a hub, lent for the call only: the one way a hub is used,
/// by its subscribers (`HubRef::with`) and by its own events. A call that
/// reaches the same hub again panics instead of lending it twice.
///
/// # Safety
/// `hub` points to a live hub that does not move while `f` runs, and is
/// reached only through `lend` (or a `&mut` derived from a loan).
pub unsafe fn lend<H: ?Sized, T>(hub: *mut H, f: impl FnOnce(&mut H) -> T) -> T {
    let _loan = Loan::take(hub as *const ());
    crate::ffi::fault_point("hub call");
    // SAFETY: live and unmoved (above); lent once at a time (the loan).
    f(unsafe { &mut *hub })
}

impl HubRef {
    /// # Safety
    /// The hub must live, unmoved, for the worker's life.
    pub unsafe fn new(hub: NonNull<dyn Hub>) -> HubRef {
        HubRef(hub)
    }

    /// Runs `f` with the hub (`lend`).
    pub fn with<T>(self, f: impl FnOnce(&mut dyn Hub) -> T) -> T {
        // SAFETY: the hub lives for the worker's life (new).
        unsafe { lend(self.0.as_ptr(), |h: &mut (dyn Hub + 'static)| f(h)) }
    }
}

/// The subscribers of a hub, by channel (a channel is subscribed to while
/// it has any). A channel is active once the server confirmed its
/// subscription on the current connection; subscribers that came before
/// wait for that.
#[derive(Default)]
pub struct Channels(BTreeMap<String, Channel>);

#[derive(Default)]
struct Channel {
    subs: Vec<ReqToken>,
    waiting: Vec<ReqToken>,
    active: bool,
}

/// What adding a subscriber gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// The channel's first: it must be subscribed to.
    First,
    /// The channel is subscribed to already, on a connection that is up.
    Active,
    /// Its subscription is on the way.
    Waiting,
}

impl Channels {
    pub fn add(&mut self, channel: &str, who: ReqToken) -> Added {
        let c = self.0.entry(channel.to_owned()).or_default();
        c.subs.push(who);
        if c.active {
            return Added::Active;
        }
        c.waiting.push(who);
        if c.subs.len() == 1 {
            Added::First
        } else {
            Added::Waiting
        }
    }

    /// Removes a subscriber; true when it was the channel's last.
    pub fn remove(&mut self, channel: &str, who: ReqToken) -> bool {
        let Some(c) = self.0.get_mut(channel) else {
            return false;
        };
        c.subs.retain(|t| *t != who);
        c.waiting.retain(|t| *t != who);
        if !c.subs.is_empty() {
            return false;
        }
        self.0.remove(channel);
        true
    }

    /// The server confirmed the channel: the subscribers that waited.
    pub fn confirm(&mut self, channel: &str) -> Vec<ReqToken> {
        match self.0.get_mut(channel) {
            Some(c) => {
                c.active = true;
                std::mem::take(&mut c.waiting)
            }
            None => Vec::new(),
        }
    }

    /// The channel is not in effect on every connection any more: new
    /// subscribers wait for its confirmation.
    pub fn deactivate_one(&mut self, channel: &str) {
        if let Some(c) = self.0.get_mut(channel) {
            c.active = false;
        }
    }

    /// The connection is gone: no channel is active until confirmed again.
    pub fn deactivate(&mut self) {
        for c in self.0.values_mut() {
            c.active = false;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// The channel's own name and its subscribers, if it has any.
    pub fn get(&self, channel: &str) -> Option<(&str, &[ReqToken])> {
        self.0
            .get_key_value(channel)
            .map(|(k, c)| (k.as_str(), c.subs.as_slice()))
    }

    /// The subscribers whose subscription was in effect before (those
    /// that wait for one are not).
    pub fn settled(&self) -> Vec<ReqToken> {
        self.0
            .values()
            .flat_map(|c| c.subs.iter().filter(|t| !c.waiting.contains(t)))
            .copied()
            .collect()
    }

    /// Every subscriber of every channel.
    pub fn everyone(&self) -> Vec<ReqToken> {
        self.0.values().flat_map(|c| c.subs.iter()).copied().collect()
    }
}

/// Where notifications go (the request side).
pub trait HubSink {
    fn notify(&self, to: &[ReqToken], channel: &str, payload: &[u8]);
    /// The connection was lost and is back: what was sent in between is lost.
    fn reconnected(&self, to: &[ReqToken]);
    /// The server confirmed these subscriptions: events reach them from now on.
    fn subscribed(&self, to: &[ReqToken]);
    /// nginx is exiting: the subscriptions end.
    fn closing(&self, to: &[ReqToken]);
    /// A server could not be reached: what is sent there is not heard
    /// until it is back (once per outage; `Outage`).
    fn unavailable(&self, to: &[ReqToken]);
    /// The server confirmed the channel on the connection now up (after
    /// `subscribed`, if it had subscribers waiting).
    fn listening(&self, _channel: &str) {}
    /// A subscriber left.
    fn left(&self, _who: ReqToken) {}
}
