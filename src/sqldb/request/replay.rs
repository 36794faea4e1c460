//! `sqldb_listen_replay`: the events a subscriber missed, read from the
//! database and sent before its live ones. A replay runs for a client that
//! comes back with its last id, and once per channel (and location) for
//! its subscribers after the listening connection was lost and made again.
//!
//! Its subscribers' live events are held meanwhile (common::sse). It runs
//! once the channel is listened to, so that what commits after the
//! replay's snapshot is heard; in rounds of the template's LIMIT rows, each
//! from the last id of the one before, until a round finds nothing new
//! while the channel stayed listened to and no held event was let go. Then
//! the held events above the last id go out, and the live ones flow.
//!
//! Its query goes to a connection of the upstream's pool, to the server
//! the listening connection is on; the driver knows it by a token of its
//! own (common::token::reserve), so its results come here, not to a request.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CString;
use std::rc::Rc;

use gateway_core::pipeline::Lost;
use gateway_core::rds::ResultSet;
use gateway_core::slab::Key;
use gateway_core::sse::{is_after, valid_id};
use gateway_core::target::Target;

use super::error::BAD_PARAMETER;
use super::{deliver_later, pool_of};
use crate::common::sse::Fanout;
use crate::common::token::{self as registry, ReqToken};
use crate::ffi::*;
use crate::log;
use crate::sqldb::config::replay::{Replay, ReplayParam};
use crate::sqldb::config::upstream::sqldb_srv_conf;
use crate::sqldb::config::{LocConf, SrvConf};
use crate::sqldb::driver::{ConnId, Delivery, PgResult, Pick, Query, ResultKind, SqlText, Submitted};

/// A round waits while one of its subscribers has more than this waiting
/// (bytes): the next one's rows go out once they have taken the last.
const ROOM: usize = 1 << 20;
/// How soon a round that waits (for room, for a connection) tries again (ms).
const AGAIN_MS: ngx_msec_t = 50;
/// How often a round's query, never sent, may move to another connection.
const MOVES: u8 = 64;

/// Where a replay is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Between rounds: it waits for the channel to be listened to, for its
    /// subscribers to take what they have, or for a connection.
    Idle,
    /// A round's query is on this connection.
    Querying(ConnId),
}

struct Job {
    /// How the driver knows it.
    token: ReqToken,
    block: &'static ngx_http_upstream_srv_conf_t,
    lcf: &'static LocConf,
    replay: Rc<Replay>,
    /// Its subscribers' fan-out.
    fan: &'static Fanout,
    channel: String,
    /// The id the next round's rows come after.
    from: Vec<u8>,
    subs: Vec<ReqToken>,
    /// The client's own last id (its first round's value is the client's).
    client: bool,
    /// The response has started (a client's starts with its first round).
    opened: bool,
    rounds: u32,
    step: Step,
    /// The channel's confirmation the round in flight started under.
    stamp: Option<u64>,
    last: Option<PgResult>,
    error: Option<PgResult>,
    moves: u8,
    /// Until when it may wait, between rounds (a client whose response has
    /// not started; a connection that cannot be had).
    deadline: Option<ngx_msec_t>,
    timer: RetryTimer,
    kick: RetryTimer,
}

/// What becomes of a job after a step.
enum Next {
    Keep,
    Done,
}

thread_local! {
    static JOBS: RefCell<HashMap<u64, Job>> = RefCell::new(HashMap::new());
    static BY_TOKEN: RefCell<HashMap<Key, u64>> = RefCell::new(HashMap::new());
    /// The replay of each subscriber that has one.
    static BY_SUB: RefCell<HashMap<Key, u64>> = RefCell::new(HashMap::new());
    static NEXT_ID: std::cell::Cell<u64> = const { std::cell::Cell::new(1) };
    /// The locations (and upstreams) of subscriptions that resume, by
    /// their tag (common::sse's `Resume::tag`).
    static TAGS: RefCell<Vec<(&'static LocConf, &'static ngx_http_upstream_srv_conf_t)>> = const { RefCell::new(Vec::new()) };
}

