//! Batched writes: the queries that requests send in one pass of nginx's
//! event loop go out together. The first query of a pass on a connection
//! turns TCP_CORK on (the kernel holds what libpq writes), and a posted
//! event, which nginx runs after every other handler of the pass, turns it
//! off again, which sends what was held in as few segments as it fills.

use std::cell::{Cell, RefCell};
use std::ptr::NonNull;

use super::{ConnId, ConnPool};
use crate::ffi::*;

thread_local! {
    /// The connections corked in this pass.
    static CORKED: RefCell<Vec<(NonNull<ConnPool>, ConnId)>> = const { RefCell::new(Vec::new()) };
    static RELEASE: Cell<*mut ngx_event_t> = const { Cell::new(std::ptr::null_mut()) };
}

/// A connection was corked: it is uncorked at the end of the pass.
pub(super) fn hold(pool: NonNull<ConnPool>, id: ConnId) {
    CORKED.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_empty() {
            event::defer_on(&RELEASE, Some(release));
        }
        c.push((pool, id));
    });
}

event_handler! {
    /// The end of the pass: every corked connection sends what it holds.
    fn release(_ev) = "database batch release", {
        for (pool, id) in CORKED.with(|c| std::mem::take(&mut *c.borrow_mut())) {
            // SAFETY: a pool lives in its upstream's configuration for the
            // worker's life, and nothing else uses it while a posted event's
            // handler runs. A connection closed since is not found (its id is
            // stale).
            let pool = unsafe { &mut *pool.as_ptr() };
            if let Some(c) = pool.conn(id) {
                c.uncork();
            }
        }
    }
}
