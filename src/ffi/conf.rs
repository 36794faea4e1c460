//! The configuration being read: a directive's arguments, errors that name
//! the file and line, module configurations, compiled values with
//! variables, and the content handler of a location.

use std::ffi::{c_char, c_void};
use std::fmt::{self, Write};
use std::mem;
use std::ptr::NonNull;

use ngx::http::{
    HttpModuleConfExt, HttpModuleLocationConf, HttpModuleMainConf, HttpModuleServerConf, NgxHttpCoreModule,
};

use super::*;

mod blocks;
pub use blocks::*;

/// The configuration nginx is reading (during a directive, a merge or a
/// post-configuration step).
#[derive(Debug, Clone, Copy)]
pub struct Conf<'a>(NonNull<ngx_conf_t>, std::marker::PhantomData<&'a ngx_conf_t>);

/// A value with variables, compiled into configuration memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComplexValue(NonNull<ngx_http_complex_value_t>);

impl ComplexValue {
    /// # Safety
    /// `p`, when not null, must be a value compiled into configuration memory.
    pub unsafe fn from_raw(p: *mut ngx_http_complex_value_t) -> Option<ComplexValue> {
        NonNull::new(p).map(ComplexValue)
    }

    pub fn as_ptr(self) -> *mut ngx_http_complex_value_t {
        self.0.as_ptr()
    }

    /// The text it was compiled from, as the configuration wrote it.
    pub fn source(self) -> String {
        // SAFETY: compiled into configuration memory, which outlives every
        // request; `value` is the source text nginx keeps beside the code.
        let v = unsafe { self.0.as_ref() }.value;
        if v.data.is_null() {
            return String::new();
        }
        // SAFETY: `data` points at `len` bytes of configuration memory.
        String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(v.data, v.len) }).into_owned()
    }

    /// The value is a constant (it has no variables).
    pub fn is_constant(self) -> bool {
        // SAFETY: compiled into configuration memory, which outlives every request.
        unsafe { self.0.as_ref() }.lengths.is_null()
    }

    /// The value's bytes, when it is a constant.
    pub fn constant(self) -> Option<&'static [u8]> {
        // SAFETY: as above; a constant's value is its text, in the same memory.
        let v = unsafe { self.0.as_ref() };
        v.lengths.is_null().then(|| v.value.as_bytes())
    }
}

