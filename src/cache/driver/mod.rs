//! The cache gateway's driver: the worker's own connections to Redis
//! (conn.rs), shared by the pipelined requests (pipe.rs) and the
//! subscribing hubs (hub.rs), and the worker's state that outlives
//! requests (the connections, the hubs, the clusters' maps, the refused
//! passwords). It knows nothing of HTTP: a request is a token (common::token)
//! behind a `Handle`, and hears of its replies through a `Sink`.

pub mod authfail;
mod conn;
pub mod hub;
pub mod pipe;
mod pipes;
pub mod sentinel;
pub mod streams;

use std::cell::{Cell, RefCell};
use std::ptr::NonNull;
use std::rc::Rc;

use crate::cache::error::Error;
use gateway_core::cluster::Topology;

use crate::common::hub::{Hub, HubRef};
use crate::common::token::ReqToken;
use crate::ffi::net::TlsClient;
use crate::ffi::{ngx_msec_t, Log};

pub use pipes::Pipes;

/// A request's side of its place on a connection: the request's token
/// while it is there, None once it left (its replies are then dropped).
pub struct Handle {
    pub who: Cell<Option<ReqToken>>,
    /// Bytes of its commands queued, and of its replies read, since the
    /// request last took them (`$upstream_bytes_sent`, `_received`).
    pub sent: Cell<u64>,
    pub received: Cell<u64>,
}

impl Handle {
    pub fn new(who: ReqToken) -> Rc<Handle> {
        Rc::new(Handle {
            who: Cell::new(Some(who)),
            sent: Cell::new(0),
            received: Cell::new(0),
        })
    }

    pub(super) fn count(n: &Cell<u64>, more: usize) {
        n.set(n.get() + more as u64);
    }

    pub(super) fn alive(&self) -> bool {
        self.who.get().is_some()
    }

    /// The request leaves: nothing reaches it through the handle any more.
    pub fn leave(&self) {
        self.who.set(None);
    }
}

/// What a request hears once the connection's event handler is done with
/// the connection (its steps may end the request, and a request that ends
/// may touch the connections).
pub enum Outcome {
    /// The connection is made: the request's commands go out.
    Connected(Rc<Handle>),
    Done(Rc<Handle>),
    /// The database exists (Ok) or Redis refused it (its message).
    Probed(Rc<Handle>, Result<(), Vec<u8>>),
    Failed(Rc<Handle>, Error),
}

/// The request side, as a pipelined connection calls it while it reads
/// (a request's response goes out as its replies arrive).
pub trait Sink {
    /// The command's reply: its status and, for a value, its length;
    /// `made`: a body made of the reply (JSON of PUBLISH's or XADD's).
    fn answer(&self, who: &Handle, status: u16, value: Option<u64>, made: Option<Vec<u8>>);
    /// More of a value came: the requests waiting on the connection see
    /// it moving (their `cache_read_timeout` starts again).
    fn progress(&self, who: &Handle);
    /// Value bytes; true when the client is behind (reading pauses).
    /// `behind`: other requests wait for replies after this one.
    fn value(&self, who: &Handle, bytes: &[u8], behind: bool) -> bool;
    /// Outcomes, once the connection's step is done with it: it takes them
    /// all (the emptied list serves again).
    fn deliver(&self, out: &mut Vec<Outcome>);
}

/// What a request needs before its command on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbStep {
    /// The connection will be in its database.
    Stay,
    /// `SELECT` it (Redis has it).
    Select(u32),
    /// Ask whether Redis has it first (`probe`).
    Probe,
    /// Another request asks already: wait for its answer (`follow`).
    Wait,
}

/// A connection's number in the worker (never the same twice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipeId(pub(super) u64);

/// Where a request's connection goes: the server's address, the password
/// (`cache_auth`) and TLS (`cache_ssl`) it uses.
pub struct Endpoint<'a> {
    pub addr: &'a [u8],
    pub auth: Option<&'a [u8]>,
    pub tls: Option<&'a TlsClient>,
    pub connect_timeout: ngx_msec_t,
    /// The request's database.
    pub db: u32,
    /// `cache_socket_keepalive`.
    pub so_keepalive: bool,
    /// The request's log: nginx's line for a connect that fails at once
    /// names the request.
    pub log: Log,
}

/// A number for the next request's PING token: never the same twice in a
/// worker (a counter), and not guessable from the ones before (the counter
/// goes through a keyed mix: splitmix64 of a secret per-worker seed, read
/// from /dev/urandom, plus the counter). A server that sends stale bytes
/// cannot forge the echo the next request waits for.
pub fn next_ping() -> u64 {
    use std::io::Read;
    thread_local! {
        static STATE: std::cell::Cell<(u64, u64)> = std::cell::Cell::new({
            let mut seed = [0u8; 8];
            let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut seed));
            let seed = match read {
                Ok(()) => u64::from_ne_bytes(seed),
                Err(_) => {
                    let t = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos() as u64);
                    t ^ (u64::from(std::process::id()) << 32)
                }
            };
            (seed, 0)
        });
    }
    STATE.with(|s| {
        let (seed, n) = s.get();
        s.set((seed, n.wrapping_add(1)));
        // splitmix64: a bijection of the counter, so never the same twice.
        let mut z = seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    })
}

