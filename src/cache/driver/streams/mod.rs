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
//! - `XRANGE key (<id> + COUNT n` for a page of each catch-up (a
//!   subscriber that came with `Last-Event-ID`): `FIRST_PAGE` entries, then
//!   as many as `PAGE_BYTES` holds at the size of the last page's (keys.rs);
//!   at most `PAGES_PER_ROUND` pages a round, none for a subscriber with
//!   more than `PAUSE_AT` bytes waiting (its catch-up goes on when it has
//!   taken them, and the round's `XREAD` blocks `PAUSED_BLOCK_MS` only);
//! - `XREAD COUNT n [BLOCK BLOCK_MS] STREAMS k1 k2 ... id1 id2 ...`
//!   over every key whose position is known, each after the last entry
//!   read of it. It blocks only when nothing else is in the round. `n` is
//!   the smallest of its keys' counts: as many entries as `PAGE_BYTES`
//!   holds at the size of the key's last ones (`READ_COUNT` at most,
//!   `FIRST_PAGE` for a key none of whose entries was seen), so that
//!   entries added at once (a burst, a transaction) come in turns, not in
//!   one reply past `REPLY_MAX`.
//!
//! The next round goes once every reply of this one is in. A connection
//! reads `READ_TURN` bytes per event at most, then posts itself after
//! nginx's other events; `resp::Scan` finds where a reply ends as its bytes
//! come (linear in them), and it is parsed once, whole, under `REPLY_MAX`
//! (its bytes and what its parsed form holds). A key that
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
//!
//! On a Redis Cluster (`cache_cluster`) a key is read on the master of its
//! slot, as the worker's map of the cluster says (driver::cluster_map,
//! trusted as far as the configured seeds: core's `cluster::Topology`):
//! one connection per master that has subscribed keys, made when a key
//! needs it, each working in rounds as above, with one `XREAD` per slot
//! (Redis reads several keys at once only in one slot; only the round's
//! last one blocks). A map that does not know a slot's master yet, or a
//! `-MOVED`, or a lost master, makes the seed connection (the configured
//! servers in turn) ask `CLUSTER SLOTS`; the keys go where the new map
//! says and read on from their positions.
//!
//! To a `cache_sentinel` upstream the one connection goes to the master its
//! set confirmed (sentinel::Follow), and after a switch to the new one,
//! reading on from each key's position.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::rc::Rc;

use gateway_core::cluster::{self as kslot, Topology};

use gateway_core::pubsub;
use gateway_core::resp::{self, Scan, Value};
use gateway_core::streams::{self, EntryId};

use super::authfail;
use super::conn::{Dial, RedisConn, State, Step};
use super::hub::Addr;
use super::sentinel::Follow;
use crate::common::hub::Hub;
use crate::common::reconnect::{self, Supervised, Supervisor};
use crate::common::sse::StreamSink;
use crate::common::token::ReqToken;
use crate::ffi::net::TlsClient;
use crate::ffi::*;

mod cluster;
mod events;
mod keys;

use events::{ask_event, more_event, tell_event};

/// How long one `XREAD` waits for new entries (ms): also the longest a
/// key that comes waits for its reading to start.
pub const BLOCK_MS: u64 = 250;
/// Entries per key per `XREAD`.
pub const READ_COUNT: usize = 200;
/// Entries per page of a catch-up, at most.
pub const PAGE: usize = 200;
/// Entries of a catch-up's first page: how large they are is not known yet.
pub const FIRST_PAGE: usize = 4;
/// The bytes a catch-up page is sized for (per subscriber): the next page
/// asks as many entries as fit, by the size of the last page's (at least one).
pub const PAGE_BYTES: usize = 256 << 10;
/// How long the `XREAD` of a round blocks while a catch-up waits for its
/// client to take what it was sent (ms): its next page goes that soon.
pub const PAUSED_BLOCK_MS: u64 = 20;
/// Bytes read from a connection per event (per connection): past them the
/// rest is read after nginx's other events (a posted event), so that one
/// large reply does not hold the worker.
const READ_TURN: usize = 512 << 10;
/// Catch-up pages per round (per hub).
pub const PAGES_PER_ROUND: usize = 16;
/// A subscriber with more bytes than this waiting gets no page this round.
pub const PAUSE_AT: usize = 256 << 10;
/// The largest reply taken per connection, in bytes, counting what its
/// parsed form holds (resp::ELEMENT_COST per element besides its bytes):
/// a bigger one breaks the connection, which is made again.
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
    /// Its slot (a cluster's).
    slot: u16,
    /// The connection that reads it (None: a cluster's map must say).
    link: Option<usize>,
    /// Its slot is being migrated (`-ASK`): it is asked again after
    /// `BLOCK_MS`, where the map says then.
    held: bool,
    /// Read with an `XREAD` of its own: an `XREAD` of several keys with it
    /// was refused, and each key's own error ends its streams only.
    alone: bool,
    /// Entries its `XREAD` asks for: as many as `PAGE_BYTES` holds at the
    /// size of its last ones (keys::read_count); 0 while none was seen
    /// (`FIRST_PAGE`).
    count: usize,
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
    /// Entries its next page asks for (PAGE_BYTES).
    count: usize,
}

