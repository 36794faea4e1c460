//! The stream hub's connections and timers, as nginx calls them: the
//! `Owner` of its links, the retry timer and the posted telling of an
//! outage.

use std::ffi::c_void;

use super::super::conn::{run_owner, Owner, RedisConn, State, Step};
use super::{Link, StreamHub};
use crate::ffi::*;

impl Owner for StreamHub {
    const EVENT: &'static str = "cache stream event";
    const HANDSHAKE: &'static str = "cache stream handshake";

    /// `data` is a Link's.
    unsafe fn from_data<'a>(data: *mut c_void) -> (&'a mut StreamHub, usize) {
        // SAFETY: data is a Link of a live hub (hubs live for the worker's
        // life, their links as long as they do); only the two plain fields
        // are read, no reference to the link is made while the hub's is.
        unsafe {
            let link = data as *mut Link;
            (&mut *(*link).hub, (*link).index)
        }
    }

    fn conn(&mut self, i: usize) -> &mut RedisConn {
        &mut self.links[i].conn
    }

    fn step(&mut self, i: usize, step: Step) {
        StreamHub::step(self, i, step);
    }

    fn panicked(&mut self, i: usize) {
        self.lost(i, "an internal error (a panic) in the module");
    }
}

event_handler! {
    /// The connection is made again. (The timer's data is the Link that
    /// owns it.)
    pub(super) fn retry_event(ev) = "cache stream retry timer", {
        ev.take_timedout();
        run_owner::<StreamHub>(ev.data(), "cache stream retry", |h, i| {
            if h.links[i].conn.state() == State::Down && !h.keys.is_empty() && !exiting() {
                h.resolve();
                if h.has_work(i) {
                    h.connect(i);
                }
            }
        });
    }
}

event_handler! {
    /// Reads on what a connection left for the next turn (READ_TURN). (The
    /// event's data is the Link that owns it.)
    pub(super) fn more_event(ev) = "cache stream read on", {
        run_owner::<StreamHub>(ev.data(), "cache stream read on", |h, i| {
            if h.links[i].conn.is_up() {
                h.read(i);
            }
        });
    }
}

event_handler! {
    /// The subscribers hear that the servers cannot be reached.
    pub(super) fn tell_event(ev) = "cache stream unavailable", {
        // SAFETY: the event's data is its hub, which lives for the
        // worker's life (its Drop takes the event out of the queue).
        let h = unsafe { &mut *(ev.data() as *mut StreamHub) };
        if h.told {
            let all = h.everyone();
            h.sink.unavailable(&all);
        }
    }
}

event_handler! {
    /// The keys of slots being migrated are asked again.
    pub(super) fn ask_event(ev) = "cache stream migrating slot", {
        ev.take_timedout();
        // SAFETY: the timer's data is its hub, which lives for the
        // worker's life (its Drop takes the timer away).
        let h = unsafe { &mut *(ev.data() as *mut StreamHub) };
        for k in h.keys.values_mut() {
            k.held = false;
        }
        if !h.keys.is_empty() && !exiting() {
            h.kick_all();
        }
    }
}