thread_local! {
    /// The addresses of the configuration objects lent now (nginx reads
    /// its configuration on one thread).
    static LOANS: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A configuration object lent as a reference, until the loan is dropped
/// (by a panic too).
struct Loan(usize);

impl Loan {
    fn of<T>(p: NonNull<T>) -> Loan {
        let at = p.as_ptr() as usize;
        LOANS.with_borrow_mut(|l| {
            assert!(!l.contains(&at), "a configuration object lent twice at once");
            l.push(at)
        });
        Loan(at)
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        LOANS.with_borrow_mut(|l| l.retain(|&at| at != self.0));
    }
}

/// `f` with `*p`, lent as the only reference to it while `f` runs: while
/// nginx reads the configuration, every reference the module makes to a
/// configuration object (a module's, a location's, an upstream block, a
/// variable) is such a loan, so a second loan of the same object, which
/// would alias the first, panics instead (an error of the directive).
///
/// # Safety
/// `p` must be a live `T` of the configuration being read, to which the
/// module holds no reference but loans.
unsafe fn lend<T, R>(p: NonNull<T>, f: impl FnOnce(&mut T) -> R) -> R {
    let _loan = Loan::of(p);
    // SAFETY: see above; the loan keeps it the only reference until f returns.
    f(unsafe { &mut *p.as_ptr() })
}

impl<'a> Conf<'a> {
    /// # Safety
    /// `cf` must be the live configuration being read, for `'a` (the
    /// handle, a copy, borrows it: it cannot be kept past the call nginx
    /// made).
    pub unsafe fn from_raw(cf: *mut ngx_conf_t) -> Conf<'a> {
        Conf(
            NonNull::new(cf).expect("nginx passes a configuration"),
            std::marker::PhantomData,
        )
    }

    pub fn raw_ptr(&self) -> *mut ngx_conf_t {
        self.0.as_ptr()
    }

    pub fn raw(&self) -> &ngx_conf_t {
        // SAFETY: live during the call nginx made (from_raw).
        unsafe { self.0.as_ref() }
    }

    pub fn log(&self) -> Log {
        // SAFETY: the configuration's log outlives the reading of it.
        unsafe { Log::from_raw(self.raw().log) }
    }

    pub fn pool(&self) -> Pool {
        // SAFETY: the configuration's pool lives as long as the configuration.
        unsafe { Pool::from_raw(self.raw().pool) }.expect("a configuration has a pool")
    }

    /// The directive's arguments, its name first.
    pub fn args(&self) -> Vec<&[u8]> {
        // SAFETY: during a directive handler cf->args is an array of
        // ngx_str_t in configuration memory.
        let args = unsafe { (*self.raw().args).as_slice::<ngx_str_t>() };
        args.iter().map(|a| a.as_bytes()).collect()
    }

    /// The directive's name (for messages).
    pub fn directive(&self) -> String {
        self.args()
            .first()
            .map_or_else(String::new, |a| String::from_utf8_lossy(a).into_owned())
    }

    /// The file and line of the directive being read.
    pub fn position(&self) -> Position {
        // SAFETY: during reading cf->conf_file is the file being read.
        let file = unsafe { &*self.raw().conf_file };
        Position {
            file: String::from_utf8_lossy(file.file.name.as_bytes()).into_owned(),
            line: file.line,
        }
    }

    /// Reports a configuration error (nginx appends " in FILE:LINE") and
    /// gives the directive's error result.
    pub fn error(&self, args: fmt::Arguments<'_>) -> *mut c_char {
        let mut line = String::new();
        let _ = line.write_fmt(args);
        // SAFETY: "%*s" reads exactly line.len() bytes from it; cf is live.
        unsafe {
            ngx_conf_log_error(
                NGX_LOG_EMERG as ngx_uint_t,
                self.0.as_ptr(),
                0,
                c"%*s".as_ptr(),
                line.len(),
                line.as_ptr(),
            )
        };
        CONF_ERROR
    }

    /// Adds a handler to an http phase (`NGX_HTTP_*_PHASE`).
    pub fn add_phase_handler(&self, phase: u32, handler: ngx_http_handler_pt) -> Result<(), ConfError> {
        self.with_main_conf::<NgxHttpCoreModule, _>(|cmcf| {
            let phase = &mut cmcf.phases[phase as usize];
            // SAFETY: the phase's handlers array, of ngx_http_handler_pt, in
            // the configuration being read.
            let h = unsafe { (ngx_array_push(&mut phase.handlers) as *mut ngx_http_handler_pt).as_mut() }
                .ok_or(ConfError::Logged)?;
            *h = handler;
            Ok(())
        })
    }

    /// `f` with the main configuration of module `M` (a loan, above).
    pub fn with_main_conf<M: HttpModuleMainConf, R>(&self, f: impl FnOnce(&mut M::MainConf) -> R) -> R {
        // SAFETY: cf is live and inside the http block, whose context holds
        // every http module's main configuration.
        let p = unsafe { self.raw().http_main_conf_unchecked::<M::MainConf>(M::module()) };
        // SAFETY: an object of the configuration being read (see lend).
        unsafe { lend(p.expect("every http module has a main configuration"), f) }
    }

    /// `f` with the server configuration of module `M` at the level being
    /// read (a loan, above).
    pub fn with_srv_conf<M: HttpModuleServerConf, R>(&self, f: impl FnOnce(&mut M::ServerConf) -> R) -> R {
        // SAFETY: as for with_main_conf.
        let p = unsafe { self.raw().http_server_conf_unchecked::<M::ServerConf>(M::module()) };
        // SAFETY: as for with_main_conf.
        unsafe { lend(p.expect("every http module has a server configuration"), f) }
    }

    /// `f` with the location configuration of module `M` at the level being
    /// read (a loan, above).
    pub fn with_loc_conf<M: HttpModuleLocationConf, R>(&self, f: impl FnOnce(&mut M::LocationConf) -> R) -> R {
        // SAFETY: as for with_main_conf.
        let p = unsafe { self.raw().http_location_conf_unchecked::<M::LocationConf>(M::module()) };
        // SAFETY: as for with_main_conf.
        unsafe { lend(p.expect("every http module has a location configuration"), f) }
    }

    /// The location being read is nginx's own, unnamed one of an `if` block
    /// or a `limit_except`.
    pub fn location_unnamed(&self) -> bool {
        self.with_loc_conf::<NgxHttpCoreModule, _>(|clcf| clcf.noname() != 0)
    }

    /// Compiles a string with variables ($arg_id, ...) into configuration memory.
    pub fn compile(&self, value: &[u8]) -> Option<ComplexValue> {
        let pool = self.pool();
        let mut text = pool.str(value)?;
        let cv = pool.calloc::<ngx_http_complex_value_t>()?;
        // SAFETY: an all-zero compile context is its C initial state; the
        // text and the value are in configuration memory, which outlives
        // them; cf is live.
        unsafe {
            let mut ccv: ngx_http_compile_complex_value_t = mem::zeroed();
            ccv.cf = self.0.as_ptr();
            ccv.value = &mut text;
            ccv.complex_value = cv.as_ptr();
            (ngx_http_compile_complex_value(&mut ccv) == OK).then_some(ComplexValue(cv))
        }
    }

    /// A file name relative to the configuration's prefix made whole
    /// (as nginx does for `ssl_certificate`).
    pub fn full_name(&self, name: &[u8]) -> Option<String> {
        let mut s = self.pool().str(name)?;
        // SAFETY: cf->cycle is the cycle being configured; the name is in
        // configuration memory, and nginx puts the whole name in its pool.
        let rc = unsafe { ngx_conf_full_name(self.raw().cycle, &mut s, 1) };
        (rc == OK).then(|| String::from_utf8_lossy(s.as_bytes()).into_owned())
    }

    /// The value has variables.
    pub fn has_variables(&self, value: &[u8]) -> bool {
        let mut s = ngx_str_t {
            len: value.len(),
            data: value.as_ptr() as *mut u8,
        };
        // SAFETY: nginx only reads the bytes, which are live for the call.
        unsafe { ngx_http_script_variables_count(&mut s) > 0 }
    }

    /// Declares a variable (or finds it): `f` with the variable (a loan,
    /// above), and its index.
    pub fn add_variable<R>(
        &self,
        name: &[u8],
        flags: u32,
        f: impl FnOnce(&mut ngx_http_variable_t) -> R,
    ) -> Option<(R, ngx_int_t)> {
        let mut n = self.pool().str(name)?;
        // SAFETY: cf is live; the name is in configuration memory, which
        // outlives the variable; nginx returns a variable that lives as long.
        let (v, index) = unsafe {
            let v = NonNull::new(ngx_http_add_variable(self.0.as_ptr(), &mut n, flags as ngx_uint_t))?;
            (v, ngx_http_get_variable_index(self.0.as_ptr(), &mut n))
        };
        // SAFETY: an object of the configuration being read (see lend).
        (index != ERROR).then(|| (unsafe { lend(v, f) }, index))
    }

    /// The index of a variable (declared now or later in the configuration).
    pub fn variable_index(&self, name: &[u8]) -> Option<ngx_int_t> {
        let mut n = self.pool().str(name)?;
        // SAFETY: cf is live; the name is in configuration memory.
        let index = unsafe { ngx_http_get_variable_index(self.0.as_ptr(), &mut n) };
        (index != ERROR).then_some(index)
    }

    /// True when a variable of that name is declared (by `set`, ...).
    pub fn variable_declared(&self, name: &[u8]) -> bool {
        self.with_main_conf::<NgxHttpCoreModule, _>(|cmcf| {
            // SAFETY: during the configuration the core module keeps its
            // variables' keys, an array of ngx_hash_key_t.
            unsafe { cmcf.variables_keys.as_ref() }.is_some_and(|keys| {
                // SAFETY: the array's elements are ngx_hash_key_t (above).
                unsafe { keys.keys.as_slice::<ngx_hash_key_t>() }
                    .iter()
                    .any(|k| k.key.as_bytes() == name)
            })
        })
    }

    /// The prefix variable of nginx or a module (`arg_`, `http_`,
    /// `cookie_`, ...) a variable name falls under, if any: nginx gives such
    /// a variable the request's value in every location.
    pub fn prefix_variable(&self, name: &[u8]) -> Option<Vec<u8>> {
        let name = name.to_ascii_lowercase();
        self.with_main_conf::<NgxHttpCoreModule, _>(|cmcf| {
            // SAFETY: the core module's prefix variables, an array of
            // ngx_http_variable_t in configuration memory that modules fill
            // in their preconfiguration (before any directive is read).
            unsafe { cmcf.prefix_variables.as_slice::<ngx_http_variable_t>() }
                .iter()
                .map(|v| v.name.as_bytes())
                .find(|p| name.starts_with(p))
                .map(<[u8]>::to_vec)
        })
    }

    /// Every upstream block of the configuration.
    pub fn upstreams(&self) -> Vec<*mut ngx_http_upstream_srv_conf_t> {
        self.with_main_conf::<ngx::http::NgxHttpUpstreamModule, _>(|umcf| {
            // SAFETY: the upstream module's array of upstream
            // configurations, in configuration memory.
            unsafe { umcf.upstreams.as_slice::<*mut ngx_http_upstream_srv_conf_t>() }.to_vec()
        })
    }

    /// Adds the upstream a `*_pass host:port` or `*_pass name` refers to (as
    /// proxy_pass does), or finds the block of that name.
    pub fn upstream_add(&self, value: &[u8]) -> Option<NonNull<ngx_http_upstream_srv_conf_t>> {
        // SAFETY: an all-zero ngx_url_t is its initial state; the value is
        // copied into configuration memory; cf is live.
        unsafe {
            let mut url: ngx_url_t = mem::zeroed();
            url.url = self.pool().str(value)?;
            url.set_no_resolve(1);
            NonNull::new(ngx_http_upstream_add(self.0.as_ptr(), &mut url, 0))
        }
    }

    /// `ngx_parse_time` of a value (seconds when `sec`, else milliseconds).
    pub fn parse_time(&self, value: &[u8], sec: bool) -> Option<ngx_int_t> {
        let mut s = ngx_str_t {
            len: value.len(),
            data: value.as_ptr() as *mut u8,
        };
        // SAFETY: nginx only reads the bytes, which are live for the call.
        let t = unsafe { ngx_parse_time(&mut s, sec as ngx_uint_t) };
        (t != ERROR).then_some(t)
    }

    /// `ngx_parse_size` of a value (`512`, `4k`, `1m`).
    pub fn parse_size(&self, value: &[u8]) -> Option<usize> {
        let mut s = ngx_str_t {
            len: value.len(),
            data: value.as_ptr() as *mut u8,
        };
        // SAFETY: nginx only reads the bytes, which are live for the call.
        let n = unsafe { ngx_parse_size(&mut s) };
        usize::try_from(n).ok()
    }

    /// Parses the arguments of a `*_next_upstream` directive against the
    /// keywords it accepts; `off` alone is 0.
    pub fn next_upstream_bits(&self, keywords: &[(&str, u32)]) -> Result<ngx_uint_t, *mut c_char> {
        let args = self.args();
        let mut bits: ngx_uint_t = 0;
        for a in &args[1..] {
            // In any letter case, as nginx reads bitmasks.
            if a.eq_ignore_ascii_case(b"off") && args.len() == 2 {
                return Ok(0);
            }
            match keywords.iter().find(|(k, _)| k.as_bytes().eq_ignore_ascii_case(a)) {
                Some(&(_, bit)) => bits |= bit as ngx_uint_t,
                None => {
                    let (text, directive) = (String::from_utf8_lossy(a), self.directive());
                    return Err(self.error(format_args!("invalid value \"{text}\" in \"{directive}\" directive")));
                }
            }
        }
        Ok(bits)
    }

    /// Makes `handler` the content handler of the location being read, for
    /// `directive`. A location has one content handler: another one set
    /// before (`sqldb_pass` and `cache_pass` together, `proxy_pass` ...) is
    /// an error naming it when it is one of `known`.
    pub fn claim_content_handler(
        &self,
        directive: &'static str,
        handler: ngx_http_handler_pt,
        known: &[(ngx_http_handler_pt, &str)],
    ) -> Result<Claim, *mut c_char> {
        let clcf = self.with_loc_conf::<NgxHttpCoreModule, _>(|clcf| {
            if let Some(other) = clcf.handler {
                if handler_addr(Some(other)) != handler_addr(handler) {
                    return Err(known
                        .iter()
                        .find(|(h, _)| handler_addr(*h) == handler_addr(Some(other)))
                        .map_or("another content handler (such as \"proxy_pass\")", |(_, n)| n));
                }
            }
            clcf.handler = handler;
            if clcf.name.as_bytes().last() == Some(&b'/') {
                clcf.set_auto_redirect(1);
            }
            Ok(NonNull::from(clcf))
        });
        let clcf =
            clcf.map_err(|name| self.error(format_args!("\"{directive}\" cannot be in the same location as {name}")))?;
        let Position { file, line } = self.position();
        Ok(Claim {
            clcf,
            handler,
            directive,
            file,
            line,
        })
    }
}

