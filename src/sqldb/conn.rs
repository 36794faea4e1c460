//! Database connections: a libpq connection with the nginx connection that
//! watches its socket, and the per-worker keepalive pool of idle ones.

use std::ffi::CString;
use std::ptr::{self, NonNull};

use super::pq::PgConn;
use crate::ffi::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// PQconnectPoll until the session is authenticated.
    Connecting,
    /// Ready for a query (all results of the previous one are read).
    Idle,
    /// A query is being sent (PQflush).
    Sending,
    /// Waiting for and reading results.
    Reading,
}

/// Templates prepared on one connection at most; later ones run unnamed.
const MAX_PREPARED: usize = 256;

/// A libpq connection and the nginx connection that watches its socket.
/// Always boxed: while it sits in the pool, its nginx connection's `data`
/// points at it.
pub struct Conn {
    pub pg: PgConn,
    pub c: NonNull<ngx_connection_t>,
    /// Index of the server address in the upstream's SrvConf.
    pub addr: usize,
    pub phase: Phase,
    write_watched: bool,
    /// Requests served so far.
    pub requests: u64,
    /// Came from the pool for the current request.
    pub reused: bool,
    prepared: Vec<usize>,
    pool: *mut Pool,
}

impl Conn {
    /// Wraps a started libpq connection's socket in an nginx connection and
    /// watches it (read always, write while libpq needs it).
    ///
    /// # Safety
    /// `log` must be live; `pool` must outlive the connection.
    pub unsafe fn wrap(pg: PgConn, addr: usize, log: *mut ngx_log_t, pool: *mut Pool) -> Option<Box<Conn>> {
        // SAFETY: a fresh socket from libpq; nginx gives us a free connection slot.
        let c = NonNull::new(unsafe { ngx_get_connection(pg.socket(), log) })?;
        // SAFETY: c is the fresh connection.
        unsafe {
            (*(*c.as_ptr()).read).log = log;
            (*(*c.as_ptr()).write).log = log;
        }
        let mut conn = Box::new(Conn {
            pg,
            c,
            addr,
            phase: Phase::Connecting,
            write_watched: false,
            requests: 0,
            reused: false,
            prepared: Vec::new(),
            pool,
        });
        // SAFETY: pool outlives the connection (it lives in the cycle's configuration).
        unsafe { (*pool).open += 1 };
        // libpq starts as if it had asked for writability.
        // SAFETY: c is live.
        if !unsafe { add_event((*c.as_ptr()).read, READ_EVENT, LEVEL_EVENT) } || !conn.want_write(true) {
            conn.close();
            return None;
        }
        Some(conn)
    }

    pub fn raw(&self) -> *mut ngx_connection_t {
        self.c.as_ptr()
    }

    /// Stops watching the socket, frees the nginx connection, then closes
    /// the libpq connection (which closes the socket).
    pub fn close(self: Box<Self>) {
        let c = self.c.as_ptr();
        // SAFETY: c is the live connection made for this socket in wrap; the
        // pool outlives it.
        unsafe {
            for ev in [(*c).read, (*c).write] {
                if (*ev).timer_set() != 0 {
                    ngx_del_timer(ev);
                }
                if (*ev).posted() != 0 {
                    ngx_delete_posted_event(ev);
                }
            }
            if (*(*c).read).active() != 0 {
                del_event((*c).read, READ_EVENT, NGX_CLOSE_EVENT as ngx_uint_t);
            }
            if (*(*c).write).active() != 0 {
                del_event((*c).write, WRITE_EVENT, NGX_CLOSE_EVENT as ngx_uint_t);
            }
            if !(*c).pool.is_null() {
                ngx_destroy_pool((*c).pool);
                (*c).pool = ptr::null_mut();
            }
            ngx_free_connection(c);
            (*c).fd = -1;
            (*self.pool).open -= 1;
        }
        drop(self);
    }

    /// Watches the socket for writability only while libpq has bytes to send.
    pub fn want_write(&mut self, on: bool) -> bool {
        if on == self.write_watched {
            return true;
        }
        // SAFETY: c is live; events are level-triggered so none is lost.
        let ok = unsafe {
            let wev = (*self.c.as_ptr()).write;
            if on {
                add_event(wev, WRITE_EVENT, LEVEL_EVENT)
            } else {
                del_event(wev, WRITE_EVENT, 0)
            }
        };
        if ok {
            self.write_watched = on;
        }
        ok
    }

    /// One timer on the read event serves every phase.
    pub fn set_timer(&mut self, ms: ngx_msec_t) {
        // SAFETY: c is live.
        unsafe {
            let c = self.c.as_ptr();
            if (*(*c).write).timer_set() != 0 {
                ngx_del_timer((*c).write);
            }
            ngx_add_timer((*c).read, ms);
        }
    }

    pub fn is_prepared(&self, template: usize) -> bool {
        self.prepared.contains(&template)
    }

    /// Remembers a prepared template; false when the cache is full.
    pub fn add_prepared(&mut self, template: usize) -> bool {
        if self.prepared.len() >= MAX_PREPARED {
            return false;
        }
        self.prepared.push(template);
        true
    }