/// A hub of the worker's: its upstream block (the address), its password.
type HubEntry = (usize, Option<Vec<u8>>, Box<hub::RedisHub>);

/// A stream hub of the worker's: its upstream block, its password.
type StreamEntry = (usize, Option<Vec<u8>>, Box<streams::StreamHub>);

/// The worker's state: made on first use, for the worker's life.
struct Worker {
    pipes: Pipes,
    /// The subscribing hubs, by upstream block (its address) and password
    /// (boxed: subscriptions keep pointers to them).
    hubs: RefCell<Vec<HubEntry>>,
    /// The stream reading hubs, by upstream block and password (boxed,
    /// as the subscribing ones).
    streams: RefCell<Vec<StreamEntry>>,
    /// Each `cache_cluster` upstream's map, by its block's address.
    maps: RefCell<Vec<(usize, Rc<RefCell<Topology>>)>>,
}

thread_local! {
    static WORKER: &'static Worker = Box::leak(Box::new(Worker {
        pipes: Pipes::default(),
        hubs: RefCell::new(Vec::new()),
        streams: RefCell::new(Vec::new()),
        maps: RefCell::new(Vec::new()),
    }));
}

/// The worker's pipelined connections.
pub fn pipes() -> &'static Pipes {
    WORKER.with(|w| &w.pipes)
}

/// Lends one of the worker's pipelined connections to `f` (`Pipes::lend`).
fn lend_pipe<T>(id: PipeId, f: impl FnOnce(&mut pipe::PipeConn) -> T) -> Option<T> {
    pipes().lend(id, f)
}

/// The worker's hub for an upstream block (`key`) and password, made by
/// `make` on first use (None: it cannot be made).
pub fn hub(
    key: usize,
    auth: Option<Vec<u8>>,
    sink: &'static dyn crate::common::hub::HubSink,
    make: impl FnOnce() -> Option<hub::HubSettings>,
) -> Option<HubRef> {
    WORKER.with(|w| {
        let mut hubs = w.hubs.borrow_mut();
        let at = match hubs.iter().position(|(k, a, _)| *k == key && *a == auth) {
            Some(at) => at,
            None => {
                hubs.push((key, auth, hub::RedisHub::new(make()?, sink)));
                hubs.len() - 1
            }
        };
        let h: &mut dyn crate::common::hub::Hub = &mut *hubs[at].2;
        // SAFETY: the worker's hubs are boxed and never dropped while it
        // runs (WORKER): each lives, unmoved, for the worker's life.
        Some(unsafe { HubRef::new(std::ptr::NonNull::from(h)) })
    })
}

/// The worker's stream hub for an upstream block (`key`) and password,
/// made by `make` on first use (None: it cannot be made).
pub fn stream_hub(
    key: usize,
    auth: Option<Vec<u8>>,
    sink: &'static dyn crate::common::sse::StreamSink,
    make: impl FnOnce() -> Option<streams::StreamSettings>,
) -> Option<HubRef> {
    WORKER.with(|w| {
        let mut hubs = w.streams.borrow_mut();
        let at = match hubs.iter().position(|(k, a, _)| *k == key && *a == auth) {
            Some(at) => at,
            None => {
                hubs.push((key, auth, streams::StreamHub::new(make()?, sink)));
                hubs.len() - 1
            }
        };
        let h: &mut dyn crate::common::hub::Hub = &mut *hubs[at].2;
        // SAFETY: the worker's hubs are boxed and never dropped while it
        // runs (WORKER): each lives, unmoved, for the worker's life.
        Some(unsafe { HubRef::new(std::ptr::NonNull::from(h)) })
    })
}

/// A Sentinel set (`key`: its upstream block) confirmed its master: the
/// hubs of the block (`cache_subscribe`, `cache_stream`) go to it, if
/// their connections are elsewhere or down.
pub fn follow_master(key: usize) {
    let hubs: Vec<HubRef> = WORKER.with(|w| {
        let mut subs = w.hubs.borrow_mut();
        let mut reads = w.streams.borrow_mut();
        let subs = subs.iter_mut().filter(|e| e.0 == key);
        let subs = subs.map(|e| NonNull::from(&mut *e.2 as &mut (dyn Hub + 'static)));
        let reads = reads.iter_mut().filter(|e| e.0 == key);
        let reads = reads.map(|e| NonNull::from(&mut *e.2 as &mut (dyn Hub + 'static)));
        // SAFETY: as in `hub`: the worker's hubs live, unmoved, for its life.
        subs.chain(reads).map(|h| unsafe { HubRef::new(h) }).collect()
    });
    for h in hubs {
        h.with(|h| h.follow());
    }
}

/// The worker's map of a cluster (`key`: its upstream block), made from its
/// seeds on first use.
pub fn cluster_map(key: usize, seeds: impl FnOnce() -> Vec<std::net::SocketAddr>) -> Rc<RefCell<Topology>> {
    WORKER.with(|w| {
        let mut maps = w.maps.borrow_mut();
        if let Some((_, t)) = maps.iter().find(|(k, _)| *k == key) {
            return t.clone();
        }
        let mut t = Topology::new();
        t.set_seeds(seeds());
        let t = Rc::new(RefCell::new(t));
        maps.push((key, t.clone()));
        t
    })
}
