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

/// This worker's batch: one thread-local (each access of one costs a call
/// in a module nginx loads at run time).
struct Batch {
    /// The connections corked in this pass.
    corked: Due,
    /// The connections whose gauges are due at the end of this pass.
    shown: Due,
    /// The posted event of the end of the pass.
    release: event::DeferSlot,
}

thread_local! {
    static BATCH: Batch = const {
        Batch {
            corked: RefCell::new(Vec::new()),
            shown: RefCell::new(Vec::new()),
            release: Cell::new(std::ptr::null_mut()),
        }
    };
}

/// A connection was corked: it is uncorked at the end of the pass.
pub(super) fn hold(pool: NonNull<ConnPool>, id: ConnId) {
    BATCH.with(|b| end_of_pass(b, &b.corked, pool, id));
}

/// A connection's gauges are brought up to date at the end of the pass.
pub(super) fn show_later(pool: NonNull<ConnPool>, id: ConnId) {
    BATCH.with(|b| end_of_pass(b, &b.shown, pool, id));
}

fn end_of_pass(b: &Batch, list: &Due, pool: NonNull<ConnPool>, id: ConnId) {
    list.borrow_mut().push((pool, id));
    // (nginx posts an event once: posting it again in the pass does nothing.)
    event::defer_on(&b.release, Some(release));
}

event_handler! {
    /// The end of the pass: every corked connection sends what it holds,
    /// and the gauges show where the connections' queues stand.
    fn release(_ev) = "database batch release", {
        BATCH.with(release_due);
    }
}

/// The end of the pass (`release`).
fn release_due(b: &Batch) {
    for (list, uncork) in [(&b.corked, true), (&b.shown, false)] {
        // (Out of the list while the connections are seen to: one may
        // be corked again.)
        let mut due = std::mem::take(&mut *list.borrow_mut());
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
        let mut c = list.borrow_mut();
        if c.is_empty() {
            *c = due;
        }
    }
}
