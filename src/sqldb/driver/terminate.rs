//! Ending a backend from the server's side. A connection that closes while
//! a query of a request that is gone still runs on it (its cancel requests
//! did not stop it within the drain's time) would leave that query running
//! on the server, unseen, to its end: closing the socket does not stop a
//! backend that is not reading. So a session of its own, opened with the
//! same connection string (the same role, which may signal its own
//! backends), runs `pg_terminate_backend(<pid>)` and closes: nonblocking,
//! on nginx's events, bounded by a timer.

use std::ffi::{CStr, CString};
use std::ptr::NonNull;

use gateway_core::rds::ResultSet as _;
use gateway_core::slab::Key;

use super::pq::{PgConn, Poll, ResultKind};
use super::ConnPool;
use crate::ffi::*;

/// How long ending a backend may take, connecting included.
pub const TERMINATE_TIMEOUT: ngx_msec_t = 5_000;

const TERMINATE: &CStr = c"select pg_catalog.pg_terminate_backend($1)";

/// Where ending a backend stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    Pending,
    /// The backend was signalled to end.
    Ended,
    /// No backend of that PID is left (it ended by itself meanwhile).
    Gone,
    Failed(String),
}

/// One `pg_terminate_backend` under way, on a session of its own.
pub struct Terminator {
    pg: PgConn,
    socket: Socket,
    /// The backend to end, and the server it runs on (for the log).
    pub pid: i32,
    pub name: String,
    /// The pool that holds it, and its key there (for its events).
    pub pool: NonNull<ConnPool>,
    pub key: Key,
    sent: bool,
    write_watched: bool,
}

impl Terminator {
    /// Starts connecting (nonblocking); `handler` runs on the connection's
    /// events, which carry `data` (set it with `set_data` once the
    /// Terminator is where it stays: `key` in `pool`).
    pub fn start(
        conninfo: &CStr,
        pid: i32,
        name: String,
        (pool, key): (NonNull<ConnPool>, Key),
        handler: ngx_event_handler_pt,
    ) -> Result<Terminator, String> {
        let pg = PgConn::start(conninfo).map_err(|e| format!("connecting failed: {e}"))?;
        let socket = Socket::get(pg.socket(), Log::cycle()).ok_or("no free connection")?;
        socket.set_handler(handler);
        let mut me = Terminator {
            pg,
            socket,
            pid,
            name,
            pool,
            key,
            sent: false,
            write_watched: false,
        };
        // libpq starts as if it had asked for writability.
        if !me.socket.watch_read(true) || !me.want_write(true) {
            me.close();
            return Err("cannot watch the connection".into());
        }
        me.socket.read().add_timer(TERMINATE_TIMEOUT);
        Ok(me)
    }

    /// What the handlers find in the connection's data.
    pub fn set_data(&self, data: *mut std::ffi::c_void) {
        self.socket.set_data(data);
    }

    fn want_write(&mut self, on: bool) -> bool {
        if on != self.write_watched {
            if !self.socket.watch_write(on) {
                return false;
            }
            self.write_watched = on;
        }
        true
    }

    fn flush(&mut self) -> Result<(), String> {
        let more = self.pg.flush().map_err(|e| format!("sending failed: {e}"))?;
        if self.want_write(more) {
            Ok(())
        } else {
            Err("cannot watch the connection".into())
        }
    }

    /// On an event of its connection: connect, send the query once
    /// connected, then read its answer.
    pub fn on_event(&mut self, timed_out: bool) -> Ending {
        if timed_out {
            return Ending::Failed(format!("no answer within {TERMINATE_TIMEOUT} ms"));
        }
        match self.step() {
            Ok(ending) => ending,
            Err(why) => Ending::Failed(why),
        }
    }

    fn step(&mut self) -> Result<Ending, String> {
        if !self.sent {
            let watched = match self.pg.poll_connect() {
                Poll::Reading => self.want_write(false),
                Poll::Writing => self.want_write(true),
                Poll::Failed => return Err(format!("connecting failed: {}", self.pg.error_message())),
                Poll::Ready => {
                    if self.pg.socket() != self.socket.fd() {
                        return Err("libpq replaced its socket while connecting".into());
                    }
                    self.pg
                        .set_nonblocking()
                        .map_err(|e| format!("connecting failed: {e}"))?;
                    let pid = CString::new(self.pid.to_string()).map_err(|_| "a PID with a NUL byte")?;
                    self.pg
                        .send_unnamed(TERMINATE, &[pid], false)
                        .map_err(|e| format!("sending failed: {e}"))?;
                    self.sent = true;
                    self.flush()?;
                    return Ok(Ending::Pending);
                }
            };
            if !watched {
                return Err("cannot watch the connection".into());
            }
            return Ok(Ending::Pending);
        }
        self.flush()?;
        if self.pg.consume_input().is_err() || self.pg.is_bad() {
            return Err(format!("connection lost: {}", self.pg.error_message()));
        }
        if self.pg.is_busy() {
            return Ok(Ending::Pending);
        }
        let mut ending = Err("no answer".to_owned());
        while let Some(res) = self.pg.get_result() {
            ending = match res.kind() {
                ResultKind::Tuples if res.rows() == 1 && res.columns() == 1 => match res.value(0, 0) {
                    Some([b't']) => Ok(Ending::Ended),
                    Some([b'f']) => Ok(Ending::Gone),
                    _ => Err("an unexpected answer".to_owned()),
                },
                ResultKind::Error => Err(res.error_summary()),
                _ => Err("an unexpected answer".to_owned()),
            };
        }
        ending
    }

    /// Closes its session (and the nginx connection that watched it).
    pub fn close(self) {
        self.socket.release();
        drop(self.pg);
    }
}
