//! Result routing for one database connection, as a pure state machine:
//! which queued request a result belongs to, where each request's results
//! end, what is sent again and what never is, and what happens to the
//! requests of a connection that is lost or whose requests have gone.
//!
//! The driver feeds it events (the connection is up, a query went out, a
//! result arrived, a request left, the connection was lost, a cancel request
//! finished) and carries out what comes back. Requests are opaque tokens
//! `T`; the machine never sees a query, a result or a request.
//!
//! On the wire (libpq's pipeline mode) each request's queries end with their
//! own sync point: an error aborts that request's queries only. A query of
//! several statements goes through the simple protocol, outside pipeline
//! mode, alone on its connection. A request that is gone stays in the queue
//! without its token, so that its results are read and dropped in order.

mod drain;
mod steps;

pub use steps::Steps;

use std::collections::VecDeque;

/// How the results of one queued request end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The simple protocol (several statements): at the end-of-results mark.
    Simple,
    /// Pipeline mode: at the request's sync point. `preparing`: its first
    /// query prepares the statement that the second executes.
    Pipelined { preparing: bool },
}

/// What one result from libpq is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultKind {
    /// One row of a query in single-row mode.
    Row,
    /// A whole result: rows, a statement without rows, or an empty query.
    Final,
    /// An error the server reported for the query.
    Error(ErrorClass),
    /// The end of one query's results (libpq's NULL result).
    End,
    /// The sync point that ends a request's queries in pipeline mode.
    Sync,
    /// A query skipped after an earlier error before the sync point.
    Aborted,
    /// COPY: a protocol state the gateway cannot carry on from.
    Copy,
}

/// Errors that change what happens to the connection or the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// An error of the statement (syntax, constraint, a bad value ...).
    Statement,
    /// Executing a prepared statement that the session does not have
    /// (DEALLOCATE, DISCARD ALL): nothing ran; it can be prepared again.
    Vanished,
    /// Executing a prepared statement whose plan no longer fits (a schema
    /// change: "cached plan must not change result type"): nothing ran;
    /// the session still holds it, so it is deallocated, then prepared again.
    PlanChanged,
    /// The server is ending the session (shutdown, pg_terminate_backend):
    /// not an answer to the query.
    SessionEnd,
    /// Preparing a statement whose name the session already holds, which
    /// this connection never prepared: the session is not the connection's
    /// own (a pooler in transaction mode shares server sessions).
    Duplicate,
}

impl ErrorClass {
    /// The class of an error from its severity (the untranslated one) and
    /// SQLSTATE. Only FATAL and PANIC end the session: an ERROR of class 08
    /// (a protocol violation in one message, say) answers the query.
    pub fn of(severity: &str, sqlstate: &str) -> ErrorClass {
        match (severity, sqlstate) {
            ("FATAL" | "PANIC", _) => ErrorClass::SessionEnd,
            // invalid_sql_statement_name
            (_, "26000") => ErrorClass::Vanished,
            // feature_not_supported (of a prepared statement's execution)
            (_, "0A000") => ErrorClass::PlanChanged,
            // duplicate_prepared_statement
            (_, "42P05") => ErrorClass::Duplicate,
            _ => ErrorClass::Statement,
        }
    }
}

/// How a request's single statement goes out (`sent_statement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// As the unnamed statement.
    Unnamed,
    /// Executed by name: the session has it, or a prepare sent before.
    Execute,
    /// Prepared under its name, then executed.
    PrepareAndExecute,
}

/// Statements prepared on one connection at most; later ones run unnamed.
pub const MAX_PREPARED: usize = 256;

/// How long after a cancel request is through, with the query it was for
/// still running, another is sent (ms): the server drops a cancel request
/// that reaches the backend before the query started or between two of
/// its messages. The pause doubles with each request, up to
/// `CANCEL_AGAIN_MAX`, until the query ends (or the drain's time is up).
pub const CANCEL_AGAIN_FIRST: u64 = 100;
pub const CANCEL_AGAIN_MAX: u64 = 1_000;

/// A statement prepared on the connection: its number and which prepare
/// of it (a statement deallocated and prepared again is a new one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Named {
    id: u32,
    gen: u32,
}

