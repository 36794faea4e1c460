//! The pool of one upstream in one worker: every connection belongs to it
//! for its whole life; requests pick one (idle, shared in pipeline mode,
//! or new) and queue their queries on it.

use std::ffi::CStr;
use std::ptr::NonNull;
use std::rc::Rc;

use gateway_core::pipeline::{Join, Pipeline};
use gateway_core::slab::Slab;
use gateway_core::target::{Role, Target, Verdict};

use super::conn::Conn;
use super::pq::PgConn;
use super::terminate::Terminator;
use super::{ConnId, Delivery, Query, ReqToken, Sink};
use crate::ffi::*;
use crate::sqldb::error::{Error, Kind};
use crate::{debug, log};

/// `sqldb_keepalive` and `sqldb_pipeline`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Idle connections kept at most; open connections before requests are
    /// pipelined onto busy ones (or rejected). 0: no keepalive.
    pub max: usize,
    /// Any idle connection serves a request, whatever server the balancer picks.
    pub single: bool,
    /// With no connection to spare: 503 rather than opening more.
    pub reject: bool,
    pub idle_timeout: ngx_msec_t,
    /// Requests one connection serves before it is closed (0: no limit).
    pub max_requests: u64,
    /// Queue requests onto busy connections (libpq pipeline mode).
    pub pipelining: bool,
    /// A busy connection takes more requests while fewer than this many
    /// are queued on it...
    pub depth: usize,
    /// ...and the query in front of its queue has run less than this (ms).
    /// Past either, the pool opens another connection (up to `max`).
    pub slow: ngx_msec_t,
    /// `sqldb_keep_role`: sessions may keep a token's role between
    /// requests (session.rs).
    pub keep_role: bool,
}

/// Defaults of `sqldb_pipeline`'s `depth=` and `slow=` (see `make bench`).
pub const DEFAULT_DEPTH: usize = 8;
pub const DEFAULT_SLOW: ngx_msec_t = 5;
/// A query that runs this many times `slow` at the front of its queue
/// marks its template: its next requests run alone (see Statement::slow).
pub const LONG_FACTOR: ngx_msec_t = 4;

impl Settings {
    /// How long a query at the front of its queue marks its template slow.
    pub fn long(&self) -> ngx_msec_t {
        self.slow.saturating_mul(LONG_FACTOR)
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max: 10,
            single: false,
            reject: false,
            idle_timeout: 60_000,
            max_requests: 0,
            pipelining: true,
            depth: DEFAULT_DEPTH,
            slow: DEFAULT_SLOW,
            keep_role: true,
        }
    }
}

/// What a request gets from the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// An idle connection (to the address asked for, or any in single mode).
    Idle(ConnId),
    /// A busy connection in pipeline mode, or one still connecting or
    /// draining, to queue behind its requests.
    Share(ConnId),
    /// Every connection the pool may open is busy and none can take the
    /// request now (pipelining on): it waits on the least busy one and
    /// goes out once that one can serve it.
    Behind(ConnId),
    /// Open a new connection.
    New,
    /// `overflow=reject` and nothing free.
    Reject,
}

/// Whether a submitted query went out or waits for its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitted {
    Sent,
    Waiting { connecting: bool },
}

pub struct ConnPool {
    pub settings: Settings,
    pub(super) conns: Slab<Box<Conn>>,
    /// Idle ones, most recently used last.
    pub(super) idle: Vec<ConnId>,
    pub(super) sink: Option<&'static dyn Sink>,
    /// The server's sessions turned out shared (a pooler in transaction
    /// mode): no named statements on this upstream in this worker.
    pub(super) statements_off: bool,
    /// A session's PID was not the one its connection reported: a pooler
    /// stands between (and `pooler_told`: the log said so).
    pub(super) pooler: bool,
    pub(super) pooler_told: bool,
    /// The upstream's name (for the metrics).
    pub name: Rc<str>,
    /// Servers (address indexes) whose connection was lost: the next one
    /// that opens counts as a reconnect.
    pub(super) lost: Vec<usize>,
    /// A request with a `sqldb_target` came: the roles that connections
    /// report are followed (until then nothing is looked at).
    pub(super) track_roles: bool,
    /// What this worker knows of each server's role, by address index.
    roles: Vec<Known>,
    /// How many server addresses the upstream has (address indexes
    /// 0..servers).
    pub servers: usize,
    /// Sessions of their own that end the backends of connections closed
    /// while a query of a request that is gone ran on them.
    pub(super) terminators: Slab<Box<Terminator>>,
    /// Fires `slow` after a query went out: a spare connection opens then
    /// if every connection is held by a long query (see spare.rs).
    pub(super) spare_timer: Option<RetryTimer>,
}

