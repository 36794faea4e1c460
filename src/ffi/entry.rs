//! Entry points: the functions nginx calls. Each is declared with one of
//! these macros, which write the `extern "C"` function: nginx's raw
//! pointers become the safe types of this module once, here, and the body
//! runs inside `guard` (no panic crosses into nginx). What a body sees is
//! a `&mut Req`, a `Conf`, a typed configuration object.

/// A request handler: content and phase handlers, write and body handlers,
/// the upstream's callbacks. nginx calls each with a live request.
///
/// ```ignore
/// request_handler! {
///     /// Docs.
///     pub(crate) fn content_handler(r) -> ngx_int_t = ("entry name", HTTP_INTERNAL_SERVER_ERROR) {
///         start(r)
///     }
/// }
/// ```
///
/// Without a result: `fn name(r) = ("entry") { ... }`, and with what is
/// done to the request after a panic: `= ("entry", panic: |r| end(r)) {...}`.
/// `, posted` after the entry runs nginx's posted subrequests after it.
/// An upstream's `finalize_request`, which nginx calls with a status too:
/// `fn name(r, rc) = ("entry") {...}`.
#[macro_export]
macro_rules! request_handler {
    ($(#[$m:meta])* $vis:vis fn $name:ident($r:ident) -> $ret:ty = ($entry:expr, $on_panic:expr) $body:block) => {
        $(#[$m])*
        $vis extern "C" fn $name($r: *mut $crate::ffi::ngx_http_request_t) -> $ret {
            // SAFETY: nginx calls a request handler with a live request.
            let $r = unsafe { $crate::ffi::Req::from_raw($r) };
            $crate::ffi::guard($r.log(), $entry, $on_panic, || $body)
        }
    };
    ($(#[$m:meta])* $vis:vis fn $name:ident($r:ident) = ($entry:expr, panic: $on_panic:expr, posted) $body:block) => {
        $(#[$m])*
        $vis extern "C" fn $name($r: *mut $crate::ffi::ngx_http_request_t) {
            // SAFETY: nginx calls a request handler with a live request.
            let $r = unsafe { $crate::ffi::Req::from_raw($r) };
            let posted = $r.posted();
            $crate::request_handler!(@run $r, $entry, $on_panic, $body);
            posted.run();
        }
    };
    ($(#[$m:meta])* $vis:vis fn $name:ident($r:ident) = ($entry:expr, panic: $on_panic:expr) $body:block) => {
        $(#[$m])*
        $vis extern "C" fn $name($r: *mut $crate::ffi::ngx_http_request_t) {
            // SAFETY: nginx calls a request handler with a live request.
            let $r = unsafe { $crate::ffi::Req::from_raw($r) };
            $crate::request_handler!(@run $r, $entry, $on_panic, $body);
        }
    };
    ($(#[$m:meta])* $vis:vis fn $name:ident($r:ident, $rc:ident) = ($entry:expr) $body:block) => {
        $(#[$m])*
        $vis extern "C" fn $name($r: *mut $crate::ffi::ngx_http_request_t, $rc: $crate::ffi::ngx_int_t) {
            // SAFETY: nginx calls a request handler with a live request.
            let $r = unsafe { $crate::ffi::Req::from_raw($r) };
            $crate::request_handler!(@run $r, $entry, |_: &mut $crate::ffi::Req| {}, $body);
        }
    };
    ($(#[$m:meta])* $vis:vis fn $name:ident($r:ident) = ($entry:expr) $body:block) => {
        $(#[$m])*
        $vis extern "C" fn $name($r: *mut $crate::ffi::ngx_http_request_t) {
            // SAFETY: nginx calls a request handler with a live request.
            let $r = unsafe { $crate::ffi::Req::from_raw($r) };
            $crate::request_handler!(@run $r, $entry, |_: &mut $crate::ffi::Req| {}, $body);
        }
    };
    (@run $r:ident, $entry:expr, $on_panic:expr, $body:block) => {
        // (Outside the unsafe block below: the body's own unsafe
        // operations need their own blocks.)
        let held = |$r: &mut $crate::ffi::Req| {
            let ok = $crate::ffi::guard($r.log(), $entry, false, || {
                // (A closure: a `return` in the body ends the body.)
                $crate::ffi::entry::run(|| $body);
                true
            });
            if !ok {
                ($on_panic)($r);
            }
        };
        // SAFETY: a live request (see the callers); `$r` is not used after
        // the hold (the request may be gone by then).
        unsafe { $crate::ffi::Req::hold($r.as_ptr(), held) }
    };
}

/// A directive's handler: `body` takes the configuration being read and the
/// directive's configuration object (`&mut T`, where the directive's
/// `conf` offset puts it).
///
/// ```ignore
/// directive_handler! {
///     pub(crate) fn cmd_cache_auth = "cmd_cache_auth", |cf: Conf, lcf: &mut CacheLocConf| { ... }
/// }
/// ```
#[macro_export]
macro_rules! directive_handler {
    ($(#[$m:meta])* $vis:vis fn $name:ident $(<$($g:ident : $b:path),*>)? = $entry:expr, $body:expr) => {
        $(#[$m])*
        $vis extern "C" fn $name $(<$($g: $b),*>)? (
            cf: *mut $crate::ffi::ngx_conf_t,
            _cmd: *mut $crate::ffi::ngx_command_t,
            conf: *mut ::std::ffi::c_void,
        ) -> *mut ::std::ffi::c_char {
            // The body is evaluated outside the unsafe block: its own unsafe
            // operations need their own blocks.
            let entry: &str = $entry;
            let body = $body;
            // SAFETY: nginx calls a directive's handler with the
            // configuration being read and the directive's configuration
            // object, of the type its command's offset names (the body's).
            unsafe { $crate::ffi::conf::directive(cf, conf, entry, body) }
        }
    };
}

/// A module's create-configuration callback: `value` makes the object.
#[macro_export]
macro_rules! create_conf_handler {
    ($(#[$m:meta])* $vis:vis fn $name:ident $(<$($g:ident : $b:path),*>)? = $entry:expr, $value:expr) => {
        $(#[$m])*
        $vis extern "C" fn $name $(<$($g: $b),*>)? (cf: *mut $crate::ffi::ngx_conf_t) -> *mut ::std::ffi::c_void {
            // The body is evaluated outside the unsafe block: its own unsafe
            // operations need their own blocks.
            let entry: &str = $entry;
            let value = $value;
            // SAFETY: nginx calls it with the configuration being read.
            unsafe { $crate::ffi::conf::create_conf(cf, entry, value) }
        }
    };
}

/// A module's merge callback: `merge` takes the configuration, the outer
/// level's object and this level's.
#[macro_export]
macro_rules! merge_conf_handler {
    ($(#[$m:meta])* $vis:vis fn $name:ident $(<$($g:ident : $b:path),*>)? = $entry:expr, $merge:expr) => {
        $(#[$m])*
        $vis extern "C" fn $name $(<$($g: $b),*>)? (
            cf: *mut $crate::ffi::ngx_conf_t,
            parent: *mut ::std::ffi::c_void,
            child: *mut ::std::ffi::c_void,
        ) -> *mut ::std::ffi::c_char {
            // The body is evaluated outside the unsafe block: its own unsafe
            // operations need their own blocks.
            let entry: &str = $entry;
            let merge = $merge;
            // SAFETY: nginx calls it with the configuration being read and
            // two objects the module's create callback made.
            unsafe { $crate::ffi::conf::merge_conf(cf, parent, child, entry, merge) }
        }
    };
}

/// A configuration step (pre- and postconfiguration): `body` takes the
/// configuration.
#[macro_export]
macro_rules! conf_step_handler {
    ($(#[$m:meta])* $vis:vis fn $name:ident $(<$($g:ident : $b:path),*>)? = $entry:expr, $body:expr) => {
        $(#[$m])*
        $vis extern "C" fn $name $(<$($g: $b),*>)? (cf: *mut $crate::ffi::ngx_conf_t) -> $crate::ffi::ngx_int_t {
            // The body is evaluated outside the unsafe block: its own unsafe
            // operations need their own blocks.
            let entry: &str = $entry;
            let body = $body;
            // SAFETY: nginx calls it with the configuration being read.
            unsafe { $crate::ffi::conf::conf_step(cf, entry, body) }
        }
    };
}

/// A process or module callback nginx calls with its cycle
/// (`init_module`, `init_process`): `body` takes the cycle and its log.
#[macro_export]
macro_rules! cycle_handler {
    ($(#[$m:meta])* $vis:vis fn $name:ident($cycle:ident, $log:ident) = $entry:expr, $body:block) => {
        $(#[$m])*
        $vis extern "C" fn $name($cycle: *mut $crate::ffi::ngx_cycle_t) -> $crate::ffi::ngx_int_t {
            // SAFETY: nginx calls it with the cycle being initialised or
            // run, whose log is set up.
            let ($cycle, $log) = unsafe { (&*$cycle, $crate::ffi::Log::from_raw((*$cycle).log)) };
            $crate::ffi::guard($log, $entry, $crate::ffi::OK, || $body)
        }
    };
}

/// A balancer's per-request init nginx calls: `fn name(r, us) = "entry" {...}`
/// with the request and the upstream block.
#[macro_export]
macro_rules! peer_init_handler {
    ($(#[$m:meta])* $vis:vis fn $name:ident($r:ident, $us:ident) = $entry:expr, $body:block) => {
        $(#[$m])*
        $vis extern "C" fn $name(
            $r: *mut $crate::ffi::ngx_http_request_t,
            $us: *mut $crate::ffi::ngx_http_upstream_srv_conf_t,
        ) -> $crate::ffi::ngx_int_t {
            // SAFETY: nginx calls a block's peer init with a live request
            // that has an upstream, and the block.
            let ($r, $us) = unsafe { ($crate::ffi::Req::from_raw($r), &mut *$us) };
            $crate::ffi::guard($r.log(), $entry, $crate::ffi::ERROR, || $body)
        }
    };
}

/// An upstream block's init (`init_upstream`), run at the end of the http
/// block: `body` takes the configuration and the block.
#[macro_export]
macro_rules! init_upstream_handler {
    ($(#[$m:meta])* $vis:vis fn $name:ident $(<$($g:ident : $b:path),*>)? = $entry:expr, $body:expr) => {
        $(#[$m])*
        $vis extern "C" fn $name $(<$($g: $b),*>)? (
            cf: *mut $crate::ffi::ngx_conf_t,
            us: *mut $crate::ffi::ngx_http_upstream_srv_conf_t,
        ) -> $crate::ffi::ngx_int_t {
            let entry: &str = $entry;
            // The body is evaluated outside the unsafe block.
            let body: fn($crate::ffi::Conf, &mut $crate::ffi::ngx_http_upstream_srv_conf_t) -> Result<(), $crate::ffi::conf::ConfError> = $body;
            // SAFETY: nginx calls it with the configuration being
            // initialized and one of its blocks.
            unsafe { $crate::ffi::conf::init_upstream(cf, us, entry, body) }
        }
    };
}

/// An event's handler (a timer, a posted event, a socket of the module's):
/// `ev` is the live Event, the body runs inside the panic guard (the
/// cycle's log).
#[macro_export]
macro_rules! event_handler {
    ($(#[$m:meta])* $vis:vis fn $name:ident $(<$($g:ident : $b:path),*>)? ($ev:ident) = $entry:expr, $body:block) => {
        $(#[$m])*
        $vis extern "C" fn $name $(<$($g: $b),*>)? ($ev: *mut $crate::ffi::ngx_event_t) {
            // SAFETY: nginx calls an event's handler with the live event.
            let Some($ev) = (unsafe { $crate::ffi::Event::from_raw($ev) }) else {
                return;
            };
            $crate::ffi::guard($crate::ffi::Log::cycle(), $entry, (), || $crate::ffi::entry::run(|| $body))
        }
    };
}

/// A request's own event (its timer: Req::new_timer), whose data is the
/// request, or (`via connection`) a connection whose data is the request.
/// The request's log is made current, the body runs as a request
/// handler's (`panic:` what is done to the request after a panic), and
/// nginx's posted subrequests run after it.
#[macro_export]
macro_rules! request_event_handler {
    ($(#[$m:meta])* $vis:vis fn $name:ident($r:ident, $ev:ident) = ($entry:expr, panic: $on_panic:expr $(, via $via:ident)?) $body:block) => {
        $(#[$m])*
        $vis extern "C" fn $name(ev: *mut $crate::ffi::ngx_event_t) {
            // SAFETY: nginx calls an event's handler with the live event.
            let Some($ev) = (unsafe { $crate::ffi::Event::from_raw(ev) }) else {
                return;
            };
            let data: *mut ::std::ffi::c_void = $crate::request_event_handler!(@data $ev $(, $via)?);
            if data.is_null() {
                // (A request's timer whose request is gone: Timer.)
                return;
            }
            // SAFETY: the event is the request's own (see above): its data
            // is the live request.
            let $r = unsafe { $crate::ffi::Req::from_raw(data.cast()) };
            $r.set_log_request();
            // Taken now: the body may finalize the request, which frees it.
            let posted = $r.posted();
            $crate::request_handler!(@run $r, $entry, $on_panic, $body);
            posted.run();
        }
    };
    (@data $ev:ident) => { $ev.data() };
    (@data $ev:ident, connection) => {
        // SAFETY: the event is a connection's (see above).
        unsafe { $ev.connection_data() }
    };
}

/// A cleanup of a request's (Req::add_request_cleanup): nginx calls it
/// with the request, live while its cleanups run.
#[macro_export]
macro_rules! request_cleanup_handler {
    ($(#[$m:meta])* $vis:vis fn $name:ident($r:ident) = $entry:expr, $body:block) => {
        $(#[$m])*
        $vis extern "C" fn $name(data: *mut ::std::ffi::c_void) {
            // SAFETY: the data is the request the cleanup was added for
            // (Req::add_request_cleanup), live while its cleanups run.
            let $r = unsafe { $crate::ffi::Req::from_raw(data.cast()) };
            $crate::ffi::guard($r.log(), $entry, (), || $crate::ffi::entry::run(|| $body))
        }
    };
}

/// A variable's getter: `fn name(r, v, data)`, with the request, the
/// value to fill and the variable's data.
#[macro_export]
macro_rules! variable_handler {
    ($(#[$m:meta])* $vis:vis fn $name:ident($r:ident, $v:ident, $data:ident) = $entry:expr, $body:block) => {
        $(#[$m])*
        $vis extern "C" fn $name(
            r: *mut $crate::ffi::ngx_http_request_t,
            v: *mut $crate::ffi::ngx_variable_value_t,
            $data: usize,
        ) -> $crate::ffi::ngx_int_t {
            // SAFETY: nginx calls a variable's getter with a live request
            // and the value to fill.
            let ($r, Some($v)) = (unsafe { ($crate::ffi::Req::from_raw(r), v.as_mut()) }) else {
                return $crate::ffi::ERROR;
            };
            $crate::ffi::guard($r.log(), $entry, $crate::ffi::ERROR, || $body)
        }
    };
}

/// The end of a TLS handshake nginx started on a connection of the
/// module's own (`ngx_ssl_handshake`): `data` is the connection's data.
#[macro_export]
macro_rules! handshake_handler {
    ($(#[$m:meta])* $vis:vis fn $name:ident $(<$($g:ident : $b:path),*>)? ($data:ident) = $entry:expr, $body:block) => {
        $(#[$m])*
        $vis extern "C" fn $name $(<$($g: $b),*>)? (c: *mut $crate::ffi::ngx_connection_t) {
            // SAFETY: nginx passes the connection whose handshake ended.
            let Some($data) = (unsafe { $crate::ffi::Socket::data_of_raw(c) }) else {
                return;
            };
            $crate::ffi::guard($crate::ffi::Log::cycle(), $entry, (), || $crate::ffi::entry::run(|| $body))
        }
    };
}

/// An upstream's input filter init, which nginx calls with the data
/// Req::set_input_filter gave it: the request.
#[macro_export]
macro_rules! input_filter_init_handler {
    ($(#[$m:meta])* $vis:vis fn $name:ident($r:ident) = $entry:expr, $body:block) => {
        $(#[$m])*
        $vis extern "C" fn $name(data: *mut ::std::ffi::c_void) -> $crate::ffi::ngx_int_t {
            // (Outside the unsafe block below: the body's own unsafe
            // operations need their own blocks.)
            let held = |$r: &mut $crate::ffi::Req| $crate::ffi::guard($r.log(), $entry, $crate::ffi::ERROR, || $body);
            // SAFETY: the data is the live request (Req::set_input_filter),
            // lent to the body only.
            unsafe { $crate::ffi::Req::hold(data.cast(), held) }
        }
    };
}

/// An upstream's input filter, which nginx calls with the request
/// (Req::set_input_filter) and the count of bytes it read.
#[macro_export]
macro_rules! input_filter_handler {
    ($(#[$m:meta])* $vis:vis fn $name:ident($r:ident, $bytes:ident) = $entry:expr, $body:block) => {
        $(#[$m])*
        $vis extern "C" fn $name(data: *mut ::std::ffi::c_void, $bytes: isize) -> $crate::ffi::ngx_int_t {
            // (Outside the unsafe block below: the body's own unsafe
            // operations need their own blocks.)
            let held = |$r: &mut $crate::ffi::Req| $crate::ffi::guard($r.log(), $entry, $crate::ffi::ERROR, || $body);
            // SAFETY: the data is the live request (Req::set_input_filter),
            // lent to the body only.
            unsafe { $crate::ffi::Req::hold(data.cast(), held) }
        }
    };
}

/// Runs an entry point's body (a closure, so that its `return` ends it).
pub fn run(body: impl FnOnce()) {
    body()
}
