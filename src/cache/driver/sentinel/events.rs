//! A set's connections and timers, as nginx calls them: the `Owner` of its
//! links, and the timers of its questions, watches, holds and wakes. Each
//! reaches the set through `hub::lend`, for the call only.

use std::ffi::c_void;

use super::super::conn::{Owner, RedisConn, State, Step};
use super::{Link, SetState, CHECK, QUERY};
use crate::common::hub;
use crate::common::token;

/// Runs `f` on the set of a timer's event (its data), lent for the call.
///
/// # Safety
/// `data` is a live set's own pointer (set by `SetState::new`).
unsafe fn lend_set<T>(data: *mut c_void, f: impl FnOnce(&mut SetState) -> T) -> T {
    // SAFETY: as the caller's; sets live for the worker's life.
    unsafe { hub::lend(data as *mut SetState, f) }
}

impl Owner for SetState {
    const EVENT: &'static str = "cache sentinel connection event";
    const HANDSHAKE: &'static str = "cache sentinel connection handshake";

    type Out = ();

    /// `data` is a Link of its set.
    unsafe fn lend<T>(data: *mut c_void, f: impl FnOnce(&mut SetState, usize) -> T) -> Option<T> {
        // SAFETY: data is a Link of a live set (sets live for the worker's
        // life, their links as long as they do, never added to after
        // `new`); its two plain fields are read before the set is lent.
        let (set, index) = unsafe {
            let link = data as *const Link;
            ((*link).set, (*link).index)
        };
        // SAFETY: see above.
        Some(unsafe { hub::lend(set, |s| f(s, index)) })
    }

    fn conn(&mut self, i: usize) -> &mut RedisConn {
        &mut self.links[i].conn
    }

    fn step(&mut self, i: usize, step: Step) {
        match step {
            Step::Wait => {}
            Step::Up | Step::Ready => self.run(i),
            Step::Lost(why) => self.failed(i, why),
            Step::Exit => {
                for l in &mut self.links {
                    l.conn.close();
                }
            }
        }
    }

    fn panicked(&mut self, i: usize) {
        self.failed(i, "an internal error (a panic) in the module".to_owned());
    }

    fn take_out(&mut self) {}

    fn deliver(_: ()) {}
}

event_handler! {
    /// Time to ask the Sentinels again.
    pub(super) fn retry_event(ev) = "cache sentinel retry", {
        ev.take_timedout();
        let ask = |s: &mut SetState| {
            if s.links[QUERY].conn.state() == State::Down {
                s.query();
            }
        };
        // SAFETY: the timer is a set's (new).
        unsafe { lend_set(ev.data(), ask) };
    }
}

event_handler! {
    /// The next round of `ROLE` to the master and the replicas.
    pub(super) fn probe_event(ev) = "cache sentinel replica probe", {
        ev.take_timedout();
        // SAFETY: the timer is a set's (new).
        unsafe { lend_set(ev.data(), SetState::probe) };
    }
}

event_handler! {
    /// A failover held the set long enough: the Sentinels are asked again,
    /// whatever they name.
    pub(super) fn hold_event(ev) = "cache sentinel failover hold", {
        ev.take_timedout();
        let end = |s: &mut SetState| {
            s.held = None;
            if s.master.is_none() && s.idle() {
                s.query();
            }
        };
        // SAFETY: the timer is a set's (new).
        unsafe { lend_set(ev.data(), end) };
    }
}

event_handler! {
    /// Time to make the watches again.
    pub(super) fn watch_retry_event(ev) = "cache sentinel watch retry", {
        ev.take_timedout();
        // SAFETY: the timer is a set's (new).
        unsafe { lend_set(ev.data(), SetState::watch) };
    }
}

event_handler! {
    /// Posted once a master is confirmed or a replica stops answering: the
    /// connections to the servers left close (shared ones, and idle ones
    /// nginx's keepalive keeps), and the requests that waited go on.
    pub(super) fn wake_event(ev) = "cache sentinel wake", {
        let take = |s: &mut SetState| {
            let waiting = if s.master.is_some() {
                std::mem::take(&mut s.waiting)
            } else {
                Vec::new()
            };
            let follow = s.master.is_some().then_some(s.conf.key);
            (std::mem::take(&mut s.left), waiting, follow)
        };
        // SAFETY: the event is a set's (new); the loan ends here, before
        // any request runs.
        let (left, waiting, follow) = unsafe { lend_set(ev.data(), take) };
        for (a, why) in left {
            super::super::pipes().close_to(a, why);
            // (And those nginx's keepalive keeps, with cache_pipeline off.)
            crate::ffi::net::close_idle_outbound_to(a);
        }
        // (The hubs of the block: their connections go to the master.)
        if let Some(key) = follow {
            super::super::follow_master(key);
        }
        for (t, resume) in waiting {
            token::with_request(t, |r| {
                let posted = r.posted();
                resume(r);
                posted.run();
            });
        }
    }
}

/// A question or a check that did not end in time fails.
fn deadline(data: *mut c_void, i: usize) {
    let fail = |s: &mut SetState| {
        if s.links[i].conn.state() != State::Down {
            s.failed(i, "no reply in time".to_owned());
        }
    };
    // SAFETY: the timer is a set's (new).
    unsafe { lend_set(data, fail) };
}

event_handler! {
    pub(super) fn query_deadline_event(ev) = "cache sentinel question timeout", {
        ev.take_timedout();
        deadline(ev.data(), QUERY);
    }
}

event_handler! {
    pub(super) fn check_deadline_event(ev) = "cache sentinel check timeout", {
        ev.take_timedout();
        deadline(ev.data(), CHECK);
    }
}