/// The tag of a location's subscriptions to an upstream.
pub fn tag_of(lcf: &'static LocConf, block: &'static ngx_http_upstream_srv_conf_t) -> usize {
    TAGS.with(|t| {
        let mut t = t.borrow_mut();
        match t
            .iter()
            .position(|(l, b)| std::ptr::eq(*l, lcf) && std::ptr::eq(*b, block))
        {
            Some(i) => i,
            None => {
                t.push((lcf, block));
                t.len() - 1
            }
        }
    })
}

fn tagged(tag: usize) -> Option<(&'static LocConf, &'static ngx_http_upstream_srv_conf_t)> {
    TAGS.with(|t| t.borrow().get(tag).copied())
}

/// Starts a replay for subscribers of one channel and location (tag),
/// after `from`; `client`: the id is the client's. It runs once the
/// current event is over.
pub fn start(fan: &'static Fanout, subs: Vec<ReqToken>, channel: String, tag: usize, from: Vec<u8>, client: bool) {
    let Some((lcf, block)) = tagged(tag) else { return };
    let Some(replay) = lcf.listen_replay.clone() else {
        return;
    };
    let id = NEXT_ID.with(|n| n.replace(n.get() + 1));
    let token = registry::reserve();
    let data = id as usize as *mut std::ffi::c_void;
    let mut job = Job {
        token,
        block,
        lcf,
        replay,
        fan,
        channel,
        from,
        subs,
        client,
        opened: !client,
        rounds: 0,
        step: Step::Idle,
        stamp: None,
        last: None,
        error: None,
        moves: 0,
        deadline: None,
        timer: RetryTimer::new(data, Some(job_timer)),
        kick: RetryTimer::new(data, Some(job_kick)),
    };
    job.kick.post();
    BY_TOKEN.with(|b| b.borrow_mut().insert(token.0, id));
    BY_SUB.with(|b| b.borrow_mut().extend(job.subs.iter().map(|t| (t.0, id))));
    JOBS.with(|j| j.borrow_mut().insert(id, job));
}

/// The channel is listened to (again): its replays that wait go on, once
/// the current event is over (the listening connection is busy now).
pub fn listening(channel: &str) {
    JOBS.with(|j| {
        for job in j.borrow_mut().values_mut() {
            if job.step == Step::Idle && job.channel == channel {
                job.kick.post();
            }
        }
    });
}

/// A subscriber left: a replay left with none stops (its query is let go)
/// once the current event is over.
pub fn left(who: ReqToken) {
    let Some(id) = BY_SUB.with(|b| b.borrow_mut().remove(&who.0)) else {
        return;
    };
    JOBS.with(|j| {
        if let Some(job) = j.borrow_mut().get_mut(&id) {
            job.kick.post();
        }
    });
}

/// A delivery of the driver, to its replay; given back when it is a
/// request's.
pub fn deliver(d: Delivery) -> Option<Delivery> {
    let token = super::respond::token_of(&d);
    let Some(id) = BY_TOKEN.with(|b| b.borrow().get(&token.0).copied()) else {
        return Some(d);
    };
    with_job(id, |job| job.on_delivery(d));
    None
}

/// Runs a step of a job, which is out of the table meanwhile (what it
/// calls cannot reach it); it goes back unless it is done.
fn with_job(id: u64, f: impl FnOnce(&mut Job) -> Next) {
    let Some(mut job) = JOBS.with(|j| j.borrow_mut().remove(&id)) else {
        return;
    };
    let log = Log::cycle();
    match guard(log, "sqldb replay", None, || Some(f(&mut job))) {
        Some(Next::Keep) => {
            JOBS.with(|j| j.borrow_mut().insert(id, job));
        }
        Some(Next::Done) => job.finish(),
        None => {
            // (A panic, said by the guard: the subscribers are not left
            // holding their events.)
            job.fan.fail(&job.subs, HTTP_INTERNAL_SERVER_ERROR);
            job.finish();
        }
    }
}

