//! The only place where nginx's raw pointers become safe types. Every entry
//! point turns the pointers nginx hands it into references or wrappers once
//! (`Req`, `Conf`, `Pool`, `Event`, `Timer`, `Socket`), and the code above
//! works with their safe methods. Each unsafe block here says why it holds.

pub use nginx_sys::*;

#[macro_use]
pub mod entry;
pub mod balancer;
pub mod buf;
pub mod conf;
pub mod event;
pub mod hold;
pub mod log;
pub mod net;
pub mod pool;
pub mod request;
pub mod shm;
pub mod ssl;
pub mod thread;
pub mod upstream;

use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

pub use buf::{memory_chain, Chain};
pub use conf::{Claim, Conf};
pub use event::{Event, RetryTimer, Socket, Timer};
pub use log::Log;
pub use pool::Pool;
pub use request::{fill_variable, Req, FILTER_REDIRECT};
pub use upstream::{Reply, Upstream};

pub const OK: ngx_int_t = 0;
pub const ERROR: ngx_int_t = -1;
pub const AGAIN: ngx_int_t = -2;
pub const BUSY: ngx_int_t = -3;
pub const DONE: ngx_int_t = -4;
pub const DECLINED: ngx_int_t = -5;

pub const CONF_OK: *mut c_char = ptr::null_mut();
pub const CONF_ERROR: *mut c_char = usize::MAX as *mut c_char;
pub const CONF_UNSET_MSEC: ngx_msec_t = ngx_msec_t::MAX;
pub const CONF_UNSET: ngx_flag_t = -1;
/// NGX_CONF_UNSET_PTR: a pointer setting not given.
pub const CONF_UNSET_PTR: *mut std::ffi::c_void = usize::MAX as *mut std::ffi::c_void;
pub const CONF_UNSET_UINT: ngx_uint_t = ngx_uint_t::MAX;
pub const CONF_UNSET_SIZE: usize = usize::MAX;

pub const HTTP_OK: ngx_int_t = 200;
pub const HTTP_BAD_REQUEST: ngx_int_t = 400;
pub const HTTP_UNAUTHORIZED: ngx_int_t = 401;
pub const HTTP_FORBIDDEN: ngx_int_t = 403;
pub const HTTP_NOT_ALLOWED: ngx_int_t = 405;
pub const HTTP_REQUEST_TIME_OUT: ngx_int_t = 408;
pub const HTTP_INTERNAL_SERVER_ERROR: ngx_int_t = 500;
pub const HTTP_BAD_GATEWAY: ngx_int_t = 502;
pub const HTTP_SERVICE_UNAVAILABLE: ngx_int_t = 503;
pub const HTTP_GATEWAY_TIME_OUT: ngx_int_t = 504;

/// A `static` ngx_str_t (for names nginx keeps pointers to).
pub const fn static_str(s: &'static str) -> ngx_str_t {
    ngx_str_t {
        len: s.len(),
        data: s.as_ptr() as *mut u8,
    }
}

/// Runs the body of a function that nginx calls: a panic never crosses into
/// nginx. It becomes `on_panic` (an error status or code) and one alert line
/// naming the entry point; the worker carries on.
pub fn guard<T>(log: Log, entry: &str, on_panic: T, body: impl FnOnce() -> T) -> T {
    quiet_panics();
    match catch_unwind(AssertUnwindSafe(|| {
        fault_injection(entry);
        body()
    })) {
        Ok(v) => v,
        Err(_) => {
            let what = LAST_PANIC.take().unwrap_or_default();
            crate::log!(NGX_LOG_ALERT, log, "gateway: internal error (panic) in {entry}{what}");
            on_panic
        }
    }
}

thread_local! {
    /// The message and place of the panic being caught, for guard's line.
    static LAST_PANIC: std::cell::Cell<Option<String>> = const { std::cell::Cell::new(None) };
}

/// Replaces std's panic hook (in this module's copy of std) by one that
/// keeps the message for guard's alert line and prints nothing: the default
/// hook writes to stderr and, with RUST_BACKTRACE set, symbolizes a
/// backtrace whose debug-info cache (megabytes) stays behind after nginx
/// unloads the module at a failed reload.
fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let at = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            LAST_PANIC.set(Some(format!(": {msg}{at}")));
        }));
    });
}

/// With the `fault-injection` feature (tests only), the entry point named by
/// the environment variable NGX_GATEWAY_PANIC panics, to show that the guard
/// holds everywhere.
#[cfg(feature = "fault-injection")]
fn fault_injection(entry: &str) {
    if std::env::var("NGX_GATEWAY_PANIC").is_ok_and(|v| v.split(',').any(|e| e == entry)) {
        panic!("injected panic in {entry}");
    }
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
fn fault_injection(_entry: &str) {}

/// With the `fault-injection` feature (tests only), a point inside the
/// module's work (not an entry point: a hub call, a delivery, a
/// connection's step) that NGX_GATEWAY_PANIC names panics, the first time
/// it is reached in the worker only: what comes after shows that the
/// worker carries on.
#[cfg(feature = "fault-injection")]
pub fn fault_point(point: &str) {
    thread_local! {
        static FIRED: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let named = std::env::var("NGX_GATEWAY_PANIC").is_ok_and(|v| v.split(',').any(|e| e == point));
    if named && FIRED.with(|f| !f.borrow().iter().any(|p| p == point)) {
        FIRED.with(|f| f.borrow_mut().push(point.to_owned()));
        panic!("injected panic in {point}");
    }
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn fault_point(_point: &str) {}

/// With the `fault-injection` feature (tests only), the value of one of the
/// environment variables by which a suite makes a fault happen on purpose
/// (NGX_GATEWAY_HOLD_QUERY, NGX_GATEWAY_LOSE_CANCELS); None in every
/// other build, where nothing can set them.
#[cfg(feature = "fault-injection")]
pub fn fault_setting(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn fault_setting(_name: &str) -> Option<String> {
    None
}

/// `ngx_current_msec`, nginx's clock.
pub fn current_msec() -> ngx_msec_t {
    // SAFETY: a plain read of a global that the event loop of this (single)
    // thread updates.
    unsafe { ngx_current_msec }
}

/// nginx is shutting down (quit, terminate, exiting): connections are not kept.
pub fn exiting() -> bool {
    // SAFETY: plain reads of nginx's process flags, written by this thread's
    // signal handling between events.
    unsafe { ngx_exiting != 0 || ngx_terminate != 0 || ngx_quit != 0 }
}

/// The system page size (the default of buffer sizes).
pub fn pagesize() -> usize {
    // SAFETY: set once at start-up, before configurations are read.
    unsafe { ngx_pagesize }
}