/// A server's role as last reported to this worker, and when it was
/// learned (a new session's first report, a change reported, or a session
/// that read a sync point and so is up to date).
#[derive(Debug, Clone, Copy, Default)]
struct Known {
    role: Option<Role>,
    at: ngx_msec_t,
}

/// A role learned longer ago than this (ms) may be out of date (a standby
/// promoted reports it only to sessions that run a query afterwards): when
/// no server meets a request's target, the server whose role is the oldest
/// is asked again, with a new connection.
pub const RECHECK: ngx_msec_t = 500;

impl ConnPool {
    pub fn new(settings: Settings) -> ConnPool {
        ConnPool {
            settings,
            conns: Slab::default(),
            idle: Vec::new(),
            sink: None,
            statements_off: false,
            pooler: false,
            pooler_told: false,
            name: Rc::from(""),
            lost: Vec::new(),
            track_roles: false,
            roles: Vec::new(),
            servers: 0,
            terminators: Slab::default(),
            spare_timer: None,
        }
    }

    /// Requests with a target come: follow the roles servers report.
    pub fn track_roles(&mut self) {
        self.track_roles = true;
    }

    /// The role last learned of a server, and when. With nothing learned
    /// yet, a session to it that is up says it (connections opened before
    /// roles were followed).
    fn server_role(&mut self, addr: usize) -> Option<(Role, ngx_msec_t)> {
        if let Some(k) = self.roles.get(addr) {
            if let Some(role) = k.role {
                return Some((role, k.at));
            }
        }
        let role = self
            .conns
            .iter()
            .find(|(_, c)| c.addr == addr && !c.pipeline.is_connecting() && !c.pipeline.is_closed() && !c.pg.is_bad())
            .map(|(_, c)| c.server_role())?;
        let now = current_msec();
        self.learn(addr, role, now);
        Some((role, now))
    }

    fn learn(&mut self, addr: usize, role: Role, at: ngx_msec_t) {
        if self.roles.len() <= addr {
            self.roles.resize(addr + 1, Known::default());
        }
        self.roles[addr] = Known { role: Some(role), at };
    }

    /// A connection to the server failed or was lost: what was known of its
    /// role is not trusted any more (it is learned again from the next
    /// session, so a server that comes back is tried, never shunned).
    pub(super) fn forget_role(&mut self, addr: usize) {
        if let Some(k) = self.roles.get_mut(addr) {
            k.role = None;
        }
    }

    /// Some server is known to be a standby (what `prefer-standby` prefers).
    pub fn standby_known(&self) -> bool {
        self.roles
            .iter()
            .any(|k| k.role.is_some_and(|r| r.hot_standby == Some(true)))
    }

    /// A standby may yet be had (what `prefer-standby` waits for): one is
    /// known, or some server's role is not known yet (never reported to
    /// this worker, or forgotten when its connection failed). Such a server
    /// is tried before a known primary takes the request, so that a fresh
    /// worker learns where its standby is before it sends reads elsewhere;
    /// whether a server that failed is tried again is nginx's `max_fails`
    /// and `fail_timeout`.
    pub fn standby_hope(&mut self) -> bool {
        self.standby_known() || (0..self.servers).any(|a| self.server_role(a).is_none())
    }

    /// What to do with the server at `addr` for a request's target, and
    /// when its role was learned (now, when not known).
    pub fn verdict(&mut self, addr: usize, target: Target) -> (Verdict, ngx_msec_t) {
        if target.is_any() {
            return (Verdict::Meets, 0);
        }
        let standby_hope = self.standby_hope();
        match self.server_role(addr) {
            Some((role, at)) => (target.judge(Some(role), standby_hope), at),
            None => (Verdict::Unknown, current_msec()),
        }
    }

