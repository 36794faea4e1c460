//! The worker's table of `cache_auth` passwords that Redis refused lately
//! (core's `AuthFailures`): every place that sends `AUTH` (a request's own
//! connection, the shared pipelined connections, the subscribing ones)
//! asks it before it connects and tells it of a refusal. A refused password
//! costs Redis one connection a second at most, and the log one line a
//! minute, however many requests carry it.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use gateway_core::authfail::AuthFailures;

use crate::ffi::*;
use crate::log;

thread_local! {
    /// A hash keyed at random per worker (SipHash): the table holds no
    /// password, and a key says nothing of one.
    static TABLE: RefCell<(RandomState, AuthFailures)> = RefCell::new((RandomState::new(), AuthFailures::default()));
}

/// The key of a password for the servers it goes to (`scope`: the upstream
/// block, or the address written in `cache_pass`).
pub fn key(scope: &[u8], password: &[u8]) -> u64 {
    TABLE.with(|t| t.borrow().0.hash_one((scope, password)))
}

/// The scope of an upstream block (its address in configuration memory,
/// the same for every request of the worker).
pub fn block_scope(block: *const ngx_http_upstream_srv_conf_t) -> [u8; 8] {
    (block as usize as u64).to_ne_bytes()
}

/// Redis refused the password less than a second ago: the request fails
/// at once (502), without a connection.
pub fn blocked(key: u64) -> bool {
    TABLE.with(|t| t.borrow().1.blocked(key, current_msec() as u64))
}

/// Whether a new request may use the password: not for a second after a
/// refusal, then one request a second tries it again (the others fail at
/// once, 502) until Redis answers it.
pub fn may_try(key: u64) -> bool {
    TABLE.with(|t| t.borrow_mut().1.may_try(key, current_msec() as u64))
}

/// Redis refused the password: one error line a minute at most.
pub fn refused(key: u64, log: Log, what: std::fmt::Arguments<'_>) {
    let due = TABLE.with(|t| t.borrow_mut().1.refused(key, current_msec() as u64));
    if due {
        log!(
            NGX_LOG_ERR,
            log,
            "cache: {what} (password #{:08x}: for a second, requests with it get 502 without a connection; this line comes once a minute at most)",
            key as u32
        );
    }
}

/// Redis took the password.
pub fn accepted(key: u64) {
    TABLE.with(|t| t.borrow_mut().1.accepted(key));
}
