//! The database driver: per worker and upstream, a pool of libpq
//! connections driven by nginx's events, each carrying the queries of
//! several requests (libpq's pipeline mode) and routing each result to its
//! request (core::pipeline). It knows nothing about HTTP: requests are
//! opaque tokens, results and outcomes go back through a `Sink`.

mod batch;
mod cancel;
mod cancelling;
mod conn;
mod connect;
mod events;
mod listen;
mod pool;
pub mod pq;
mod session;
mod spare;
mod terminate;
pub mod worker;

use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::rc::Rc;

use gateway_core::pipeline::Lost;
use gateway_core::slab::Key;
use gateway_core::target::Target;

pub use crate::common::token::ReqToken;

use crate::ffi::{ngx_msec_t, Event};
use conn::Conn;

pub use listen::Listener;
pub use pool::{ConnPool, Pick, Settings, Submitted, RECHECK};
pub use pq::{check_conninfo, PgResult, PqError, ResultKind};
pub use session::{settings_calls, SessionTexts, Text};

/// A connection of a pool (stale once the connection is closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnId(Key);

/// A statement prepared once per connection: its template's number and name.
#[derive(Debug)]
pub struct Statement {
    pub id: u32,
    pub name: CString,
    /// Its query ran long at the front of a connection's queue lately
    /// (counts down with each run that did not): it runs alone, so that no
    /// request is pipelined behind it. A template starts so, until a run
    /// shows it is not long: no request is pipelined behind a query whose
    /// time nobody knows yet.
    pub slow: Cell<u8>,
}

impl Statement {
    pub fn new(id: u32, name: CString) -> Statement {
        Statement {
            id,
            name,
            slow: Cell::new(1),
        }
    }

    /// A run of its query took `ms` at the front of the queue.
    pub fn ran(&self, ms: ngx_msec_t, long: ngx_msec_t) {
        let v = self.slow.get();
        if ms >= long {
            self.slow.set(SLOW_MEMORY);
        } else if v > 0 {
            self.slow.set(v - 1);
        }
    }
}

/// How many runs that are not long a template takes to lose its slow mark.
const SLOW_MEMORY: u8 = 8;

impl Query {
    /// It needs the connection to itself: nothing pipelined with it.
    pub fn alone(&self) -> bool {
        self.several || self.streaming || self.changes_session || self.slow
    }
}

/// A query's SQL text: its template's own, the same for every request (a
/// template without untyped variables), or the one built for the request.
#[derive(Debug)]
pub enum SqlText {
    Shared(Rc<CStr>),
    Built(CString),
}

impl std::ops::Deref for SqlText {
    type Target = CStr;
    fn deref(&self) -> &CStr {
        match self {
            SqlText::Shared(s) => s,
            SqlText::Built(s) => s,
        }
    }
}

/// What a request asks the database, ready to send.
#[derive(Debug)]
pub struct Query {
    pub sql: SqlText,
    /// Values of the typed parameters, as text.
    pub params: Vec<CString>,
    /// Prepare once per connection and execute by name (a constant
    /// template of one statement, with `sqldb_prepare on`).
    pub statement: Option<Rc<Statement>>,
    /// Several statements: the simple protocol, the connection alone.
    pub several: bool,
    /// Results in PostgreSQL's binary format.
    pub binary: bool,
    /// Rows one by one (single-row mode), for a streamed response.
    pub streaming: bool,
    /// `sqldb_stream_connections` of its location (None: the default, half
    /// of `sqldb_keepalive max`): a stream starts only while streams hold
    /// fewer connections of the pool than this.
    pub stream_connections: Option<usize>,
    /// It may change its session beyond its sync point (a transaction, a
    /// setting, a COPY): it needs the connection to itself.
    pub changes_session: bool,
    /// Its template: what its runs teach (see Statement::slow).
    pub template: Rc<Statement>,
    /// The template was slow when the request came: it runs alone.
    pub slow: bool,
    /// `sqldb_target`: the role its server must have (`any` once a
    /// `prefer-standby` request takes the primary it skipped: no standby
    /// could be had).
    pub target: Cell<Target>,
    /// Sent before the query in its sync segment (the same implicit
    /// transaction): the role and settings of `sqldb_jwt_key` and
    /// `sqldb_setting`, as `set_config(..., true)`.
    pub preamble: Option<Preamble>,
}