    /// A connection read from its server (it came up, or results came):
    /// the role it reports. `current`: the session has just started, or
    /// has just read a sync point (the server reports a change before it):
    /// what it says is the server's role now. A change it reports is news
    /// too; otherwise the same report again is not (an idle session hears
    /// of a promotion only after its next query).
    pub(super) fn observe_role(&mut self, id: ConnId, current: bool) {
        if !self.track_roles {
            return;
        }
        let Some(c) = self.conn(id) else { return };
        let role = c.server_role();
        if !current && c.role == Some(role) {
            return;
        }
        c.role = Some(role);
        let addr = c.addr;
        let before = self.roles.get(addr).and_then(|k| k.role);
        self.learn(addr, role, current_msec());
        if before.is_some_and(|b| b.hot_standby != role.hot_standby || b.read_only != role.read_only) {
            if let Some(c) = self.conns.get(id.0) {
                log!(
                    NGX_LOG_NOTICE,
                    Log::cycle(),
                    "sqldb: {} now reports being {}",
                    c.name,
                    role.describe()
                );
            }
        }
    }

    /// Room for a connection that learns a server's role: at `max`, an
    /// idle connection goes (one to `addr` first, whose role is in doubt).
    pub fn make_room(&mut self, addr: usize) {
        let max = self.settings.max;
        if max == 0 || self.conns.len() < max {
            return;
        }
        let victim = self
            .idle
            .iter()
            .position(|&id| self.addr_of(id) == Some(addr))
            .or((!self.idle.is_empty()).then_some(0));
        if let Some(i) = victim {
            let id = self.idle[i];
            self.close(id);
        }
    }

    /// Where results and outcomes of this pool's connections go.
    pub fn set_sink(&mut self, sink: &'static dyn Sink) {
        self.sink = Some(sink);
    }

    pub(super) fn conn(&mut self, id: ConnId) -> Option<&mut Conn> {
        self.conns.get_mut(id.0).map(|b| &mut **b)
    }

    /// The connection is still connecting.
    pub fn is_connecting(&self, id: ConnId) -> bool {
        self.conns.get(id.0).is_some_and(|c| c.pipeline.is_connecting())
    }

    /// The server address a connection goes to.
    pub fn addr_of(&self, id: ConnId) -> Option<usize> {
        self.conns.get(id.0).map(|c| c.addr)
    }

    /// How many connections streams hold: a streamed request is on each,
    /// sent or waiting its turn.
    pub fn stream_held(&self) -> usize {
        self.conns.iter().filter(|(_, c)| c.holds_stream()).count()
    }

    /// The most connections streams may hold for a stream of a location
    /// with this `sqldb_stream_connections` to start: the value set, else
    /// half of `max` (at least one). None: no bound (`sqldb_keepalive off`
    /// and no value set: each request has a connection of its own).
    pub fn stream_bound(&self, set: Option<usize>) -> Option<usize> {
        match (set, self.settings.max) {
            (Some(n), _) => Some(n),
            (None, 0) => None,
            (None, max) => Some((max / 2).max(1)),
        }
    }