/// Why a request lost its connection, and so what it may do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// Connecting failed: the next server, counted as this one's failure.
    Connect,
    /// Its query was never sent (it waited on the connection): one more try.
    NotSent,
    /// Its query was sent and may have run: never sent again.
    Sent,
}

/// Where a result goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<T> {
    /// A row of a streamed request.
    Row(T),
    /// A whole result of the request (the last one counts).
    Result(T),
    /// An error of the request (the first one counts).
    Error(T),
    /// The request's query started a COPY: it fails (500), and the
    /// connection must be closed (`lost` for the others).
    Refused(T),
    /// An error of the request's preamble (its role and settings, see
    /// `sent_statement_with`): the query did not run.
    PreambleError(T),
    /// Read and dropped: a request that is gone, a statement being prepared,
    /// a query skipped after an error, the end of one query.
    Drop,
    /// The server announced the end of the session: once the connection is
    /// seen closed, everyone on it is `lost`.
    SessionEnding,
    /// More results than the requests asked for: the connection cannot be
    /// trusted and must be closed (`lost`).
    Confused,
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<T> {
    /// Every result of the request is in.
    Complete(T),
    /// The request's prepared statement had vanished: prepare and send it
    /// again (it did not run).
    Resend(T),
    /// The plan of the request's prepared statement no longer fits: send
    /// `DEALLOCATE` for it now (`sent_internal`), before the request is
    /// sent again.
    Deallocate(T),
    /// Send a cancel request for the query running now (one of a request
    /// that is gone; no other request is on the connection).
    Cancel,
    /// The cancel request is through, yet the query it was for still runs
    /// (the request may have been dropped): start the timer (ms) after
    /// which `cancel_again` is called. Started again, it replaces the one
    /// running.
    CancelLater(u64),
    /// Start the timer that bounds how long the connection may drain.
    DrainTimer,
    /// Send these requests' queries now, in this order (they waited while
    /// the connection was connecting or draining).
    Send(Vec<T>),
    /// The connection is idle: back to the pool.
    Settle,
    /// Read the connection again (a paused stream's request left).
    Resume,
    /// Nobody is left on a connection that cannot serve yet: close it.
    Close,
}

/// Whether a request joining the connection is sent now or waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Join {
    SendNow,
    Wait,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connecting,
    Ready,
    Closed,
}

#[derive(Debug, Clone)]
struct Entry<T> {
    /// None once the request has gone.
    req: Option<T>,
    mode: Mode,
    /// Queries of the request whose results have ended (pipeline mode).
    stage: u8,
    /// Its prepared statement vanished: sent again after its sync point.
    again: bool,
    /// It was sent again once already.
    resent: bool,
    streaming: bool,
    /// Single-row mode was asked for its query.
    single: bool,
    seq: u64,
    /// The prepared statement it executes.
    named: Option<Named>,
    /// The gateway's own query (DEALLOCATE): never cancelled.
    internal: bool,
    /// Its request needs the connection alone: nothing queues behind it.
    alone: bool,
    /// Queries sent before the request's own in its sync segment (its
    /// preamble: the role and settings of the transaction): 0, 1 (executed
    /// by name, or unnamed), or 2 (prepared, then executed by name).
    pre: u8,
}

impl<T> Entry<T> {
    /// The result being read belongs to the statement being prepared.
    fn preparing_step(&self) -> bool {
        self.mode == Mode::Pipelined { preparing: true } && self.stage == self.pre
    }

    /// The result being read belongs to the request's preamble.
    fn preamble_step(&self) -> bool {
        matches!(self.mode, Mode::Pipelined { .. }) && self.stage < self.pre
    }
}

