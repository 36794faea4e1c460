//! Tokens: how a connection (or a hub) names a live request without a
//! pointer to it. A request registers when it hands itself to a driver and
//! leaves when it ends; a token of one that has gone finds nothing, so a
//! late reply or event cannot reach freed memory. One scheme for every
//! connection of the module: the database pools, the cache's pipelined
//! connections and the subscription hubs.

use std::cell::RefCell;
use std::ptr::NonNull;

use gateway_core::slab::{Key, Slab};

use crate::ffi::{ngx_http_request_t, Req};

/// A live thing of the worker, as a connection knows it (a key of a
/// `Registry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReqToken(pub Key);

/// Live things of one kind, by token.
pub struct Registry<T>(RefCell<Slab<NonNull<T>>>);

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Registry(RefCell::new(Slab::default()))
    }
}

impl<T> Registry<T> {
    pub fn register(&self, p: NonNull<T>) -> ReqToken {
        ReqToken(self.0.borrow_mut().insert(p))
    }

    /// The token the next `register` gives.
    pub fn next(&self) -> ReqToken {
        ReqToken(self.0.borrow().next_key())
    }

    pub fn unregister(&self, t: ReqToken) {
        self.0.borrow_mut().remove(t.0);
    }

    /// What a token names, if it is still there.
    pub fn lookup(&self, t: ReqToken) -> Option<NonNull<T>> {
        self.0.borrow().get(t.0).copied()
    }

    /// Every live one, with its token.
    pub fn all(&self) -> Vec<(ReqToken, NonNull<T>)> {
        self.0.borrow().iter().map(|(k, p)| (ReqToken(k), *p)).collect()
    }
}

thread_local! {
    /// The worker's requests that a driver may call back.
    static REQUESTS: Registry<ngx_http_request_t> = Registry::default();
}

/// Registers a request (it must `unregister` before its pool goes).
pub fn register(r: &Req) -> ReqToken {
    let p = NonNull::new(r.as_ptr()).expect("a live request");
    REQUESTS.with(|l| l.register(p))
}

pub fn unregister(t: ReqToken) {
    REQUESTS.with(|l| l.unregister(t));
}

/// The token names a request (or a reserved token) that is still there.
pub fn is_live(t: ReqToken) -> bool {
    REQUESTS.with(|l| l.lookup(t).is_some())
}

/// A token of the requests' kind for work of the gateway's own that no
/// request carries (a query it runs for subscribers): a driver takes it
/// as a request's, `with_request` finds nothing for it. `unregister` ends it.
pub fn reserve() -> ReqToken {
    REQUESTS.with(|l| l.register(NonNull::dangling()))
}

/// Runs `f` with the request of a token, if it is still there. The
/// request is borrowed for the call only.
pub fn with_request<T>(t: ReqToken, f: impl FnOnce(&mut Req) -> T) -> Option<T> {
    let p = REQUESTS.with(|l| l.lookup(t)).filter(|p| *p != NonNull::dangling())?;
    // SAFETY: a registered request is live (it leaves the registry before
    // its pool goes); it is lent to `f` only, held (`f` may end it).
    Some(unsafe { Req::hold(p.as_ptr(), f) })
}