    /// Where a request goes. `addr` is the balancer's choice (None: any,
    /// single mode). The query says whether it needs the connection to
    /// itself (several statements, a stream), and its target: with `addr`
    /// None, only a connection to a server known to meet it (with an
    /// address, the caller chose the server for it).
    ///
    /// A stream starts only while streams hold fewer connections than its
    /// bound (`stream_bound`), so that slow readers cannot hold the whole
    /// pool: past it, it waits behind a stream on a connection to its
    /// server (`overflow=reject`: 503). With no stream on a connection to
    /// its server (the streams that fill the bound are all on the
    /// upstream's other servers) it starts: past the bound, streams hold at
    /// most one more connection per further server.
    pub fn pick(&mut self, addr: Option<usize>, query: &Query) -> Pick {
        let (alone, target) = (query.alone(), query.target.get());
        if query.streaming {
            if let Some(pick) = self.over_stream_bound(addr, query.stream_connections) {
                return pick;
            }
        }
        if !alone && self.settings.pipelining && self.settings.max != 0 {
            if let Some(id) = self.shallow(addr) {
                return Pick::Share(id);
            }
        }
        // (Single mode: only the idle connections of servers known to fit;
        // none, and the balancer's server is tried.)
        let standby_hope = !target.is_any() && self.standby_hope();
        let fits = |pool: &ConnPool, id: &ConnId| match addr {
            Some(want) => pool.addr_of(*id) == Some(want),
            None if target.is_any() => true,
            None => pool
                .addr_of(*id)
                .and_then(|a| pool.roles.get(a))
                .and_then(|k| k.role)
                .is_some_and(|r| target.meets(r, standby_hope)),
        };
        while let Some(i) = self.idle.iter().rposition(|id| fits(self, id)) {
            let id = self.idle.remove(i);
            let Some(c) = self.conn(id) else { continue };
            if !c.alive() {
                // Closed by the server a moment ago: no query was sent on it.
                log!(
                    NGX_LOG_INFO,
                    Log::cycle(),
                    "sqldb: idle connection to {} closed by the server",
                    c.name
                );
                let addr = c.addr;
                self.lost(id);
                self.forget_role(addr);
                self.close(id);
                continue;
            }
            if let Err(e) = c.check_encoding() {
                log!(
                    NGX_LOG_ERR,
                    Log::cycle(),
                    "sqldb: idle connection to {}: {}",
                    c.name,
                    e.0
                );
                self.close(id);
                continue;
            }
            c.set_idle(None);
            debug!(
                Log::cycle(),
                "sqldb: pool picks idle connection #{} to {}",
                id.0.as_u64(),
                c.name
            );
            return Pick::Idle(id);
        }
        // A spare still connecting that no request has joined yet is an
        // idle connection to come: the request takes it rather than open
        // another or be turned away (one that needs a connection alone is
        // then the first on it, and goes alone).
        let spare = self.conns.iter().map(|(key, c)| (ConnId(key), c)).find(|(id, c)| {
            c.pipeline.is_connecting() && c.pipeline.depth() == 0 && c.pipeline.shareable() && fits(self, id)
        });
        if let Some((id, _)) = spare {
            self.trace_pick("takes the spare", id);
            return Pick::Share(id);
        }
        let s = &self.settings;
        if s.max == 0 || self.conns.len() < s.max {
            return Pick::New;
        }
        if !alone && s.pipelining {
            // Every connection the pool may open is open: the least busy one
            // whose front query is not slow takes it, however deep.
            let now = current_msec();
            if let Some(id) = self.least_busy(addr, now, |c| c.pipeline.shareable()) {
                self.trace_pick("shares", id);
                return Pick::Share(id);
            }
        }
        if s.reject {
            return Pick::Reject;
        }
        if s.pipelining {
            // The bound holds: the request waits its turn on a connection.
            if let Some(id) = self.least_busy(addr, current_msec(), |c| !c.pipeline.is_closed()) {
                self.trace_pick("queues behind", id);
                return Pick::Behind(id);
            }
        }
        Pick::New
    }

    /// A stream past its bound: where it waits (None: it may start).
    fn over_stream_bound(&self, addr: Option<usize>, set: Option<usize>) -> Option<Pick> {
        let bound = self.stream_bound(set)?;
        let held = self.stream_held();
        if held < bound {
            return None;
        }
        if self.settings.reject {
            debug!(
                Log::cycle(),
                "sqldb: pool turns a stream away: streams hold {held} connections (bound {bound})"
            );
            return Some(Pick::Reject);
        }
        // (Single mode, no server chosen yet: the balancer's server is
        // asked for next.)
        let id = self.least_busy(addr, current_msec(), |c| c.holds_stream() && !c.pipeline.is_closed())?;
        self.trace_pick("queues a stream behind the stream on", id);
        Some(Pick::Behind(id))
    }

    /// A busy connection that a pipelined request should join rather than
    /// take an idle one or open another: its queue is shorter than `depth`
    /// and the query in front of it has run less than `slow`, so that
    /// requests share writes and reads without waiting behind a long query.
    fn shallow(&self, addr: Option<usize>) -> Option<ConnId> {
        let s = &self.settings;
        let now = current_msec();
        // (The cheap tests first: shareable() looks at every queued query.)
        let id = self.least_busy(addr, now, |c| {
            (1..s.depth).contains(&c.pipeline.depth())
                && !c.pipeline.is_draining()
                && c.head_age(now) < s.slow
                && c.pipeline.shareable()
        })?;
        self.trace_pick("shares", id);
        Some(id)
    }

