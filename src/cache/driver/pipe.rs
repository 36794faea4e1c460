//! Shared, pipelined connections to Redis (`cache_pipeline on`, the
//! default). Each worker keeps a few connections per server address and
//! `cache_auth` password; requests queue their commands on them, and the
//! commands of one pass of the event loop go out in one write. Replies come
//! in order: each request's reader (core's `redis::Exchange`) takes its own,
//! from the echo of its `PING <token>` to the end of its command's reply,
//! and the next request's reader goes on from there.
//!
//! - `AUTH` goes once, when a connection opens; `SELECT` only when the
//!   connection's database must change. A database the connection has not
//!   yet seen Redis accept is asked about first, alone (`PING`, `SELECT`),
//!   and the request's command goes out only once Redis said yes: a refused
//!   `SELECT` never leaves a command to run in another database.
//! - A reply that cannot be read (not RESP, a stale echo, bytes nobody asked
//!   for, a connection closed) closes the connection; every request still
//!   on it hears why, and nginx's next-upstream rules decide what it does.
//! - A request that leaves (client gone, timeout) leaves its place: its
//!   replies are read and dropped.

use std::cell::Cell;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::rc::Rc;

use gateway_core::redis::{self, Event as RedisEvent, Exchange, Plan, ReplyError, Setup};
use gateway_core::resp::{self, Reply};

use super::conn::{run_owner, Dial, Owner, RedisConn, Step};
use super::{next_ping, DbStep, Endpoint, Handle, Outcome, PipeId, Sink};
use crate::cache::error::{self, Broken, Error, How};
use crate::ffi::net::TlsClient;
use crate::ffi::*;
use crate::log;

/// Connections per server address, password and worker at most (those on
/// their way out not counted).
pub const MAX_CONNS: usize = 8;
/// Requests waiting on a connection before another one is opened.
pub const DEPTH: usize = 64;
/// A connection whose oldest waiting request has waited this long (ms) is
/// slow: another one is opened for new requests.
pub const SLOW_MS: ngx_msec_t = 5;
/// A value at least this long (bytes) takes its connection out of the
/// choice for new requests until it is read.
pub const HEAVY_VALUE: u64 = 1024 * 1024;
/// An idle connection closes after this long (ms).
pub const IDLE_MS: ngx_msec_t = 60_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `AUTH` and `PING` when the connection opens.
    Open,
    /// `PING`, `SELECT db`: does the database exist? `prev`: the database
    /// the connection was known to be in before it; `seq`: its place among
    /// the commands that change the database.
    Probe {
        db: u32,
        prev: Option<u32>,
        seq: u64,
    },
    Request,
}

struct Waiter {
    who: Option<Rc<Handle>>,
    /// Requests that wait for a probe's answer too.
    followers: Vec<Rc<Handle>>,
    exchange: Exchange,
    kind: Kind,
    /// Where its bytes start in what the connection sends.
    start: u64,
    /// When it was queued.
    since: ngx_msec_t,
    /// The connection had served requests before.
    reused: bool,
}

impl Waiter {
    fn live(&self) -> Option<&Rc<Handle>> {
        self.who.as_ref().filter(|h| h.alive())
    }

    /// The waiter's request and the followers still there.
    fn everyone(&self) -> impl Iterator<Item = &Rc<Handle>> {
        self.live()
            .into_iter()
            .chain(self.followers.iter().filter(|h| h.alive()))
    }
}