    pub fn can_prepare_more(&self) -> bool {
        self.prepared.len() < MAX_PREPARED
    }

    /// After DEALLOCATE / DISCARD or a schema change, forget what was prepared.
    pub fn forget_prepared(&mut self) {
        self.prepared.clear();
    }
}

/// The statement name of a template on every connection.
pub fn statement_name(template: usize) -> CString {
    CString::new(format!("ngx_gateway_{template:x}")).unwrap_or_default()
}

/// `sqldb_keepalive` settings and the idle connections of one upstream in
/// one worker process.
pub struct Pool {
    /// Idle connections kept at most (and, with `reject`, connections open at most).
    pub max: usize,
    /// Any idle connection serves a request, whatever server the balancer would pick.
    pub single: bool,
    /// When `max` connections are open and none is idle, answer 503.
    pub reject: bool,
    pub idle_timeout: ngx_msec_t,
    /// Requests one connection serves before it is closed (0: no limit).
    pub max_requests: u64,
    pub idle: Vec<Box<Conn>>,
    /// Connections open now, busy and idle.
    pub open: usize,
}

impl Default for Pool {
    fn default() -> Self {
        Pool {
            max: 10,
            single: false,
            reject: false,
            idle_timeout: 60_000,
            max_requests: 0,
            idle: Vec::new(),
            open: 0,
        }
    }
}

impl Pool {
    /// Takes an idle connection: the most recently used one to `addr`, or any
    /// one in single mode.
    pub fn take(&mut self, addr: Option<usize>) -> Option<Box<Conn>> {
        let i = match addr {
            Some(a) => self.idle.iter().rposition(|c| c.addr == a)?,
            None => self.idle.len().checked_sub(1)?,
        };
        let mut conn = self.idle.remove(i);
        // SAFETY: the pooled connection is live.
        unsafe {
            let c = conn.raw();
            (*c).set_idle(0);
            if (*(*c).read).timer_set() != 0 {
                ngx_del_timer((*c).read);
            }
        }
        conn.reused = true;
        Some(conn)
    }

    /// True when `overflow=reject` must turn a request away.
    pub fn full(&self) -> bool {
        self.reject && self.idle.is_empty() && self.open >= self.max
    }

    /// Keeps a connection that finished a request, or closes it.
    pub fn release(&mut self, mut conn: Box<Conn>) {
        conn.requests += 1;
        conn.reused = false;
        // SAFETY: reading nginx's process flags.
        let exiting = unsafe { ngx_exiting != 0 || ngx_terminate != 0 || ngx_quit != 0 };
        let healthy = conn.phase == Phase::Idle
            && !conn.pg.is_bad()
            && conn.pg.is_idle_outside_transaction()
            && conn.want_write(false);
        let spent = self.max_requests != 0 && conn.requests >= self.max_requests;
        if !healthy || spent || exiting || self.idle.len() >= self.max {
            conn.close();
            return;
        }
        let raw: *mut Conn = &mut *conn;
        // SAFETY: c is live; the request's log dies with the request, so
        // the idle connection logs to the cycle's log.
        unsafe {
            let c = conn.raw();
            let log = (*ngx_cycle).log;
            (*c).log = log;
            (*(*c).read).log = log;
            (*(*c).write).log = log;
            if !(*c).pool.is_null() {
                (*(*c).pool).log = log;
            }
            (*c).data = raw.cast();
            (*(*c).read).handler = Some(idle_event);
            (*(*c).write).handler = Some(idle_event);
            (*c).set_idle(1);
            ngx_add_timer((*c).read, self.idle_timeout);
        }
        self.idle.push(conn);
    }

    fn remove(&mut self, conn: *const Conn) -> Option<Box<Conn>> {
        let i = self.idle.iter().position(|c| ptr::eq(&**c, conn))?;
        Some(self.idle.remove(i))
    }
}

/// Events on an idle connection: the server closed it (restart,
/// pg_terminate_backend), the idle timeout passed, or nginx is shutting down.
unsafe extern "C" fn idle_event(ev: *mut ngx_event_t) {
    // SAFETY: ev belongs to a pooled connection whose data is its Conn.
    unsafe {
        let c = (*ev).data as *mut ngx_connection_t;
        let conn = (*c).data as *mut Conn;
        if (*ev).write() != 0 {
            return; // nothing to write while idle
        }
        let pool = (*conn).pool;
        let drop_it = (*ev).timedout() != 0
            || (*c).close() != 0
            || !(*conn).pg.consume_input()
            || (*conn).pg.is_bad()
            || (*conn).pg.is_busy();
        if drop_it {
            if (*ev).timedout() == 0 && (*c).close() == 0 {
                log!(
                    NGX_LOG_INFO,
                    (*c).log,
                    "sqldb: idle connection closed by the server: {}",
                    (*conn).pg.error_message()
                );
            }
            if let Some(conn) = (*pool).remove(conn) {
                conn.close();
            }
        }
    }
}
