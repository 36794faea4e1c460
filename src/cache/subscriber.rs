//! `cache_subscribe CHANNEL`: Redis SUBSCRIBE as server-sent events.
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
//! published on that server in between is lost. The request side is
//! crate::common::sse's, shared with `sqldb_listen`.

use std::collections::BTreeSet;
use std::ptr::NonNull;

use gateway_core::pubsub::{self, Push};

use super::authfail;
use super::cluster::cluster_of;
use super::config::{Cache, CacheLocConf};
use super::link::{self, nonblocking_connect, socket_error, Connect, Io, IoError, Tls};
use crate::common::hub::{Added, Channels, Hub, HubSink, RETRY};
use crate::common::sse::{self as subscribe, Fanout, Refused};
use crate::common::token::ReqToken;
use crate::ffi::*;
use crate::log;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Down,
    Connecting,
    /// The TLS handshake (`cache_ssl`).
    Handshaking,
    /// Connected; AUTH and the SUBSCRIBEs are sent.
    Up,
}

/// The fan-out of `cache_subscribe`'s events.
pub static FANOUT: Fanout = Fanout::new("cache_subscribe", 1, "cache_subscribe_buffers_max", "cache", || {
    <Cache as ngx::http::HttpModule>::module()
});

/// One address of the upstream's servers.
#[derive(Clone)]
struct Addr {
    sockaddr: Vec<u8>,
    name: String,
}

/// One subscribing connection: to one address of the upstream's servers,
/// or, for a cluster, to its configured nodes in turn.
struct Link {
    /// The hub it belongs to, and its place there (for its events).
    hub: *mut RedisHub,
    index: usize,
    addrs: Vec<Addr>,
    /// The address to try next (the one in use, while connected).
    next: usize,
    socket: Option<Socket>,
    state: State,
    /// Bytes to write.
    out: Vec<u8>,
    /// Bytes read and not used yet (a reply that is not whole).
    input: Vec<u8>,
    /// This connection had worked before: subscribers hear of the gap once
    /// it works again (Redis confirmed a subscription on it).
    was_up: bool,
    /// This connection works.
    live: bool,
    /// The next status or error is AUTH's.
    auth_pending: bool,
    /// Redis refused the password (its message).
    auth_refused: Option<String>,
    /// The channels Redis confirmed on this connection.
    confirmed: BTreeSet<String>,
    /// The timer that makes the connection again.
    retry: RetryTimer,
}

pub struct RedisHub {
    /// The upstream, for the log.
    upstream: String,
    /// Made with the hub, never added to later: their events carry
    /// pointers to them.
    links: Vec<Link>,
    auth: Option<Vec<u8>>,
    /// The password's key in the worker's table of refused ones.
    auth_key: Option<u64>,
    tls: Option<Tls>,
    connect_timeout: ngx_msec_t,
    sink: &'static dyn HubSink,
    channels: Channels,
    /// Runs `settle_all` after a connection that was up is lost (posted:
    /// a loss may come while a request subscribes, which the subscribers'
    /// side must not hear of then).
    settle_later: RetryTimer,
}

/// A hub of the worker's: its upstream block (the address), its password.
/// Kept in the main configuration, which lives as long as the worker.
pub type HubEntry = (usize, Option<Vec<u8>>, Box<RedisHub>);

/// Starts a subscription; what the content handler returns.
pub fn start(r: &mut Req, lcf: &CacheLocConf) -> Result<ngx_int_t, Refused> {
    let Some(cv) = lcf.subscribe else {
        return Err(Refused::Nginx);
    };
    let channel = r.complex_value(cv).ok_or(Refused::Nginx)?.to_vec();
    let auth = match lcf.auth {
        None => None,
        Some(cv) => Some(r.complex_value(cv).ok_or(Refused::Nginx)?.to_vec()),
    };
    let buffers_max = r.main_conf::<Cache>().subscribe_buffers_max;
    subscribe::start(
        r,
        &channel,
        pubsub::valid_channel,
        subscribe::Source {
            block: lcf.upstream.upstream,
            every: lcf.subscribe_heartbeat,
            buffers_max,
        },
        &FANOUT,
        |r| hub(r, lcf, auth).map(|h| h as NonNull<dyn Hub>),
    )
}

