//! Database connections and the per-worker pool that owns them.
//!
//! Every connection belongs to its upstream's pool for its whole life;
//! requests only queue on it. A connection in pipeline mode carries several
//! requests at once, each ended by its own sync point so that an error stays
//! with its request; results come back in order and go to the request at
//! the head of the queue.

use std::collections::VecDeque;
use std::ptr::{self, NonNull};

use super::cancel::Canceller;
use super::handler::Ctx;
use super::pq::{CancelKey, PgConn};
use crate::ffi::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// PQconnectPoll until the session is authenticated.
    Connecting,
    /// Authenticated; carries queries.
    Ready,
}

/// How the results of one queued request end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Simple protocol (several statements): at the NULL result.
    Simple,
    /// Pipeline: at the sync point; `preparing` when the first query of the
    /// request prepares its statement.
    Pipelined { preparing: bool },
}

/// A request waiting for its results.
pub struct Pending {
    /// Null once the request has gone (client closed, timed out): its
    /// results are read and dropped.
    pub ctx: *mut Ctx,
    pub mode: Mode,
    /// Queries of this request whose results are complete (pipeline).
    pub stage: u32,
    /// Run it once more at the end of its results (its prepared statement vanished).
    pub again: bool,
    /// Single-row mode was asked for its query (streamed requests).
    pub single: bool,
    /// Its rows are streamed: nothing may queue behind it (a client that
    /// stops reading would hold them up).
    pub streaming: bool,
    /// Its number on the connection (to cancel each running query once).
    pub seq: u64,
}

/// Templates prepared on one connection at most; later ones run unnamed.
const MAX_PREPARED: usize = 256;

/// A libpq connection and the nginx connection that watches its socket.
/// Boxed and owned by its pool; its nginx connection's `data` points at it.
pub struct Conn {
    pub pg: PgConn,
    c: NonNull<ngx_connection_t>,
    /// Index of the server address in the upstream's SrvConf.
    pub addr: usize,
    /// That address as text, for the log.
    pub name: String,
    pub state: State,
    /// libpq pipeline mode is on.
    pub pipeline: bool,
    pub queue: VecDeque<Pending>,
    /// While connecting: the request that opened it (null once it left).
    pub creator: *mut Ctx,
    /// While connecting: requests queued behind the creator, sent once it is up.
    pub waiting: Vec<*mut Ctx>,
    /// Opened for a query of several statements: nothing may queue behind it.
    pub exclusive: bool,
    /// A streamed request's client is behind: results wait in the socket.
    pub paused: bool,
    write_watched: bool,
    /// Requests served.
    pub served: u64,
    prepared: Vec<usize>,
    pub pool: *mut Pool,
    /// The session's cancel key (None: its queries cannot be cancelled).
    pub cancel_key: Option<CancelKey>,
    /// A cancel request under way.
    pub canceller: Option<Canceller>,
    /// Every request queued on it has gone: its queries are being
    /// cancelled and their results read and dropped. It still counts
    /// against `max`; new requests wait in `waiting` until it is clean.
    pub draining: bool,
    /// The `seq` of the last request queued, and of the last one whose
    /// query a cancel request was sent for.
    pub last_seq: u64,
    pub cancelled_seq: Option<u64>,
}

impl Conn {
    pub fn raw(&self) -> *mut ngx_connection_t {
        self.c.as_ptr()
    }

