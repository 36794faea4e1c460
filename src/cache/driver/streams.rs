//! The reading hubs of `cache_stream`: Redis `XREAD` for the worker's
//! stream subscribers.
//!
//! Each worker keeps one hub per upstream (and `cache_auth` password),
//! shared by every subscriber of every key, with one connection: to the
//! upstream's servers in turn (a stream lives on one server; the first
//! that answers is read). The connection works in rounds: one round is a
//! pipeline of
//!
//! - `XREVRANGE key + - COUNT 1` for each key that came since the last
//!   round: where its reading starts (its last entry; 0-0 when it has
//!   none), after which its subscribers are told they are subscribed;
//! - `XRANGE key (<id> + COUNT PAGE` for a page of each catch-up (a
//!   subscriber that came with `Last-Event-ID`), at most `PAGES_PER_ROUND`
//!   pages a round, none for a subscriber with more than `PAUSE_AT` bytes
//!   waiting (its catch-up goes on when it has taken them);
//! - `XREAD COUNT READ_COUNT [BLOCK BLOCK_MS] STREAMS k1 k2 ... id1 id2 ...`
//!   over every key whose position is known, each after the last entry
//!   read of it. It blocks only when nothing else is in the round.
//!
//! The next round goes once every reply of this one is in. A key that
//! comes while an `XREAD` blocks waits for it to return: at most
//! `BLOCK_MS`, the price of one connection instead of two (no entry is
//! lost meanwhile: its reading starts where its `XREVRANGE` found it).
//!
//! None twice, none missing: the reader's position per key only grows; a
//! subscriber is never sent an id that is not above the last it was sent
//! (common::sse). A catch-up pages from the client's id until a page comes
//! back short; meanwhile the live entries of its key are held for it
//! (bounded, common::sse's `HELD_MAX`: past it they are let go and one more
//! round of pages finds them in the stream), then released.
//!
//! A connection that is lost is made again after `RETRY` ms (to the next
//! server) and reading goes on from each key's position: nothing is lost
//! while the entries are still in the stream, and subscribers hear of no
//! gap. The subscribers' side is common::sse's (stream.rs).

use std::collections::{BTreeMap, VecDeque};
use std::ffi::c_void;

use gateway_core::pubsub;
use gateway_core::resp::{self, Value};
use gateway_core::streams::{self, EntryId};

use super::authfail;
use super::conn::{run_owner, Dial, Owner, RedisConn, State, Step};
use super::hub::Addr;
use crate::common::hub::{Hub, RETRY};
use crate::common::sse::StreamSink;
use crate::common::token::ReqToken;
use crate::ffi::net::TlsClient;
use crate::ffi::*;
use crate::log;

/// How long one `XREAD` waits for new entries (ms): also the longest a
/// key that comes waits for its reading to start.
pub const BLOCK_MS: u64 = 250;
/// Entries per key per `XREAD`.
pub const READ_COUNT: usize = 200;
/// Entries per page of a catch-up.
pub const PAGE: usize = 200;
/// Catch-up pages per round (per hub).
pub const PAGES_PER_ROUND: usize = 16;
/// A subscriber with more bytes than this waiting gets no page this round.
pub const PAUSE_AT: usize = 256 << 10;
/// The largest reply taken (a bigger one breaks the connection).
const REPLY_MAX: usize = 64 << 20;

#[derive(Default)]
struct Key {
    subs: Vec<ReqToken>,
    /// Those not told yet that the key is read.
    waiting: Vec<ReqToken>,
    /// The last entry read of it (None: not known yet).
    pos: Option<EntryId>,
    /// Its `XREVRANGE` is out.
    asked: bool,
}

/// A subscriber's catch-up.
struct CatchUp {
    who: ReqToken,
    key: String,
    /// The last entry it was given.
    after: EntryId,
    /// Its first round began.
    started: bool,
    /// A page is out.
    asked: bool,
}

/// What each reply in flight answers.
enum Op {
    Auth,
    Last(String),
    Range(ReqToken),
    Read,
}

