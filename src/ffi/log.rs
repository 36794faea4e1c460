//! Writing to nginx's logs: `log!` for lines at a level, `debug!` for
//! `NGX_LOG_DEBUG_HTTP` traces (seen with `error_log ... debug` on an nginx
//! built `--with-debug`).

use std::fmt::{self, Write};

use super::*;

/// A fixed stack buffer that formats and truncates instead of allocating.
struct LineBuf {
    buf: [u8; 2048],
    len: usize,
}

impl Write for LineBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

fn format_line(args: fmt::Arguments<'_>) -> LineBuf {
    let mut line = LineBuf { buf: [0; 2048], len: 0 };
    let _ = line.write_fmt(args);
    line
}

/// One of nginx's logs (of a connection, a request, the cycle, a
/// configuration), which lives as long as what it logs for.
#[derive(Debug, Clone, Copy)]
pub struct Log(*mut ngx_log_t);

impl Log {
    /// # Safety
    /// `log` must be null or a log of nginx's that outlives every use of the copy.
    pub unsafe fn from_raw(log: *mut ngx_log_t) -> Log {
        Log(log)
    }

    /// The log of the running cycle (for what outlives a request).
    pub fn cycle() -> Log {
        // SAFETY: a plain read of nginx's global cycle pointer, set before
        // any module code runs; the cycle outlives every caller.
        Log(unsafe { ngx_cycle.as_ref().map_or(std::ptr::null_mut(), |c| c.log) })
    }

    pub fn as_ptr(self) -> *mut ngx_log_t {
        self.0
    }

    fn level(self) -> Option<usize> {
        // SAFETY: null or a live log (see from_raw).
        unsafe { self.0.as_ref() }.map(|l| l.log_level)
    }

    fn emit(self, level: u32, line: &LineBuf) {
        let b = &line.buf[..line.len];
        // SAFETY: "%*s" reads exactly b.len() bytes from b; the log is live.
        unsafe { ngx_log_error_core(level as ngx_uint_t, self.0, 0, c"%*s".as_ptr(), b.len(), b.as_ptr()) };
    }
}

/// Writes one line to a log at `level` (NGX_LOG_ERR, ...).
pub fn write(level: u32, log: Log, args: fmt::Arguments<'_>) {
    if log.level().is_some_and(|l| level as usize <= l) {
        log.emit(level, &format_line(args));
    }
}

/// Writes a debug line at `NGX_LOG_DEBUG_HTTP` when the log asks for it.
pub fn debug_http(log: Log, args: fmt::Arguments<'_>) {
    if ngx::log::DEBUG && log.level().is_some_and(|l| l & NGX_LOG_DEBUG_HTTP as usize != 0) {
        log.emit(NGX_LOG_DEBUG, &format_line(args));
    }
}

/// Logs at a level: `log!(NGX_LOG_ERR, log, "fmt", args..)`.
#[macro_export]
macro_rules! log {
    ($level:expr, $log:expr, $($arg:tt)+) => {
        $crate::ffi::log::write($level, $log, format_args!($($arg)+))
    };
}

/// A debug trace: `debug!(log, "fmt", args..)`.
#[macro_export]
macro_rules! debug {
    ($log:expr, $($arg:tt)+) => {
        $crate::ffi::log::debug_http($log, format_args!($($arg)+))
    };
}