/// A location whose content handler a `*_pass` directive set, checked again
/// once the whole configuration is read (a later directive of another
/// module, such as `proxy_pass`, would silently replace it).
pub struct Claim {
    clcf: NonNull<ngx_http_core_loc_conf_t>,
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

    /// The location still has the handler the directive set.
    pub fn holds(&self, conf: &Conf) -> bool {
        // SAFETY: the location's configuration lives as long as the
        // configuration; nothing else touches it while nginx runs this step.
        if handler_addr(unsafe { self.clcf.as_ref() }.handler) == handler_addr(self.handler) {
            return true;
        }
        crate::log!(
            NGX_LOG_EMERG,
            conf.log(),
            "another directive of the location replaced the content handler that \"{}\" set in {}:{}",
            self.directive,
            self.file,
            self.line
        );
        false
    }
}

/// Why a directive (or a configuration step) fails.
#[derive(Debug)]
pub enum ConfError {
    /// The message for `nginx -t` (nginx adds " in FILE:LINE").
    Invalid(String),
    /// A message found after the directive was read (when the levels are
    /// merged), for the directive at this position.
    At(String, Position),
    /// nginx already said why.
    Logged,
}

impl ConfError {
    /// Says it (unless nginx did) and gives a directive's error result.
    fn report(self, c: Conf) -> *mut c_char {
        match self {
            ConfError::Invalid(m) => c.error(format_args!("{m}")),
            ConfError::At(m, at) => {
                crate::log!(NGX_LOG_EMERG, c.log(), "{m} in {at}");
                CONF_ERROR
            }
            ConfError::Logged => CONF_ERROR,
        }
    }
}

