//! Batched writes: the queries that requests send in one pass of nginx's
//! event loop go out together. The first query of a pass on a connection
//! turns TCP_CORK on (the kernel holds what libpq writes), and a posted
//! event, which nginx runs after every other handler of the pass, turns it
//! off again, which sends what was held in as few segments as it fills.
//! The same event brings the connections' gauges up to date once per pass,
//! however often their queues moved in it.

use std::cell::{Cell, RefCell};
use std::ptr::NonNull;

use super::{ConnId, ConnPool};
use crate::ffi::*;

/// Connections of the pools, to be seen to at the end of the pass.
type Due = RefCell<Vec<(NonNull<ConnPool>, ConnId)>>;

thread_local! {
    /// The connections corked in this pass.
    static CORKED: Due = const { RefCell::new(Vec::new()) };
    /// The connections whose gauges are due at the end of this pass.
    static SHOWN: Due = const { RefCell::new(Vec::new()) };
    static RELEASE: Cell<*mut ngx_event_t> = const { Cell::new(std::ptr::null_mut()) };
}

/// A connection was corked: it is uncorked at the end of the pass.
pub(super) fn hold(pool: NonNull<ConnPool>, id: ConnId) {
    end_of_pass(&CORKED, pool, id);
}

/// A connection's gauges are brought up to date at the end of the pass.
pub(super) fn show_later(pool: NonNull<ConnPool>, id: ConnId) {
    end_of_pass(&SHOWN, pool, id);
}

fn end_of_pass(list: &'static std::thread::LocalKey<Due>, pool: NonNull<ConnPool>, id: ConnId) {
    list.with(|c| c.borrow_mut().push((pool, id)));
    // (nginx posts an event once: posting it again in the pass does nothing.)
    event::defer_on(&RELEASE, Some(release));
}

event_handler! {
    /// The end of the pass: every corked connection sends what it holds,
    /// and the gauges show where the connections' queues stand.
    fn release(_ev) = "database batch release", {
        for (list, uncork) in [(&CORKED, true), (&SHOWN, false)] {
            let mut due = list.with(|c| std::mem::take(&mut *c.borrow_mut()));
            for &(pool, id) in &due {
                let step = |pool: &mut ConnPool| {
                    if let Some(c) = pool.conn(id) {
                        if uncork {
                            c.uncork();
                        } else {
                            c.show_due = false;
                            c.show(true);
                        }
                    }
                };
                // SAFETY: a pool is the worker's (worker) until the worker
                // ends. A connection closed since is not found (its id is
                // stale).
                unsafe { super::worker::lend(pool, step) };
            }
            // (Its room serves the next pass.)
            due.clear();
            list.with(|c| {
                let mut c = c.borrow_mut();
                if c.is_empty() {
                    *c = due;
                }
            });
        }
    }
}
