//! Thin wrappers over nginx's C API: status codes, strings, logging, pool
//! allocation, configuration lookups, events and timers. Every `unsafe`
//! block of the module that touches nginx directly lives here or says why it
//! holds where it is.

use std::ffi::{c_char, c_void};
use std::fmt::{self, Write};
use std::mem;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, NonNull};

pub use nginx_sys::*;

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
pub const CONF_UNSET_UINT: ngx_uint_t = ngx_uint_t::MAX;

pub const HTTP_OK: ngx_int_t = 200;
pub const HTTP_BAD_REQUEST: ngx_int_t = 400;
pub const HTTP_REQUEST_TIME_OUT: ngx_int_t = 408;
pub const HTTP_NOT_ALLOWED: ngx_int_t = 405;
pub const HTTP_INTERNAL_SERVER_ERROR: ngx_int_t = 500;
pub const HTTP_BAD_GATEWAY: ngx_int_t = 502;
pub const HTTP_SERVICE_UNAVAILABLE: ngx_int_t = 503;
pub const HTTP_GATEWAY_TIME_OUT: ngx_int_t = 504;

/// epoll's values of NGX_READ_EVENT / NGX_WRITE_EVENT on Linux (the macros are
/// expressions that bindgen does not export).
pub const READ_EVENT: ngx_uint_t = (libc::EPOLLIN | libc::EPOLLRDHUP) as ngx_uint_t;
pub const WRITE_EVENT: ngx_uint_t = libc::EPOLLOUT as ngx_uint_t;
/// Level-triggered registration (NGX_LEVEL_EVENT is 0 with epoll).
pub const LEVEL_EVENT: ngx_uint_t = 0;

const _: () = assert!(mem::align_of::<u64>() <= NGX_ALIGNMENT);

/// An ngx_str_t for a static string, usable in statics.
pub const fn static_str(s: &'static str) -> ngx_str_t {
    ngx_str_t {
        len: s.len(),
        data: s.as_ptr() as *mut u8,
    }
}

/// The bytes of an ngx_str_t.
///
/// # Safety
/// `s` must describe `len` readable bytes that outlive `'a`.
pub unsafe fn bytes<'a>(s: &ngx_str_t) -> &'a [u8] {
    if s.len == 0 || s.data.is_null() {
        &[]
    } else {
        // SAFETY: the caller promises data/len describe live memory.
        unsafe { std::slice::from_raw_parts(s.data, s.len) }
    }
}

/// A fixed stack buffer that formats and truncates instead of allocating.
struct LineBuf {
    buf: [u8; 2048],
    len: usize,
}

