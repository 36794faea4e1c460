//! The subscribing hubs of `cache_subscribe`: Redis SUBSCRIBE for the
//! worker's subscribers.
//!
//! Each worker keeps one hub per upstream (and `cache_auth` password),
//! shared by every subscriber of every channel. The hub subscribes on every
//! server of the upstream, one connection to each address (backup servers
//! too): `cache_publish` is balanced over those servers, and a subscriber
//! hears what was published on any of them. A Redis Cluster carries every
//! PUBLISH to all its nodes, so the hub of a `cache_cluster` upstream has
//! one connection, to its configured nodes in turn.
//!
//! SUBSCRIBE when a channel's first subscriber comes, UNSUBSCRIBE after its
//! last one leaves, the connections closed when nobody is left. A
//! subscriber is told it is subscribed once every connection that is up
//! has confirmed its channel. A connection that is lost is made again after
//! `RETRY` ms (to the next address, for a cluster), subscribes to every
//! channel again, and the subscribers get `event: reconnect`: what was
//! published on that server in between is lost. While a server cannot be
//! reached, the log says so once for that connection and the subscribers
//! hear it once (hub::Outage). The subscribers' side is
//! crate::common::sse's, shared with `sqldb_listen`.
//!
//! The hub of a `cache_sentinel` upstream has one connection, to the master
//! its set confirmed (sentinel::Follow): made again there after a switch,
//! as for any connection lost (the subscribers get `event: reconnect`);
//! while no master is confirmed, its attempts fail as for a server down.

use std::collections::BTreeSet;
use std::ffi::c_void;

use gateway_core::pubsub::{self, Push};
use gateway_core::resp::Scan;

use super::authfail;
use super::conn::{run_owner, Dial, Owner, RedisConn, State, Step};
use super::sentinel::Follow;
use crate::common::hub::{self, Added, Channels, Hub, HubSink};
use crate::common::reconnect::{self, Supervised, Supervisor};
use crate::common::token::ReqToken;
use crate::ffi::conf::sockaddr_bytes;
use crate::ffi::net::TlsClient;
use crate::ffi::*;
use crate::log;

/// One address of the upstream's servers.
#[derive(Clone)]
pub struct Addr {
    pub sockaddr: Vec<u8>,
    pub name: String,
}

/// One subscribing connection: to one address of the upstream's servers,
/// or, for a cluster, to its configured nodes in turn.
struct Link {
    addrs: Vec<Addr>,
    /// Its retry, its outage, the address it tries next (its events find
    /// the hub through it); it works again once Redis confirmed a
    /// subscription on it, and subscribers then hear of the gap.
    sup: Supervisor,
    conn: RedisConn,
    /// This connection works.
    live: bool,
    /// The next status or error is AUTH's.
    auth_pending: bool,
    /// Redis refused the password (its message).
    auth_refused: Option<String>,
    /// The channels Redis confirmed on this connection.
    confirmed: BTreeSet<String>,
    /// Where the message being read ends (resp::Scan).
    scan: Scan,
    /// Reads on after nginx's other events (READ_TURN).
    more: RetryTimer,
}

/// The most bytes a connection reads in one event: the rest waits for
/// nginx's other events (a burst of messages, or one large message, does
/// not hold the worker).
const READ_TURN: usize = 512 << 10;

pub struct RedisHub {
    /// The upstream, for the log.
    upstream: String,
    /// Made with the hub (their events find them through their
    /// supervisors, not by where they are).
    links: Vec<Link>,
    auth: Option<Vec<u8>>,
    /// The password's key in the worker's table of refused ones.
    auth_key: Option<u64>,
    tls: Option<TlsClient>,
    connect_timeout: ngx_msec_t,
    sink: &'static dyn HubSink,
    channels: Channels,
    /// Runs `settle_all` after a connection that was up is lost (posted:
    /// a loss may come while a request subscribes, which the subscribers'
    /// side must not hear of then); tells the subscribers that a server
    /// is unavailable (`tell`).
    settle_later: RetryTimer,
    /// The subscribers are to hear that the servers are unavailable.
    tell: bool,
    /// They heard it (or are to), and no connection is up since.
    told: bool,
    /// The Sentinel set whose master its one connection goes to.
    follow: Option<Follow>,
}

/// What a hub is made of.
pub struct HubSettings {
    /// The upstream's name, for the log.
    pub upstream: String,
    /// The addresses of each connection (one each; a cluster's nodes in turn).
    pub groups: Vec<Vec<Addr>>,
    pub auth: Option<Vec<u8>>,
    /// The password's key in the worker's table of refused ones.
    pub auth_key: Option<u64>,
    pub tls: Option<TlsClient>,
    pub connect_timeout: ngx_msec_t,
    /// A Sentinel set's master (one group, whose address is set at each
    /// connection).
    pub follow: Option<Follow>,
}