/// The hub's connection (a hub has one; the index is Owner's).
struct Link {
    hub: *mut StreamHub,
    index: usize,
    addrs: Vec<Addr>,
    next: usize,
    conn: RedisConn,
    retry: RetryTimer,
    /// Redis refused the password (its message).
    auth_refused: Option<String>,
}

pub struct StreamHub {
    upstream: String,
    links: Vec<Link>,
    auth: Option<Vec<u8>>,
    auth_key: Option<u64>,
    tls: Option<TlsClient>,
    connect_timeout: ngx_msec_t,
    sink: &'static dyn StreamSink,
    keys: BTreeMap<String, Key>,
    catchups: Vec<CatchUp>,
    inflight: VecDeque<Op>,
}

/// What a stream hub is made of.
pub struct StreamSettings {
    pub upstream: String,
    /// The servers, tried in turn.
    pub addrs: Vec<Addr>,
    pub auth: Option<Vec<u8>>,
    pub auth_key: Option<u64>,
    pub tls: Option<TlsClient>,
    pub connect_timeout: ngx_msec_t,
}

impl StreamHub {
    pub fn new(s: StreamSettings, sink: &'static dyn StreamSink) -> Box<StreamHub> {
        let mut h = Box::new(StreamHub {
            upstream: s.upstream,
            links: Vec::new(),
            auth: s.auth,
            auth_key: s.auth_key,
            tls: s.tls,
            connect_timeout: s.connect_timeout,
            sink,
            keys: BTreeMap::new(),
            catchups: Vec::new(),
            inflight: VecDeque::new(),
        });
        let hub: *mut StreamHub = &mut *h;
        h.links.push(Link {
            hub,
            index: 0,
            addrs: s.addrs,
            next: 0,
            conn: RedisConn::new(),
            retry: RetryTimer::new(std::ptr::null_mut(), Some(retry_event)),
            auth_refused: None,
        });
        // (The link stays where it is now.)
        let data: *mut Link = &mut h.links[0];
        h.links[0].retry.set_data(data.cast());
        h
    }

    fn server(&self, i: usize) -> &str {
        let l = &self.links[i];
        l.addrs.get(l.next % l.addrs.len().max(1)).map_or("", |a| &a.name)
    }

    /// What was out on a connection that went is asked again on the next.
    fn forget_inflight(&mut self) {
        self.inflight.clear();
        for k in self.keys.values_mut() {
            k.asked = false;
        }
        for c in &mut self.catchups {
            c.asked = false;
        }
    }

    /// Closes the connection (no retry): nobody reads any more.
    fn close(&mut self) {
        for l in &mut self.links {
            l.conn.close();
            l.retry.stop();
        }
        self.forget_inflight();
    }

    fn lost(&mut self, i: usize, why: &str) {
        let was = self.links[i].conn.state();
        self.links[i].conn.close();
        self.forget_inflight();
        if self.keys.is_empty() {
            return;
        }
        log!(
            NGX_LOG_ERR,
            Log::cycle(),
            "cache: the stream reading connection to {} of upstream \"{}\" {}: {why}; trying again in {} ms",
            self.server(i),
            self.upstream,
            if was == State::Up { "was lost" } else { "failed" },
            RETRY
        );
        let l = &mut self.links[i];
        l.next = (l.next + 1) % l.addrs.len().max(1);
        l.retry.start(RETRY);
    }

    /// Every subscriber of every key.
    fn everyone(&self) -> Vec<ReqToken> {
        self.keys.values().flat_map(|k| k.subs.iter()).copied().collect()
    }

    fn refused(&mut self, i: usize, why: &str) {
        if let Some(k) = self.auth_key {
            authfail::refused(
                k,
                Log::cycle(),
                format_args!(
                    "{why}, by redis {} of upstream \"{}\" (reading streams); its streams end",
                    self.server(i),
                    self.upstream
                ),
            );
        }
        let all = self.everyone();
        self.close();
        self.sink.closing(&all);
    }