event_handler! {
    /// A job's timer: its query's time is up, or it waited long enough.
    fn job_timer(ev) = "sqldb replay timer", {
        ev.take_timedout();
        with_job(ev.data() as usize as u64, Job::on_timer);
    }
}

event_handler! {
    /// A job goes on (it started, or its channel is listened to).
    fn job_kick(ev) = "sqldb replay kick", {
        with_job(ev.data() as usize as u64, |job| match job.step {
            Step::Idle => job.advance(),
            // (Its subscribers left: the query is let go.)
            Step::Querying(_) if job.fan.live(&job.subs).is_empty() => Next::Done,
            Step::Querying(_) => Next::Keep,
        });
    }
}

impl Job {
    fn srv(&self) -> Option<&'static SrvConf> {
        sqldb_srv_conf(self.block)
    }

    /// The channel is listened to on the connection now up: since when.
    fn in_effect(&self) -> Option<u64> {
        let key = super::key_of(self.srv()?);
        crate::sqldb::driver::worker::with_listener(key, |l| l.in_effect(&self.channel))?
    }

    /// The next round, when it can start.
    fn advance(&mut self) -> Next {
        self.subs = self.fan.live(&self.subs);
        if self.subs.is_empty() {
            return Next::Done;
        }
        let Some(stamp) = self.in_effect() else {
            // Told when it is (`listening`); a client whose response has
            // not started waits no longer than a connection takes.
            if !self.opened {
                if self.waited() {
                    let why = "the channel is not listened to (the listening connection is not up)";
                    return self.fail(HTTP_BAD_GATEWAY, why);
                }
                self.wait(self.lcf.connect_timeout, None);
            }
            return Next::Keep;
        };
        if self.fan.backlog(&self.subs) > ROOM {
            self.timer.start(AGAIN_MS);
            return Next::Keep;
        }
        self.submit(stamp)
    }

    /// Waits, `limit` ms at most from the first wait (`waited` says when
    /// that is over), looking again `every` ms (None: at the end).
    fn wait(&mut self, limit: ngx_msec_t, every: Option<ngx_msec_t>) {
        let now = current_msec();
        let deadline = *self.deadline.get_or_insert(now.wrapping_add(limit));
        let left = deadline.wrapping_sub(now).min(limit);
        self.timer.start(every.unwrap_or(left).clamp(1, left.max(1)));
    }

    /// The time `wait` gave is over.
    fn waited(&self) -> bool {
        self.deadline
            .is_some_and(|d| current_msec().wrapping_sub(d) < ngx_msec_t::MAX / 2)
    }

    fn query(&self) -> Result<Query, String> {
        let value = |p: &ReplayParam| match p {
            ReplayParam::Channel => self.channel.as_bytes(),
            ReplayParam::LastEventId => self.from.as_slice(),
        };
        let params = self
            .replay
            .params
            .iter()
            .map(|p| CString::new(value(p)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| "the last id contains a NUL byte".to_owned())?;
        let statement = &self.replay.statement;
        Ok(Query {
            sql: SqlText::Shared(self.replay.sql.clone()),
            params,
            statement: (self.lcf.prepare == 1).then(|| statement.clone()),
            several: false,
            binary: false,
            streaming: false,
            stream_connections: None,
            changes_session: self.replay.changes_session,
            template: statement.clone(),
            slow: statement.slow.get() > 0,
            target: std::cell::Cell::new(Target::Any),
            preamble: None,
        })
    }

    /// Sends a round's query on a connection of the pool, to the server of
    /// the listening connection.
    fn submit(&mut self, stamp: u64) -> Next {
        let query = match self.query() {
            Ok(q) => Rc::new(q),
            Err(why) if self.client && !self.opened => return self.refuse_client(&why),
            Err(why) => return self.fail(HTTP_BAD_GATEWAY, &why),
        };
        let Some(srv) = self.srv() else {
            return self.fail(HTTP_INTERNAL_SERVER_ERROR, "no upstream");
        };
        let Some(addr) = srv.addrs.first() else {
            return self.fail(HTTP_INTERNAL_SERVER_ERROR, "no server");
        };
        let conn = match pool_of(srv, |p| p.pick(Some(0), &query)) {
            Pick::Idle(id) | Pick::Share(id) | Pick::Behind(id) => id,
            Pick::New => match pool_of(srv, |p| {
                p.open(0, &addr.conninfo, addr.name_text(), self.token, query.alone())
            }) {
                Ok(id) => id,
                Err(e) => return self.fail(HTTP_BAD_GATEWAY, &e.to_string()),
            },
            Pick::Reject => {
                // Tried again in a moment, for as long as a query may take.
                if self.waited() {
                    return self.fail(
                        HTTP_BAD_GATEWAY,
                        &format!("no connection to spare for {}", addr.name_text()),
                    );
                }
                self.wait(self.lcf.result_timeout, Some(AGAIN_MS));
                return Next::Keep;
            }
        };
        self.fan.begin_round(&self.subs);
        self.deadline = None;
        self.timer.stop();
        self.step = Step::Querying(conn);
        self.stamp = Some(stamp);
        match pool_of(srv, |p| p.submit(conn, self.token, query)) {
            Ok(Submitted::Waiting { connecting: true }) => self.timer.start(self.lcf.connect_timeout),
            Ok(_) => self.timer.start(self.lcf.result_timeout),
            // (What the driver says of it comes back here after this event.)
            Err(out) => deliver_later(out),
        }
        Next::Keep
    }

    fn on_timer(&mut self) -> Next {
        match self.step {
            Step::Idle => self.advance(),
            Step::Querying(conn) => {
                if let Some(srv) = self.srv() {
                    deliver_later(pool_of(srv, |p| p.abandon(conn, self.token)));
                }
                self.step = Step::Idle;
                let why = format!("timed out ({} ms)", self.lcf.result_timeout);
                self.fail(HTTP_BAD_GATEWAY, &why)
            }
        }
    }

    fn on_delivery(&mut self, d: Delivery) -> Next {
        let Step::Querying(_) = self.step else {
            return Next::Keep;
        };
        match d {
            Delivery::Started(_, _) => {
                self.timer.stop();
                self.timer.start(self.lcf.result_timeout);
                Next::Keep
            }
            Delivery::Result(_, res) => {
                self.last = Some(res);
                Next::Keep
            }
            Delivery::Error(_, res) | Delivery::PreambleFailed(_, res) => {
                self.error.get_or_insert(res);
                Next::Keep
            }
            Delivery::Complete(_) => {
                self.step = Step::Idle;
                self.moves = 0;
                self.timer.stop();
                self.round_done()
            }
            Delivery::Failed(_, Lost::NotSent, _) if self.moves < MOVES => {
                // Another connection takes it, as a request's would.
                self.step = Step::Idle;
                self.moves += 1;
                self.advance()
            }
            Delivery::Failed(_, _, why) | Delivery::Refused(_, why) | Delivery::Unfit(_, why) => {
                self.step = Step::Idle;
                self.fail(HTTP_BAD_GATEWAY, &why)
            }
        }
    }

    /// A round's results are in: its rows go out; then another round, or
    /// the end of the replay.
    fn round_done(&mut self) -> Next {
        self.rounds += 1;
        if let Some(err) = self.error.take() {
            let summary = err.error_summary();
            if self.client && !self.opened && BAD_PARAMETER.contains(&err.sqlstate().as_str()) {
                return self.refuse_client(&summary);
            }
            return self.fail(HTTP_BAD_GATEWAY, &format!("query failed: {summary}"));
        }
        let Some(res) = self.last.take() else {
            return self.fail(HTTP_BAD_GATEWAY, "the server returned no result");
        };
        if res.kind() != ResultKind::Tuples || res.columns() < 2 {
            return self.fail(
                HTTP_BAD_GATEWAY,
                "its query must return rows of two columns, (id, data)",
            );
        }
        let rows = res.rows();
        if let Some(bad) = (0..rows).find(|&i| !res.value(i, 0).is_some_and(valid_id)) {
            let id = String::from_utf8_lossy(res.value(bad, 0).unwrap_or(b"NULL")).into_owned();
            return self.fail(
                HTTP_BAD_GATEWAY,
                &format!("row {} has the id \"{}\", not one an event can carry (1 to 256 bytes, no space or control character)", bad + 1, id.escape_default()),
            );
        }
        self.fan.replayed(
            &self.subs,
            &self.channel,
            (0..rows).map(|i| (res.value(i, 0).unwrap_or_default(), res.value(i, 1).unwrap_or_default())),
        );
        // A client's response starts with its first round.
        if !self.opened {
            self.opened = true;
            self.fan.open(&self.subs);
        }
        let last = rows.checked_sub(1).and_then(|i| res.value(i, 0)).map(<[u8]>::to_vec);
        match last {
            Some(last) if is_after(&last, Some(&self.from)) => {
                self.from = last;
                self.advance()
            }
            Some(last) => {
                let log = self.log();
                log!(
                    NGX_LOG_ERR,
                    log,
                    "sqldb: \"sqldb_listen_replay\" of channel \"{}\" returned rows up to id \"{}\", not above \"{}\": its rows must be above $sqldb_last_event_id, in order; the replay ends",
                    self.channel,
                    String::from_utf8_lossy(&last).escape_default(),
                    String::from_utf8_lossy(&self.from).escape_default()
                );
                self.release()
            }
            // Nothing new: done when the channel was listened to all along
            // and nothing held was let go; else one more round.
            None if self.stamp.is_some() && self.stamp == self.in_effect() && !self.fan.lapsed(&self.subs) => {
                self.release()
            }
            None => self.advance(),
        }
    }

    fn release(&mut self) -> Next {
        self.fan.release(&self.subs);
        Next::Done
    }

    /// The log of the replay: its client's, or the worker's.
    fn log(&self) -> Log {
        match (self.client, self.subs.first()) {
            (true, Some(&t)) => self.fan.log_of(t).unwrap_or_else(Log::cycle),
            _ => Log::cycle(),
        }
    }

    /// The client's last id was refused for its type: 400, logged as
    /// client mistakes are.
    fn refuse_client(&mut self, why: &str) -> Next {
        let log = self.log();
        log!(
            NGX_LOG_INFO,
            log,
            "sqldb: the last event id \"{}\" was refused by \"sqldb_listen_replay\": {why}",
            String::from_utf8_lossy(&self.from).escape_default()
        );
        self.fan.fail(&self.subs, HTTP_BAD_REQUEST);
        Next::Done
    }

    /// The replay cannot go on: `status` for subscribers whose response has
    /// not started, the end of the stream for the others.
    fn fail(&mut self, status: ngx_int_t, why: &str) -> Next {
        let log = self.log();
        log!(
            NGX_LOG_ERR,
            log,
            "sqldb: \"sqldb_listen_replay\" of channel \"{}\" after id \"{}\" failed: {why}; {}",
            self.channel,
            String::from_utf8_lossy(&self.from).escape_default(),
            if self.opened {
                format!("the stream of its {} subscribers ends", self.subs.len())
            } else {
                format!("the request gets {status}")
            }
        );
        self.fan.fail(&self.subs, status);
        Next::Done
    }

    /// The job is over: its query (if one runs) is let go, its token ends.
    fn finish(mut self) {
        if let (Step::Querying(conn), Some(srv)) = (self.step, self.srv()) {
            deliver_later(pool_of(srv, |p| p.abandon(conn, self.token)));
        }
        self.step = Step::Idle;
        let id = BY_TOKEN.with(|b| b.borrow_mut().remove(&self.token.0));
        BY_SUB.with(|b| {
            let mut b = b.borrow_mut();
            for t in &self.subs {
                if b.get(&t.0).copied() == id {
                    b.remove(&t.0);
                }
            }
        });
        registry::unregister(self.token);
    }
}