/// The keys read by one `XREAD`: those of a slot (of a cluster's, else
/// all), but a key read alone by itself (its name).
type ReadGroup<'a> = (bool, u16, &'a str);

/// What each reply in flight answers.
enum Op {
    Auth,
    Last(String),
    /// A page of a catch-up, of so many entries.
    Range(ReqToken, usize),
    /// An `XREAD` of these keys.
    Read(Vec<String>),
    Slots,
}

/// One of the hub's connections: to the upstream's servers in turn (the
/// first, and a cluster's seed connection), or to one master of a
/// cluster.
struct Link {
    addrs: Vec<Addr>,
    /// Its retry, its outage, the address it tries next (its events find
    /// the hub through it: common::reconnect).
    sup: Supervisor,
    conn: RedisConn,
    /// Redis refused the password (its message).
    auth_refused: Option<String>,
    /// What each reply to come answers.
    inflight: VecDeque<Op>,
    /// The master it goes to (a cluster's).
    node: Option<SocketAddr>,
    /// Where the reply being read ends (resp::Scan).
    scan: Scan,
    /// Reads on after nginx's other events (READ_TURN).
    more: RetryTimer,
}

/// A cluster's side of a hub.
struct ClusterSide {
    map: Rc<RefCell<Topology>>,
    /// `CLUSTER SLOTS` is out, or to go on the seed connection.
    want_slots: bool,
    asked_slots: bool,
}

pub struct StreamHub {
    upstream: String,
    /// (A link's events find it through its supervisor, not by where it
    /// is: a cluster's master adds one.)
    links: Vec<Link>,
    cluster: Option<ClusterSide>,
    auth: Option<Vec<u8>>,
    auth_key: Option<u64>,
    tls: Option<TlsClient>,
    connect_timeout: ngx_msec_t,
    sink: &'static dyn StreamSink,
    keys: BTreeMap<String, Key>,
    catchups: Vec<CatchUp>,
    /// The subscribers were told (or are to be) that the servers are
    /// unavailable, and no connection is up since.
    told: bool,
    /// Tells them (posted: a failure may come while a request subscribes).
    tell_later: RetryTimer,
    /// Lets the keys of slots being migrated be asked again.
    ask_later: RetryTimer,
    /// The Sentinel set whose master its connection goes to.
    follow: Option<Follow>,
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
    /// A cluster's map (`cache_cluster`): the addresses are its seeds.
    pub cluster: Option<Rc<RefCell<Topology>>>,
    /// A Sentinel set's master (the address is set at each connection).
    pub follow: Option<Follow>,
}

impl StreamHub {
    pub fn new(s: StreamSettings, sink: &'static dyn StreamSink) -> Box<StreamHub> {
        let mut h = Box::new(StreamHub {
            upstream: s.upstream,
            links: Vec::new(),
            cluster: s.cluster.map(|map| ClusterSide {
                map,
                want_slots: false,
                asked_slots: false,
            }),
            auth: s.auth,
            auth_key: s.auth_key,
            tls: s.tls,
            connect_timeout: s.connect_timeout,
            sink,
            keys: BTreeMap::new(),
            catchups: Vec::new(),
            told: false,
            tell_later: RetryTimer::new(std::ptr::null_mut(), Some(tell_event)),
            ask_later: RetryTimer::new(std::ptr::null_mut(), Some(ask_event)),
            follow: s.follow,
        });
        let data: *mut StreamHub = &mut *h;
        h.tell_later.set_data(data.cast());
        h.ask_later.set_data(data.cast());
        h.add_link(s.addrs, None);
        h
    }