/// The requests of one connection and the state of their results.
#[derive(Debug, Clone)]
pub struct Pipeline<T> {
    phase: Phase,
    queue: VecDeque<Entry<T>>,
    /// Requests not sent yet, in order (connecting, draining, or behind
    /// queries they cannot share the connection with).
    waiting: Vec<T>,
    /// Those of them that need the connection alone (several statements,
    /// a stream, a statement that changes the session): each goes out once
    /// nothing is in flight, and nothing queues behind it.
    alone: Vec<T>,
    /// Requests told to go out that need the connection alone, until sent.
    alone_going: Vec<T>,
    /// Requests told to send again (`Step::Resend`), until they have.
    resending: Vec<T>,
    /// Opened for a request that needs it alone (several statements, a stream).
    exclusive: bool,
    /// Every request queued has gone: queries are being cancelled and
    /// their results dropped; new requests wait.
    draining: bool,
    cancel_in_flight: bool,
    /// The query the cancel requests are for (the head's sequence number).
    cancelled_seq: Option<u64>,
    /// Cancel requests sent for it.
    cancel_tries: u32,
    /// A `CancelLater` timer runs for it.
    cancel_again_due: bool,
    /// Cancel requests cannot be sent (no key), until the drain is over.
    cancels_off: bool,
    /// A streamed request's client is behind: the driver stopped reading.
    paused: bool,
    last_seq: u64,
    served: u64,
    /// Entries whose results are all in (the head moved on this often).
    finished: u64,
    /// The statements the session holds or will once the prepares in
    /// flight are through (a failed prepare is forgotten).
    prepared: Vec<Named>,
    prepare_gen: u32,
    /// A query that may drop prepared statements (DEALLOCATE, DISCARD) went
    /// out: a statement that vanishes is explained.
    session_touched: bool,
    /// The server's sessions are not this connection's own: a statement it
    /// prepared vanished unexplained, or one it never prepared was there.
    shared_session: bool,
    /// A prepared preamble was found missing: the driver prepares its
    /// preambles again.
    preamble_vanished: bool,
}

impl<T: Copy + Eq> Pipeline<T> {
    /// A connection being opened for `creator`.
    pub fn connecting(creator: T, exclusive: bool) -> Pipeline<T> {
        let mut p = Pipeline::spare();
        p.waiting.push(creator);
        if exclusive {
            p.alone.push(creator);
        }
        p.exclusive = exclusive;
        p
    }

    /// A spare connection being opened ahead of need: no request waits for
    /// it; once up it settles (idle), unless a request joined meanwhile.
    pub fn spare() -> Pipeline<T> {
        Pipeline {
            phase: Phase::Connecting,
            queue: VecDeque::new(),
            waiting: Vec::new(),
            alone: Vec::new(),
            alone_going: Vec::new(),
            resending: Vec::new(),
            exclusive: false,
            draining: false,
            cancel_in_flight: false,
            cancelled_seq: None,
            cancel_tries: 0,
            cancel_again_due: false,
            cancels_off: false,
            paused: false,
            last_seq: 0,
            served: 0,
            finished: 0,
            prepared: Vec::new(),
            prepare_gen: 0,
            session_touched: false,
            shared_session: false,
            preamble_vanished: false,
        }
    }

