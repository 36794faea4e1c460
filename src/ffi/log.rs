//! Writing to nginx's logs: `log!` for lines at a level, `debug!` for
//! `NGX_LOG_DEBUG_HTTP` traces (seen with `error_log ... debug` on an nginx
//! built `--with-debug`).

use std::fmt::{self, Write};

use super::*;

/// The most of a line the module writes: nginx's own line is 2048 bytes at
/// most, and what nginx adds after it (client, request, upstream) needs
/// room too.
const LINE_MAX: usize = 1536;
/// What ends a line cut at LINE_MAX.
const CUT: &[u8] = b"...";

/// A fixed stack buffer that formats and truncates instead of allocating.
/// Control bytes (a server's message may quote the client's value) are
/// written as `\xNN`, so that a line stays one line of plain text.
struct LineBuf {
    buf: [u8; LINE_MAX],
    len: usize,
    cut: bool,
}

impl LineBuf {
    fn push(&mut self, bytes: &[u8]) -> bool {
        let room = LINE_MAX - CUT.len() - self.len;
        if bytes.len() > room {
            self.cut = true;
        }
        let n = bytes.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
        !self.cut
    }

    fn finish(&mut self) {
        if self.cut {
            self.buf[self.len..self.len + CUT.len()].copy_from_slice(CUT);
            self.len += CUT.len();
        }
    }
}

impl Write for LineBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s.as_bytes();
        while !rest.is_empty() && !self.cut {
            let plain = rest.iter().position(|&b| b < 0x20 || b == 0x7f).unwrap_or(rest.len());
            if !self.push(&rest[..plain]) || plain == rest.len() {
                break;
            }
            const HEX: &[u8; 16] = b"0123456789abcdef";
            let b = rest[plain];
            self.push(&[b'\\', b'x', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
            rest = &rest[plain + 1..];
        }
        Ok(())
    }
}

fn format_line(args: fmt::Arguments<'_>) -> LineBuf {
    let mut line = LineBuf {
        buf: [0; LINE_MAX],
        len: 0,
        cut: false,
    };
    let _ = line.write_fmt(args);
    line.finish();
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
