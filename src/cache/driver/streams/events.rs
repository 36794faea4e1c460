//! The stream hub's connections and timers, as nginx calls them: the
//! `Owner` of its links, their supervision (common::reconnect), and the
//! posted telling of an outage.

use std::ffi::c_void;

use super::super::conn::{run_owner, Owner, RedisConn, State, Step};
use super::StreamHub;
use crate::common::hub;
use crate::common::reconnect::{self, Supervised, Supervisor};
use crate::ffi::*;

impl StreamHub {
    /// Its Sentinel set confirmed a master: a connection that is down is
    /// made now, one to another server is made again there (reading on
    /// from each key's position).
    pub(super) fn follow_master(&mut self) {
        let Some(f) = &self.follow else { return };
        let (Some(master), moved) = (f.confirmed(), f.moved()) else {
            return;
        };
        for i in 0..self.links.len() {
            if !self.has_work(i) {
                continue;
            }
            match self.links[i].conn.state() {
                State::Down => self.connect(i),
                _ if moved.is_some() => {
                    self.lost(i, &format!("the master of its sentinel set switched to {master}"));
                    self.connect(i);
                }
                _ => {}
            }
        }
    }
}

impl Supervised for StreamHub {
    fn supervisor(&mut self, i: usize) -> &mut Supervisor {
        &mut self.links[i].sup
    }

    fn what(&self, i: usize) -> String {
        format!(
            "cache: the stream reading connection to {} of upstream \"{}\"",
            self.server(i),
            self.upstream
        )
    }

    fn close_link(&mut self, i: usize) -> bool {
        let was = self.links[i].conn.state();
        self.links[i].conn.close();
        self.forget_inflight(i);
        was == State::Up
    }

    fn wanted(&self) -> bool {
        !self.keys.is_empty()
    }

    fn all_down(&self) -> bool {
        self.links.iter().all(|l| l.conn.state() == State::Down)
    }

    fn told(&mut self) -> &mut bool {
        &mut self.told
    }

    /// The subscribers hear of an outage (posted: a failure may come while
    /// a request subscribes); a cluster master's keys go where the next
    /// map says.
    fn after_loss(&mut self, i: usize, _: bool, tell: bool) {
        if tell {
            self.tell_later.post();
        }
        if self.cluster.is_some() && i != 0 {
            self.kick_all();
        }
    }

    fn reconnect(&mut self, i: usize) {
        if self.links[i].conn.state() == State::Down && !self.keys.is_empty() {
            self.resolve();
            if self.has_work(i) {
                self.connect(i);
            }
        }
    }
}

impl Owner for StreamHub {
    const EVENT: &'static str = "cache stream event";
    const HANDSHAKE: &'static str = "cache stream handshake";

    type Out = ();

    /// `data` is a link's supervisor's (common::reconnect).
    unsafe fn lend<T>(data: *mut c_void, f: impl FnOnce(&mut StreamHub, usize) -> T) -> Option<T> {
        // SAFETY: the hubs live for the worker's life, boxed, and their
        // links' supervisors as long as they do.
        Some(unsafe { reconnect::lend_seat(data, f) })
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

    fn take_out(&mut self) {}

    fn deliver(_: ()) {}
}

event_handler! {
    /// Reads on what a connection left for the next turn (READ_TURN). (The
    /// event's data is its link's supervisor's.)
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
        let tell = |h: &mut StreamHub| {
            if h.told {
                let all = h.everyone();
                h.sink.unavailable(&all);
            }
        };
        // SAFETY: see above.
        unsafe { hub::lend(ev.data() as *mut StreamHub, tell) };
    }
}

event_handler! {
    /// The keys of slots being migrated are asked again.
    pub(super) fn ask_event(ev) = "cache stream migrating slot", {
        ev.take_timedout();
        // SAFETY: the timer's data is its hub, which lives for the
        // worker's life (its Drop takes the timer away).
        let ask = |h: &mut StreamHub| {
            for k in h.keys.values_mut() {
                k.held = false;
            }
            if !h.keys.is_empty() && !exiting() {
                h.kick_all();
            }
        };
        // SAFETY: see above.
        unsafe { hub::lend(ev.data() as *mut StreamHub, ask) };
    }
}