pub struct PipeConn {
    pub(super) addr: Vec<u8>,
    pub(super) auth: Option<Vec<u8>>,
    pub(super) tls: Option<TlsClient>,
    conn: RedisConn,
    /// It closed (for good: a pipelined connection is not made again).
    pub(super) closed: bool,
    /// Where the request side hears of its requests.
    pub(super) sink: &'static dyn Sink,
    /// Bytes that went out, and bytes queued, since the connection opened.
    sent: u64,
    queued: u64,
    waiters: VecDeque<Waiter>,
    /// The database the connection is in once everything queued has run,
    /// when that is certain.
    pub(super) tail_db: Option<u32>,
    /// Databases up to this one exist (Redis accepted a SELECT of it here).
    valid_max: u32,
    /// Commands that change the database, counted.
    select_seq: u64,
    /// No new requests: it closes once nobody waits on it.
    pub(super) retired: bool,
    /// The client of the request being answered is behind: no reading.
    pub(super) paused: bool,
    /// The reply being read is a large value (HEAVY_VALUE or more).
    pub(super) heavy: bool,
    /// Requests answered on it.
    served: u64,
    /// Why it closed, and whether its replies were wrong.
    pub(super) closed_why: String,
    closed_invalid: bool,
    /// It closed because Redis refused its password.
    closed_auth: bool,
    /// Posted to send what a pass of the event loop queued, in one write.
    kick: RetryTimer,
    idle: RetryTimer,
    out_buf: Vec<Outcome>,
}

