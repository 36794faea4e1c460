//! The requests of this worker that the driver may call back, by token: a
//! request is registered when its query is built and leaves when its pool
//! is destroyed. A token of a request that has gone finds nothing.

use std::cell::RefCell;
use std::ptr::NonNull;

use gateway_core::slab::Slab;

use crate::ffi::{ngx_http_request_t, Req};
use crate::sqldb::driver::ReqToken;

thread_local! {
    static LIVE: RefCell<Slab<NonNull<ngx_http_request_t>>> = RefCell::new(Slab::default());
}

pub fn register(r: &Req) -> ReqToken {
    let p = NonNull::new(r.as_ptr()).expect("a live request");
    ReqToken(LIVE.with(|l| l.borrow_mut().insert(p)))
}

pub fn unregister(t: ReqToken) {
    LIVE.with(|l| l.borrow_mut().remove(t.0));
}

/// The request of a token, if it is still there.
pub fn lookup(t: ReqToken) -> Option<NonNull<ngx_http_request_t>> {
    LIVE.with(|l| l.borrow().get(t.0).copied())
}
