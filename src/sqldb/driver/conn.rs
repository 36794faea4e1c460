//! One database connection: libpq's connection, the nginx connection that
//! watches its socket, and the routing of its results.

use std::ffi::{CStr, CString};
use std::ptr::NonNull;
use std::rc::Rc;

use gateway_core::metrics::{Id, Memo};
use gateway_core::pipeline::{Mode, Pipeline, Wire};
use gateway_core::target::Role;

use super::cancel::Canceller;
use super::pq::{CancelKey, PgConn, PqError};
use super::session::{SessionState, RESET_READ_ONLY, RESET_SESSION};
use super::{ConnId, ConnPool, Query, ReqToken, Statement};
use crate::ffi::*;
use crate::metrics;

pub(super) struct Conn {
    pub pg: PgConn,
    pub socket: Socket,
    pub id: ConnId,
    /// The pool it belongs to (the upstream's configuration holds it, so
    /// it does not move).
    pub pool: NonNull<ConnPool>,
    /// Index of the server address in the upstream's configuration.
    pub addr: usize,
    /// That address as text, for the log.
    pub name: String,
    pub pipeline: Pipeline<ReqToken>,
    /// The query of each request waiting or in flight (to send it once
    /// the connection serves, or again when its statement vanished).
    queries: Vec<(ReqToken, Rc<Query>)>,
    /// libpq is in pipeline mode.
    in_pipeline: bool,
    write_watched: bool,
    reading_paused: bool,
    /// The client encoding last found safe (see check_encoding).
    safe_encoding: Option<std::ffi::c_int>,
    /// When the query in front of the queue started, as far as the event
    /// loop can tell (opening, sent to an empty queue, or the one before it
    /// finished), and how many had finished then.
    head_since: ngx_msec_t,
    head_finished: u64,
    /// TCP_CORK is on until the end of this pass of the event loop, so that
    /// the queries of the pass go out together (see batch.rs).
    corked: bool,
    /// With libpq 17 and later: what the pass's queries put in libpq's
    /// buffer is written at the end of the pass, in one write.
    deferred: bool,
    /// Its gauges are to be brought up to date at the end of the pass.
    pub show_due: bool,
    /// The socket takes TCP_CORK (not a Unix socket).
    corkable: bool,
    /// Statements go out unnamed: the pool found the server's sessions
    /// shared (a pooler in transaction mode).
    pub unnamed: bool,
    /// The session's PID asked of the server once it is up (see
    /// ConnPool::check_pooler): sent, and not answered yet.
    pub checking_pid: bool,
    /// A step of the connect (PQconnectPoll) runs on a thread: nothing
    /// else may use the session meanwhile. `poll_again`: the socket was
    /// ready meanwhile (its event is edge-triggered: step again then).
    pub polling: bool,
    pub poll_again: bool,
    /// The preambles (see Query::preamble) the session holds prepared, by
    /// name (as many as the configuration has texts at most).
    pub preambles: Vec<Rc<CString>>,
    /// The prepared preamble each request in flight sent by name.
    pub sent_preambles: Vec<(ReqToken, Rc<CString>)>,
    /// The session's cancel key (None: its queries cannot be cancelled).
    pub cancel_key: Option<CancelKey>,
    pub canceller: Option<Canceller>,
    /// The timer after which a cancel request is sent again (made when
    /// first needed; see Pipeline::cancel_again).
    pub cancel_timer: Option<RetryTimer>,
    /// The session's PID, asked of the server when it started, was the
    /// one libpq reported (PostgreSQL's own session, no pooler between):
    /// its backend can be ended by PID from another session.
    pub pid_checked: bool,
    /// The connection string it was opened with (for a session of its own
    /// that ends its backend, see terminate.rs).
    pub conninfo: CString,
    /// Fault injection only (NGX_GATEWAY_HOLD_QUERY): what libpq holds is
    /// not sent until the next cancel request is through.
    pub held: bool,
    /// The server's role this session last reported (followed only once
    /// requests with a `sqldb_target` come).
    pub role: Option<Role>,
    /// The upstream's name, for the metrics.
    pub upstream: Rc<str>,
    /// What the shared gauges count of it now.
    shown: Shown,
    /// What the session holds of the roles the gateway sets (session.rs).
    pub session: SessionState,
    /// `sqldb_keep_role`: the session may keep a token's role.
    pub keep_role: bool,
}

/// A connection's share of the gauges (`gateway_status`): its state and
/// the requests queued on it, as last added.
#[derive(Debug, Default)]
struct Shown {
    state: Option<&'static str>,
    depth: i64,
    /// The connection's series (by state, and the depth's).
    known: Memo<&'static str>,
}

