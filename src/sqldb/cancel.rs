//! Cancel requests sent on nginx's events. PostgreSQL cancels a backend's
//! running query when a new connection to the server sends a CancelRequest
//! packet with the backend's PID and secret key; the server then closes
//! that connection. libpq 15 only has a blocking way to do it (PQcancel),
//! so the gateway opens the connection itself, nonblocking, watched by
//! nginx like any other socket.

use std::ffi::c_void;
use std::ptr::NonNull;

use gateway_core::pgwire::cancel_request;

use super::pq::CancelKey;
use crate::ffi::*;

/// Where a cancel request stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Not finished.
    Pending,
    /// The server read the request and closed the connection.
    Done,
    Failed(String),
}

/// One cancel request under way: its own connection to the server.
pub struct Canceller {
    c: NonNull<ngx_connection_t>,
    packet: [u8; 16],
    sent: bool,
}

fn errno_text() -> String {
    std::io::Error::last_os_error().to_string()
}

impl Canceller {
    /// Connects (nonblocking) to the server of `key`; `handler` runs on the
    /// connection's events with `data` as the connection's data. Fails at
    /// once when no socket can be had.
    ///
    /// # Safety
    /// `data` must stay valid until the canceller is closed.
    pub unsafe fn start(
        key: &CancelKey,
        handler: ngx_event_handler_pt,
        data: *mut c_void,
        timeout: ngx_msec_t,
    ) -> Result<Canceller, String> {
        let addr = key.addr.as_ptr() as *const libc::sockaddr;
        // SAFETY: key.addr holds a sockaddr of the length given (checked
        // when the key was read); the socket is ours until nginx's
        // connection takes it over.
        unsafe {
            let family = i32::from((*addr).sa_family);
            let fd = libc::socket(family, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0);
            if fd < 0 {
                return Err(format!("socket() failed: {}", errno_text()));
            }
            let rc = libc::connect(fd, addr, key.addr.len() as libc::socklen_t);
            if rc != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINPROGRESS) {
                let e = errno_text();
                libc::close(fd);
                return Err(format!("connect() failed: {e}"));
            }
            let Some(c) = NonNull::new(ngx_get_connection(fd, cycle_log())) else {
                libc::close(fd);
                return Err("no free connection".into());
            };
            let cp = c.as_ptr();
            // nginx does not give the events a log; its debug lines need one.
            (*(*cp).read).log = (*cp).log;
            (*(*cp).write).log = (*cp).log;
            (*cp).data = data;
            (*(*cp).read).handler = handler;
            (*(*cp).write).handler = handler;
            let me = Canceller {
                c,
                packet: cancel_request(key.pid, key.key),
                sent: false,
            };
            if !add_event((*cp).write, WRITE_EVENT, LEVEL_EVENT) {
                me.close();
                return Err("cannot watch the cancel connection".into());
            }
            ngx_add_timer((*cp).write, timeout);
            Ok(me)
        }
    }

    /// The nginx connection, to tell its events from others.
    pub fn raw(&self) -> *mut ngx_connection_t {
        self.c.as_ptr()
    }

    /// On an event of its connection: send the request once connected,
    /// then wait for the server to close.
    pub fn on_event(&mut self, timed_out: bool) -> Progress {
        if timed_out {
            return Progress::Failed("timed out".into());
        }
        let cp = self.c.as_ptr();
        // SAFETY: the connection is ours and live; fd is its socket.
        unsafe {
            let fd = (*cp).fd;
            if !self.sent {
                let mut err: libc::c_int = 0;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                let got = libc::getsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_ERROR,
                    (&mut err as *mut libc::c_int).cast(),
                    &mut len,
                );
                if got != 0 || err != 0 {
                    let why = if got != 0 {
                        errno_text()
                    } else {
                        std::io::Error::from_raw_os_error(err).to_string()
                    };
                    return Progress::Failed(format!("connecting failed: {why}"));
                }
                let n = libc::send(fd, self.packet.as_ptr().cast(), self.packet.len(), libc::MSG_NOSIGNAL);
                if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN) {
                    return Progress::Pending;
                }
                if n != self.packet.len() as isize {
                    return Progress::Failed(format!("sending failed: {}", errno_text()));
                }
                self.sent = true;
                if !del_event((*cp).write, WRITE_EVENT, 0) || !add_event((*cp).read, READ_EVENT, LEVEL_EVENT) {
                    return Progress::Failed("cannot watch the cancel connection".into());
                }
                return Progress::Pending;
            }
            let mut buf = [0u8; 64];
            match libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) {
                0 => Progress::Done,
                n if n > 0 => Progress::Pending,
                _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN) => Progress::Pending,
                // The server closes at once after reading the request.
                _ => Progress::Done,
            }
        }
    }

    /// Closes the connection (timers and events with it).
    pub fn close(self) {
        // SAFETY: the connection and its socket are ours.
        unsafe { ngx_close_connection(self.c.as_ptr()) };
    }
}