impl LineBuf {
    fn new() -> Self {
        LineBuf { buf: [0; 2048], len: 0 }
    }
    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Write for LineBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Writes one line to an nginx log at `level` (NGX_LOG_ERR, ...).
///
/// # Safety
/// `log` must be null or a live nginx log.
pub unsafe fn log_error(level: u32, log: *mut ngx_log_t, args: fmt::Arguments<'_>) {
    // SAFETY: checked for null; the caller promises a live log otherwise.
    if log.is_null() || level as usize > unsafe { (*log).log_level } {
        return;
    }
    let mut line = LineBuf::new();
    let _ = line.write_fmt(args);
    let b = line.as_bytes();
    // SAFETY: "%*s" reads exactly b.len() bytes from b.
    unsafe { ngx_log_error_core(level as ngx_uint_t, log, 0, c"%*s".as_ptr(), b.len(), b.as_ptr()) };
}

/// Logs at a level: `log!(NGX_LOG_ERR, log, "fmt", args..)`.
#[macro_export]
macro_rules! log {
    ($level:expr, $log:expr, $($arg:tt)+) => {{
        let log: *mut $crate::ffi::ngx_log_t = $log;
        let level: u32 = $level;
        let args = format_args!($($arg)+);
        // SAFETY: callers pass a log taken from a live connection, request or cycle.
        #[allow(unused_unsafe)]
        let () = unsafe { $crate::ffi::log_error(level, log, args) };
    }};
}

/// Reports a configuration error; nginx appends " in FILE:LINE".
///
/// # Safety
/// `cf` must be the live configuration being parsed.
pub unsafe fn conf_error(cf: *mut ngx_conf_t, args: fmt::Arguments<'_>) -> *mut c_char {
    let mut line = LineBuf::new();
    let _ = line.write_fmt(args);
    let b = line.as_bytes();
    // SAFETY: "%*s" reads exactly b.len() bytes from b; cf is live.
    unsafe { ngx_conf_log_error(NGX_LOG_EMERG as ngx_uint_t, cf, 0, c"%*s".as_ptr(), b.len(), b.as_ptr()) };
    CONF_ERROR
}

/// Runs the body of a function that nginx calls: a panic never crosses into
/// nginx. It becomes `on_panic` (an error status or code) and one alert line
/// naming the entry point; the worker carries on.
pub fn guard<T>(log: *mut ngx_log_t, entry: &str, on_panic: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(|| {
        fault_injection(entry);
        body()
    })) {
        Ok(v) => v,
        Err(_) => {
            log!(NGX_LOG_ALERT, log, "gateway: internal error (panic) in {entry}");
            on_panic
        }
    }
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

unsafe extern "C" fn drop_value<T>(data: *mut c_void) {
    // SAFETY: registered only by pool_alloc for a T written at `data`.
    guard(cycle_log(), "pool cleanup", (), || unsafe {
        ptr::drop_in_place(data as *mut T)
    });
}

/// Moves `value` into memory of `pool`; it is dropped when the pool is destroyed.
///
/// # Safety
/// `pool` must be a live pool.
pub unsafe fn pool_alloc<T>(pool: *mut ngx_pool_t, value: T) -> Option<NonNull<T>> {
    const { assert!(mem::align_of::<T>() <= NGX_ALIGNMENT) };
    // SAFETY: pool is live; ngx_palloc returns NGX_ALIGNMENT-aligned memory or null.
    let p = NonNull::new(unsafe { ngx_palloc(pool, mem::size_of::<T>()) } as *mut T)?;
    if mem::needs_drop::<T>() {
        // SAFETY: pool is live.
        let cln = NonNull::new(unsafe { ngx_pool_cleanup_add(pool, 0) })?;
        // SAFETY: cln is a fresh cleanup record; p is valid for a write of T.
        unsafe {
            ptr::write(p.as_ptr(), value);
            (*cln.as_ptr()).handler = Some(drop_value::<T>);
            (*cln.as_ptr()).data = p.as_ptr() as *mut c_void;
        }
    } else {
        // SAFETY: p is valid for a write of T.
        unsafe { ptr::write(p.as_ptr(), value) };
    }
    Some(p)
}

/// Copies bytes into a pool as an ngx_str_t.
///
/// # Safety
/// `pool` must be a live pool.
pub unsafe fn pool_str(pool: *mut ngx_pool_t, b: &[u8]) -> Option<ngx_str_t> {
    // SAFETY: pool is live; a non-null result has room for b.len() bytes.
    let data = unsafe { ngx_pnalloc(pool, b.len().max(1)) } as *mut u8;
    if data.is_null() {
        return None;
    }
    // SAFETY: see above.
    unsafe { ptr::copy_nonoverlapping(b.as_ptr(), data, b.len()) };
    Some(ngx_str_t { len: b.len(), data })
}

/// The arguments of the directive being parsed.
///
/// # Safety
/// `cf` must be the live configuration being parsed.
pub unsafe fn conf_args<'a>(cf: *mut ngx_conf_t) -> &'a [ngx_str_t] {
    // SAFETY: during a directive handler cf->args is an array of ngx_str_t.
    unsafe { (*(*cf).args).as_slice::<ngx_str_t>() }
}

/// `ngx_http_conf_get_module_*_conf` for a module and a kind of slot.
///
/// # Safety
/// `cf->ctx` must be an http configuration context.
pub unsafe fn http_conf_get<T>(cf: *mut ngx_conf_t, module: *const ngx_module_t, which: ConfSlot) -> *mut T {
    // SAFETY: within the http block cf->ctx is an ngx_http_conf_ctx_t.
    unsafe {
        let ctx = (*cf).ctx as *mut ngx_http_conf_ctx_t;
        let arr = match which {
            ConfSlot::Main => (*ctx).main_conf,
            ConfSlot::Srv => (*ctx).srv_conf,
            ConfSlot::Loc => (*ctx).loc_conf,
        };
        *arr.add((*module).ctx_index) as *mut T
    }
}

#[derive(Clone, Copy)]
pub enum ConfSlot {
    Main,
    Srv,
    Loc,
}

/// `ngx_http_get_module_loc_conf(r, module)`.
///
/// # Safety
/// `r` must be a live request.
pub unsafe fn request_loc_conf<T>(r: *mut ngx_http_request_t, module: *const ngx_module_t) -> *mut T {
    // SAFETY: r->loc_conf has a slot for every http module.
    unsafe { *(*r).loc_conf.add((*module).ctx_index) as *mut T }
}

/// The log of a request's client connection.
///
/// # Safety
/// `r` must be a live request.
pub unsafe fn client_log(r: *mut ngx_http_request_t) -> *mut ngx_log_t {
    // SAFETY: a live request has a live connection.
    unsafe { (*(*r).connection).log }
}

/// Adds an event to the event module's watch list.
///
/// # Safety
/// `ev` must be an event of a live connection.
pub unsafe fn add_event(ev: *mut ngx_event_t, event: ngx_uint_t, flags: ngx_uint_t) -> bool {
    // SAFETY: ngx_event_actions is set up by the event module before any request.
    unsafe {
        match ngx_event_actions.add {
            Some(add) => add(ev, event as ngx_int_t, flags) == OK,
            None => false,
        }
    }
}

/// Removes an event from the event module's watch list.
///
/// # Safety
/// `ev` must be an event of a live connection.
pub unsafe fn del_event(ev: *mut ngx_event_t, event: ngx_uint_t, flags: ngx_uint_t) -> bool {
    // SAFETY: as for add_event.
    unsafe {
        match ngx_event_actions.del {
            Some(del) => del(ev, event as ngx_int_t, flags) == OK,
            None => false,
        }
    }
}

/// The log of the running cycle (for what outlives a request).
pub fn cycle_log() -> *mut ngx_log_t {
    // SAFETY: ngx_cycle is set before any module code runs and stays valid.
    unsafe {
        if ngx_cycle.is_null() {
            ptr::null_mut()
        } else {
            (*ngx_cycle).log
        }
    }
}

/// `ngx_current_msec`.
pub fn current_msec() -> ngx_msec_t {
    // SAFETY: a plain read of nginx's clock, updated by the event loop on this thread.
    unsafe { ngx_current_msec }
}

/// Sets the request of a connection's log context, as ngx_http_set_log_request does.
///
/// # Safety
/// `log` must be an http connection's log whose data is an ngx_http_log_ctx_t.
pub unsafe fn set_log_request(log: *mut ngx_log_t, r: *mut ngx_http_request_t) {
    // SAFETY: see above.
    unsafe {
        let ctx = (*log).data as *mut ngx_http_log_ctx_t;
        if !ctx.is_null() {
            (*ctx).current_request = r;
        }
    }
}

/// Compiles a string with variables into a complex value in the
/// configuration pool (the string must live as long as the configuration).
///
/// # Safety
/// `cf` must be the live configuration being parsed.
pub unsafe fn compile_complex(cf: *mut ngx_conf_t, value: &mut ngx_str_t) -> Option<*mut ngx_http_complex_value_t> {
    // SAFETY: cf is live; the compile context is filled as nginx expects.
    unsafe {
        let cv = ngx_pcalloc((*cf).pool, mem::size_of::<ngx_http_complex_value_t>()) as *mut ngx_http_complex_value_t;
        if cv.is_null() {
            return None;
        }
        let mut ccv: ngx_http_compile_complex_value_t = mem::zeroed();
        ccv.cf = cf;
        ccv.value = value;
        ccv.complex_value = cv;
        (ngx_http_compile_complex_value(&mut ccv) == OK).then_some(cv)
    }
}

/// Parses the arguments of a `*_next_upstream` directive against the
/// keywords it accepts; `off` alone is 0.
///
/// # Safety
/// `cf` must be the live configuration being parsed.
pub unsafe fn next_upstream_bits(cf: *mut ngx_conf_t, keywords: &[(&str, u32)]) -> Result<ngx_uint_t, *mut c_char> {
    // SAFETY: see above.
    unsafe {
        let args = conf_args(cf);
        let directive = String::from_utf8_lossy(bytes(&args[0])).into_owned();
        let mut bits: ngx_uint_t = 0;
        for arg in &args[1..] {
            let a = bytes(arg);
            if a == b"off" && args.len() == 2 {
                return Ok(0);
            }
            match keywords.iter().find(|(k, _)| k.as_bytes() == a) {
                Some(&(_, bit)) => bits |= bit as ngx_uint_t,
                None => {
                    let text = String::from_utf8_lossy(a);
                    return Err(conf_error(
                        cf,
                        format_args!("invalid value \"{text}\" in \"{directive}\" directive"),
                    ));
                }
            }
        }
        Ok(bits)
    }
}

/// A location whose content handler a `*_pass` directive set, checked again
/// once the whole configuration is read (a later directive of another
/// module, such as `proxy_pass`, would silently replace it).
pub struct Claim {
    clcf: *mut ngx_http_core_loc_conf_t,
    handler: ngx_http_handler_pt,
    directive: &'static str,
    file: String,
    line: usize,
}

/// A handler's address, for comparing handlers.
fn handler_addr(h: ngx_http_handler_pt) -> usize {
    h.map_or(0, |f| f as usize)
}

impl Claim {
    pub fn file(&self) -> &str {
        &self.file
    }
    pub fn line(&self) -> usize {
        self.line
    }
}

/// Where the directive being parsed is: (file, line).
///
/// # Safety
/// `cf` must be the live configuration being parsed.
pub unsafe fn conf_position(cf: *mut ngx_conf_t) -> (String, usize) {
    // SAFETY: during parsing cf->conf_file is the file being read.
    unsafe {
        let file = &*(*cf).conf_file;
        (String::from_utf8_lossy(bytes(&file.file.name)).into_owned(), file.line)
    }
}

/// Makes `handler` the content handler of the location being parsed, for
/// `directive`. A location has one content handler: another one set before
/// (`sqldb_pass` and `cache_pass` together, or `proxy_pass` ...) is an error.
///
/// # Safety
/// `cf` must be the live configuration being parsed, inside a location.
pub unsafe fn claim_content_handler(
    cf: *mut ngx_conf_t,
    directive: &'static str,
    handler: ngx_http_handler_pt,
    known: &[(ngx_http_handler_pt, &str)],
) -> Result<Claim, *mut c_char> {
    // SAFETY: see above.
    unsafe {
        let clcf: *mut ngx_http_core_loc_conf_t = http_conf_get(cf, ptr::addr_of!(ngx_http_core_module), ConfSlot::Loc);
        if let Some(other) = (*clcf).handler {
            if handler_addr(Some(other)) != handler_addr(handler) {
                let name = known
                    .iter()
                    .find(|(h, _)| handler_addr(*h) == handler_addr(Some(other)))
                    .map_or("another content handler (such as \"proxy_pass\")", |(_, n)| n);
                return Err(conf_error(
                    cf,
                    format_args!("\"{directive}\" cannot be in the same location as {name}"),
                ));
            }
        }
        (*clcf).handler = handler;
        if bytes(&(*clcf).name).last() == Some(&b'/') {
            (*clcf).set_auto_redirect(1);
        }
        let (file, line) = conf_position(cf);
        Ok(Claim {
            clcf,
            handler,
            directive,
            file,
            line,
        })
    }
}

/// After the configuration is read: every claimed location still has the
/// handler its directive set.
///
/// # Safety
/// The claims must belong to the configuration `cf` finishes.
pub unsafe fn check_claims(cf: *mut ngx_conf_t, claims: &[Claim]) -> bool {
    for c in claims {
        // SAFETY: the location configurations live as long as the configuration.
        if handler_addr(unsafe { (*c.clcf).handler }) != handler_addr(c.handler) {
            log!(
                NGX_LOG_EMERG,
                // SAFETY: cf is live.
                unsafe { (*cf).log },
                "another directive of the location replaced the content handler that \"{}\" set in {}:{}",
                c.directive,
                c.file,
                c.line
            );
            return false;
        }
    }
    true
}