    /// Requests still waiting on this connection.
    pub fn live(&self) -> usize {
        self.queue.iter().filter(|p| !p.ctx.is_null()).count()
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

    /// Can a pipelined request queue on it? A ready connection in pipeline
    /// mode without a streamed request, one still connecting for a request
    /// that does not need it alone, or one draining (the request waits).
    fn shareable(&self) -> bool {
        match self.state {
            State::Ready if self.draining => true,
            State::Ready => self.pipeline && !self.queue.iter().any(|p| p.streaming),
            State::Connecting => !self.exclusive,
        }
    }

    /// Requests wait in `waiting` rather than being sent (connecting or draining).
    pub fn holds_requests(&self) -> bool {
        self.state == State::Connecting || self.draining
    }

    /// An idle connection is still open at the server's end: nothing to
    /// read, or only messages of no consequence (parameter changes). A
    /// connection the server closed (restart, pg_terminate_backend) is found
    /// here before a query is sent on it.
    fn alive(&mut self) -> bool {
        let peek = |c: &Conn| {
            let mut b = 0u8;
            // SAFETY: c's socket is open (libpq owns it); a 1-byte peek that never blocks.
            let n = unsafe {
                libc::recv(
                    (*c.c.as_ptr()).fd,
                    (&mut b as *mut u8).cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            match n {
                0 => Some(false),
                n if n > 0 => None,
                _ => Some(matches!(
                    std::io::Error::last_os_error().raw_os_error(),
                    Some(libc::EAGAIN | libc::EINTR)
                )),
            }
        };
        if let Some(verdict) = peek(self) {
            return verdict;
        }
        // Bytes on an idle session: let libpq read them (a FATAL message
        // before the end, or a parameter change).
        if !self.pg.consume_input() || self.pg.is_bad() {
            return false;
        }
        let _ = self.pg.is_busy();
        !self.pg.is_bad() && peek(self) != Some(false)
    }

    /// Stops (or resumes) reading the socket while a streamed request's
    /// client catches up.
    pub fn pause_reading(&mut self, pause: bool) -> bool {
        if pause == self.paused {
            return true;
        }
        // SAFETY: c is live; its read event is registered (level-triggered).
        let ok = unsafe {
            let rev = (*self.c.as_ptr()).read;
            if pause {
                del_event(rev, READ_EVENT, 0)
            } else {
                add_event(rev, READ_EVENT, LEVEL_EVENT)
            }
        };
        if ok {
            self.paused = pause;
        }
        ok
    }

    pub fn is_prepared(&self, template: usize) -> bool {
        self.prepared.contains(&template)
    }

    /// Remembers a template as prepared (callers check `can_prepare_more`).
    pub fn add_prepared(&mut self, template: usize) {
        if self.prepared.len() < MAX_PREPARED {
            self.prepared.push(template);
        }
    }

    pub fn can_prepare_more(&self) -> bool {
        self.prepared.len() < MAX_PREPARED
    }

    /// After DEALLOCATE / DISCARD or a schema change, forget what was prepared.
    pub fn forget_prepared(&mut self) {
        self.prepared.clear();
    }

    /// Logs to the cycle's log: requests come and go, the connection stays.
    fn log_to_cycle(&mut self) {
        // SAFETY: c is live; the cycle's log outlives it.
        unsafe {
            let c = self.c.as_ptr();
            let log = (*ngx_cycle).log;
            (*c).log = log;
            (*(*c).read).log = log;
            (*(*c).write).log = log;
        }
    }

    /// Idle in the pool (nginx may close it on shutdown), with the idle timeout.
    fn set_idle_timer(&mut self, on: bool, ms: ngx_msec_t) {
        // SAFETY: c is live.
        unsafe { (*self.c.as_ptr()).set_idle(on as u32) };
        self.set_timer(on.then_some(ms));
    }

    /// Arms (or clears) the connection's own timer: the idle timeout, or
    /// how long draining may take.
    pub fn set_timer(&mut self, ms: Option<ngx_msec_t>) {
        // SAFETY: c is live; its read event carries the connection's timer.
        unsafe {
            let rev = (*self.c.as_ptr()).read;
            match ms {
                Some(ms) => ngx_add_timer(rev, ms),
                None if (*rev).timer_set() != 0 => ngx_del_timer(rev),
                None => {}
            }
        }
    }
}

/// What a request gets from the pool.
pub enum Pick {
    /// An idle connection (to the address asked for, or any in single mode).
    Idle(*mut Conn),
    /// A busy connection in pipeline mode, or one still connecting, to
    /// queue behind its requests.
    Share(*mut Conn),
    /// Open a new connection.
    New,
    /// `overflow=reject` and nothing free.
    Reject,
}

/// `sqldb_keepalive` / `sqldb_pipeline` settings and, in each worker
/// process, the connections of one upstream.
pub struct Pool {
    /// Idle connections kept at most; open connections before requests
    /// are pipelined onto busy ones (or rejected).
    pub max: usize,
    /// Any idle connection serves a request, whatever server the balancer would pick.
    pub single: bool,
    /// With no connection to spare: 503 instead of opening more.
    pub reject: bool,
    pub idle_timeout: ngx_msec_t,
    /// Requests one connection serves before it is closed (0: no limit).
    pub max_requests: u64,
    /// Queue requests onto busy connections (libpq pipeline mode).
    pub pipelining: bool,
    /// Every open connection. Boxed so that a connection keeps its address
    /// (its nginx connection and its requests point at it) as the Vec grows.
    #[allow(clippy::vec_box)]
    all: Vec<Box<Conn>>,
    /// Idle ones, most recently used last.
    idle: Vec<*mut Conn>,
}

impl Default for Pool {
    fn default() -> Self {
        Pool {
            max: 10,
            single: false,
            reject: false,
            idle_timeout: 60_000,
            max_requests: 0,
            pipelining: true,
            all: Vec::new(),
            idle: Vec::new(),
        }
    }
}

impl Pool {
    /// Where a request goes. `addr` is the balancer's choice (None: any,
    /// single mode); `pipelinable` is false for several statements, which
    /// need a connection of their own.
    pub fn pick(&mut self, addr: Option<usize>, pipelinable: bool) -> Pick {
        // SAFETY: idle and all hold live connections of this pool.
        let fits = |c: &*mut Conn| addr.is_none_or(|a| unsafe { (**c).addr } == a);
        while let Some(i) = self.idle.iter().rposition(fits) {
            let conn = self.idle.remove(i);
            // SAFETY: conn is live.
            unsafe {
                if !(*conn).alive() {
                    // Closed by the server a moment ago: no query was sent on it.
                    self.close(conn);
                    continue;
                }
                (*conn).set_idle_timer(false, 0);
            }
            return Pick::Idle(conn);
        }
        if self.max == 0 || self.all.len() < self.max {
            return Pick::New;
        }
        if pipelinable && self.pipelining {
            let best = self
                .all
                .iter_mut()
                .filter(|c| c.shareable() && addr.is_none_or(|a| c.addr == a))
                .min_by_key(|c| c.queue.len() + c.waiting.len());
            if let Some(c) = best {
                return Pick::Share(&mut **c);
            }
        }
        if self.reject {
            Pick::Reject
        } else {
            Pick::New
        }
    }

    /// True when a request would be turned away (checked before nginx's
    /// upstream starts, so that the answer is 503).
    pub fn full(&self) -> bool {
        self.reject
            && self.max > 0
            && self.idle.is_empty()
            && self.all.len() >= self.max
            && !(self.pipelining && self.all.iter().any(|c| c.shareable()))
    }

    /// Opens the nginx side of a started libpq connection and adds it to the pool.
    ///
    /// # Safety
    /// `log` must be live.
    pub unsafe fn add(&mut self, pg: PgConn, addr: usize, name: String, log: *mut ngx_log_t) -> Option<*mut Conn> {
        // SAFETY: a fresh socket from libpq; nginx gives us a free connection slot.
        let c = NonNull::new(unsafe { ngx_get_connection(pg.socket(), log) })?;
        let pool: *mut Pool = self;
        let mut conn = Box::new(Conn {
            pg,
            c,
            addr,
            name,
            state: State::Connecting,
            pipeline: false,
            queue: VecDeque::new(),
            creator: ptr::null_mut(),
            waiting: Vec::new(),
            exclusive: false,
            paused: false,
            write_watched: false,
            served: 0,
            prepared: Vec::new(),
            pool,
            cancel_key: None,
            canceller: None,
            draining: false,
            last_seq: 0,
            cancelled_seq: None,
        });
        let raw: *mut Conn = &mut *conn;
        conn.log_to_cycle();
        // SAFETY: c is the fresh connection; libpq starts as if it had asked
        // for writability, and the read side is watched for its whole life.
        let ok = unsafe {
            let cp = c.as_ptr();
            (*cp).data = raw.cast();
            (*(*cp).read).handler = Some(super::handler::conn_event);
            (*(*cp).write).handler = Some(super::handler::conn_event);
            add_event((*cp).read, READ_EVENT, LEVEL_EVENT)
        };
        self.all.push(conn);
        // SAFETY: raw is the box just pushed.
        if !ok || !unsafe { (*raw).want_write(true) } {
            self.close(raw);
            return None;
        }
        Some(raw)
    }

    /// A connection whose queue has emptied: keep it idle or close it.
    ///
    /// # Safety
    /// `conn` must be a live connection of this pool.
    pub unsafe fn settle(&mut self, conn: *mut Conn) {
        // SAFETY: see above.
        let cn = unsafe { &mut *conn };
        if !cn.queue.is_empty() {
            return;
        }
        // SAFETY: reading nginx's process flags.
        let exiting = unsafe { ngx_exiting != 0 || ngx_terminate != 0 || ngx_quit != 0 };
        let healthy =
            cn.state == State::Ready && !cn.pg.is_bad() && cn.pg.is_idle_outside_transaction() && cn.want_write(false);
        let spent = self.max_requests != 0 && cn.served >= self.max_requests;
        if !healthy || spent || exiting || self.idle.len() >= self.max {
            self.close(conn);
            return;
        }
        cn.log_to_cycle();
        cn.set_idle_timer(true, self.idle_timeout);
        self.idle.push(conn);
    }

    /// Closes a connection: stops watching the socket, frees the nginx
    /// connection, then the libpq one (which closes the socket).
    ///
    /// # Safety
    /// `conn` must be a live connection of this pool; it is freed.
    pub unsafe fn close(&mut self, conn: *mut Conn) {
        self.idle.retain(|&c| c != conn);
        let Some(i) = self.all.iter().position(|c| ptr::eq(&**c, conn)) else {
            return;
        };
        let mut boxed = self.all.swap_remove(i);
        if let Some(canceller) = boxed.canceller.take() {
            canceller.close();
        }
        let c = boxed.c.as_ptr();
        // SAFETY: c is the live connection made for this socket in add().
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
            ngx_free_connection(c);
            (*c).fd = -1;
        }
        drop(boxed);
    }
}
