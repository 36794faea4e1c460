//! Spare connections: a fast request should not wait for a connection to
//! be opened (connect, authentication) because long queries hold every
//! open one. `slow` (`sqldb_pipeline slow=`) after a query goes out, if
//! every connection to a server is held by a query that has run that long
//! (none idle, none connecting, none whose front query is younger) and the
//! pool may open more (fewer than `sqldb_keepalive max`), one more is
//! opened for no request: once up it waits in the idle list for the next
//! one. Per pool (one upstream in one worker), one at a time, within the
//! pool's bound.

use gateway_core::pipeline::Pipeline;

use super::ConnPool;
use crate::ffi::*;
use crate::{debug, log};

/// A spare that is not up within this (ms) is given up (no request waits
/// on it to time it out).
pub(super) const SPARE_CONNECT_TIMEOUT: ngx_msec_t = 10_000;

event_handler! {
    /// `slow` after a query went out: a spare connection, if every one is
    /// held by a long query.
    pub(super) fn spare_event(ev) = "sqldb spare timer", {
        ev.take_timedout();
        let Some(pool) = std::ptr::NonNull::new(ev.data().cast::<ConnPool>()) else { return };
        // SAFETY: the timer's data is its pool, the worker's (worker), which
        // owns it (the timer is dropped with the pool).
        unsafe { super::worker::lend(pool, ConnPool::keep_spare) };
    }
}

impl ConnPool {
    /// The pool may open another connection: none past its bound, none
    /// while nginx exits.
    fn room_for_spare(&self) -> bool {
        let s = &self.settings;
        s.pipelining && s.max != 0 && self.conns.len() < s.max && !exiting()
    }

    /// A query went out or waits: check for a spare `slow` from now (the
    /// timer runs once at a time).
    pub(super) fn spare_later(&mut self) {
        if !self.room_for_spare() {
            return;
        }
        let ms = self.settings.slow.max(1);
        let data: *mut ConnPool = self;
        self.spare_timer
            .get_or_insert_with(|| RetryTimer::new(data.cast(), Some(spare_event)))
            .start(ms);
    }

    /// Opens a spare connection to the first server whose every connection
    /// is held by a query that has run `slow` or more; while a connection
    /// connects or its front query has not run that long, looks again
    /// `slow` later (an idle one stops it: the next query starts it again).
    fn keep_spare(&mut self) {
        if !self.room_for_spare() {
            return;
        }
        let (slow, now) = (self.settings.slow, current_msec());
        let mut held = Vec::new();
        let mut free = Vec::new();
        // A connection connecting, or busy with a query that has not run
        // long yet: look again later.
        let mut unsettled = false;
        for (_, c) in self.conns.iter() {
            let p = &c.pipeline;
            if p.is_closed() {
                continue;
            }
            if !p.is_connecting() && p.depth() > 0 && c.head_age(now) >= slow {
                if !held.iter().any(|(a, _, _)| *a == c.addr) {
                    held.push((c.addr, c.conninfo.clone(), c.name.clone()));
                }
            } else {
                unsettled |= p.is_connecting() || p.depth() > 0;
                free.push(c.addr);
            }
        }
        let Some((addr, conninfo, name)) = held.into_iter().find(|(a, _, _)| !free.contains(a)) else {
            if unsettled {
                self.spare_later();
            }
            return;
        };
        match self.open_with(addr, &conninfo, name, Pipeline::spare()) {
            Ok(id) => {
                if let Some(c) = self.conn(id) {
                    c.set_timer(Some(SPARE_CONNECT_TIMEOUT));
                    debug!(
                        Log::cycle(),
                        "sqldb: spare connection #{} to {} opens: long queries hold every other",
                        id.0.as_u64(),
                        c.name
                    );
                }
            }
            Err(e) => {
                log!(NGX_LOG_INFO, Log::cycle(), "sqldb: no spare connection: {e}");
            }
        }
    }
}