impl PipeConn {
    pub fn is_connecting(&self) -> bool {
        self.conn.is_connecting()
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// A closed connection: why, when its replies were wrong (the
    /// server's failure, not a connection that simply went).
    pub fn closed_invalid(&self) -> Option<&str> {
        (self.closed && self.closed_invalid).then_some(self.closed_why.as_str())
    }

    /// What a request for database `db` needs here.
    pub fn select_for(&self, db: u32) -> DbStep {
        if self.tail_db == Some(db) {
            DbStep::Stay
        } else if db <= self.valid_max {
            DbStep::Select(db)
        } else if self
            .waiters
            .iter()
            .any(|w| matches!(w.kind, Kind::Probe { db: d, .. } if d == db))
        {
            DbStep::Wait
        } else {
            DbStep::Probe
        }
    }

    /// Queues a request's commands (`select`: the `SELECT` its plan has,
    /// a `Select` of `select_for`). `body`: the request body, sent between the
    /// plan's head and tail.
    pub fn submit(&mut self, who: Rc<Handle>, plan: Plan, body: &[u8], select: Option<u32>) {
        if let Some(db) = select {
            self.tail_db = Some(db);
            self.select_seq += 1;
        }
        let len = plan.head.len() + body.len() + plan.tail.len();
        self.queue(Some(who), plan.exchange, Kind::Request, len, |out| {
            out.extend_from_slice(&plan.head);
            out.extend_from_slice(body);
            out.extend_from_slice(&plan.tail);
        });
    }

    /// Asks whether database `db` exists (`PING`, `SELECT`), for a request
    /// whose command waits for the answer.
    pub fn probe(&mut self, who: Rc<Handle>, db: u32) {
        let (bytes, exchange) = redis::plan_setup(None, Some(db), next_ping());
        self.select_seq += 1;
        let kind = Kind::Probe {
            db,
            prev: self.tail_db.take(),
            seq: self.select_seq,
        };
        self.queue(Some(who), exchange, kind, bytes.len(), |out| {
            out.extend_from_slice(&bytes)
        });
    }

    /// The probe of database `db` on its way, if any.
    fn probing(&mut self, db: u32) -> Option<&mut Waiter> {
        self.waiters
            .iter_mut()
            .find(|w| matches!(w.kind, Kind::Probe { db: d, .. } if d == db))
    }

    /// Waits for the answer of the probe of `db` on its way (a `Wait` of
    /// `select_for`): the request hears it as if it had asked.
    pub fn follow(&mut self, who: Rc<Handle>, db: u32) {
        if let Some(w) = self.probing(db) {
            w.followers.push(who);
        }
    }

    fn queue(
        &mut self,
        who: Option<Rc<Handle>>,
        exchange: Exchange,
        kind: Kind,
        len: usize,
        write: impl FnOnce(&mut Vec<u8>),
    ) {
        if let Some(h) = &who {
            Handle::count(&h.sent, len);
        }
        self.waiters.push_back(Waiter {
            who,
            followers: Vec::new(),
            exchange,
            kind,
            start: self.queued,
            since: current_msec(),
            reused: self.served > 0,
        });
        self.conn.out.reserve(len);
        write(&mut self.conn.out);
        self.queued += len as u64;
        self.idle.stop();
        if let Some(s) = self.conn.socket() {
            s.set_idle(false);
        }
        if self.conn.is_up() {
            self.kick.post();
        }
    }

    /// The request leaves its place (its replies will be dropped).
    pub fn leave(&mut self, who: &Rc<Handle>) {
        let head = self
            .waiters
            .front()
            .and_then(|w| w.who.as_ref())
            .is_some_and(|h| Rc::ptr_eq(h, who));
        for w in self.waiters.iter_mut() {
            if w.who.as_ref().is_some_and(|h| Rc::ptr_eq(h, who)) {
                w.who = None;
            }
            w.followers.retain(|h| !Rc::ptr_eq(h, who));
        }
        if head && self.paused {
            // Its client held the reading up: go on (later, not inside
            // the request's own end: `run` watches the socket again).
            self.paused = false;
            self.kick.post();
        }
        if self.retired {
            self.kick.post();
        }
    }

    /// No new requests (one of its requests timed out: Redis may be stuck
    /// on it); it closes once nobody waits.
    pub fn retire(&mut self) {
        self.retired = true;
        self.kick.post();
    }

    /// Closes it now: its requests hear why, and go on to their next try.
    pub fn close(&mut self, why: &str) {
        self.broken(why, false);
    }

    /// The client of the request being answered caught up: read on.
    pub fn resume(&mut self) {
        if self.paused {
            self.paused = false;
            self.kick.post();
        }
    }

    /// Reading stops (the socket is not watched) or goes on.
    fn set_paused(&mut self, on: bool) {
        self.paused = on;
        if self.conn.is_up() && !self.conn.watch_read(!on) {
            self.broken("cannot watch the connection", false);
        }
    }

    fn live_waiters(&self) -> bool {
        self.waiters.iter().any(|w| w.everyone().next().is_some())
    }

    pub(super) fn load(&self) -> usize {
        self.waiters.len()
    }

    pub(super) fn slow(&self, now: ngx_msec_t) -> bool {
        self.waiters
            .front()
            .is_some_and(|w| now.wrapping_sub(w.since) >= SLOW_MS)
    }

    pub(super) fn open(id: PipeId, to: &Endpoint<'_>, sink: &'static dyn Sink) -> Result<PipeConn, Error> {
        let mut c = PipeConn {
            addr: to.addr.to_vec(),
            auth: to.auth.map(<[u8]>::to_vec),
            tls: to.tls.cloned(),
            conn: RedisConn::new(),
            closed: false,
            sink,
            sent: 0,
            queued: 0,
            waiters: VecDeque::new(),
            tail_db: Some(0),
            valid_max: 0,
            select_seq: 0,
            retired: false,
            paused: false,
            heavy: false,
            served: 0,
            closed_why: String::new(),
            closed_invalid: false,
            closed_auth: false,
            kick: RetryTimer::new(std::ptr::null_mut(), Some(kick_event)),
            idle: RetryTimer::new(std::ptr::null_mut(), Some(idle_event)),
            out_buf: Vec::new(),
        };
        // Its events find it by its number (driver::pipes), not by where it is.
        let data = id.as_data();
        c.kick.set_data(data);
        c.idle.set_data(data);
        if let Some(pw) = c.auth.clone() {
            let (bytes, exchange) = redis::plan_setup(Some(&pw), None, next_ping());
            c.queue(None, exchange, Kind::Open, bytes.len(), |out| {
                out.extend_from_slice(&bytes)
            });
        }
        let dial = Dial {
            addr: to.addr,
            tls: to.tls,
            connect_timeout: to.connect_timeout,
            keepalive: to.so_keepalive,
            log: Some(to.log),
        };
        match c.conn.open::<PipeConn>(&dial, data) {
            Err(_) => return Err(error::Kind::ConnectLogged.into()),
            Ok(Step::Lost(why)) => {
                c.conn.close();
                return Err(Error::because(error::Kind::Connect, why));
            }
            Ok(step) => c.step(0, step),
        }
        Ok(c)
    }

    fn connected(&mut self) {
        for w in &self.waiters {
            if w.kind != Kind::Open {
                for h in w.everyone() {
                    self.out_buf.push(Outcome::Connected(h.clone()));
                }
            }
        }
        self.flush();
    }

    /// Sends what is queued, reads what came, hands the replies on.
    fn run(&mut self) {
        if !self.paused {
            // (Reading may have paused for a client.)
            self.set_paused(false);
        }
        self.flush();
        if self.conn.is_up() {
            self.process();
            self.read();
        }
        self.settle();
    }

    /// Sends what is queued, as far as the socket takes it.
    fn flush(&mut self) {
        match self.conn.flush() {
            Ok(n) => self.sent += n as u64,
            Err(why) => self.broken(&why, false),
        }
    }

    /// Reads until the socket (and TLS) has nothing more, or the reading
    /// pauses. A plain socket that gave less than was asked has nothing
    /// more for now: the read is level-triggered, so whatever comes after
    /// (or is left) brings the event back, without one more recv() that
    /// would only say so.
    fn read(&mut self) {
        while self.conn.is_up() && !self.paused {
            match self.conn.read() {
                Ok(0) => return,
                Ok(n) => {
                    self.process();
                    if !self.conn.read_was_full(n) {
                        return;
                    }
                }
                Err(why) => return self.broken(&why, false),
            }
        }
    }

    /// Hands the replies read so far to their requests, in order.
    fn process(&mut self) {
        while self.conn.is_up() && !self.paused {
            let Some(w) = self.waiters.front_mut() else { break };
            let buf = &self.conn.input[self.conn.in_at..];
            if buf.is_empty() {
                break;
            }
            let who = w.live().cloned();
            let (event, used) = w.exchange.step(buf);
            self.conn.in_at += used;
            if let Some(h) = &who {
                Handle::count(&h.received, used);
            }
            match event {
                RedisEvent::More => break,
                RedisEvent::Answer { status, value } => {
                    // A value that came whole with its header is checked to
                    // its end before the status goes out: one not ended by
                    // CRLF is a malformed reply (502), not a 200 cut short.
                    if value.is_some() {
                        if let Err(e) = w.exchange.check_value_end(&self.conn.input[self.conn.in_at..]) {
                            return self.broken(&e.to_string(), true);
                        }
                    }
                    let made = w.exchange.answer_body();
                    let done = w.exchange.is_done();
                    self.heavy = value.is_some_and(|n| n >= HEAVY_VALUE);
                    if let (Some(h), Kind::Request) = (&who, w.kind) {
                        self.sink.answer(h, status, value, made);
                    }
                    if done {
                        self.finish_head();
                    }
                }
                RedisEvent::Value(v) => {
                    if let Some(h) = &who {
                        let behind = self.waiters.iter().skip(1).any(|w| w.everyone().next().is_some());
                        if self.sink.value(h, v, behind) {
                            self.set_paused(true);
                        }
                    }
                }
                RedisEvent::Done => self.finish_head(),
                RedisEvent::Slots(_) | RedisEvent::Redirect(_) => {
                    return self.broken("redis sent a reply that no command of this connection asks for", true)
                }
                RedisEvent::Failed(e) => self.failed_head(e),
            }
        }
        let mid_value = self
            .waiters
            .front()
            .is_some_and(|w| w.exchange.answered() && !w.exchange.is_done());
        if mid_value && self.conn.is_up() {
            // A value still coming: progress, for everyone waiting on it.
            for w in &self.waiters {
                for h in w.everyone() {
                    self.sink.progress(h);
                }
            }
        }
        if self.waiters.is_empty() && self.conn.in_at < self.conn.input.len() && self.conn.is_up() {
            self.broken(&ReplyError::Unsolicited.to_string(), true);
        }
    }

    /// The first waiter's replies are all in.
    fn finish_head(&mut self) {
        self.heavy = false;
        let Some(w) = self.waiters.pop_front() else { return };
        let who = w.live().cloned();
        match w.kind {
            Kind::Open => {}
            Kind::Request => {
                self.served += 1;
                if let Some(h) = who {
                    self.out_buf.push(Outcome::Done(h));
                }
            }
            Kind::Probe { db, seq, .. } => {
                self.valid_max = self.valid_max.max(db);
                if self.select_seq == seq {
                    self.tail_db = Some(db);
                }
                for h in w.everyone() {
                    self.out_buf.push(Outcome::Probed(h.clone(), Ok(())));
                }
            }
        }
    }

    /// The first waiter's exchange failed at the reply that starts at
    /// `in_at`. A whole error reply that ends its exchange leaves the
    /// connection as it was; anything else breaks it.
    fn failed_head(&mut self, e: ReplyError) {
        let Some(w) = self.waiters.front() else { return };
        let ends = matches!(
            (&e, w.kind),
            (
                ReplyError::Refused {
                    setup: Setup::Select,
                    ..
                },
                Kind::Probe { .. }
            ) | (ReplyError::Failed { .. }, Kind::Request)
        );
        let whole = match resp::reply_header(&self.conn.input[self.conn.in_at..]) {
            (Reply::Error(_), n) => Some(n),
            _ => None,
        };
        let (true, Some(n)) = (ends, whole) else {
            let auth = matches!(e, ReplyError::Refused { setup: Setup::Auth, .. });
            self.closed_auth = auth;
            return self.broken(&e.to_string(), !auth);
        };
        self.conn.in_at += n;
        let Some(w) = self.waiters.pop_front() else { return };
        let who = w.live().cloned();
        match (w.kind, e) {
            (Kind::Probe { prev, seq, .. }, ReplyError::Refused { message, .. }) => {
                // Redis stays in the database it was in.
                if self.select_seq == seq {
                    self.tail_db = prev;
                }
                for h in w.everyone() {
                    self.out_buf.push(Outcome::Probed(h.clone(), Err(message.clone())));
                }
            }
            (_, e) => {
                self.served += 1;
                if let Some(h) = who {
                    self.out_buf.push(Outcome::Failed(h, Error::answered(e)));
                }
            }
        }
    }

    /// The connection is closed; every request still on it hears why.
    fn broken(&mut self, why: &str, invalid: bool) {
        if self.closed {
            return;
        }
        let connecting = self.is_connecting();
        let how = if self.closed_auth {
            How::PasswordRefused
        } else if self.conn.timed_out() {
            How::TimedOut
        } else if invalid {
            How::Invalid
        } else {
            How::Closed
        };
        self.closed_why = why.to_owned();
        self.closed_invalid = invalid;
        let told = self.out_buf.iter().any(|d| matches!(d, Outcome::Probed(..)));
        if invalid && !self.live_waiters() && !told {
            // Nobody to tell (a request whose probe just ended will hear
            // of it when it comes back): the connection's own line.
            log!(
                NGX_LOG_ERR,
                Log::cycle(),
                "cache: {why}; the connection to redis is closed"
            );
        }
        self.closed = true;
        self.conn.close();
        self.kick.stop();
        self.idle.stop();
        self.paused = false;
        for w in std::mem::take(&mut self.waiters) {
            if w.kind == Kind::Open {
                continue;
            }
            // (A probe runs nothing: its requests' commands were not sent.)
            let sent = w.kind == Kind::Request && self.sent > w.start;
            for h in w.everyone() {
                let broken = Broken {
                    how,
                    sent,
                    reused: w.reused,
                    connecting,
                };
                self.out_buf.push(Outcome::Failed(
                    h.clone(),
                    Error::because(error::Kind::Broken(broken), why),
                ));
            }
        }
    }

    /// After a step: an unneeded connection closes, an idle one waits.
    fn settle(&mut self) {
        if self.closed {
            return;
        }
        if self.retired && !self.live_waiters() {
            return self.broken("retired", false);
        }
        // (A request whose probe just ended comes back with its command.)
        let returning = self.out_buf.iter().any(|d| matches!(d, Outcome::Probed(_, Ok(()))));
        if !self.live_waiters() && !returning {
            // Nobody waits for anything on it (replies of requests that
            // left may still come): it closes when nginx exits, and after
            // IDLE_MS (a server that stays silent does not keep it).
            if exiting() {
                return self.broken("nginx is exiting", false);
            }
            if let Some(s) = self.conn.socket() {
                // nginx closes idle connections when it exits.
                s.set_idle(true);
            }
            self.idle.start(IDLE_MS);
        }
    }

    /// What the steps left for the requests; an emptied list with room
    /// takes its place (one per delivery, else each step's would grow one
    /// of its own).
    pub(super) fn take_deliveries(&mut self) -> Vec<Outcome> {
        if self.out_buf.is_empty() {
            return Vec::new();
        }
        std::mem::replace(&mut self.out_buf, SPARE_OUT.take())
    }
}

impl PipeId {
    /// The number as its connection's events carry it (never null).
    fn as_data(self) -> *mut c_void {
        std::ptr::without_provenance_mut(self.0 as usize + 1)
    }