impl Conn {
    pub fn new(
        pg: PgConn,
        socket: Socket,
        id: ConnId,
        pool: NonNull<ConnPool>,
        addr: usize,
        name: String,
        pipeline: Pipeline<ReqToken>,
    ) -> Conn {
        Conn {
            pg,
            socket,
            id,
            pool,
            addr,
            name,
            pipeline,
            queries: Vec::new(),
            in_pipeline: false,
            write_watched: false,
            reading_paused: false,
            safe_encoding: None,
            head_since: current_msec(),
            head_finished: 0,
            corked: false,
            deferred: false,
            show_due: false,
            corkable: true,
            unnamed: false,
            checking_pid: false,
            polling: false,
            poll_again: false,
            preambles: Vec::new(),
            sent_preambles: Vec::new(),
            cancel_key: None,
            canceller: None,
            cancel_timer: None,
            pid_checked: false,
            conninfo: CString::default(),
            held: false,
            upstream: Rc::from(""),
            shown: Shown::default(),
            role: None,
            session: SessionState::default(),
            keep_role: true,
        }
    }

    /// The session is PostgreSQL's own (no pooler between): it may keep
    /// a role between requests (session.rs).
    fn owns_session(&self) -> bool {
        self.pid_checked && !self.unnamed && self.keep_role
    }

    /// The server's role as this session reports it (see
    /// SessionState::server_role).
    pub fn server_role(&self) -> Role {
        self.session.server_role(self.pg.role())
    }

    /// Brings the gauges up to date with the connection (None: it closes).
    pub fn show(&mut self, open: bool) {
        let (state, depth) = match open {
            false => (None, 0),
            true if self.pipeline.is_connecting() => (Some("connecting"), self.pipeline.depth() as i64),
            true if self.pipeline.is_idle() => (Some("idle"), 0),
            true => (Some("busy"), self.pipeline.depth() as i64),
        };
        let labels = [&*self.upstream, self.name.as_str()];
        if state != self.shown.state {
            for (s, delta) in [(self.shown.state, -1), (state, 1)] {
                if let Some(s) = s {
                    metrics::add_known(
                        &mut self.shown.known,
                        s,
                        Id::SqldbConnections,
                        &[labels[0], labels[1], s],
                        delta,
                    );
                }
            }
            self.shown.state = state;
        }
        if depth != self.shown.depth {
            let delta = depth - self.shown.depth;
            metrics::add_known(&mut self.shown.known, "", Id::SqldbPipelineDepth, &labels, delta);
            self.shown.depth = depth;
        }
    }

    /// After a step of the connect: libpq closed its socket and made
    /// another (the server refused TLS with sslmode=prefer and it tries
    /// without, or the next address), which nginx does not watch yet.
    pub fn socket_replaced(&self) -> bool {
        self.pg.connect_started() || self.pg.socket() != self.socket.fd()
    }

    /// Watches the socket for writability only while libpq has bytes to send.
    /// libpq made a new socket while connecting: watched from now on as
    /// the old one was (reads; writes as want_write asks next).
    pub fn follow_new_socket(&mut self) -> bool {
        if !self.socket.follow(self.pg.socket()) {
            return false;
        }
        self.write_watched = false;
        self.reading_paused = false;
        self.corkable = true;
        self.socket.watch_read(true)
    }

    pub fn want_write(&mut self, on: bool) -> bool {
        if on != self.write_watched {
            if !self.socket.watch_write(on) {
                return false;
            }
            self.write_watched = on;
        }
        true
    }

    /// Stops (or resumes) reading the socket while a streamed request's
    /// client catches up.
    pub fn pause_reading(&mut self, pause: bool) -> bool {
        if pause != self.reading_paused {
            if !self.socket.watch_read(!pause) {
                return false;
            }
            self.reading_paused = pause;
        }
        true
    }

    /// Pushes out what libpq holds; watches writability while it cannot.
    /// (Held back until the pass's end while the pass defers its writes.)
    pub fn flush(&mut self) -> Result<(), PqError> {
        if self.held || self.deferred {
            return Ok(());
        }
        let more = self.pg.flush()?;
        if self.want_write(more) {
            Ok(())
        } else {
            Err(PqError("event error".into()))
        }
    }

    /// How long the query in front of the queue has been running (0 with
    /// nothing queued).
    pub fn head_age(&self, now: ngx_msec_t) -> ngx_msec_t {
        if self.pipeline.depth() == 0 {
            0
        } else {
            now.wrapping_sub(self.head_since)
        }
    }