/// The worker's hub for the location's upstream and password, made on first use.
fn hub(r: &mut Req, lcf: &CacheLocConf, auth: Option<Vec<u8>>) -> Option<NonNull<RedisHub>> {
    let us = lcf.upstream.upstream;
    let key = us as usize;
    let hubs = &r.main_conf::<Cache>().hubs;
    if let Some(e) = hubs.borrow_mut().iter_mut().find(|(u, a, _)| *u == key && *a == auth) {
        return Some(NonNull::from(&mut *e.2));
    }
    // SAFETY: the upstream block lives as long as the configuration.
    let us = unsafe { us.as_ref() }?;
    let addrs = addresses(us);
    if addrs.is_empty() {
        log!(
            NGX_LOG_ERR,
            r.log(),
            "cache: upstream \"{}\" has no address to subscribe to",
            String::from_utf8_lossy(us.host.as_bytes())
        );
        return None;
    }
    // (An address written in cache_pass is an upstream of its own, its
    // port apart.)
    let mut name = String::from_utf8_lossy(us.host.as_bytes()).into_owned();
    if us.port != 0 {
        name = format!("{name}:{}", us.port);
    }
    let tls = Tls::of_location(r, lcf, us.host.as_bytes())?;
    let auth_key = auth
        .as_deref()
        .map(|pw| authfail::key(&authfail::block_scope(lcf.upstream.upstream), pw));
    // A cluster delivers every PUBLISH on each node: one connection, to
    // its nodes in turn. Otherwise one connection to each address.
    let groups = if cluster_of(r.main_conf::<Cache>(), lcf.upstream.upstream).is_some() {
        vec![addrs]
    } else {
        addrs.into_iter().map(|a| vec![a]).collect()
    };
    let mut h = RedisHub::new(
        name,
        groups,
        auth.clone(),
        auth_key,
        tls,
        lcf.upstream.connect_timeout,
        &FANOUT,
    );
    let ptr = NonNull::from(&mut *h);
    hubs.borrow_mut().push((key, auth, h));
    Some(ptr)
}

/// The addresses of an upstream block's servers, in order (backup ones too,
/// last, as they are written last; not those marked `down`).
fn addresses(us: &ngx_http_upstream_srv_conf_t) -> Vec<Addr> {
    // SAFETY: the block's servers array, of ngx_http_upstream_server_t, in
    // configuration memory.
    let servers =
        unsafe { us.servers.as_ref() }.map_or(&[][..], |a| unsafe { a.as_slice::<ngx_http_upstream_server_t>() });
    let mut out = Vec::new();
    for s in servers {
        // (A server marked `down` takes no publish.)
        if s.addrs.is_null() || s.down != 0 {
            continue;
        }
        // SAFETY: naddrs addresses, in configuration memory.
        let addrs = unsafe { std::slice::from_raw_parts(s.addrs, s.naddrs) };
        for a in addrs {
            if a.sockaddr.is_null() {
                continue;
            }
            // SAFETY: socklen bytes of the address.
            let sa = unsafe { std::slice::from_raw_parts(a.sockaddr as *const u8, a.socklen as usize) };
            out.push(Addr {
                sockaddr: sa.to_vec(),
                name: String::from_utf8_lossy(a.name.as_bytes()).into_owned(),
            });
        }
    }
    out
}

