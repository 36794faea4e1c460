//! The worker's watch of a Redis Sentinel master set (`cache_sentinel`):
//! which server is the master, as the Sentinels name it and as the server
//! itself confirms with `ROLE`, and the replicas the Sentinels list.
//!
//! Per set and worker, two connections made when needed and one kept per
//! Sentinel:
//! - the question (a Sentinel): `SENTINEL get-master-addr-by-name NAME`
//!   and `SENTINEL replicas NAME`, then closed; the next Sentinel when one
//!   cannot be reached or does not know the set;
//! - the check (the server a Sentinel named): `AUTH` (the upstream's
//!   `cache_auth`, sent to no server before a Sentinel named it), `ROLE`;
//!   a master is confirmed, anything else (a replica, no connection) is
//!   asked about again after `RETRY_MS`;
//! - the watches, one per Sentinel (a failover is told only by the
//!   Sentinel that leads it, at first): `SUBSCRIBE +selected-slave
//!   +promoted-slave +switch-master`. A replica selected for promotion
//!   holds the set: no request goes to the old master from then on (its
//!   writes would be lost once the replica is promoted), they wait until
//!   the promoted replica is checked, or `HOLD_MS` has passed.
//!
//! Requests learn the confirmed master here; while there is none they wait
//! (`wait`) and are woken once one is confirmed. A request that finds the
//! master refusing connections or writes (`suspect`) takes the
//! confirmation back, and the Sentinels are asked again. Sentinels are the
//! only source of addresses: nothing else a server says moves a request.

use std::collections::VecDeque;
use std::net::SocketAddr;

use gateway_core::metrics::Id;
use gateway_core::resp::{self, Value};

use super::conn::{Dial, Owner, RedisConn, State};
mod events;
mod failover;
mod follow;
mod probe;
mod reply;

use crate::common::hub;
use crate::common::token::{self, ReqToken};
use crate::ffi::conf::sockaddr_bytes;
use crate::ffi::net::TlsClient;
use crate::ffi::*;
use crate::{log, metrics};
use events::{
    check_deadline_event, hold_event, probe_event, query_deadline_event, retry_event, wake_event, watch_retry_event,
};
pub use follow::Follow;
pub use probe::{replica, replica_failed};
use probe::{Offsets, Probe};
pub use reply::Replica;
use reply::{is_bulk, parse_addr, parse_replicas};

/// How long after a question that confirmed no master the Sentinels are
/// asked again (ms).
pub const RETRY_MS: ngx_msec_t = 200;
/// How often the replicas are asked for again while a master is confirmed (ms).
pub const REFRESH_MS: ngx_msec_t = 5_000;
/// The longest reply read from a Sentinel or a server's `ROLE`.
const MAX_REPLY: usize = 1024 * 1024;
/// The watch's channels: a switch, and a replica promoted (which comes
/// first: the old master may still take writes until it is told).
const SWITCH: &[u8] = b"+switch-master";
const PROMOTED: &[u8] = b"+promoted-slave";
/// A replica chosen for promotion (the old master is left from then on).
const SELECTED: &[u8] = b"+selected-slave";
/// A replica found, or found down or up again: the replicas are asked for.
const REPLICA_EVENTS: [&[u8]; 3] = [b"+slave", b"+sdown", b"-sdown"];
/// How long a failover that began holds the set at most (ms): its
/// requests wait for the promoted replica until then; after it, the
/// Sentinels are asked again.
pub const HOLD_MS: ngx_msec_t = 5_000;

/// A set, as the configuration gives it.
#[derive(Clone)]
pub struct SetConf {
    /// The upstream block's address: the set's key in the worker.
    pub key: usize,
    pub upstream: String,
    pub name: Vec<u8>,
    pub sentinels: Vec<SocketAddr>,
    pub auth: Option<Vec<u8>>,
    pub data_auth: Option<Vec<u8>>,
    pub connect_timeout: ngx_msec_t,
    /// TLS to the Sentinels and the servers (`cache_ssl`).
    pub tls: Option<TlsClient>,
    /// Reads may go to replicas (`cache_target`): they are probed.
    pub replicas: bool,
}

/// A reply a connection waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    Auth,
    MasterAddr,
    Replicas,
    /// `SENTINEL replicas` alone (probe.rs): the master is not asked.
    ReplicasOnly,
    Role,
    Subscribe,
    Probe,
}