    /// The template of the query at the front of the queue.
    pub fn front_template(&self) -> Option<Rc<Statement>> {
        let req = self.pipeline.front()?;
        self.queries
            .iter()
            .find(|(r, _)| *r == req)
            .map(|(_, q)| q.template.clone())
    }

    /// Results were read: if the front of the queue moved, the query now
    /// there started about now, and the one that was there (`front`) ran
    /// until now: its template learns whether that was `long`.
    pub fn progressed(&mut self, front: Option<Rc<Statement>>, long: ngx_msec_t) {
        let finished = self.pipeline.finished();
        if finished != self.head_finished {
            let now = current_msec();
            if let Some(t) = front {
                t.ran(now.wrapping_sub(self.head_since), long);
            }
            self.head_finished = finished;
            self.head_since = now;
        }
    }

    /// Holds what is written until the end of the event loop's pass: with
    /// libpq 17 and later, libpq's own buffer holds it (its sync points
    /// are queued without a write); before, the kernel does (TCP_CORK),
    /// libpq writing at every sync point.
    fn cork(&mut self) {
        if cfg!(libpq_send_sync) {
            if !self.deferred {
                self.deferred = true;
                super::batch::hold(self.pool, self.id);
            }
            return;
        }
        if self.corked || !self.corkable {
            return;
        }
        if self.socket.cork(true) {
            self.corked = true;
            super::batch::hold(self.pool, self.id);
        } else {
            self.corkable = false;
        }
    }

    /// Sends what was held (the pass is over). A write that fails here is
    /// found by the write event's handler, whose flush fails the same way
    /// and ends the connection as any failed send does.
    pub fn uncork(&mut self) {
        if std::mem::take(&mut self.deferred) && self.flush().is_err() {
            let _ = self.want_write(true);
        }
        if self.corked {
            self.corked = false;
            self.socket.cork(false);
        }
    }

    /// A query goes out: with nothing in flight, it is the front one.
    fn starting(&mut self) {
        self.cork();
        if self.pipeline.nothing_in_flight() {
            self.head_since = current_msec();
        }
    }

    pub fn remember(&mut self, req: ReqToken, query: Rc<Query>) {
        if !self.queries.iter().any(|(r, _)| *r == req) {
            self.queries.push((req, query));
        }
    }

    /// A streamed request (sent, or waiting its turn) is on it: until it
    /// ends the connection serves nothing else.
    pub fn holds_stream(&self) -> bool {
        self.queries.iter().any(|(_, q)| q.streaming)
    }

    pub fn query_of(&self, req: ReqToken) -> Option<Rc<Query>> {
        self.queries.iter().find(|(r, _)| *r == req).map(|(_, q)| q.clone())
    }

    pub fn forget(&mut self, req: ReqToken) {
        self.queries.retain(|(r, _)| *r != req);
        self.sent_preambles.retain(|(r, _)| *r != req);
    }

    /// A request's statement vanished (DEALLOCATE ALL or DISCARD ALL): so
    /// did the preambles prepared before, which are prepared again when
    /// next sent; but the one its sync segment ran (prepared then, or
    /// there) is there.
    /// Those it cannot tell (prepared again since, by other requests) are
    /// returned, to be deallocated (see deallocate_preambles).
    pub fn preambles_vanished(&mut self, req: ReqToken) -> Vec<Rc<CString>> {
        let sent = &self.sent_preambles;
        let (keep, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut self.preambles)
            .into_iter()
            .partition(|n| sent.iter().any(|(r, s)| *r == req && s.as_c_str() == n.as_c_str()));
        self.preambles = keep;
        gone
    }

    /// Deallocates preambles, each in a sync segment of its own (one that
    /// is not there fails alone): none of them is believed there wrongly,
    /// or taken for another's when prepared again.
    pub fn deallocate_preambles(&mut self, names: Vec<Rc<CString>>) -> Result<(), PqError> {
        if names.is_empty() {
            return Ok(());
        }
        self.send_deallocates(names.iter().map(|n| n.as_c_str()))
    }