impl RedisHub {
    pub fn new(settings: HubSettings, sink: &'static dyn HubSink) -> Box<RedisHub> {
        let HubSettings {
            upstream,
            groups,
            auth,
            auth_key,
            tls,
            connect_timeout,
            follow,
        } = settings;
        let mut h = Box::new(RedisHub {
            upstream,
            links: Vec::new(),
            auth,
            auth_key,
            tls,
            connect_timeout,
            sink,
            channels: Channels::default(),
            settle_later: RetryTimer::new(std::ptr::null_mut(), Some(settle_event)),
            tell: false,
            told: false,
            follow,
        });
        let hub: *mut RedisHub = &mut *h;
        h.settle_later.set_data(hub.cast());
        h.links = groups
            .into_iter()
            .enumerate()
            .map(|(index, addrs)| {
                let sup = Supervisor::new(hub, index, addrs.len());
                let more = RetryTimer::new(sup.data(), Some(more_event));
                Link {
                    sup,
                    addrs,
                    conn: RedisConn::new(),
                    live: false,
                    auth_pending: false,
                    auth_refused: None,
                    confirmed: BTreeSet::new(),
                    scan: Scan::default(),
                    more,
                }
            })
            .collect();
        h
    }

    fn server(&self, i: usize) -> &str {
        let l = &self.links[i];
        l.addrs.get(l.sup.next() % l.addrs.len().max(1)).map_or("", |a| &a.name)
    }

    /// Closes a link's socket, and frees its TLS state.
    fn drop_socket(&mut self, i: usize) {
        let l = &mut self.links[i];
        l.live = false;
        l.confirmed.clear();
        l.scan = Scan::default();
        l.more.stop();
        l.conn.close();
    }

    /// Closes every connection (no retry).
    fn close(&mut self) {
        for i in 0..self.links.len() {
            self.drop_socket(i);
            // (A connection made later for new subscribers is no reconnect.)
            self.links[i].sup.forget();
        }
        self.settle_later.stop();
        self.tell = false;
        self.told = false;
        self.channels.deactivate();
    }

    /// A channel is in effect once every connection that is up has
    /// confirmed it (and one is up): its waiting subscribers are told so.
    fn settle(&mut self, channel: &str) {
        let mut up = self.links.iter().filter(|l| l.conn.is_up()).peekable();
        let any = up.peek().is_some();
        if any && up.all(|l| l.confirmed.contains(channel)) {
            let to = self.channels.confirm(channel);
            if !to.is_empty() {
                self.sink.subscribed(&to);
            }
        } else {
            self.channels.deactivate_one(channel);
        }
    }

    /// `settle` for every channel (a connection came up or went down).
    fn settle_all(&mut self) {
        let names: Vec<String> = self.channels.names().map(str::to_owned).collect();
        for c in names {
            self.settle(&c);
        }
    }

    /// A connection is gone: tried again later (the next address of a
    /// cluster) while anyone is subscribed (common::reconnect).
    fn lost(&mut self, i: usize, why: &str) {
        reconnect::lost(self, i, why);
    }

    /// Redis refused the password: the subscriptions end (the responses
    /// end), and the connections are not made again for them; a subscriber
    /// that comes back within a second gets 502 without a connection, and
    /// the refusal is logged once a minute at most. Idle subscribers with a
    /// wrong password cost Redis one connection each, not one a second.
    fn refused(&mut self, i: usize, why: &str) {
        if let Some(k) = self.auth_key {
            authfail::refused(
                k,
                Log::cycle(),
                format_args!(
                    "{why}, by redis {} of upstream \"{}\" (subscribing); its subscriptions end",
                    self.server(i),
                    self.upstream
                ),
            );
        }
        let all = self.channels.everyone();
        self.close();
        self.sink.closing(&all);
    }