    fn connect(&mut self, i: usize) {
        let l = &self.links[i];
        let Some(addr) = l.addrs.get(l.next % l.addrs.len().max(1)).map(|a| a.sockaddr.clone()) else {
            return;
        };
        let dial = Dial {
            addr: &addr,
            tls: self.tls.as_ref(),
            connect_timeout: self.connect_timeout,
            keepalive: false,
            log: None,
        };
        let l = &mut self.links[i];
        let data: *mut Link = l;
        let step = l
            .conn
            .open::<StreamHub>(&dial, data.cast())
            .unwrap_or_else(|e| Step::Lost(e.to_string()));
        if let Some(s) = l.conn.socket() {
            // nginx tells an idle connection when it exits (a reload, a quit).
            s.set_idle(true);
        }
        self.step(i, step);
    }

    fn step(&mut self, i: usize, step: Step) {
        match step {
            Step::Wait => {}
            Step::Up => {
                let l = &mut self.links[i];
                l.conn.out.clear();
                self.forget_inflight();
                if let Some(pw) = &self.auth {
                    pubsub::auth(&mut self.links[i].conn.out, pw);
                    self.inflight.push_back(Op::Auth);
                }
                self.round(i);
            }
            Step::Ready => {
                self.flush(i);
                self.read(i);
            }
            Step::Lost(why) => self.lost(i, &why),
            Step::Exit => {
                let all = self.everyone();
                self.close();
                self.sink.closing(&all);
            }
        }
    }

    fn flush(&mut self, i: usize) {
        if let Err(why) = self.links[i].conn.flush() {
            self.lost(i, &why);
        }
    }

    /// The next round, once the last one is answered.
    fn kick(&mut self, i: usize) {
        if self.links[i].conn.is_up() && self.inflight.is_empty() {
            self.round(i);
        }
    }

    /// Queues and sends one round (module comment).
    fn round(&mut self, i: usize) {
        let mut out = std::mem::take(&mut self.links[i].conn.out);
        let mut others = false;
        for (name, k) in self.keys.iter_mut() {
            if k.pos.is_none() && !k.asked {
                streams::xlast(&mut out, name.as_bytes());
                k.asked = true;
                self.inflight.push_back(Op::Last(name.clone()));
                others = true;
            }
        }
        let mut pages = 0;
        let mut gone = Vec::new();
        for c in &mut self.catchups {
            if pages >= PAGES_PER_ROUND {
                break;
            }
            if c.asked || self.keys.get(&c.key).is_none_or(|k| k.pos.is_none()) {
                continue;
            }
            match self.sink.backlog(c.who) {
                None => {
                    gone.push(c.who);
                    continue;
                }
                Some(b) if b > PAUSE_AT => continue,
                Some(_) => {}
            }
            if !std::mem::replace(&mut c.started, true) {
                self.sink.begin_round(c.who);
            }
            streams::xrange_after(&mut out, c.key.as_bytes(), c.after, PAGE);
            c.asked = true;
            pages += 1;
            self.inflight.push_back(Op::Range(c.who));
            others = true;
        }
        self.catchups.retain(|c| !gone.contains(&c.who));
        let read: Vec<(&[u8], String)> = self
            .keys
            .iter()
            .filter_map(|(name, k)| k.pos.map(|p| (name.as_bytes(), p.to_string())))
            .collect();
        if !read.is_empty() {
            let ids: Vec<(&[u8], &[u8])> = read.iter().map(|(k, p)| (*k, p.as_bytes())).collect();
            streams::xread(&mut out, READ_COUNT, (!others).then_some(BLOCK_MS), &ids);
            self.inflight.push_back(Op::Read);
        }
        self.links[i].conn.out = out;
        self.flush(i);
    }