impl RedisHub {
    fn new(
        upstream: String,
        groups: Vec<Vec<Addr>>,
        auth: Option<Vec<u8>>,
        auth_key: Option<u64>,
        tls: Option<Tls>,
        connect_timeout: ngx_msec_t,
        sink: &'static dyn HubSink,
    ) -> Box<RedisHub> {
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
        });
        let hub: *mut RedisHub = &mut *h;
        h.settle_later.set_data(hub.cast());
        h.links = groups
            .into_iter()
            .enumerate()
            .map(|(index, addrs)| Link {
                hub,
                index,
                addrs,
                next: 0,
                socket: None,
                state: State::Down,
                out: Vec::new(),
                input: Vec::new(),
                was_up: false,
                live: false,
                auth_pending: false,
                auth_refused: None,
                confirmed: BTreeSet::new(),
                retry: RetryTimer::new(std::ptr::null_mut(), Some(retry_event)),
            })
            .collect();
        // (The links stay where they are now.)
        for l in &mut h.links {
            let data: *mut Link = l;
            l.retry.set_data(data.cast());
        }
        h
    }

    fn server(&self, i: usize) -> &str {
        let l = &self.links[i];
        l.addrs.get(l.next % l.addrs.len().max(1)).map_or("", |a| &a.name)
    }

    /// Closes a link's socket, and frees its TLS state.
    fn drop_socket(&mut self, i: usize) {
        let l = &mut self.links[i];
        l.live = false;
        l.confirmed.clear();
        if let Some(s) = l.socket.take() {
            link::close(s);
        }
    }

    /// Closes every connection (no retry).
    fn close(&mut self) {
        for i in 0..self.links.len() {
            self.drop_socket(i);
            let l = &mut self.links[i];
            l.retry.stop();
            l.state = State::Down;
            l.out.clear();
            l.input.clear();
            // A connection made later for new subscribers is no reconnect.
            l.was_up = false;
        }
        self.settle_later.stop();
        self.channels.deactivate();
    }

    /// A channel is in effect once every connection that is up has
    /// confirmed it (and one is up): its waiting subscribers are told so.
    fn settle(&mut self, channel: &str) {
        let mut up = self.links.iter().filter(|l| l.state == State::Up).peekable();
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
    /// cluster) while anyone is subscribed.
    fn lost(&mut self, i: usize, why: &str) {
        self.drop_socket(i);
        let l = &mut self.links[i];
        let was = std::mem::replace(&mut l.state, State::Down);
        l.out.clear();
        l.input.clear();
        if self.channels.is_empty() {
            return;
        }
        log!(
            NGX_LOG_ERR,
            Log::cycle(),
            "cache: the subscribing connection to {} of upstream \"{}\" {}: {why}; trying again in {} ms",
            self.server(i),
            self.upstream,
            if was == State::Up { "was lost" } else { "failed" },
            RETRY
        );
        let l = &mut self.links[i];
        l.next = (l.next + 1) % l.addrs.len().max(1);
        l.retry.start(RETRY);
        // The channels the other connections confirmed are in effect now.
        if was == State::Up {
            self.settle_later.post();
        }
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
        let l = &self.links[i];
        let Some(addr) = l.addrs.get(l.next % l.addrs.len().max(1)) else {
            return;
        };
        let (fd, rc) = match nonblocking_connect(&addr.sockaddr) {
            Ok(v) => v,
            Err(e) => return self.lost(i, &format!("connecting failed: {e}")),
        };
        let Some(socket) = Socket::get(fd, Log::cycle()) else {
            // SAFETY: the socket is ours and nothing else holds it.
            unsafe { libc::close(fd) };
            return self.lost(i, "no free connection");
        };
        let l = &mut self.links[i];
        let data: *mut Link = l;
        socket.set_data(data.cast());
        socket.set_handler(Some(hub_event));
        // nginx tells an idle connection when it exits (a reload, a quit).
        socket.set_idle(true);
        l.socket = Some(socket);
        l.state = State::Connecting;
        l.out.clear();
        l.input.clear();
        if rc == Connect::Done {
            return self.transport_ready(i);
        }
        let timeout = self.connect_timeout;
        let watched = self.links[i].socket.as_ref().is_some_and(|s| {
            s.write().add_timer(timeout);
            s.watch_write(true)
        });
        if !watched {
            self.lost(i, "cannot watch the connection");
        }
    }

    /// TCP is connected: the TLS handshake, or straight on.
    fn transport_ready(&mut self, i: usize) {
        if self.tls.is_none() || self.links[i].socket.is_none() {
            return self.connected(i);
        }
        self.links[i].state = State::Handshaking;
        let (Some(tls), Some(s)) = (self.tls.as_ref(), self.links[i].socket.as_ref()) else {
            return;
        };
        match link::start_tls(s, tls, Some(handshake_done)) {
            Err(why) => self.lost(i, &why),
            Ok(true) => self.handshaked(i),
            Ok(false) => {
                // nginx's handshake handler takes the events until it
                // ends, under the connect timeout.
                s.write().add_timer(self.connect_timeout);
            }
        }
    }

    /// The TLS handshake ended: the server's certificate is checked as
    /// `proxy_ssl_verify` checks it.
    fn handshaked(&mut self, i: usize) {
        let (Some(tls), Some(s)) = (self.tls.as_ref(), self.links[i].socket.as_ref()) else {
            return;
        };
        s.write().del_timer();
        if let Err(why) = link::check_tls(s, tls) {
            return self.lost(i, &why);
        }
        // The events are the hub's again.
        s.set_handler(Some(hub_event));
        self.connected(i);
    }

    /// The connection is made: AUTH, then SUBSCRIBE to every channel.
    fn connected(&mut self, i: usize) {
        let l = &mut self.links[i];
        if let Some(s) = l.socket.as_ref() {
            s.write().del_timer();
        }
        l.state = State::Up;
        if let Some(pw) = &self.auth {
            pubsub::auth(&mut l.out, pw);
        }
        l.auth_pending = self.auth.is_some();
        pubsub::subscribe(&mut l.out, self.channels.names().map(str::as_bytes));
        if !l.socket.as_ref().is_some_and(|s| s.watch_read(true)) {
            return self.lost(i, "cannot watch the connection");
        }
        // Until this connection confirms them, new subscribers wait.
        self.settle_all();
        self.flush(i);
    }

    /// Sends what is queued, as far as the socket takes it.
    fn flush(&mut self, i: usize) {
        let tls = self.tls.is_some();
        let l = &mut self.links[i];
        if l.state != State::Up {
            return;
        }
        while !l.out.is_empty() {
            let Some(sock) = l.socket.as_ref() else { break };
            match link::io(sock, tls, Io::Send(&l.out)).map_err(why) {
                Ok(0) => break,
                Ok(n) => drop(l.out.drain(..n)),
                Err(e) => return self.lost(i, &e),
            }
        }
        let more = !l.out.is_empty();
        if !l.socket.as_ref().is_some_and(|s| s.watch_write(more)) {
            self.lost(i, "cannot watch the connection");
        }
    }

    fn on_event(&mut self, i: usize, timedout: bool) {
        if self.links[i].socket.as_ref().is_some_and(Socket::close_requested) {
            // nginx is exiting: the subscriptions end, the connections close.
            let all = self.channels.everyone();
            self.close();
            self.sink.closing(&all);
            return;
        }
        match self.links[i].state {
            State::Down => {}
            State::Connecting if timedout => self.lost(i, "timed out connecting"),
            // (nginx's handshake handler has the events until it ends.)
            State::Handshaking => {}
            State::Connecting => match self.links[i].socket.as_ref().map(|s| socket_error(s.fd())) {
                Some(Ok(())) => self.transport_ready(i),
                Some(Err(e)) => self.lost(i, &format!("connecting failed: {e}")),
                None => {}
            },
            State::Up => {
                self.flush(i);
                self.read(i);
            }
        }
    }

    /// Reads until the socket (and TLS) has nothing more: with TLS, bytes
    /// may wait in OpenSSL where no readiness event tells of them.
    fn read(&mut self, i: usize) {
        let tls = self.tls.is_some();
        let mut buf = vec![0u8; 64 * 1024];
        while self.links[i].state == State::Up {
            let l = &mut self.links[i];
            let Some(sock) = l.socket.as_ref() else { return };
            match link::io(sock, tls, Io::Recv(&mut buf)).map_err(why) {
                Ok(0) => return,
                Ok(n) => l.input.extend_from_slice(&buf[..n]),
                Err(e) => return self.lost(i, &e),
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
    /// subscribers.
    fn take_pushes(&mut self, i: usize) -> Result<(), String> {
        let input = std::mem::take(&mut self.links[i].input);
        let mut at = 0;
        let result = loop {
            match pubsub::next(&input[at..]) {
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
        // (Nothing is read into it while the pushes are taken.)
        l.input = input;
        l.input.drain(..at.min(l.input.len()));
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
                if !std::mem::replace(&mut l.live, true) && std::mem::replace(&mut l.was_up, true) {
                    let all = self.channels.settled();
                    self.sink.reconnected(&all);
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
            match self.links[i].state {
                State::Up if added == Added::First => {
                    pubsub::subscribe(&mut self.links[i].out, [channel.as_bytes()]);
                    self.flush(i);
                }
                State::Down if !self.links[i].retry.pending() => self.connect(i),
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
            if self.links[i].state == State::Up {
                pubsub::unsubscribe(&mut self.links[i].out, channel.as_bytes());
                self.flush(i);
            }
        }
    }

    fn servers(&self) -> Vec<String> {
        (0..self.links.len()).map(|i| self.server(i).to_owned()).collect()
    }
}

/// What a broken connection says in the log.
fn why(e: IoError) -> String {
    match e {
        IoError::Closed => "redis closed the connection".to_owned(),
        IoError::Failed(why) => why,
    }
}

/// The hub of a link, and the link's place in it, from the pointer its
/// socket or timer carries.
///
/// # Safety
/// `link` is a link of a live hub (hubs live for the worker's life, their
/// links as long as they do).
unsafe fn hub_of(link: *mut Link) -> (&'static mut RedisHub, usize) {
    // SAFETY: as the caller promises; only the two plain fields are read,
    // no reference to the link is made while the hub's is.
    unsafe { (&mut *(*link).hub, (*link).index) }
}

/// Read/write readiness (or the connect timeout) of a subscribing connection.
extern "C" fn hub_event(ev: *mut ngx_event_t) {
    guard(Log::cycle(), "cache subscribe event", (), || {
        // SAFETY: the connection's data is the Link that owns it (in a hub
        // leaked for the worker's life; it closes the connection before it
        // lets it go).
        let ((h, i), timedout) = unsafe {
            let Some(ev) = Event::from_raw(ev) else { return };
            let timedout = ev.take_timedout();
            let c = ev.data() as *mut ngx_connection_t;
            (hub_of((*c).data as *mut Link), timedout)
        };
        h.on_event(i, timedout);
    })
}

/// nginx's TLS handshake ended (well or not, or timed out).
extern "C" fn handshake_done(c: *mut ngx_connection_t) {
    guard(Log::cycle(), "cache subscribe handshake", (), || {
        // SAFETY: the connection's data is the Link that owns it.
        let (h, i) = unsafe { hub_of((*c).data as *mut Link) };
        if h.links[i].state == State::Handshaking {
            h.handshaked(i);
        }
    })
}

/// The channels are settled after a connection was lost.
extern "C" fn settle_event(ev: *mut ngx_event_t) {
    guard(Log::cycle(), "cache subscribe settle", (), || {
        // SAFETY: the event's data is its hub, which lives for the
        // worker's life (its Drop would take the event out of the queue).
        let h = unsafe {
            let Some(ev) = Event::from_raw(ev) else { return };
            &mut *(ev.data() as *mut RedisHub)
        };
        h.settle_all();
    })
}

/// A connection is made again.
extern "C" fn retry_event(ev: *mut ngx_event_t) {
    guard(Log::cycle(), "cache subscribe retry", (), || {
        // SAFETY: the timer's data is the Link that owns it.
        let (h, i) = unsafe {
            let Some(ev) = Event::from_raw(ev) else { return };
            ev.take_timedout();
            hub_of(ev.data() as *mut Link)
        };
        if h.links[i].state == State::Down && !h.channels.is_empty() && !exiting() {
            h.connect(i);
        }
    })
}