impl From<String> for ConfError {
    fn from(m: String) -> Self {
        ConfError::Invalid(m)
    }
}

/// Where a directive is in the configuration ("FILE:LINE", as nginx says it).
#[derive(Debug, Clone)]
pub struct Position {
    pub file: String,
    pub line: usize,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// Runs a directive's body with the configuration being read and the
/// module's configuration object the directive writes.
///
/// # Safety
/// `cf` must be the live configuration being read, and `conf` the
/// directive's configuration object, a `T` (the slot its command names).
pub unsafe fn directive<T>(
    cf: *mut ngx_conf_t,
    conf: *mut std::ffi::c_void,
    entry: &str,
    body: impl FnOnce(Conf, &mut T) -> Result<(), ConfError>,
) -> *mut c_char {
    // SAFETY: see above.
    let c = unsafe { Conf::from_raw(cf) };
    guard(c.log(), entry, CONF_ERROR, || {
        let target = NonNull::new(conf.cast::<T>()).expect("nginx passes the directive's configuration");
        // SAFETY: a T of the configuration being read (see above).
        match unsafe { lend(target, |target| body(c, target)) } {
            Ok(()) => CONF_OK,
            Err(e) => e.report(c),
        }
    })
}

/// Makes a module's configuration object in the configuration's pool.
///
/// # Safety
/// `cf` must be the live configuration being read.
pub unsafe fn create_conf<T>(cf: *mut ngx_conf_t, entry: &str, value: impl FnOnce() -> T) -> *mut std::ffi::c_void {
    // SAFETY: see above.
    let c = unsafe { Conf::from_raw(cf) };
    guard(c.log(), entry, std::ptr::null_mut(), || {
        c.pool()
            .alloc(value())
            .map_or(std::ptr::null_mut(), |p| p.as_ptr().cast())
    })
}

/// Merges a level's configuration object with the one around it.
///
/// # Safety
/// `cf` must be the live configuration being read; `parent` and `child` two
/// `T` made by the module's create function.
pub unsafe fn merge_conf<T>(
    cf: *mut ngx_conf_t,
    parent: *mut std::ffi::c_void,
    child: *mut std::ffi::c_void,
    entry: &str,
    merge: impl FnOnce(Conf, &T, &mut T) -> Result<(), ConfError>,
) -> *mut c_char {
    // SAFETY: see above.
    let c = unsafe { Conf::from_raw(cf) };
    guard(c.log(), entry, CONF_ERROR, || {
        let parent = NonNull::new(parent.cast::<T>()).expect("nginx passes two configurations");
        let child = NonNull::new(child.cast::<T>()).expect("nginx passes two configurations");
        // SAFETY: two distinct T of the configuration being read (see above).
        let merged = unsafe { lend(parent, |prev| lend(child, |conf| merge(c, prev, conf))) };
        match merged {
            Ok(()) => CONF_OK,
            Err(e) => e.report(c),
        }
    })
}

/// Runs an upstream block's init (`init_upstream`) with the block.
///
/// # Safety
/// `cf` must be the live configuration being read, and `us` one of its
/// upstream blocks.
pub unsafe fn init_upstream(
    cf: *mut ngx_conf_t,
    us: *mut ngx_http_upstream_srv_conf_t,
    entry: &str,
    body: impl FnOnce(Conf, &mut ngx_http_upstream_srv_conf_t) -> Result<(), ConfError>,
) -> ngx_int_t {
    let Some(us) = NonNull::new(us) else {
        return ERROR;
    };
    // SAFETY: see above; the block is an object of the configuration.
    unsafe { conf_step(cf, entry, |c| lend(us, |us| body(c, us))) }
}

/// Runs a step after the http block is read (pre- or postconfiguration).
///
/// # Safety
/// `cf` must be the live configuration being read.
pub unsafe fn conf_step(
    cf: *mut ngx_conf_t,
    entry: &str,
    body: impl FnOnce(Conf) -> Result<(), ConfError>,
) -> ngx_int_t {
    // SAFETY: see above.
    let c = unsafe { Conf::from_raw(cf) };
    guard(c.log(), entry, ERROR, || match body(c) {
        Ok(()) => OK,
        Err(ConfError::Invalid(m)) => {
            crate::log!(NGX_LOG_EMERG, c.log(), "{m}");
            ERROR
        }
        Err(ConfError::At(m, at)) => {
            crate::log!(NGX_LOG_EMERG, c.log(), "{m} in {at}");
            ERROR
        }
        Err(ConfError::Logged) => ERROR,
    })
}

/// A directive's `on` or `off` (in any letter case, as nginx reads them);
/// another value is an error naming the directive.
pub fn on_off(directive: &str, value: &[u8]) -> Result<bool, ConfError> {
    match value.to_ascii_lowercase().as_slice() {
        b"on" => Ok(true),
        b"off" => Ok(false),
        _ => Err(format!(
            "invalid value \"{}\" in \"{directive}\" directive, it must be \"on\" or \"off\"",
            String::from_utf8_lossy(value)
        )
        .into()),
    }
}

/// nginx's words for a directive given again where it may be given once.
pub fn duplicate(directive: &str) -> ConfError {
    format!("\"{directive}\" directive is duplicate").into()
}

/// A timeout directive: nginx's time syntax (`ngx_conf_set_msec_slot`), and
/// more than 0 (a zero timeout would fail every request at once).
pub(crate) extern "C" fn set_timeout_slot(
    cf: *mut ngx_conf_t,
    cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx passes the configuration being read, the command
    // (whose offset names an ngx_msec_t of `conf`) and the command's
    // configuration object.
    let rc = unsafe { ngx_conf_set_msec_slot(cf, cmd, conf) };
    if !rc.is_null() {
        return rc;
    }
    // SAFETY: as above; the field at the command's offset is the ngx_msec_t
    // just set.
    unsafe { directive(cf, field_of(conf, cmd), "set_timeout_slot", more_than_zero) }
}

/// A size directive: nginx's size syntax (`ngx_conf_set_size_slot`:
/// `65536`, `64k`, `64m`), and more than 0.
pub(crate) extern "C" fn set_size_slot(cf: *mut ngx_conf_t, cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: nginx passes the configuration being read, the command
    // (whose offset names a size_t of `conf`, NGX_CONF_UNSET_SIZE until
    // set) and the command's configuration object.
    let rc = unsafe { ngx_conf_set_size_slot(cf, cmd, conf) };
    if !rc.is_null() {
        return rc;
    }
    // SAFETY: as above; the field at the command's offset is the size
    // just set.
    unsafe { directive(cf, field_of(conf, cmd), "set_size_slot", more_than_zero) }
}

/// The field of `conf` at the command's offset.
///
/// # Safety
/// `cmd` is a live command whose offset lies within the object `conf`.
unsafe fn field_of(conf: *mut c_void, cmd: *mut ngx_command_t) -> *mut c_void {
    // SAFETY: see above.
    unsafe { (conf as *mut u8).add((*cmd).offset) as *mut c_void }
}

/// The check of the timeout and size directives (ngx_msec_t and size_t
/// are both the machine's word): the value is more than 0.
fn more_than_zero(c: Conf, value: &mut usize) -> Result<(), ConfError> {
    if *value == 0 {
        return Err(format!("\"{}\" must be more than 0", c.directive()).into());
    }
    Ok(())
}

/// The levels a directive may be written at, up to `location`.
pub const LOC_ANY: u32 = NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF;
/// Where a directive's handler finds its configuration: the location's.
pub const LOC: usize = NGX_HTTP_LOC_CONF_OFFSET;
/// The server's (an `upstream` block's, for the directives written there).
pub const SRV: usize = NGX_HTTP_SRV_CONF_OFFSET;

/// A command table as a module gives it to nginx (`ngx_module_t`'s
/// `commands`). nginx walks it up to the null command that ends it, which
/// must be there: a module's static is built at compile time, so a table
/// without it does not compile. nginx reads the table and never writes it
/// (the pointer is `*mut` by its C type only).
pub const fn commands(table: &'static [ngx_command_t]) -> *mut ngx_command_t {
    assert!(
        matches!(table.last(), Some(last) if last.name.len == 0 && last.set.is_none()),
        "a command table ends with ngx_command_t::empty()"
    );
    table.as_ptr().cast_mut()
}

/// A directive; `name` ends with NUL because nginx compares names with strcmp.
pub const fn command(
    name: &'static str,
    type_: u32,
    set: unsafe extern "C" fn(*mut ngx_conf_t, *mut ngx_command_t, *mut std::ffi::c_void) -> *mut std::ffi::c_char,
    conf: usize,
    offset: usize,
) -> ngx_command_t {
    ngx_command_t {
        name: ngx_str_t {
            len: name.len() - 1,
            data: name.as_ptr() as *mut u8,
        },
        type_: type_ as ngx_uint_t,
        set: Some(set),
        conf: conf as ngx_uint_t,
        offset: offset as ngx_uint_t,
        post: std::ptr::null_mut(),
    }
}