    /// A new connection (not made yet): its index.
    fn add_link(&mut self, addrs: Vec<Addr>, node: Option<SocketAddr>) -> usize {
        let hub: *mut StreamHub = self;
        let index = self.links.len();
        let sup = Supervisor::new(hub, index, addrs.len());
        let more = RetryTimer::new(sup.data(), Some(more_event));
        self.links.push(Link {
            addrs,
            sup,
            conn: RedisConn::new(),
            auth_refused: None,
            inflight: VecDeque::new(),
            node,
            scan: Scan::default(),
            more,
        });
        index
    }

    /// Starts every connection that has work and is down, and the next
    /// round of each that is idle.
    fn kick_all(&mut self) {
        self.resolve();
        for i in 0..self.links.len() {
            if !self.has_work(i) {
                continue;
            }
            match self.links[i].conn.state() {
                State::Up => self.kick(i),
                State::Down if !self.links[i].sup.retrying() => self.connect(i),
                _ => {}
            }
        }
    }

    /// A connection has keys to read (or, the seed's, a map to ask for).
    fn has_work(&self, i: usize) -> bool {
        let slots = i == 0 && self.cluster.as_ref().is_some_and(|c| c.want_slots || c.asked_slots);
        slots || self.keys.values().any(|k| k.link == Some(i))
    }

    fn server(&self, i: usize) -> &str {
        let l = &self.links[i];
        l.addrs.get(l.sup.next() % l.addrs.len().max(1)).map_or("", |a| &a.name)
    }

    /// What was out on a connection that went is asked again on the next
    /// (a cluster's keys where the map will say).
    fn forget_inflight(&mut self, i: usize) {
        self.links[i].inflight.clear();
        self.links[i].scan = Scan::default();
        self.links[i].more.stop();
        let keys = &self.keys;
        for c in &mut self.catchups {
            if keys.get(&c.key).is_none_or(|k| k.link == Some(i)) {
                c.asked = false;
            }
        }
        let cluster = self.cluster.is_some();
        for k in self.keys.values_mut().filter(|k| k.link == Some(i)) {
            k.asked = false;
            if cluster && i != 0 {
                k.link = None;
            }
        }
        if let Some(c) = self.cluster.as_mut() {
            if i == 0 {
                c.asked_slots = false;
            } else {
                c.map.borrow_mut().mark_stale();
            }
        }
    }

    /// Closes the connections (no retry): nobody reads any more.
    fn close(&mut self) {
        for i in 0..self.links.len() {
            self.links[i].conn.close();
            self.links[i].sup.forget();
            self.forget_inflight(i);
        }
        self.told = false;
        self.tell_later.stop();
        self.ask_later.stop();
    }