/// A statement that runs before a request's query, in its transaction.
#[derive(Debug)]
pub struct Preamble {
    /// Its text where the session keeps nothing between requests (see
    /// session.rs): the role and settings for the transaction only.
    pub sql: Rc<CString>,
    /// Its name, when prepared once per connection.
    pub name: Rc<CString>,
    /// Prepared once per connection (`sqldb_prepare on`), else unnamed.
    pub named: bool,
    /// The role and the claims first (`with_role`), then each setting's
    /// name and value.
    pub params: Vec<CString>,
    pub with_role: bool,
    /// Its transaction is read-only (GET and HEAD with a role).
    pub read_only: bool,
    /// Its texts where the session keeps the role.
    pub session: Rc<SessionTexts>,
}

/// What the driver tells the request side.
#[derive(Debug)]
pub enum Delivery {
    /// The request's query went out (it had waited for the connection;
    /// true: while it was connecting).
    Started(ReqToken, bool),
    /// A whole result (with several statements, the last one counts).
    Result(ReqToken, PgResult),
    /// An error of the query (the first one counts).
    Error(ReqToken, PgResult),
    /// Every result of the request is in.
    Complete(ReqToken),
    /// The request lost its connection: what it may do next, and why.
    Failed(ReqToken, Lost, String),
    /// The query cannot be served (it started a COPY).
    Refused(ReqToken, String),
    /// The request's preamble failed (its role cannot be set): the
    /// query did not run.
    PreambleFailed(ReqToken, PgResult),
    /// The connection came up to a server that does not meet the request's
    /// `sqldb_target` (what the server is said): the query was not sent,
    /// the request tries another server.
    Unfit(ReqToken, String),
}

/// Whether reading the connection goes on after a streamed row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowVerdict {
    Continue,
    /// The request's client is behind: stop reading until `ConnPool::resume`.
    Pause,
}

/// The request side, as the driver calls it.
pub trait Sink {
    /// A row of a streamed request, as it is read. It must not call the
    /// driver back (the driver is in the middle of reading).
    fn row(&self, req: ReqToken, res: &PgResult) -> RowVerdict;

    /// Results and outcomes, once the driver is done with the event: it
    /// takes them all, and the list is left empty.
    fn deliver(&self, out: &mut Vec<Delivery>);
}

/// Runs `f` with the pool behind an event of one of its sockets, lent for
/// the call (worker::lend), and the connection's id.
///
/// # Safety
/// `ev` must be an event nginx passes to a handler of a database
/// connection's socket (or of its cancel request's): its connection's data
/// is the live `Conn`, boxed in its pool.
unsafe fn with_owner<T>(ev: &Event, f: impl FnOnce(&mut ConnPool, ConnId) -> T) -> T {
    // SAFETY: see above: the connection's data is the Conn (set when it was
    // opened, and the socket is released before the Conn is freed).
    let (pool, id) = unsafe {
        let conn = &*(ev.connection_data() as *const Conn);
        (conn.pool, conn.id)
    };
    // SAFETY: a Conn's pool is the worker's pool that owns it (worker).
    unsafe { worker::lend(pool, |p| f(p, id)) }
}

thread_local! {
    /// An empty list with room, kept from one event to the next: each
    /// event's results would otherwise grow a list of their own.
    static SPARE: Cell<Vec<Delivery>> = const { Cell::new(Vec::new()) };
}

/// A list to collect an event's results and outcomes in.
fn out_list() -> Vec<Delivery> {
    SPARE.take()
}

/// Hands results and outcomes to the request side (no reference to the
/// pool is held meanwhile: the request side may use it); the emptied list
/// is kept for the next event.
fn deliver(sink: Option<&'static dyn Sink>, mut out: Vec<Delivery>) {
    if let (Some(sink), false) = (sink, out.is_empty()) {
        sink.deliver(&mut out);
    }
    out.clear();
    SPARE.set(out);
}