    pub fn is_connecting(&self) -> bool {
        self.phase == Phase::Connecting
    }

    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closed
    }

    pub fn is_draining(&self) -> bool {
        self.draining
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Nothing queued, nothing waiting: the connection can be idle.
    pub fn is_idle(&self) -> bool {
        self.phase == Phase::Ready && !self.draining && self.queue.is_empty() && self.waiting.is_empty()
    }

    /// Requests served to the end on this connection.
    pub fn served(&self) -> u64 {
        self.served
    }

    /// How often the head of the queue finished: a change tells the driver
    /// that the query now in front started later than the one it timed.
    pub fn finished(&self) -> u64 {
        self.finished
    }

    /// A query that may change the session (and drop its prepared
    /// statements) goes out.
    pub fn touch_session(&mut self) {
        self.session_touched = true;
    }

    /// Whether the results showed that the server's session is shared (a
    /// pooler in transaction mode), once: named statements are not safe.
    pub fn take_shared_session(&mut self) -> bool {
        std::mem::take(&mut self.shared_session)
    }

    /// Whether a prepared preamble was found missing, once.
    pub fn take_preamble_vanished(&mut self) -> bool {
        std::mem::take(&mut self.preamble_vanished)
    }

    /// The request whose results come next (None: an internal query, or
    /// one whose request has gone).
    pub fn front(&self) -> Option<T> {
        self.queue.front().and_then(|e| e.req)
    }

    /// Queued and waiting requests (how busy the connection is).
    pub fn depth(&self) -> usize {
        self.queue.len() + self.waiting.len()
    }

    /// Can another pipelined request join? A ready connection whose queue
    /// holds only pipelined, unstreamed queries; one connecting for a
    /// request that does not need it alone; one draining (the request waits).
    pub fn shareable(&self) -> bool {
        match self.phase {
            Phase::Ready if self.draining => true,
            Phase::Ready => {
                self.waiting.is_empty()
                    && self
                        .queue
                        .iter()
                        .all(|e| e.mode != Mode::Simple && !e.streaming && !e.alone)
            }
            // (Not behind a request that needs the connection alone.)
            Phase::Connecting => !self.exclusive && self.alone.is_empty(),
            Phase::Closed => false,
        }
    }

    /// Nothing is in flight (a query of several statements can go out:
    /// libpq must leave pipeline mode for it).
    pub fn nothing_in_flight(&self) -> bool {
        self.queue.is_empty()
    }

    /// A request joins: sent now, or waiting for the connection. `alone`:
    /// it needs the connection to itself (several statements, a stream),
    /// so it waits until nothing is in flight; another waits while the
    /// connection cannot be shared (a pool at its bound queues requests
    /// on its busiest connections rather than open more).
    pub fn join(&mut self, req: T, alone: bool) -> Join {
        let now = match self.phase {
            Phase::Ready if self.draining => false,
            Phase::Ready if self.queue.is_empty() && self.waiting.is_empty() => true,
            Phase::Ready => !alone && self.shareable(),
            Phase::Connecting | Phase::Closed => false,
        };
        if now {
            if alone && !self.alone_going.contains(&req) {
                self.alone_going.push(req);
            }
            return Join::SendNow;
        }
        if !self.waiting.contains(&req) {
            self.waiting.push(req);
            if alone {
                self.alone.push(req);
            }
        }
        Join::Wait
    }

    /// The request's query was handed to libpq: it is in flight. (Queued
    /// before the bytes go out, so that a failed send fails it too.)
    pub fn sent(&mut self, req: T, mode: Mode, streaming: bool) {
        self.push(Some(req), mode, streaming, None);
    }

    /// The request's single statement is handed to libpq in pipeline mode;
    /// `statement`: the number of a statement to run by name. Says how it
    /// goes out: executed by name when the session has it (or a prepare of
    /// it is on its way), prepared first when not, unnamed when the
    /// connection holds MAX_PREPARED statements already.
    pub fn sent_statement(&mut self, req: T, statement: Option<u32>, streaming: bool) -> Wire {
        self.sent_statement_with(req, statement, streaming, 0)
    }

    /// As `sent_statement`, with `preamble` queries (0 to 2: its prepare
    /// and its execution) before the request's own, in the same sync
    /// segment (so in the same implicit transaction). Their results are
    /// dropped; their error is the request's (`Route::PreambleError`), and
    /// the request's queries are then skipped; but a prepared preamble
    /// that vanished (DISCARD ALL), or one whose prepare finds it there,
    /// sends the request again once (nothing of it ran), and
    /// `take_preamble_vanished` says so for the first.
    pub fn sent_statement_with(&mut self, req: T, statement: Option<u32>, streaming: bool, preamble: u8) -> Wire {
        let (wire, named) = match statement {
            None => (Wire::Unnamed, None),
            Some(id) => match self.prepared.iter().find(|n| n.id == id) {
                Some(&n) => (Wire::Execute, Some(n)),
                None if self.prepared.len() < MAX_PREPARED => {
                    self.prepare_gen = self.prepare_gen.wrapping_add(1);
                    let n = Named {
                        id,
                        gen: self.prepare_gen,
                    };
                    self.prepared.push(n);
                    (Wire::PrepareAndExecute, Some(n))
                }
                None => (Wire::Unnamed, None),
            },
        };
        let preparing = wire == Wire::PrepareAndExecute;
        self.push(Some(req), Mode::Pipelined { preparing }, streaming, named);
        if let Some(e) = self.queue.back_mut() {
            e.pre = preamble.min(2);
        }
        wire
    }

    /// The gateway's own query (a DEALLOCATE, with its sync point) went
    /// out: its results are read and dropped.
    pub fn sent_internal(&mut self) {
        self.push(None, Mode::Pipelined { preparing: false }, false, None);
        if let Some(e) = self.queue.back_mut() {
            e.internal = true;
        }
    }

    /// Whether the session holds (or is preparing) statement `id`.
    pub fn holds_statement(&self, id: u32) -> bool {
        self.prepared.iter().any(|n| n.id == id)
    }

    fn push(&mut self, req: Option<T>, mode: Mode, streaming: bool, named: Option<Named>) {
        let Some(req) = req else {
            self.last_seq += 1;
            self.queue.push_back(Entry {
                req: None,
                mode,
                stage: 0,
                again: false,
                resent: false,
                streaming,
                single: false,
                seq: self.last_seq,
                named,
                internal: false,
                alone: false,
                pre: 0,
            });
            return;
        };
        self.waiting.retain(|&w| w != req);
        let alone = match self.alone_going.iter().position(|&r| r == req) {
            Some(i) => {
                self.alone_going.swap_remove(i);
                true
            }
            None => false,
        };
        let resent = match self.resending.iter().position(|&r| r == req) {
            Some(i) => {
                self.resending.swap_remove(i);
                true
            }
            None => false,
        };
        self.last_seq += 1;
        self.queue.push_back(Entry {
            req: Some(req),
            mode,
            stage: 0,
            again: false,
            resent,
            streaming,
            single: false,
            seq: self.last_seq,
            named,
            internal: false,
            alone,
            pre: 0,
        });
    }

    /// The connection is up: the requests that waited go out, in order.
    pub fn connected(&mut self) -> Steps<T> {
        if self.phase != Phase::Connecting {
            return Steps::new();
        }
        self.phase = Phase::Ready;
        self.send_waiting()
    }

    /// A request told to go out (`Step::Send`) was not sent after all: the
    /// connection's server does not meet what it asks (`sqldb_target`). It
    /// leaves without a trace; `resume_waiting` says what comes next.
    pub fn withdraw(&mut self, req: T) {
        self.waiting.retain(|&r| r != req);
        self.alone.retain(|&r| r != req);
        self.alone_going.retain(|&r| r != req);
        self.resending.retain(|&r| r != req);
    }

    /// After requests were withdrawn: with nothing in flight, those still
    /// waiting go out (or the connection settles).
    pub fn resume_waiting(&mut self) -> Steps<T> {
        if self.phase != Phase::Ready || self.draining || !self.queue.is_empty() {
            return Steps::new();
        }
        self.send_waiting()
    }

    /// The requests that waited go out, in order: up to the first that
    /// needs the connection alone (which goes only when nothing is in
    /// flight, and then alone). Settle when none waited.
    fn send_waiting(&mut self) -> Steps<T> {
        if self.waiting.is_empty() {
            return Steps::one(Step::Settle);
        }
        let mut batch = Vec::new();
        while let Some(&w) = self.waiting.first() {
            let alone = self.alone.contains(&w);
            if alone && !(batch.is_empty() && self.queue.is_empty()) {
                break;
            }
            self.waiting.remove(0);
            self.alone.retain(|&a| a != w);
            batch.push(w);
            if alone {
                self.alone_going.push(w);
                break;
            }
        }
        if batch.is_empty() {
            Steps::new()
        } else {
            Steps::one(Step::Send(batch))
        }
    }

    /// Before the next result is read: true when single-row mode must be
    /// asked for it (the head request streams, and its rows come next).
    pub fn wants_single_row(&mut self) -> bool {
        match self.queue.front_mut() {
            Some(e) if e.req.is_some() && e.streaming && !e.single => {
                let rows_next = match e.mode {
                    Mode::Simple => true,
                    Mode::Pipelined { preparing } => e.stage == e.pre + u8::from(preparing),
                };
                e.single = rows_next;
                rows_next
            }
            _ => false,
        }
    }

    /// A result arrived for the head of the queue: where it goes, and what
    /// follows (a request whose results are all in, one to send again, a
    /// statement to deallocate first: one at most).
    pub fn on_result(&mut self, kind: ResultKind) -> (Route<T>, Option<Step<T>>) {
        let mut steps = None;
        let Pipeline { queue, prepared, .. } = self;
        let Some(head) = queue.front_mut() else {
            return (Route::Confused, steps);
        };
        // The session does not hold that prepare of the statement.
        let forget = |prepared: &mut Vec<Named>, n: Option<Named>| -> bool {
            let before = prepared.len();
            prepared.retain(|&p| Some(p) != n);
            prepared.len() != before
        };
        let route = match (kind, head.mode) {
            (ResultKind::End, Mode::Simple) => {
                steps = self.finish_head();
                Route::Drop
            }
            // A request sends two queries at most (and its preamble): more
            // ends mean confusion.
            (ResultKind::End, Mode::Pipelined { .. }) if head.stage >= 2 + head.pre => Route::Confused,
            (ResultKind::End, Mode::Pipelined { .. }) => {
                head.stage += 1;
                Route::Drop
            }
            (ResultKind::Sync, Mode::Pipelined { .. }) => {
                steps = self.finish_head();
                Route::Drop
            }
            (ResultKind::Sync, Mode::Simple) => Route::Confused,
            (ResultKind::Error(ErrorClass::SessionEnd), _) => Route::SessionEnding,
            (ResultKind::Copy, _) => match head.req.take() {
                Some(req) => Route::Refused(req),
                None => Route::Confused,
            },
            (ResultKind::Aborted, _) => Route::Drop,
            // The prepared preamble is not there, or its prepare found it
            // there already: nothing ran; sent again (prepared again for
            // the first), once.
            (ResultKind::Error(class @ (ErrorClass::Vanished | ErrorClass::Duplicate)), _)
                if head.preamble_step() && head.req.is_some() && !head.resent =>
            {
                if head.mode == (Mode::Pipelined { preparing: true }) {
                    forget(prepared, head.named);
                }
                // Only DEALLOCATE ALL or DISCARD ALL drop it: the session
                // holds none of the connection's statements any more. With
                // no such query of the connection's, the session is not its
                // own (a pooler in transaction mode).
                if class == ErrorClass::Vanished {
                    prepared.clear();
                    self.preamble_vanished = true;
                    if !self.session_touched {
                        self.shared_session = true;
                    }
                } else {
                    // Preparing it found the name taken, not by this
                    // connection (it prepares each statement once): the
                    // session is another's, as for a request's statement.
                    self.preamble_vanished = true;
                    self.shared_session = true;
                }
                head.again = true;
                Route::Drop
            }
            // The preamble failed (a role that cannot be set): the request's
            // queries are skipped; it learns why. A prepare behind it is
            // skipped too: the session will not hold it.
            (ResultKind::Error(_), _) if head.preamble_step() => {
                if head.mode == (Mode::Pipelined { preparing: true }) {
                    forget(prepared, head.named);
                }
                head.req.map_or(Route::Drop, Route::PreambleError)
            }
            (ResultKind::Row | ResultKind::Final, _) if head.preamble_step() => Route::Drop,
            // The name was taken, not by this connection: prepared again, or
            // unnamed once the driver knows, never run as another's statement.
            (ResultKind::Error(ErrorClass::Duplicate), _) if head.preparing_step() => {
                forget(prepared, head.named);
                self.shared_session = true;
                match head.req {
                    Some(req) if head.resent => Route::Error(req),
                    Some(_) => {
                        head.again = true;
                        Route::Drop
                    }
                    None => Route::Drop,
                }
            }
            // A prepare failed: the session does not have the statement.
            (ResultKind::Error(_), _) if head.preparing_step() => {
                forget(prepared, head.named);
                head.req.map_or(Route::Drop, Route::Error)
            }
            (ResultKind::Error(ErrorClass::Vanished), _) if head.named.is_some() => {
                // The session was believed to hold it (its prepare went
                // through), and no query of this connection's dropped it.
                if forget(prepared, head.named) && !self.session_touched {
                    self.shared_session = true;
                }
                match head.req {
                    Some(req) if head.resent => Route::Error(req),
                    Some(_) => {
                        head.again = true;
                        Route::Drop
                    }
                    None => Route::Drop,
                }
            }
            // A request that has gone leaves the stale statement to the
            // next one that runs it.
            (ResultKind::Error(ErrorClass::PlanChanged), _) if head.named.is_some() && head.req.is_some() => {
                match head.req {
                    Some(req) if head.resent => Route::Error(req),
                    Some(req) => {
                        if forget(prepared, head.named) {
                            steps = Some(Step::Deallocate(req));
                        }
                        head.again = true;
                        Route::Drop
                    }
                    None => Route::Drop,
                }
            }
            (ResultKind::Error(_), _) => head.req.map_or(Route::Drop, Route::Error),
            (ResultKind::Row, _) => head.req.map_or(Route::Drop, Route::Row),
            (ResultKind::Final, _) if head.preparing_step() => Route::Drop,
            (ResultKind::Final, _) => head.req.map_or(Route::Drop, Route::Result),
        };
        (route, steps)
    }

    /// The head request's results are all in.
    fn finish_head(&mut self) -> Option<Step<T>> {
        let e = self.queue.pop_front()?;
        self.finished += 1;
        let req = e.req?;
        if e.again {
            if e.alone {
                self.alone_going.push(req);
            }
            self.resending.push(req);
            Some(Step::Resend(req))
        } else {
            self.served += 1;
            Some(Step::Complete(req))
        }
    }

    /// After the results that arrived were read (and requests sent again):
    /// the connection is idle, drains, or carries on.
    pub fn after_results(&mut self) -> Steps<T> {
        if self.phase != Phase::Ready {
            Steps::new()
        } else if self.queue.is_empty() && self.resending.is_empty() {
            if !self.draining {
                self.send_waiting()
            } else if !self.cancel_in_flight {
                self.finish_drain()
            } else {
                Steps::new()
            }
        } else if self.drainable() {
            self.begin_drain()
        } else {
            Steps::new()
        }
    }

    /// The request left (client gone, timeout). Its results, if they come,
    /// are dropped; what the connection does next.
    pub fn abandon(&mut self, req: T) -> Steps<T> {
        self.waiting.retain(|&w| w != req);
        self.alone.retain(|&w| w != req);
        self.alone_going.retain(|&w| w != req);
        self.resending.retain(|&w| w != req);
        let was_head = self.queue.front().is_some_and(|e| e.req == Some(req));
        for e in self.queue.iter_mut().filter(|e| e.req == Some(req)) {
            e.req = None;
        }
        let mut steps = Steps::new();
        match self.phase {
            Phase::Closed => {}
            Phase::Connecting => {
                if self.waiting.is_empty() {
                    self.phase = Phase::Closed;
                    steps.push(Step::Close);
                }
            }
            Phase::Ready => {
                if was_head && self.paused {
                    self.paused = false;
                    steps.push(Step::Resume);
                }
                if self.queue.is_empty() && !self.draining && self.waiting.is_empty() {
                    // Picked but never used.
                    steps.push(Step::Settle);
                } else if self.drainable() {
                    steps.extend(self.begin_drain());
                }
            }
        }
        steps
    }

    /// The connection is gone (broken, closed by the server, timed out
    /// draining): every request on it fails, each with what it may do next.
    pub fn lost(&mut self) -> Vec<(T, Lost)> {
        let waited = if self.phase == Phase::Connecting {
            Lost::Connect
        } else {
            Lost::NotSent
        };
        self.phase = Phase::Closed;
        self.draining = false;
        self.cancel_again_due = false;
        self.paused = false;
        self.alone.clear();
        self.alone_going.clear();
        let mut failed: Vec<(T, Lost)> = self.waiting.drain(..).map(|r| (r, waited)).collect();
        failed.extend(self.resending.drain(..).map(|r| (r, Lost::Sent)));
        failed.extend(self.queue.drain(..).filter_map(|e| e.req).map(|r| (r, Lost::Sent)));
        failed
    }

    /// The head streamed request's client is behind: reading stops.
    pub fn pause(&mut self) {
        self.paused = true;
    }

    /// Its client caught up: reading resumes.
    pub fn resume(&mut self) {
        self.paused = false;
    }
}

#[cfg(test)]
mod tests;