    /// A connection is gone: made again later while anyone reads
    /// (common::reconnect).
    fn lost(&mut self, i: usize, why: &str) {
        reconnect::lost(self, i, why);
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
        if let Some(f) = self.follow.as_mut() {
            match f.target() {
                Ok(a) => {
                    self.links[i].addrs = vec![Addr {
                        sockaddr: crate::ffi::conf::sockaddr_bytes(a),
                        name: a.to_string(),
                    }]
                }
                Err(why) => return self.lost(i, &why),
            }
        }
        let l = &self.links[i];
        let Some(addr) = l
            .addrs
            .get(l.sup.next() % l.addrs.len().max(1))
            .map(|a| a.sockaddr.clone())
        else {
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
        let data = l.sup.data();
        let step = l
            .conn
            .open::<StreamHub>(&dial, data)
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
                let what = self.what(i);
                self.links[i].sup.up(format_args!("{what}"));
                self.told = false;
                let l = &mut self.links[i];
                l.conn.out.clear();
                l.inflight.clear();
                if let Some(pw) = &self.auth {
                    pubsub::auth(&mut l.conn.out, pw);
                    l.inflight.push_back(Op::Auth);
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
        if self.links[i].conn.is_up() && self.links[i].inflight.is_empty() {
            self.round(i);
        }
    }

    /// Queues and sends one round of connection `i` (module comment).
    fn round(&mut self, i: usize) {
        let mut out = std::mem::take(&mut self.links[i].conn.out);
        let mut ops = std::mem::take(&mut self.links[i].inflight);
        let mut others = false;
        if i == 0 {
            if let Some(c) = self.cluster.as_mut() {
                if c.want_slots && !c.asked_slots {
                    resp::command(&mut out, &[b"CLUSTER", b"SLOTS"]);
                    c.want_slots = false;
                    c.asked_slots = true;
                    ops.push_back(Op::Slots);
                    others = true;
                }
            }
        }
        for (name, k) in self.keys.iter_mut().filter(|(_, k)| k.link == Some(i)) {
            if k.pos.is_none() && !k.asked {
                streams::xlast(&mut out, name.as_bytes());
                k.asked = true;
                ops.push_back(Op::Last(name.clone()));
                others = true;
            }
        }
        let mut pages = 0;
        let mut paused = false;
        let mut gone = Vec::new();
        for c in &mut self.catchups {
            if pages >= PAGES_PER_ROUND {
                break;
            }
            let here = self
                .keys
                .get(&c.key)
                .is_some_and(|k| k.pos.is_some() && k.link == Some(i));
            if c.asked || !here {
                continue;
            }
            match self.sink.backlog(c.who) {
                None => {
                    gone.push(c.who);
                    continue;
                }
                Some(b) if b > PAUSE_AT => {
                    paused = true;
                    continue;
                }
                Some(_) => {}
            }
            if !std::mem::replace(&mut c.started, true) {
                self.sink.begin_round(c.who);
            }
            streams::xrange_after(&mut out, c.key.as_bytes(), c.after, c.count);
            c.asked = true;
            pages += 1;
            ops.push_back(Op::Range(c.who, c.count));
            others = true;
        }
        self.catchups.retain(|c| !gone.contains(&c.who));
        // One XREAD (a cluster's: one per slot, and one per key read
        // alone; the last one blocks).
        let mut groups: BTreeMap<ReadGroup, Vec<(&str, String)>> = BTreeMap::new();
        // (One COUNT for the keys of an XREAD: the smallest of theirs.)
        let mut counts: BTreeMap<ReadGroup, usize> = BTreeMap::new();
        let cluster = self.cluster.is_some();
        for (name, k) in self.keys.iter().filter(|(_, k)| k.link == Some(i)) {
            if let Some(p) = k.pos {
                let g = (
                    k.alone,
                    if cluster { k.slot } else { 0 },
                    if k.alone { name.as_str() } else { "" },
                );
                groups.entry(g).or_default().push((name.as_str(), p.to_string()));
                let count = if k.count == 0 { FIRST_PAGE } else { k.count };
                let c = counts.entry(g).or_insert(READ_COUNT);
                *c = (*c).min(count);
            }
        }
        let n = groups.len();
        let wait = if paused { PAUSED_BLOCK_MS } else { BLOCK_MS };
        for (at, (g, read)) in groups.iter().enumerate() {
            let ids: Vec<(&[u8], &[u8])> = read.iter().map(|(k, p)| (k.as_bytes(), p.as_bytes())).collect();
            let block = (!others && at + 1 == n).then_some(wait);
            let count = counts.get(g).copied().unwrap_or(READ_COUNT);
            streams::xread(&mut out, count, block, &ids);
            ops.push_back(Op::Read(read.iter().map(|(k, _)| (*k).to_owned()).collect()));
        }
        let l = &mut self.links[i];
        l.conn.out = out;
        l.inflight = ops;
        self.flush(i);
    }

    /// Reads until the socket (and TLS) has nothing more, or READ_TURN
    /// bytes were read: the rest after nginx's other events.
    fn read(&mut self, i: usize) {
        let mut turn = 0;
        while self.links[i].conn.is_up() {
            if turn >= READ_TURN {
                return self.links[i].more.post_next();
            }
            match self.links[i].conn.read() {
                Ok(0) => return,
                Ok(n) => turn += n,
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
            let buf = &l.conn.input[l.conn.in_at..];
            let bad = || "a reply that is not RESP, or one past 64 MB".to_owned();
            let len = match l.scan.feed(buf, REPLY_MAX) {
                Ok(None) => return Ok(()),
                Ok(Some(len)) => len,
                Err(_) => return Err(bad()),
            };
            l.scan = Scan::default();
            let Ok(Some((v, used))) = resp::value(&buf[..len], REPLY_MAX) else {
                return Err(bad());
            };
            l.conn.in_at += used;
            let Some(op) = l.inflight.pop_front() else {
                return Err("a reply to nothing that was asked".to_owned());
            };
            self.take_reply(i, op, v, used)?;
            if self.links[i].inflight.is_empty() {
                self.kick(i);
            }
        }
    }

    fn take_reply(&mut self, i: usize, op: Op, v: Value, bytes: usize) -> Result<(), String> {
        if let Value::Error(msg) = &v {
            if !matches!(op, Op::Auth | Op::Slots) && self.redirected(i, msg) {
                // Asked again where the map says (a connection that is
                // busy asks in its next round).
                self.kick_all();
                return Ok(());
            }
        }
        match (op, v) {
            (Op::Slots, v) => {
                self.slots_answer(i, &v);
                self.kick_all();
            }
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
            (Op::Last(name), Value::Error(msg)) => self.drop_key(i, &name, "to read", &msg),
            (Op::Last(name), v) => {
                let last = streams::parse_range(v).map_err(|_| "a reply to XREVRANGE that is not one".to_owned())?;
                if let Some(k) = self.keys.get_mut(&name) {
                    k.asked = false;
                    k.pos = Some(last.first().map_or(EntryId { ms: 0, seq: 0 }, |e| e.id));
                    k.count = keys::read_count(&last).unwrap_or(k.count);
                    let to = std::mem::take(&mut k.waiting);
                    if !to.is_empty() {
                        self.sink.subscribed(&to);
                    }
                }
            }
            (Op::Range(who, _), Value::Error(msg)) => {
                let key = self.catchups.iter().find(|c| c.who == who).map(|c| c.key.clone());
                self.catchups.retain(|c| c.who != who);
                if let Some(key) = key {
                    self.key_error(i, &format!("a catch-up read of stream \"{key}\""), &[who], &msg);
                }
            }
            (Op::Range(who, count), v) => {
                let entries = streams::parse_range(v).map_err(|_| "a reply to XRANGE that is not one".to_owned())?;
                self.page(who, count, &entries, bytes);
            }
            (Op::Read(names), Value::Error(msg)) => self.read_refused(i, &names, &msg),
            (Op::Read(names), v) => {
                for name in &names {
                    if let Some(k) = self.keys.get_mut(name) {
                        k.alone = false;
                    }
                }
                let read = streams::parse_xread(v).map_err(|_| "a reply to XREAD that is not one".to_owned())?;
                for (name, entries) in read {
                    let Some(k) = std::str::from_utf8(&name).ok().and_then(|n| self.keys.get_mut(n)) else {
                        continue;
                    };
                    k.count = keys::read_count(&entries).unwrap_or(k.count);
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
        let cluster = self.cluster.is_some();
        let k = self.keys.entry(key.to_owned()).or_insert_with(|| Key {
            slot: kslot::key_slot(key.as_bytes()),
            link: (!cluster).then_some(0),
            ..Key::default()
        });
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
                count: FIRST_PAGE,
            });
        }
        self.kick_all();
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
        if let Some(k) = self.keys.get_mut(key) {
            k.subs.retain(|t| *t != who);
            k.waiting.retain(|t| *t != who);
            if k.subs.is_empty() {
                self.keys.remove(key);
            }
        }
        if self.keys.is_empty() {
            // Nobody reads any more: the connection goes too.
            self.close();
        }
    }

    fn servers(&self) -> Vec<String> {
        (0..self.links.len()).map(|i| self.server(i).to_owned()).collect()
    }

    fn unavailable(&self) -> bool {
        self.told && !self.tell_later.posted()
    }

    fn follow(&mut self) {
        self.follow_master();
    }
}