    /// Among the connections to `addr` that `ok` accepts, the one with the
    /// shortest queue; those whose front query is slow last, and of those
    /// the one whose front query has run the shortest time first (a query
    /// that has run for seconds is likely to run on, one just past `slow`
    /// to end soon: a request should not wait behind the first because its
    /// queue is one shorter).
    fn least_busy(&self, addr: Option<usize>, now: ngx_msec_t, ok: impl Fn(&Conn) -> bool) -> Option<ConnId> {
        let slow = self.settings.slow;
        self.conns
            .iter()
            .filter(|(_, c)| addr.is_none_or(|a| c.addr == a) && ok(c))
            .min_by_key(|(_, c)| {
                let age = c.head_age(now);
                if age >= slow {
                    (true, age, c.pipeline.depth())
                } else {
                    (false, 0, c.pipeline.depth())
                }
            })
            .map(|(key, _)| ConnId(key))
    }

    fn trace_pick(&self, how: &str, id: ConnId) {
        if let Some(c) = self.conns.get(id.0) {
            debug!(
                Log::cycle(),
                "sqldb: pool {how} connection #{} to {} ({} queued)",
                id.0.as_u64(),
                c.name,
                c.pipeline.depth()
            );
        }
    }

    /// A request would be turned away (checked before nginx's upstream
    /// starts, so that the answer is 503).
    pub fn full(&self) -> bool {
        let s = &self.settings;
        s.reject
            && s.max > 0
            && self.idle.is_empty()
            && self.conns.len() >= s.max
            && !(s.pipelining && self.conns.iter().any(|(_, c)| c.pipeline.shareable()))
    }

    /// Opens a connection for `creator` (nonblocking: connecting goes on
    /// on nginx's events). `exclusive`: nothing may queue behind it.
    pub fn open(
        &mut self,
        addr: usize,
        conninfo: &CStr,
        name: String,
        creator: ReqToken,
        exclusive: bool,
    ) -> Result<ConnId, Error> {
        self.open_with(addr, conninfo, name, Pipeline::connecting(creator, exclusive))
    }

    /// Opens a connection whose requests are `pipeline`'s (see open).
    pub(super) fn open_with(
        &mut self,
        addr: usize,
        conninfo: &CStr,
        name: String,
        pipeline: Pipeline<ReqToken>,
    ) -> Result<ConnId, Error> {
        let pg = PgConn::start(conninfo)
            .map_err(|e| Error::because(Kind::Connect, format!("connecting to {name} failed: {e}")))?;
        // On failure nginx has logged why ("worker_connections are not enough").
        let socket = Socket::get(pg.socket(), Log::cycle())
            .ok_or_else(|| Error::because(Kind::NoResources, format!("no free connection for {name}")))?;
        socket.set_handler(Some(super::events::conn_event));
        let id = ConnId(self.conns.next_key());
        let pool = NonNull::from(&mut *self);
        let mut conn = Box::new(Conn::new(pg, socket, id, pool, addr, name, pipeline));
        // The events find their connection (boxed: it does not move).
        let data: *mut Conn = &mut *conn;
        conn.socket.set_data(data.cast());
        let key = self.conns.insert(conn);
        debug_assert_eq!(key, id.0);
        let statements_off = self.statements_off;
        let keep_role = self.settings.keep_role;
        let upstream = self.name.clone();
        let c = self.conn(id).expect("just inserted");
        c.unnamed = statements_off;
        c.keep_role = keep_role;
        c.upstream = upstream;
        c.conninfo = conninfo.to_owned();
        c.show(true);
        // libpq starts as if it had asked for writability; the read side is
        // watched for the connection's whole life.
        if !c.socket.watch_read(true) || !c.want_write(true) {
            self.close(id);
            return Err(Error::because(
                Kind::NoResources,
                "cannot watch the database connection",
            ));
        }
        debug!(Log::cycle(), "sqldb: connection #{} opened", key.as_u64());
        Ok(id)
    }