    fn connect(&mut self, i: usize) {
        if let Some(f) = self.follow.as_mut() {
            match f.target() {
                Ok(a) => {
                    self.links[i].addrs = vec![Addr {
                        sockaddr: sockaddr_bytes(a),
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
        // (A connect that did not start: nginx's line says why, this one
        // what it comes to.)
        let step = l
            .conn
            .open::<RedisHub>(&dial, data)
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
            Step::Up => self.connected(i),
            Step::Ready => {
                self.flush(i);
                self.read(i);
            }
            Step::Lost(why) => self.lost(i, &why),
            Step::Exit => {
                // nginx is exiting: the subscriptions end, the connections close.
                let all = self.channels.everyone();
                self.close();
                self.sink.closing(&all);
            }
        }
    }

    /// The connection is made: AUTH, then SUBSCRIBE to every channel.
    fn connected(&mut self, i: usize) {
        let l = &mut self.links[i];
        l.conn.out.clear();
        if let Some(pw) = &self.auth {
            pubsub::auth(&mut l.conn.out, pw);
        }
        l.auth_pending = self.auth.is_some();
        pubsub::subscribe(&mut l.conn.out, self.channels.names().map(str::as_bytes));
        // Until this connection confirms them, new subscribers wait.
        self.settle_all();
        self.flush(i);
    }

    /// Sends what is queued, as far as the socket takes it.
    fn flush(&mut self, i: usize) {
        if let Err(why) = self.links[i].conn.flush() {
            self.lost(i, &why);
        }
    }

    /// Reads until the socket (and TLS) has nothing more (with TLS, bytes
    /// may wait in OpenSSL where no readiness event tells of them), or
    /// READ_TURN bytes were read: the rest after nginx's other events.
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
            if let Err(e) = self.take_pushes(i) {
                return match self.links[i].auth_refused.take() {
                    Some(why) => self.refused(i, &why),
                    None => self.lost(i, &e),
                };
            }
        }
    }

    /// Everything whole in a connection's input: publications go to their
    /// subscribers. `resp::Scan` finds where a message ends as its bytes
    /// come (each byte looked at once, however many reads it takes), and
    /// it is parsed once, whole.
    fn take_pushes(&mut self, i: usize) -> Result<(), String> {
        let input = std::mem::take(&mut self.links[i].conn.input);
        let mut at = self.links[i].conn.in_at;
        let result = loop {
            let rest = &input[at.min(input.len())..];
            let len = match self.links[i].scan.feed(rest, pubsub::MAX_MESSAGE) {
                Ok(None) => break Ok(()),
                Ok(Some(len)) => len,
                Err(_) => break Err(pubsub::PushError::NotResp.to_string()),
            };
            self.links[i].scan = Scan::default();
            match pubsub::next(&rest[..len]) {
                Ok(None) => break Ok(()),
                Err(e) => break Err(e.to_string()),
                Ok(Some((push, used))) => {
                    at += used;
                    if let Err(e) = self.take_push(i, push) {
                        break Err(e);
                    }
                }
            }
        };
        let l = &mut self.links[i];
        // (Nothing is read into it while the pushes are taken; a connection
        // closed meanwhile has nothing to keep.)
        if l.conn.is_up() {
            l.conn.input = input;
            l.conn.in_at = at.min(l.conn.input.len());
        }
        result
    }

    fn take_push(&mut self, i: usize, push: Push) -> Result<(), String> {
        match push {
            Push::Message { channel, payload } => {
                let to = std::str::from_utf8(&channel).ok().and_then(|c| self.channels.get(c));
                if let Some((name, to)) = to {
                    self.sink.notify(to, name, &payload);
                }
            }
            Push::Subscribed(channel) => {
                let l = &mut self.links[i];
                if !std::mem::replace(&mut l.live, true) {
                    self.told = false;
                    let what = self.what(i);
                    if self.links[i].sup.up(format_args!("{what}")) {
                        let all = self.channels.settled();
                        self.sink.reconnected(&all);
                    }
                }
                if let Ok(c) = std::str::from_utf8(&channel) {
                    self.links[i].confirmed.insert(c.to_owned());
                    self.settle(c);
                }
            }
            Push::Unsubscribed(channel) => {
                if let Ok(c) = std::str::from_utf8(&channel) {
                    self.links[i].confirmed.remove(c);
                }
            }
            Push::Status => {
                if std::mem::take(&mut self.links[i].auth_pending) {
                    if let Some(k) = self.auth_key {
                        authfail::accepted(k);
                    }
                }
            }
            Push::Error(msg) if std::mem::take(&mut self.links[i].auth_pending) => {
                // A wrong password: nothing works on this connection.
                let why = format!("AUTH was refused: {}", String::from_utf8_lossy(&msg));
                self.links[i].auth_refused = Some(why.clone());
                return Err(why);
            }
            Push::Error(msg) => log!(
                NGX_LOG_ERR,
                Log::cycle(),
                "cache: redis {} of upstream \"{}\" refused a subscription: {}",
                self.server(i),
                self.upstream,
                String::from_utf8_lossy(&msg)
            ),
        }
        Ok(())
    }
}

impl Hub for RedisHub {
    fn subscribe(&mut self, channel: &str, who: ReqToken) -> bool {
        let added = self.channels.add(channel, who);
        for i in 0..self.links.len() {
            match self.links[i].conn.state() {
                State::Up if added == Added::First => {
                    pubsub::subscribe(&mut self.links[i].conn.out, [channel.as_bytes()]);
                    self.flush(i);
                }
                State::Down if !self.links[i].sup.retrying() => self.connect(i),
                _ => {}
            }
        }
        added == Added::Active
    }

    fn unsubscribe(&mut self, channel: &str, who: ReqToken) {
        if !self.channels.remove(channel, who) {
            return;
        }
        if self.channels.is_empty() {
            // Nobody listens any more: the connections go too.
            return self.close();
        }
        for i in 0..self.links.len() {
            if self.links[i].conn.is_up() {
                pubsub::unsubscribe(&mut self.links[i].conn.out, channel.as_bytes());
                self.flush(i);
            }
        }
    }

    fn servers(&self) -> Vec<String> {
        (0..self.links.len()).map(|i| self.server(i).to_owned()).collect()
    }

    fn unavailable(&self) -> bool {
        self.told && !self.tell
    }

    /// Its set confirmed a master: a connection that is down is made now,
    /// one to another server is made again there.
    fn follow(&mut self) {
        let Some(f) = &self.follow else { return };
        let (Some(master), moved) = (f.confirmed(), f.moved()) else {
            return;
        };
        if self.channels.is_empty() {
            return;
        }
        for i in 0..self.links.len() {
            match self.links[i].conn.state() {
                State::Down => self.connect(i),
                _ if moved.is_some() => {
                    self.lost(i, &format!("the master of its sentinel set switched to {master}"));
                    self.connect(i);
                }
                _ => {}
            }
        }
    }
}

impl Supervised for RedisHub {
    fn supervisor(&mut self, i: usize) -> &mut Supervisor {
        &mut self.links[i].sup
    }

    fn what(&self, i: usize) -> String {
        format!(
            "cache: the subscribing connection to {} of upstream \"{}\"",
            self.server(i),
            self.upstream
        )
    }

    fn close_link(&mut self, i: usize) -> bool {
        let was = self.links[i].conn.state();
        self.drop_socket(i);
        was == State::Up
    }

    fn wanted(&self) -> bool {
        !self.channels.is_empty()
    }

    fn all_down(&self) -> bool {
        self.links.iter().all(|l| l.conn.state() == State::Down)
    }

    fn told(&mut self) -> &mut bool {
        &mut self.told
    }

    /// The subscribers hear of an outage (with several servers, only once
    /// none is left: the others carry the subscriptions), and the channels
    /// the other connections confirmed are in effect now: both posted
    /// (a loss may come while a request subscribes).
    fn after_loss(&mut self, _: usize, was_up: bool, tell: bool) {
        self.tell |= tell;
        if was_up || self.tell {
            self.settle_later.post();
        }
    }

    fn reconnect(&mut self, i: usize) {
        if self.links[i].conn.state() == State::Down && !self.channels.is_empty() {
            self.connect(i);
        }
    }
}

impl Owner for RedisHub {
    const EVENT: &'static str = "cache subscribe event";
    const HANDSHAKE: &'static str = "cache subscribe handshake";

    type Out = ();

    /// `data` is a link's supervisor's (common::reconnect).
    unsafe fn lend<T>(data: *mut c_void, f: impl FnOnce(&mut RedisHub, usize) -> T) -> Option<T> {
        // SAFETY: the hubs live for the worker's life, boxed, and their
        // links' supervisors as long as they do.
        Some(unsafe { reconnect::lend_seat(data, f) })
    }

    fn conn(&mut self, i: usize) -> &mut RedisConn {
        &mut self.links[i].conn
    }

    fn step(&mut self, i: usize, step: Step) {
        RedisHub::step(self, i, step);
    }

    fn panicked(&mut self, i: usize) {
        self.lost(i, "an internal error (a panic) in the module");
    }

    fn take_out(&mut self) {}

    fn deliver(_: ()) {}
}

event_handler! {
    /// The channels are settled after a connection was lost.
    fn settle_event(ev) = "cache subscribe settle", {
        // SAFETY: the event's data is its hub, which lives for the
        // worker's life (its Drop would take the event out of the queue).
        let settle = |h: &mut RedisHub| {
            if std::mem::take(&mut h.tell) {
                let all = h.channels.everyone();
                h.sink.unavailable(&all);
            }
            h.settle_all();
        };
        // SAFETY: see above.
        unsafe { hub::lend(ev.data() as *mut RedisHub, settle) };
    }
}

event_handler! {
    /// Reads on what a connection left for the next turn (READ_TURN). (The
    /// event's data is its link's supervisor's.)
    fn more_event(ev) = "cache subscribe read on", {
        run_owner::<RedisHub>(ev.data(), "cache subscribe read on", |h, i| {
            if h.links[i].conn.is_up() {
                h.read(i);
            }
        });
    }
}