    /// Reads until the socket (and TLS) has nothing more.
    fn read(&mut self, i: usize) {
        while self.links[i].conn.is_up() {
            match self.links[i].conn.read() {
                Ok(0) => return,
                Ok(_) => {}
                Err(why) => return self.lost(i, &why),
            }
            if let Err(e) = self.take_replies(i) {
                return match self.links[i].auth_refused.take() {
                    Some(why) => self.refused(i, &why),
                    None => self.lost(i, &e),
                };
            }
        }
    }

    fn take_replies(&mut self, i: usize) -> Result<(), String> {
        loop {
            let l = &mut self.links[i];
            if !l.conn.is_up() {
                return Ok(());
            }
            let (v, used) = match resp::value(&l.conn.input[l.conn.in_at..], REPLY_MAX) {
                Ok(None) => return Ok(()),
                Ok(Some(x)) => x,
                Err(_) => return Err("a reply that is not RESP, or one past 64 MB".to_owned()),
            };
            l.conn.in_at += used;
            let Some(op) = self.inflight.pop_front() else {
                return Err("a reply to nothing that was asked".to_owned());
            };
            self.take_reply(i, op, v)?;
            if self.inflight.is_empty() {
                self.kick(i);
            }
        }
    }

    /// A Redis error for a key's subscribers: logged, their streams end
    /// (502 before the header; their clients come back with their last id).
    fn key_error(&mut self, i: usize, what: &str, who: &[ReqToken], msg: &[u8]) {
        log!(
            NGX_LOG_ERR,
            Log::cycle(),
            "cache: redis {} of upstream \"{}\" refused {what}: {}",
            self.server(i),
            self.upstream,
            String::from_utf8_lossy(msg)
        );
        self.sink.fail(who, HTTP_BAD_GATEWAY);
    }

    fn take_reply(&mut self, i: usize, op: Op, v: Value) -> Result<(), String> {
        match (op, v) {
            (Op::Auth, Value::Error(msg)) => {
                let why = format!("AUTH was refused: {}", String::from_utf8_lossy(&msg));
                self.links[i].auth_refused = Some(why.clone());
                return Err(why);
            }
            (Op::Auth, _) => {
                if let Some(k) = self.auth_key {
                    authfail::accepted(k);
                }
            }
            (Op::Last(name), Value::Error(msg)) => {
                let who = self.keys.get(&name).map(|k| k.subs.clone()).unwrap_or_default();
                self.key_error(i, &format!("to read stream \"{name}\""), &who, &msg);
            }
            (Op::Last(name), v) => {
                let last = streams::parse_range(v).map_err(|_| "a reply to XREVRANGE that is not one".to_owned())?;
                if let Some(k) = self.keys.get_mut(&name) {
                    k.asked = false;
                    k.pos = Some(last.first().map_or(EntryId { ms: 0, seq: 0 }, |e| e.id));
                    let to = std::mem::take(&mut k.waiting);
                    if !to.is_empty() {
                        self.sink.subscribed(&to);
                    }
                }
            }
            (Op::Range(who), Value::Error(msg)) => {
                let key = self.catchups.iter().find(|c| c.who == who).map(|c| c.key.clone());
                self.catchups.retain(|c| c.who != who);
                if let Some(key) = key {
                    self.key_error(i, &format!("a catch-up read of stream \"{key}\""), &[who], &msg);
                }
            }
            (Op::Range(who), v) => {
                let entries = streams::parse_range(v).map_err(|_| "a reply to XRANGE that is not one".to_owned())?;
                let Some(at) = self.catchups.iter().position(|c| c.who == who) else {
                    return Ok(());
                };
                let c = &mut self.catchups[at];
                c.asked = false;
                if let Some(e) = entries.last() {
                    c.after = c.after.max(e.id);
                    self.sink.replayed(who, &entries);
                }
                if entries.len() < PAGE {
                    if self.sink.lapsed(who) {
                        // Held live entries were let go: one more round.
                        self.sink.begin_round(who);
                    } else {
                        self.catchups.remove(at);
                        self.sink.release(who);
                    }
                }
            }
            (Op::Read, Value::Error(msg)) => {
                // (A key that is no stream any more: every stream ends, and
                // the one whose key it is fails when it comes back.)
                let all = self.everyone();
                self.key_error(i, "XREAD", &all, &msg);
            }
            (Op::Read, v) => {
                let read = streams::parse_xread(v).map_err(|_| "a reply to XREAD that is not one".to_owned())?;
                for (name, entries) in read {
                    let Some(k) = std::str::from_utf8(&name).ok().and_then(|n| self.keys.get_mut(n)) else {
                        continue;
                    };
                    let from = k.pos.unwrap_or(EntryId { ms: 0, seq: 0 });
                    let new: Vec<_> = entries.into_iter().filter(|e| e.id > from).collect();
                    if let Some(e) = new.last() {
                        k.pos = Some(e.id);
                        let to = k.subs.clone();
                        self.sink.entries(&to, &new);
                    }
                }
            }
        }
        Ok(())
    }