    /// Sends `DEALLOCATE` for each name, each with a sync point of its own.
    fn send_deallocates<'a>(&mut self, names: impl IntoIterator<Item = &'a CStr>) -> Result<(), PqError> {
        self.starting();
        self.enter_pipeline()?;
        for name in names {
            let sql = CString::new(format!("DEALLOCATE {}", name.to_string_lossy()))
                .map_err(|_| PqError("a statement name with a NUL byte".into()))?;
            self.pipeline.sent_internal();
            self.pg.send_unnamed(&sql, &[], false)?;
            self.pg.pipeline_sync()?;
        }
        self.flush()
    }

    /// Queues the request's query and hands it to libpq, choosing the
    /// protocol: a constant statement is prepared once per connection and
    /// executed by name, another single statement runs as the unnamed
    /// statement, both in pipeline mode with the request's own sync point;
    /// several statements need the simple protocol, outside pipeline mode.
    /// Queued first, so that a failed send fails it with the others.
    pub fn send(&mut self, req: ReqToken, q: &Query) -> Result<(), PqError> {
        self.starting();
        if q.several || q.changes_session {
            self.pipeline.touch_session();
        }
        if q.several {
            // The request side never sends a preamble with several
            // statements (its role would not bind them all).
            if q.preamble.is_some() {
                return Err(PqError("a role or settings for a query of several statements".into()));
            }
            let standby = self.pg.role().hot_standby == Some(true);
            let prefix = self.session.several_prefix(self.owns_session(), standby, req);
            self.pipeline.sent(req, Mode::Simple, q.streaming);
            self.check_encoding()?;
            if self.in_pipeline {
                self.pg.exit_pipeline()?;
                self.in_pipeline = false;
            }
            match prefix {
                None => self.pg.send_query(&q.sql)?,
                Some(prefix) => {
                    let mut sql = prefix.as_bytes().to_vec();
                    sql.extend_from_slice(q.sql.to_bytes());
                    let sql = CString::new(sql).map_err(|_| PqError("a query with a NUL byte".into()))?;
                    self.pg.send_query(&sql)?;
                }
            }
        } else {
            let statement = q.statement.as_deref().filter(|_| !self.unnamed);
            let plan = self.session.plan(self.owns_session(), req, q);
            // The preamble: prepared once per connection and executed by
            // name (unnamed where sessions are shared).
            let pre = match &plan.before {
                None => 0,
                Some(p) if self.unnamed || !p.named => 1,
                Some(p) if self.preambles.iter().any(|n| n.as_c_str() == p.name.as_c_str()) => 1,
                Some(_) => 2,
            };
            if plan.reset_read_only || plan.reset_session {
                self.pipeline.sent_internal();
            }
            let wire = self
                .pipeline
                .sent_statement_with(req, statement.map(|s| s.id), q.streaming, pre);
            self.check_encoding()?;
            self.enter_pipeline()?;
            if plan.reset_read_only {
                self.pg.send_unnamed(RESET_READ_ONLY, &[], false)?;
                self.pg.pipeline_sync()?;
            }
            if plan.reset_session {
                self.pg.send_unnamed(RESET_SESSION, &[], false)?;
                self.pg.pipeline_sync()?;
            }
            let live = &self.queries;
            self.sent_preambles
                .retain(|(r, _)| *r != req && live.iter().any(|(l, _)| l == r));
            if let Some(p) = plan.before.as_ref().filter(|p| p.named && !self.unnamed) {
                self.sent_preambles.push((req, p.name.clone()));
            }
            if let Some(p) = &plan.before {
                match pre {
                    2 => {
                        self.pg.send_prepare(&p.name, &p.sql)?;
                        self.preambles.push(p.name.clone());
                        self.pg.send_prepared(&p.name, p.params, false)?;
                    }
                    _ if self.unnamed || !p.named => self.pg.send_unnamed(&p.sql, p.params, false)?,
                    _ => self.pg.send_prepared(&p.name, p.params, false)?,
                }
            }
            match (wire, statement) {
                (Wire::PrepareAndExecute, Some(s)) => {
                    metrics::add(Id::SqldbPrepares, &[&self.upstream], 1);
                    self.pg.send_prepare(&s.name, &q.sql)?;
                    self.pg.send_prepared(&s.name, &q.params, q.binary)?;
                }
                (Wire::Execute, Some(s)) => self.pg.send_prepared(&s.name, &q.params, q.binary)?,
                _ => self.pg.send_unnamed(&q.sql, &q.params, q.binary)?,
            }
            if self.hold_for_test(&q.sql) {
                return Ok(());
            }
            self.pg.pipeline_sync()?;
        }
        self.flush()
    }

    /// Fault injection (NGX_GATEWAY_HOLD_QUERY=<text>): a pipelined query
    /// whose text holds <text> is not sent until the next cancel request
    /// on the connection is through, so that the cancel request reaches an
    /// idle backend (which drops it) and the query starts after it. libpq
    /// holds its messages (it sends at the sync point, or past 64 kB): the
    /// sync point is added then.
    fn hold_for_test(&mut self, sql: &CStr) -> bool {
        let hold = fault_setting("NGX_GATEWAY_HOLD_QUERY")
            .is_some_and(|mark| sql.to_bytes().windows(mark.len()).any(|w| w == mark.as_bytes()));
        self.held |= hold;
        hold
    }

    /// Sends a query held back (see hold_for_test), with its sync point.
    pub fn release_held(&mut self) -> Result<(), PqError> {
        if !std::mem::take(&mut self.held) {
            return Ok(());
        }
        self.pg.pipeline_sync()?;
        self.flush()
    }

    /// Starts the timer after which a cancel request is sent again (again
    /// from the start, if it runs): `handler` runs then, with this Conn as
    /// the timer's data.
    pub fn cancel_later(&mut self, ms: ngx_msec_t, handler: ngx_event_handler_pt) {
        let data: *mut Conn = self;
        let timer = self
            .cancel_timer
            .get_or_insert_with(|| RetryTimer::new(data.cast(), handler));
        timer.stop();
        timer.start(ms);
    }

    /// Escaped values (sqldb_escape) are quoted byte by byte, which is safe
    /// only if no character of the session's encoding can hold a quote's
    /// byte: however such an encoding came (options, a service file, a
    /// `SET` in a template), that session is not used.
    /// The name is looked at only when the encoding's number changes (it
    /// is checked before every query).
    pub fn check_encoding(&mut self) -> Result<(), PqError> {
        let id = self.pg.client_encoding_id();
        if self.safe_encoding == Some(id) {
            return Ok(());
        }
        let encoding = PgConn::encoding_name(id);
        if gateway_core::conninfo::unsafe_encoding(&encoding) {
            return Err(PqError(format!(
                "the session's client_encoding is {encoding}, in which quoting values byte by byte is unsafe; the connection is closed"
            )));
        }
        self.safe_encoding = Some(id);
        Ok(())
    }

    fn enter_pipeline(&mut self) -> Result<(), PqError> {
        if !self.in_pipeline {
            self.pg.enter_pipeline()?;
            self.in_pipeline = true;
        }
        Ok(())
    }

    /// Sends `DEALLOCATE` for the request's statement (its plan no longer
    /// fits), with its own sync point, ahead of the request's new prepare.
    pub fn deallocate(&mut self, req: ReqToken) -> Result<(), PqError> {
        let Some(q) = self.query_of(req) else { return Ok(()) };
        let Some(s) = q.statement.clone() else { return Ok(()) };
        self.send_deallocates([s.name.as_c_str()])
    }

    /// An idle connection is still open at the server's end: nothing to
    /// read, or only messages of no consequence (parameter changes). A
    /// connection the server closed (restart, pg_terminate_backend) is found
    /// here before a query is sent on it.
    pub fn alive(&mut self) -> bool {
        let peek = |fd| {
            let mut b = 0u8;
            // SAFETY: the socket is open (libpq owns it); a 1-byte peek that never blocks.
            let n = unsafe { libc::recv(fd, (&mut b as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
            match n {
                0 => Some(false),
                n if n > 0 => None,
                _ => Some(matches!(
                    std::io::Error::last_os_error().raw_os_error(),
                    Some(libc::EAGAIN | libc::EINTR)
                )),
            }
        };
        let fd = self.socket.fd();
        if let Some(verdict) = peek(fd) {
            return verdict;
        }
        // Bytes on an idle session: libpq reads them (a FATAL message before
        // the end, or a parameter change).
        if self.pg.consume_input().is_err() || self.pg.is_bad() {
            return false;
        }
        let _ = self.pg.is_busy();
        !self.pg.is_bad() && peek(fd) != Some(false)
    }

    /// Idle in the pool (nginx may close it on shutdown), with the idle timeout.
    pub fn set_idle(&mut self, idle: Option<ngx_msec_t>) {
        self.socket.set_idle(idle.is_some());
        self.set_timer(idle);
    }

    /// Arms or clears the connection's own timer (idle, or draining).
    pub fn set_timer(&mut self, ms: Option<ngx_msec_t>) {
        match ms {
            Some(ms) => self.socket.read().add_timer(ms),
            None => self.socket.read().del_timer(),
        }
    }

    /// Healthy enough to go back to the pool.
    pub fn reusable(&mut self) -> bool {
        !self.pg.is_bad() && self.pg.is_idle_outside_transaction() && self.want_write(false)
    }
}
