//! The database gateway's run-time state in this worker: for each upstream
//! block, its connection pool and its listening connection (`sqldb_listen`).
//! Owned here, one way, per worker, not by the configuration (which stays
//! as nginx loaded it): made on first use, each boxed (its connections and
//! timers point at it) and dropped with the pool of the cycle it was made
//! in (the configuration's, so at the worker's end). It is reached for a
//! call only: `with_pool` lends a pool while its closure runs, and a loan
//! of a pool that is lent already (from inside the first) panics rather
//! than make a second `&mut` of it; the mark goes with the loan's end,
//! however it ends.

use std::cell::RefCell;
use std::ptr::NonNull;

use super::{ConnPool, Listener};
use crate::common::hub::{HubRef, HubSink};

/// What one upstream block has in this worker.
struct State {
    pool: ConnPool,
    /// `sqldb_listen`'s connection, made on first use (boxed: the hub's
    /// subscribers reach it through a HubRef).
    listener: Option<Box<Listener>>,
}

thread_local! {
    /// The states, by their upstream's key (the address of its
    /// configuration). A state is never moved (boxed) and leaves only
    /// with its cycle's pool (`Gone`).
    static STATES: RefCell<Vec<(usize, NonNull<State>)>> = const { RefCell::new(Vec::new()) };
    /// The pools lent now, innermost last.
    static LENT: RefCell<Vec<*const ConnPool>> = const { RefCell::new(Vec::new()) };
}

/// The state of the upstream `key`, made by `make` on first use.
fn state(key: usize, make: impl FnOnce() -> ConnPool) -> NonNull<State> {
    if let Some(s) = STATES.with_borrow(|v| v.iter().find(|(k, _)| *k == key).map(|(_, s)| *s)) {
        return s;
    }
    let s = NonNull::from(Box::leak(Box::new(State {
        pool: make(),
        listener: None,
    })));
    STATES.with_borrow_mut(|v| v.push((key, s)));
    // Its end: with the cycle's pool, as the configuration it was made for.
    if crate::ffi::pool::cycle_pool()
        .and_then(|p| p.alloc(Gone(key)))
        .is_none()
    {
        crate::log!(
            crate::ffi::NGX_LOG_ALERT,
            crate::ffi::Log::cycle(),
            "sqldb: no memory to note the end of an upstream's connections: they stay until the worker exits"
        );
    }
    s
}

/// Drops the state of `key` (with the cycle's pool).
struct Gone(usize);

impl Drop for Gone {
    fn drop(&mut self) {
        let Some(s) = STATES.with_borrow_mut(|v| {
            let at = v.iter().position(|(k, _)| *k == self.0)?;
            Some(v.swap_remove(at).1)
        }) else {
            return;
        };
        // SAFETY: leaked by `state` for this key alone, and out of the
        // registry now; nothing is lent at the cycle's end.
        drop(unsafe { Box::from_raw(s.as_ptr()) });
    }
}

/// A loan of a pool, marked in LENT (`lent`) while it lasts (its end, a
/// return or an unwinding panic, takes the mark away).
struct Loan<'a> {
    lent: &'a RefCell<Vec<*const ConnPool>>,
}

impl<'a> Loan<'a> {
    fn take(lent: &'a RefCell<Vec<*const ConnPool>>, pool: *const ConnPool) -> Loan<'a> {
        let mut l = lent.borrow_mut();
        assert!(!l.contains(&pool), "a database pool lent twice");
        l.push(pool);
        Loan { lent }
    }
}

impl Drop for Loan<'_> {
    fn drop(&mut self) {
        self.lent.borrow_mut().pop();
    }
}

/// Runs `f` with the pool at `pool`, lent for the call only (inside the
/// one access of LENT the loan needs: each costs a call in a module nginx
/// loads at run time).
///
/// # Safety
/// `pool` is the pool of a live state of this worker's (a connection's or
/// timer's pointer to the pool that owns it).
pub(super) unsafe fn lend<T>(pool: NonNull<ConnPool>, f: impl FnOnce(&mut ConnPool) -> T) -> T {
    LENT.with(|lent| {
        let _loan = Loan::take(lent, pool.as_ptr());
        // SAFETY: live and boxed (above); lent once at a time (the loan).
        f(unsafe { &mut *pool.as_ptr() })
    })
}

/// Runs `f` with the worker's pool of the upstream `key` (made by `make`
/// on first use), lent for the call only.
pub fn with_pool<T>(key: usize, make: impl FnOnce() -> ConnPool, f: impl FnOnce(&mut ConnPool) -> T) -> T {
    let s = state(key, make);
    // SAFETY: a state of the registry's, live and boxed (state).
    let pool = NonNull::from(unsafe { &mut (*s.as_ptr()).pool });
    // SAFETY: as above.
    unsafe { lend(pool, f) }
}

/// The worker's listening connection of the upstream `key`, made by
/// `make` on first use (None: it cannot be made).
pub fn listener(
    key: usize,
    make_pool: impl FnOnce() -> ConnPool,
    make: impl FnOnce() -> (std::ffi::CString, String),
    sink: &'static dyn HubSink,
) -> Option<HubRef> {
    let s = state(key, make_pool);
    // SAFETY: a state of the registry's, live and boxed (state); its
    // listener is reached only here and through the HubRef's loans.
    let slot = unsafe { &mut (*s.as_ptr()).listener };
    if slot.is_none() {
        let (conninfo, name) = make();
        *slot = Some(Listener::new(conninfo, name, sink));
    }
    let l: &mut dyn crate::common::hub::Hub = slot.as_deref_mut()?;
    // SAFETY: the listener is boxed in its state, which stays until the
    // cycle's pool goes (after the worker's last request), and it is never
    // replaced.
    Some(unsafe { HubRef::new(NonNull::from(l)) })
}

/// Runs `f` with the worker's listening connection of the upstream `key`,
/// if it was made; lent as its subscribers' HubRef lends it (hub::lend).
pub fn with_listener<T>(key: usize, f: impl FnOnce(&mut Listener) -> T) -> Option<T> {
    let s = STATES.with_borrow(|v| v.iter().find(|(k, _)| *k == key).map(|(_, s)| *s))?;
    // SAFETY: a state of the registry's, live and boxed (state).
    let l: *mut Listener = unsafe { (*s.as_ptr()).listener.as_deref_mut() }?;
    // SAFETY: boxed in its state, which stays until the cycle's pool goes;
    // reached only through loans (this one and the HubRef's).
    Some(unsafe { crate::common::hub::lend(l, f) })
}