    fn from_data(data: *mut c_void) -> PipeId {
        PipeId((data as usize).wrapping_sub(1) as u64)
    }
}

thread_local! {
    /// An emptied list of outcomes with room, kept from one delivery to the
    /// next (take_deliveries).
    static SPARE_OUT: Cell<Vec<Outcome>> = const { Cell::new(Vec::new()) };
}

impl Owner for PipeConn {
    const EVENT: &'static str = "cache pipelined connection event";
    const HANDSHAKE: &'static str = "cache pipelined connection handshake";

    type Out = (&'static dyn Sink, Vec<Outcome>);

    /// `data` is the connection's number (`PipeId::as_data`): it is found
    /// in the worker's list, and lent from there.
    unsafe fn lend<T>(data: *mut c_void, f: impl FnOnce(&mut PipeConn, usize) -> T) -> Option<T> {
        super::lend_pipe(PipeId::from_data(data), |c| f(c, 0))
    }

    fn conn(&mut self, _: usize) -> &mut RedisConn {
        &mut self.conn
    }

    fn step(&mut self, _: usize, step: Step) {
        match step {
            Step::Wait => {}
            Step::Up => self.connected(),
            Step::Ready => self.run(),
            Step::Lost(why) => self.broken(&why, false),
            // nginx exits (it asks idle connections only).
            Step::Exit => self.broken("nginx is exiting", false),
        }
    }

    fn panicked(&mut self, _: usize) {
        self.broken("an internal error (a panic) in the module", false);
    }

    fn take_out(&mut self) -> Self::Out {
        (self.sink, self.take_deliveries())
    }

    fn deliver((sink, mut out): Self::Out) {
        if !out.is_empty() {
            sink.deliver(&mut out);
            out.clear();
            SPARE_OUT.set(out);
        }
    }
}

event_handler! {
    /// Posted: what was queued goes out, and reading goes on. (The event
    /// is a PipeConn's: open.)
    fn kick_event(ev) = "cache pipelined connection kick", {
        run_owner::<PipeConn>(ev.data(), "cache pipelined connection", |c, _| {
            if c.conn.is_up() {
                c.run();
            } else {
                c.settle();
            }
        });
    }
}

event_handler! {
    /// Nobody used the connection for IDLE_MS. (The event is a PipeConn's
    /// timer: open.)
    fn idle_event(ev) = "cache pipelined connection idle timer", {
        ev.take_timedout();
        run_owner::<PipeConn>(ev.data(), "cache pipelined connection idle", |c, _| {
            if !c.live_waiters() {
                c.broken("idle", false);
            }
        });
    }
}