    /// Queues a request's query on its connection: sent now, or when the
    /// connection serves. When sending fails, the connection is gone and
    /// every request on it (this one included) gets its outcome.
    pub fn submit(&mut self, id: ConnId, req: ReqToken, query: Rc<Query>) -> Result<Submitted, Vec<Delivery>> {
        if self.pooler
            && !self.pooler_told
            && (query.statement.is_some() || query.preamble.as_ref().is_some_and(|p| p.named))
        {
            // Said once, when a query would have been prepared: with
            // `sqldb_prepare off` there is nothing to tell.
            self.pooler_told = true;
            let name = self.conn(id).map(|c| c.name.clone()).unwrap_or_default();
            log!(
                NGX_LOG_WARN,
                Log::cycle(),
                "sqldb: {name} is a pooler, not PostgreSQL's own session (the backend PID it reported is not the session's, or the session did not say): \
                 prepared statements are off for this upstream, as anyone who logs in through it could replace them; set \"sqldb_prepare off\""
            );
        }
        let Some(c) = self.conn(id) else {
            return Err(vec![Delivery::Failed(
                req,
                gateway_core::pipeline::Lost::NotSent,
                "the connection closed".into(),
            )]);
        };
        c.remember(req, query.clone());
        let alone = query.alone();
        let submitted = match c.pipeline.join(req, alone) {
            Join::Wait => Ok(Submitted::Waiting {
                connecting: c.pipeline.is_connecting(),
            }),
            Join::SendNow => match c.send(req, &query) {
                Ok(()) => Ok(Submitted::Sent),
                Err(e) => {
                    let mut out = Vec::new();
                    self.broken(id, &format!("sending the query failed: {e}"), &mut out);
                    Err(out)
                }
            },
        };
        self.show(id);
        self.spare_later();
        submitted
    }

    /// Brings the gauges up to date with a connection, if it is still open,
    /// at the end of the event loop's pass (batch.rs): its queue may move
    /// many times in one.
    pub(super) fn show(&mut self, id: ConnId) {
        if let Some(c) = self.conn(id) {
            if !c.show_due {
                c.show_due = true;
                super::batch::show_later(c.pool, id);
            }
        }
    }

    /// The request left (client gone, timeout): its results are dropped
    /// when they come; with nobody left, running queries are cancelled.
    pub fn abandon(&mut self, id: ConnId, req: ReqToken) -> Vec<Delivery> {
        let mut out = Vec::new();
        let Some(c) = self.conn(id) else { return out };
        c.forget(req);
        let steps = c.pipeline.abandon(req);
        self.apply(id, steps, &mut out);
        self.show(id);
        out
    }

    /// A paused stream's client caught up: reading resumes, with the
    /// results libpq already holds.
    pub fn resume(&mut self, id: ConnId) -> Vec<Delivery> {
        let mut out = Vec::new();
        let Some(c) = self.conn(id) else { return out };
        c.pipeline.resume();
        if !c.pause_reading(false) {
            self.broken(id, "event error", &mut out);
            return out;
        }
        self.read_results(id, &mut out);
        self.show(id);
        out
    }

    /// A connection with nothing queued: back to the idle list, or closed
    /// (unhealthy, spent, nginx exiting, too many idle).
    pub(super) fn settle(&mut self, id: ConnId) {
        let (max, max_requests, idle_timeout) = (
            self.settings.max,
            self.settings.max_requests,
            self.settings.idle_timeout,
        );
        let idle_full = self.idle.len() >= max;
        let Some(c) = self.conn(id) else { return };
        if !c.pipeline.is_idle() {
            return;
        }
        let spent = max_requests != 0 && c.pipeline.served() >= max_requests;
        if !c.reusable() || spent || exiting() || idle_full {
            debug!(
                Log::cycle(),
                "sqldb: connection #{} to {} closes instead of idling",
                id.0.as_u64(),
                c.name
            );
            self.close(id);
            return;
        }
        c.set_idle(Some(idle_timeout));
        self.idle.push(id);
    }

    /// Closes a connection: its cancel request, the nginx connection, then
    /// libpq's (which closes the socket).
    pub(super) fn close(&mut self, id: ConnId) {
        self.idle.retain(|&i| i != id);
        let Some(c) = self.conns.remove(id.0) else { return };
        let mut c = *c;
        c.show(false);
        debug!(
            Log::cycle(),
            "sqldb: connection #{} to {} closed",
            id.0.as_u64(),
            c.name
        );
        if let Some(canceller) = c.canceller {
            canceller.close();
        }
        if c.polling {
            // A step of its connect runs on a thread: the socket leaves
            // nginx's events now, the session is finished when the step is
            // back (connect.rs).
            c.socket.release_open();
            super::connect::orphan(c.pg);
            return;
        }
        c.socket.release();
        drop(c.pg);
    }
}
