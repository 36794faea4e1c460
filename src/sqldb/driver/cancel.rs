//! Cancel requests sent on nginx's events. PostgreSQL cancels a backend's
//! running query when a new connection to the server sends a CancelRequest
//! with the backend's PID and secret key; the server then closes that
//! connection. libpq 15 only sends one blocking (PQcancel), so the driver
//! opens the connection itself, nonblocking, watched by nginx.

use std::ffi::c_void;
use std::io;

use gateway_core::pgwire::cancel_request;

use super::pq::CancelKey;
use crate::ffi::*;

/// Where a cancel request stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    Pending,
    /// The server read the request and closed the connection.
    Done,
    Failed(String),
}

/// One cancel request under way: its own connection to the server.
pub struct Canceller {
    socket: Socket,
    packet: [u8; 16],
    sent: bool,
}

fn os_error() -> io::Error {
    io::Error::last_os_error()
}

impl Canceller {
    /// Connects (nonblocking) to the server of `key`; `handler` runs on the
    /// connection's events, which carry `data`.
    pub fn start(key: &CancelKey, handler: ngx_event_handler_pt, data: *mut c_void) -> Result<Canceller, String> {
        let addr = key.addr.as_ptr() as *const libc::sockaddr;
        // SAFETY: key.addr holds a sockaddr of its length (checked when the
        // key was read): its family is readable.
        let family = i32::from(unsafe { (*addr).sa_family });
        // SAFETY: a plain system call.
        let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(format!("socket() failed: {}", os_error()));
        }
        // SAFETY: fd is our socket; addr and its length describe a sockaddr.
        let rc = unsafe { libc::connect(fd, addr, key.addr.len() as libc::socklen_t) };
        if rc != 0 && os_error().raw_os_error() != Some(libc::EINPROGRESS) {
            let e = os_error();
            // SAFETY: our socket, not handed to anyone.
            unsafe { libc::close(fd) };
            return Err(format!("connect() failed: {e}"));
        }
        let Some(socket) = Socket::get(fd, Log::cycle()) else {
            // SAFETY: as above.
            unsafe { libc::close(fd) };
            return Err("no free connection".into());
        };
        socket.set_data(data);
        socket.set_handler(handler);
        let me = Canceller {
            socket,
            packet: cancel_request(key.pid, key.key),
            sent: false,
        };
        if !me.socket.watch_write(true) {
            me.close();
            return Err("cannot watch the cancel connection".into());
        }
        Ok(me)
    }

    /// Bounds how long the request may take.
    pub fn set_timer(&self, ms: ngx_msec_t) {
        self.socket.write().add_timer(ms);
    }

    /// On an event of its connection: send the request once connected,
    /// then wait for the server to close.
    pub fn on_event(&mut self, timed_out: bool) -> Progress {
        if timed_out {
            return Progress::Failed("timed out".into());
        }
        let fd = self.socket.fd();
        if !self.sent {
            let mut err: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: our socket; err and len are valid for the call.
            let got = unsafe {
                libc::getsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_ERROR,
                    (&mut err as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            if got != 0 || err != 0 {
                let why = if got != 0 {
                    os_error()
                } else {
                    io::Error::from_raw_os_error(err)
                };
                return Progress::Failed(format!("connecting failed: {why}"));
            }
            // SAFETY: our socket; the packet's 16 bytes are valid for the call.
            let n = unsafe { libc::send(fd, self.packet.as_ptr().cast(), self.packet.len(), libc::MSG_NOSIGNAL) };
            if n < 0 && os_error().raw_os_error() == Some(libc::EAGAIN) {
                return Progress::Pending;
            }
            if n != self.packet.len() as isize {
                return Progress::Failed(format!("sending failed: {}", os_error()));
            }
            self.sent = true;
            if !self.socket.watch_write(false) || !self.socket.watch_read(true) {
                return Progress::Failed("cannot watch the cancel connection".into());
            }
            return Progress::Pending;
        }
        let mut buf = [0u8; 64];
        // SAFETY: our socket; buf is valid for its length.
        match unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) } {
            n if n > 0 => Progress::Pending,
            n if n < 0 && os_error().raw_os_error() == Some(libc::EAGAIN) => Progress::Pending,
            // The server closes at once after reading the request.
            _ => Progress::Done,
        }
    }

    /// Closes the connection (its timer and events with it).
    pub fn close(self) {
        self.socket.close();
    }
}