    /// Subscribes `who` to `key`, from the entries after `from` when given
    /// (an id the request side checked), else from those that come next.
    fn join(&mut self, key: &str, who: ReqToken, from: Option<EntryId>) -> bool {
        let k = self.keys.entry(key.to_owned()).or_default();
        k.subs.push(who);
        let now = k.pos.is_some();
        if !now {
            k.waiting.push(who);
        }
        if let Some(after) = from {
            self.catchups.push(CatchUp {
                who,
                key: key.to_owned(),
                after,
                started: false,
                asked: false,
            });
        }
        match self.links[0].conn.state() {
            State::Up => self.kick(0),
            State::Down if !self.links[0].retry.pending() => self.connect(0),
            _ => {}
        }
        now
    }
}

impl Hub for StreamHub {
    fn subscribe(&mut self, key: &str, who: ReqToken) -> bool {
        self.join(key, who, None)
    }

    fn subscribe_from(&mut self, key: &str, who: ReqToken, from: Option<&[u8]>) -> bool {
        self.join(key, who, from.and_then(streams::parse_id))
    }

    fn unsubscribe(&mut self, key: &str, who: ReqToken) {
        self.catchups.retain(|c| c.who != who);
        let Some(k) = self.keys.get_mut(key) else { return };
        k.subs.retain(|t| *t != who);
        k.waiting.retain(|t| *t != who);
        if k.subs.is_empty() {
            self.keys.remove(key);
        }
        if self.keys.is_empty() {
            // Nobody reads any more: the connection goes too.
            self.close();
        }
    }

    fn servers(&self) -> Vec<String> {
        (0..self.links.len()).map(|i| self.server(i).to_owned()).collect()
    }
}

impl Owner for StreamHub {
    const EVENT: &'static str = "cache stream event";
    const HANDSHAKE: &'static str = "cache stream handshake";

    /// `data` is a Link's.
    unsafe fn from_data<'a>(data: *mut c_void) -> (&'a mut StreamHub, usize) {
        // SAFETY: data is a Link of a live hub (hubs live for the worker's
        // life, their links as long as they do); only the two plain fields
        // are read, no reference to the link is made while the hub's is.
        unsafe {
            let link = data as *mut Link;
            (&mut *(*link).hub, (*link).index)
        }
    }

    fn conn(&mut self, i: usize) -> &mut RedisConn {
        &mut self.links[i].conn
    }

    fn step(&mut self, i: usize, step: Step) {
        StreamHub::step(self, i, step);
    }

    fn panicked(&mut self, i: usize) {
        self.lost(i, "an internal error (a panic) in the module");
    }
}

event_handler! {
    /// The connection is made again. (The timer's data is the Link that
    /// owns it.)
    fn retry_event(ev) = "cache stream retry timer", {
        ev.take_timedout();
        run_owner::<StreamHub>(ev.data(), "cache stream retry", |h, i| {
            if h.links[i].conn.state() == State::Down && !h.keys.is_empty() && !exiting() {
                h.connect(i);
            }
        });
    }
}
