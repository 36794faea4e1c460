//! Cancel requests sent on nginx's events. PostgreSQL cancels a backend's
//! running query when a new connection to the server sends a CancelRequest
//! with the backend's PID and secret key; the server then closes that
//! connection. libpq 15 only sends one blocking (PQcancel), so the driver
//! opens the connection itself, nonblocking, watched by nginx.

use std::ffi::c_void;

use gateway_core::pgwire::cancel_request;

use super::pq::CancelKey;
use crate::ffi::net::{Outbound, Peer, TIMED_OUT};
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
    conn: Outbound,
    packet: [u8; 16],
    sent: bool,
}

impl Canceller {
    /// Connects (nonblocking) to the server of `key`; `handler` runs on the
    /// connection's events, which carry `data`. A connect that did not
    /// start is logged by nginx; the error says so in a few words.
    pub fn start(key: &CancelKey, handler: ngx_event_handler_pt, data: *mut c_void) -> Result<Canceller, String> {
        let peer = Peer {
            sockaddr: &key.addr,
            keepalive: false,
            // One packet, then the server closes: nothing to hold back.
            nodelay: false,
            log: None,
        };
        let (conn, _) = Outbound::connect(&peer, handler, data).map_err(|e| e.to_string())?;
        let me = Canceller {
            conn,
            packet: cancel_request(key.pid, key.key),
            sent: false,
        };
        if !me.conn.socket().watch_write(true) {
            me.close();
            return Err("cannot watch the cancel connection".into());
        }
        Ok(me)
    }

    /// Bounds how long the request may take.
    pub fn set_timer(&self, ms: ngx_msec_t) {
        self.conn.socket().write().add_timer(ms);
    }

    /// On an event of its connection: send the request once connected,
    /// then wait for the server to close.
    pub fn on_event(&mut self, timed_out: bool) -> Progress {
        if timed_out {
            let doing = if self.sent {
                "reading upstream"
            } else {
                "connecting to upstream"
            };
            return Progress::Failed(format!("{TIMED_OUT} while {doing}"));
        }
        if !self.sent {
            if let Err(why) = self.conn.connect_result() {
                return Progress::Failed(why);
            }
            match self.conn.send(&self.packet) {
                Ok(0) => return Progress::Pending,
                Ok(n) if n == self.packet.len() => {}
                Ok(_) => return Progress::Failed("send() sent part of the request".into()),
                Err(e) => return Progress::Failed(e.why()),
            }
            self.sent = true;
            let s = self.conn.socket();
            if !s.watch_write(false) || !s.watch_read(true) {
                return Progress::Failed("cannot watch the cancel connection".into());
            }
            return Progress::Pending;
        }
        let mut buf = [0u8; 64];
        match self.conn.recv(&mut buf) {
            Ok(_) => Progress::Pending,
            // The server closes at once after reading the request.
            Err(_) => Progress::Done,
        }
    }

    /// Closes the connection (its timer and events with it).
    pub fn close(self) {
        self.conn.close();
    }
}