const QUERY: usize = 0;
const CHECK: usize = 1;
/// The probes (`ROLE` every round, probe.rs): the master's, and replica
/// k's at PREPLICA + k.
const PMASTER: usize = 2;
const PREPLICA: usize = 3;
/// The replicas probed, at most.
pub const MAX_REPLICAS: usize = 8;
/// The watch of Sentinel k is link WATCH + k.
const WATCH: usize = PREPLICA + MAX_REPLICAS;

struct Link {
    /// Its set, and its place there (for its events).
    set: *mut SetState,
    index: usize,
    conn: RedisConn,
    due: VecDeque<Due>,
    /// The server it goes to.
    peer: Option<SocketAddr>,
}

/// What a request that waits for a master does once one is confirmed.
pub type Resume = fn(&mut Req);

pub struct SetState {
    conf: SetConf,
    links: Vec<Link>,
    /// The master confirmed (None: none now; requests wait).
    master: Option<SocketAddr>,
    /// The master last confirmed (a switch is a new one).
    current: Option<SocketAddr>,
    /// The master the question being asked named.
    named: Option<SocketAddr>,
    replicas: Vec<Replica>,
    /// The Sentinel asked next, and those tried in this round.
    ask: usize,
    tried: usize,
    /// Each Sentinel's watch was subscribed before (a switch may have come
    /// while it was away: the Sentinels are asked again once it is back).
    watched: Vec<bool>,
    /// A failover of this master began (a replica was selected): it is not
    /// confirmed again until `hold` ends.
    held: Option<SocketAddr>,
    /// Sentinels logged as not reachable.
    down: Vec<bool>,
    waiting: Vec<(ReqToken, Resume)>,
    /// Servers left, and why: masters a switch left, replicas that stopped
    /// answering their probes. Their shared connections close, and the
    /// requests on them go on to their next try (wake_event).
    left: Vec<(SocketAddr, &'static str)>,
    /// The master the last switch left, and when (failover.rs).
    gone: Option<(SocketAddr, ngx_msec_t)>,
    retry: RetryTimer,
    watch_retry: RetryTimer,
    hold: RetryTimer,
    refresh: RetryTimer,
    wake: RetryTimer,
    /// A question or a check that takes longer than the connect timeout
    /// (a server that takes connections and does not answer) fails.
    query_deadline: RetryTimer,
    check_deadline: RetryTimer,
    /// What each replica's last `ROLE` said (probe.rs), the master's
    /// offsets, the probes' round, the replica the last read went to.
    probes: Vec<Probe>,
    offsets: Offsets,
    probe_timer: RetryTimer,
    turn: usize,
    /// The replicas are to be asked for (a Sentinel told of one, or the
    /// master switched): the next probe round asks, the master aside.
    replicas_stale: bool,
    /// The question under way asks for the replicas only.
    replicas_only: bool,
}

thread_local! {
    // Boxed: the links' events point at their set, which must not move
    // when the list grows.
    #[allow(clippy::vec_box)]
    static SETS: std::cell::RefCell<Vec<Box<SetState>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on the worker's state of a set, made (and its watch started)
/// on first use; the set is lent for the call only (`hub::lend`), as to
/// its own events.
fn with_set<T>(conf: impl FnOnce() -> SetConf, key: usize, f: impl FnOnce(&mut SetState) -> T) -> T {
    let (set, new) = SETS.with(|sets| {
        let mut sets = sets.borrow_mut();
        match sets.iter_mut().find(|s| s.conf.key == key) {
            Some(s) => (&mut **s as *mut SetState, false),
            None => {
                sets.push(SetState::new(conf()));
                let s = sets.last_mut().expect("just pushed");
                (&mut **s as *mut SetState, true)
            }
        }
    });
    if new {
        // SAFETY: the sets are boxed and kept for the worker's life (never
        // taken out of SETS), and reached only through `hub::lend`.
        unsafe { hub::lend(set, SetState::start) };
    }
    // SAFETY: as above.
    unsafe { hub::lend(set, f) }
}

/// What a request finds: the confirmed master, and the replicas.
pub struct View {
    pub master: Option<SocketAddr>,
    pub replicas: Vec<Replica>,
}

/// The set's master (None: none is confirmed now) and replicas.
pub fn view(key: usize, conf: impl FnOnce() -> SetConf) -> View {
    with_set(conf, key, |s| View {
        master: s.master,
        replicas: s.replicas.clone(),
    })
}

/// A request waits for a confirmed master: `resume` runs with it once
/// there is one (the request times out on its own).
pub fn wait(key: usize, conf: impl FnOnce() -> SetConf, who: ReqToken, resume: Resume) {
    with_set(conf, key, |s| {
        s.waiting.retain(|(t, _)| token::is_live(*t));
        s.waiting.push((who, resume));
        if s.master.is_some() {
            s.wake.post();
        }
    })
}

/// A request found `addr` refusing a connection or a write, or not a
/// master: it is not the master until the Sentinels say so again.
pub fn suspect(key: usize, conf: impl FnOnce() -> SetConf, addr: SocketAddr, why: &str) {
    with_set(conf, key, |s| {
        if s.master != Some(addr) {
            return;
        }
        log!(
            NGX_LOG_INFO,
            Log::cycle(),
            "cache: the master {addr} of sentinel set \"{}\" of upstream \"{}\": {why}; asking the Sentinels again",
            s.name(),
            s.conf.upstream
        );
        s.master = None;
        if s.idle() {
            s.query();
        }
    })
}

impl SetState {
    fn new(conf: SetConf) -> Box<SetState> {
        let n = conf.sentinels.len();
        let mut s = Box::new(SetState {
            conf,
            links: Vec::new(),
            master: None,
            current: None,
            named: None,
            replicas: Vec::new(),
            ask: 0,
            tried: 0,
            watched: vec![false; n],
            held: None,
            down: vec![false; n],
            waiting: Vec::new(),
            left: Vec::new(),
            gone: None,
            retry: RetryTimer::new(std::ptr::null_mut(), Some(retry_event)),
            watch_retry: RetryTimer::new(std::ptr::null_mut(), Some(watch_retry_event)),
            hold: RetryTimer::new(std::ptr::null_mut(), Some(hold_event)),
            refresh: RetryTimer::new(std::ptr::null_mut(), Some(retry_event)),
            wake: RetryTimer::new(std::ptr::null_mut(), Some(wake_event)),
            query_deadline: RetryTimer::new(std::ptr::null_mut(), Some(query_deadline_event)),
            check_deadline: RetryTimer::new(std::ptr::null_mut(), Some(check_deadline_event)),
            probes: vec![Probe::default(); MAX_REPLICAS],
            offsets: Offsets::default(),
            probe_timer: RetryTimer::new(std::ptr::null_mut(), Some(probe_event)),
            turn: 0,
            replicas_stale: false,
            replicas_only: false,
        });
        let p: *mut SetState = &mut *s;
        for index in 0..WATCH + n {
            s.links.push(Link {
                set: p,
                index,
                conn: RedisConn::new(),
                due: VecDeque::new(),
                peer: None,
            });
        }
        s.retry.set_data(p.cast());
        s.watch_retry.set_data(p.cast());
        s.hold.set_data(p.cast());
        s.refresh.set_data(p.cast());
        s.wake.set_data(p.cast());
        s.query_deadline.set_data(p.cast());
        s.check_deadline.set_data(p.cast());
        s.probe_timer.set_data(p.cast());
        s
    }

    fn name(&self) -> String {
        String::from_utf8_lossy(&self.conf.name).into_owned()
    }

    fn start(&mut self) {
        self.query();
        self.watch();
        if self.conf.replicas {
            self.probe();
        }
    }

    /// No question or check under way, none planned.
    fn idle(&self) -> bool {
        self.links[QUERY].conn.state() == State::Down
            && self.links[CHECK].conn.state() == State::Down
            && !self.retry.pending()
    }

    /// Opens link `i` to `addr` with `out` queued; false when it could not
    /// start (its failure is handled).
    fn open(&mut self, i: usize, addr: SocketAddr, out: Vec<u8>, due: VecDeque<Due>) {
        let link = &mut self.links[i];
        link.conn.close();
        link.peer = Some(addr);
        link.due = due;
        link.conn.out = out;
        let bytes = sockaddr_bytes(addr);
        let dial = Dial {
            addr: &bytes,
            tls: self.conf.tls.as_ref(),
            connect_timeout: self.conf.connect_timeout,
            keepalive: i >= WATCH,
            log: None,
        };
        let data: *mut Link = link;
        let deadline = match i {
            QUERY => Some(&mut self.query_deadline),
            CHECK => Some(&mut self.check_deadline),
            _ => None,
        };
        if let Some(d) = deadline {
            d.stop();
            // (Twice the connect timeout: the connection, then the replies.)
            d.start(self.conf.connect_timeout.saturating_mul(2));
        }
        let link = &mut self.links[i];
        match link.conn.open::<SetState>(&dial, data.cast()) {
            Err(_) => self.failed(i, "the connection could not start".to_owned()),
            Ok(step) => self.step(i, step),
        }
    }

    /// `AUTH` with the Sentinels' password, when there is one.
    fn sentinel_auth(&self, out: &mut Vec<u8>, due: &mut VecDeque<Due>) {
        if let Some(pw) = &self.conf.auth {
            resp::command(out, &[b"AUTH", pw]);
            due.push_back(Due::Auth);
        }
    }

    /// Asks a Sentinel which server is the master, and the replicas.
    fn query(&mut self) {
        if exiting() {
            return;
        }
        self.retry.stop();
        self.replicas_only = false;
        let addr = self.conf.sentinels[self.ask % self.conf.sentinels.len()];
        let (mut out, mut due) = (Vec::new(), VecDeque::new());
        self.sentinel_auth(&mut out, &mut due);
        resp::command(&mut out, &[b"SENTINEL", b"get-master-addr-by-name", &self.conf.name]);
        resp::command(&mut out, &[b"SENTINEL", b"replicas", &self.conf.name]);
        due.extend([Due::MasterAddr, Due::Replicas]);
        self.named = None;
        self.open(QUERY, addr, out, due);
    }

    /// Subscribes to the failovers on every Sentinel not watched now.
    fn watch(&mut self) {
        if exiting() {
            return;
        }
        for k in 0..self.conf.sentinels.len() {
            if self.links[WATCH + k].conn.state() != State::Down {
                continue;
            }
            let (mut out, mut due) = (Vec::new(), VecDeque::new());
            self.sentinel_auth(&mut out, &mut due);
            let mut channels = vec![b"SUBSCRIBE".as_slice(), SELECTED, PROMOTED, SWITCH];
            if self.conf.replicas {
                channels.extend(REPLICA_EVENTS);
            }
            resp::command(&mut out, &channels);
            due.extend(channels[1..].iter().map(|_| Due::Subscribe));
            self.open(WATCH + k, self.conf.sentinels[k], out, due);
        }
    }

    /// Checks with `ROLE` that a server the Sentinels named is a master.
    fn check(&mut self, addr: SocketAddr) {
        let (out, due) = self.ask_role(Due::Role);
        self.open(CHECK, addr, out, due);
    }

    /// What a data server is sent to learn its role: `AUTH` first with the
    /// upstream's `cache_auth`, then `ROLE`, its reply due as `role`.
    fn ask_role(&self, role: Due) -> (Vec<u8>, VecDeque<Due>) {
        let (mut out, mut due) = (Vec::new(), VecDeque::new());
        if let Some(pw) = &self.conf.data_auth {
            resp::command(&mut out, &[b"AUTH", pw]);
            due.push_back(Due::Auth);
        }
        resp::command(&mut out, &[b"ROLE"]);
        due.push_back(role);
        (out, due)
    }

    /// A Sentinel answered (it is reachable).
    fn reached(&mut self, at: usize) {
        if let Some(d) = self.down.get_mut(at) {
            if std::mem::take(d) {
                log!(
                    NGX_LOG_NOTICE,
                    Log::cycle(),
                    "cache: sentinel {} of upstream \"{}\" can be reached again",
                    self.conf.sentinels[at],
                    self.conf.upstream
                );
            }
        }
    }

    /// A Sentinel could not be reached or answer: logged once until it
    /// answers again.
    fn unreachable(&mut self, at: usize, why: &str) {
        if let Some(d) = self.down.get_mut(at) {
            if !std::mem::replace(d, true) {
                log!(
                    NGX_LOG_NOTICE,
                    Log::cycle(),
                    "cache: sentinel {} of upstream \"{}\" cannot be reached: {why}",
                    self.conf.sentinels[at],
                    self.conf.upstream
                );
            }
        }
    }

    /// Link `i` failed (or its server answered what it must not).
    fn failed(&mut self, i: usize, why: String) {
        let link = &mut self.links[i];
        link.conn.close();
        link.due.clear();
        let peer = link.peer.take();
        if exiting() {
            return;
        }
        let n = self.conf.sentinels.len();
        match i {
            QUERY => {
                self.unreachable(self.ask % n, &why);
                self.ask = (self.ask + 1) % n;
                self.tried += 1;
                if std::mem::take(&mut self.replicas_only) {
                    // (The next round asks the next Sentinel.)
                    self.replicas_stale = true;
                    self.tried = 0;
                } else if self.tried < n {
                    self.query();
                } else {
                    self.tried = 0;
                    self.retry.start(RETRY_MS);
                }
            }
            CHECK => {
                if let Some(a) = peer {
                    log!(
                        NGX_LOG_INFO,
                        Log::cycle(),
                        "cache: {a}, named master of sentinel set \"{}\" of upstream \"{}\", is not confirmed: {why}",
                        self.name(),
                        self.conf.upstream
                    );
                }
                if self.master.is_none() {
                    // (Another Sentinel next: this one may not know yet.)
                    self.ask = (self.ask + 1) % n;
                    self.retry.start(RETRY_MS);
                }
            }
            _ if i < WATCH => self.probe_failed(i),
            _ => {
                self.unreachable(i - WATCH, &why);
                if !self.watch_retry.pending() {
                    self.watch_retry.start(RETRY_MS);
                }
            }
        }
    }

    /// The question is answered: the master the Sentinel named is checked,
    /// unless it is the one confirmed.
    fn answered(&mut self) {
        let n = self.conf.sentinels.len();
        self.reached(self.ask % n);
        self.tried = 0;
        self.links[QUERY].conn.close();
        self.links[QUERY].peer = None;
        match self.named {
            Some(a) if self.master == Some(a) => self.refresh.start(REFRESH_MS),
            // (The master a failover leaves, named until the switch.)
            Some(a) if self.held == Some(a) => self.retry.start(RETRY_MS),
            Some(a) if self.just_left(a) => self.not_told(),
            Some(a) => {
                // (The Sentinels are the authority: the master confirmed
                // before is not one until this one is checked.)
                self.master = None;
                self.check(a)
            }
            None => self.retry.start(RETRY_MS),
        }
    }

    /// `addr` said it is a master.
    fn confirm(&mut self, addr: SocketAddr) {
        self.links[CHECK].conn.close();
        self.links[CHECK].peer = None;
        if self.held == Some(addr) {
            // (It says so until the Sentinels make it a replica.)
            self.retry.start(RETRY_MS);
            return;
        }
        self.held = None;
        self.hold.stop();
        let upstream = self.conf.upstream.clone();
        let name = self.name();
        if self.current != Some(addr) {
            let new = addr.to_string();
            match self.current {
                Some(old) => {
                    log!(
                        NGX_LOG_NOTICE,
                        Log::cycle(),
                        "cache: master of sentinel set \"{name}\" of upstream \"{upstream}\" switched from {old} to {addr}"
                    );
                    metrics::add(Id::CacheSentinelSwitches, &[&upstream, &name], 1);
                    metrics::add(Id::CacheSentinelMaster, &[&upstream, &name, &old.to_string()], -1);
                    self.left.push((old, "the master of its sentinel set switched"));
                    self.gone = Some((old, current_msec()));
                }
                None => log!(
                    NGX_LOG_NOTICE,
                    Log::cycle(),
                    "cache: master of sentinel set \"{name}\" of upstream \"{upstream}\" is {addr}"
                ),
            }
            metrics::add(Id::CacheSentinelMaster, &[&upstream, &name, &new], 1);
            self.current = Some(addr);
            // (The replicas are read from again once they say they follow
            // it, and asked for soon: the Sentinels list them anew.)
            self.offsets.clear();
            for p in &mut self.probes {
                p.ok = false;
            }
            self.replicas_stale = true;
        }
        self.master = Some(addr);
        self.left.retain(|(a, _)| *a != addr);
        self.refresh.start(REFRESH_MS);
        self.wake.post();
    }

    /// A whole reply on link `i`.
    fn reply(&mut self, i: usize, v: Value) {
        let due = self.links[i].due.pop_front();
        match (due, v) {
            (Some(Due::Auth), Value::Status(_)) => {}
            (Some(Due::Probe), Value::Error(m)) => self.failed(i, String::from_utf8_lossy(&m).into_owned()),
            (Some(Due::Probe), v) => self.probed(i, v),
            (Some(Due::Auth), Value::Error(m)) => {
                self.failed(i, format!("AUTH was refused: {}", String::from_utf8_lossy(&m)))
            }
            (Some(Due::MasterAddr), Value::Array(a)) => match parse_addr(a.first(), a.get(1)) {
                Some(addr) => self.named = Some(addr),
                None => self.failed(i, "an address that is not an IP address and port".to_owned()),
            },
            (Some(Due::MasterAddr), Value::Nil) => {
                let why = format!("it watches no master set \"{}\"", self.name());
                self.failed(i, why)
            }
            (Some(Due::ReplicasOnly), Value::Array(a)) => {
                self.replicas = parse_replicas(&a);
                self.replicas_answered();
            }
            (Some(Due::Replicas), Value::Array(a)) => {
                self.replicas = parse_replicas(&a);
                self.answered();
            }
            (Some(Due::Role), Value::Array(a)) => match a.first() {
                Some(Value::Bulk(r)) if r == b"master" => {
                    if let Some(addr) = self.links[i].peer {
                        self.confirm(addr);
                    }
                }
                Some(Value::Bulk(r)) => {
                    let why = format!("ROLE says \"{}\"", String::from_utf8_lossy(r));
                    self.failed(i, why)
                }
                _ => self.failed(i, "an invalid reply to ROLE".to_owned()),
            },
            (Some(Due::Subscribe), Value::Array(a)) if is_bulk(a.first(), b"subscribe") => {
                if !self.links[i].due.is_empty() {
                    return;
                }
                let k = i - WATCH;
                self.reached(k);
                if let Some(s) = self.links[i].conn.socket() {
                    // nginx closes it when it exits (not a request's).
                    s.set_idle(true);
                }
                // A switch may have come while this watch was away.
                if std::mem::replace(&mut self.watched[k], true) && self.idle() {
                    self.query();
                }
            }
            (None, Value::Array(a)) if i >= WATCH && is_bulk(a.first(), b"message") => match (a.get(1), a.get(2)) {
                (Some(Value::Bulk(ch)), Some(Value::Bulk(text))) if ch == PROMOTED => self.promoted(text),
                (Some(Value::Bulk(ch)), Some(Value::Bulk(text))) if ch == SELECTED => self.selected(text),
                (Some(Value::Bulk(ch)), Some(Value::Bulk(text))) if ch == SWITCH => self.switched(text),
                (Some(Value::Bulk(ch)), Some(Value::Bulk(text))) if REPLICA_EVENTS.contains(&ch.as_slice()) => {
                    self.replica_event(text)
                }
                _ => {}
            },
            (_, Value::Error(m)) => self.failed(i, String::from_utf8_lossy(&m).into_owned()),
            _ => self.failed(i, "an unexpected reply".to_owned()),
        }
    }

    /// Reads the whole replies that came on link `i`.
    fn process(&mut self, i: usize) {
        loop {
            let link = &mut self.links[i];
            if !link.conn.is_up() {
                return;
            }
            let buf = &link.conn.input[link.conn.in_at..];
            if buf.is_empty() {
                return;
            }
            match resp::value(buf, MAX_REPLY) {
                Ok(None) => return,
                Ok(Some((v, n))) => {
                    link.conn.in_at += n;
                    self.reply(i, v);
                }
                Err(resp::NotResp) => return self.failed(i, "bytes that are not RESP".to_owned()),
            }
        }
    }

    fn run(&mut self, i: usize) {
        if let Err(why) = self.links[i].conn.flush() {
            return self.failed(i, why);
        }
        loop {
            if !self.links[i].conn.is_up() {
                return;
            }
            match self.links[i].conn.read() {
                Ok(0) => return,
                Ok(n) => {
                    self.process(i);
                    if !self.links[i].conn.read_was_full(n) {
                        return;
                    }
                }
                Err(why) => return self.failed(i, why),
            }
        }
    }
}
