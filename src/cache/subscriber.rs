//! `cache_subscribe CHANNEL`: Redis SUBSCRIBE as server-sent events.
//!
//! Each worker keeps one subscribing connection per upstream (and
//! `cache_auth` password), shared by every subscriber of every channel:
//! SUBSCRIBE when a channel's first subscriber comes, UNSUBSCRIBE after its
//! last one leaves, the connection closed when nobody is left. A connection
//! that is lost is made again after `RETRY` ms (to the next address of the
//! upstream's servers, in turn), subscribes to every channel again, and the
//! subscribers get `event: reconnect`: what was published in between is
//! lost. The request side is crate::subscribe's, shared with `sqldb_listen`.

use std::ptr::NonNull;

use gateway_core::pubsub::{self, Push};

use super::authfail;
use super::config::{Cache, CacheLocConf};
use super::link::{self, nonblocking_connect, socket_error, Connect, Io, IoError, Tls};
use crate::ffi::*;
use crate::log;
use crate::sqldb::driver::{Added, Channels, Hub, ListenSink, ReqToken};
use crate::subscribe::{self, Refused};

/// How long after a lost connection another is tried (ms).
const RETRY: ngx_msec_t = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Down,
    Connecting,
    /// The TLS handshake (`cache_ssl`).
    Handshaking,
    Up,
}

/// One address of the upstream's servers.
struct Addr {
    sockaddr: Vec<u8>,
    name: String,
}

pub struct RedisHub {
    /// The upstream, for the log.
    upstream: String,
    addrs: Vec<Addr>,
    /// The address to try next (the one in use, while connected).
    next: usize,
    auth: Option<Vec<u8>>,
    /// The password's key in the worker's table of refused ones.
    auth_key: Option<u64>,
    tls: Option<Tls>,
    connect_timeout: ngx_msec_t,
    sink: &'static dyn ListenSink,
    channels: Channels,
    socket: Option<Socket>,
    state: State,
    /// Bytes to write.
    out: Vec<u8>,
    /// Bytes read and not used yet (a reply that is not whole).
    input: Vec<u8>,
    /// A connection had worked before: subscribers hear of the gap once
    /// this one works (Redis confirmed a subscription on it).
    was_up: bool,
    /// This connection works.
    live: bool,
    /// The next status or error is AUTH's.
    auth_pending: bool,
    /// Redis refused the password (its message).
    auth_refused: Option<String>,
    /// The timer that makes the connection again.
    retry: RetryTimer,
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
        lcf.subscribe_heartbeat,
        buffers_max,
        &subscribe::CACHE,
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
    let h = RedisHub::new(
        name,
        addrs,
        auth.clone(),
        auth_key,
        tls,
        lcf.upstream.connect_timeout,
        &subscribe::CACHE,
    );
    let mut h = h;
    let ptr = NonNull::from(&mut *h);
    hubs.borrow_mut().push((key, auth, h));
    Some(ptr)
}

/// The addresses of an upstream block's servers, in order (backup ones too,
/// last, as they are written last).
fn addresses(us: &ngx_http_upstream_srv_conf_t) -> Vec<Addr> {
    // SAFETY: the block's servers array, of ngx_http_upstream_server_t, in
    // configuration memory.
    let servers =
        unsafe { us.servers.as_ref() }.map_or(&[][..], |a| unsafe { a.as_slice::<ngx_http_upstream_server_t>() });
    let mut out = Vec::new();
    for s in servers {
        if s.addrs.is_null() {
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
        addrs: Vec<Addr>,
        auth: Option<Vec<u8>>,
        auth_key: Option<u64>,
        tls: Option<Tls>,
        connect_timeout: ngx_msec_t,
        sink: &'static dyn ListenSink,
    ) -> Box<RedisHub> {
        let mut h = Box::new(RedisHub {
            upstream,
            addrs,
            next: 0,
            auth,
            auth_key,
            tls,
            connect_timeout,
            sink,
            channels: Channels::default(),
            socket: None,
            state: State::Down,
            out: Vec::new(),
            input: Vec::new(),
            was_up: false,
            live: false,
            auth_pending: false,
            auth_refused: None,
            retry: RetryTimer::new(std::ptr::null_mut(), Some(retry_event)),
        });
        let data: *mut RedisHub = &mut *h;
        h.retry.set_data(data.cast());
        h
    }

    fn server(&self) -> &str {
        self.addrs
            .get(self.next % self.addrs.len().max(1))
            .map_or("", |a| &a.name)
    }

    /// Closes the socket, and frees its TLS state.
    fn drop_socket(&mut self) {
        self.live = false;
        if let Some(s) = self.socket.take() {
            link::close(s);
        }
    }

    /// Closes the connection (no retry).
    fn close(&mut self) {
        self.retry.stop();
        self.drop_socket();
        self.state = State::Down;
        self.out.clear();
        self.input.clear();
        self.channels.deactivate();
        // A connection made later for new subscribers is no reconnect.
        self.was_up = false;
    }

    /// The connection is gone: try again later (the next address) while
    /// anyone is subscribed.
    fn lost(&mut self, why: &str) {
        self.drop_socket();
        let was = std::mem::replace(&mut self.state, State::Down);
        self.out.clear();
        self.input.clear();
        self.channels.deactivate();
        if self.channels.is_empty() {
            return;
        }
        log!(
            NGX_LOG_ERR,
            Log::cycle(),
            "cache: the subscribing connection to {} of upstream \"{}\" {}: {why}; trying again in {} ms",
            self.server(),
            self.upstream,
            if was == State::Up { "was lost" } else { "failed" },
            RETRY
        );
        self.next = (self.next + 1) % self.addrs.len().max(1);
        self.retry.start(RETRY);
    }

    /// Redis refused the password: the subscriptions end (the responses
    /// end), and the connection is not made again for them; a subscriber
    /// that comes back within a second gets 502 without a connection, and
    /// the refusal is logged once a minute at most. Idle subscribers with a
    /// wrong password cost Redis one connection each, not one a second.
    fn refused(&mut self, why: &str) {
        if let Some(k) = self.auth_key {
            authfail::refused(
                k,
                Log::cycle(),
                format_args!(
                    "{why}, by redis {} of upstream \"{}\" (subscribing); its subscriptions end",
                    self.server(),
                    self.upstream
                ),
            );
        }
        let all = self.channels.everyone();
        self.close();
        self.sink.closing(&all);
    }

    fn connect(&mut self) {
        let Some(addr) = self.addrs.get(self.next % self.addrs.len().max(1)) else {
            return;
        };
        let (fd, rc) = match nonblocking_connect(&addr.sockaddr) {
            Ok(v) => v,
            Err(e) => return self.lost(&format!("connecting failed: {e}")),
        };
        let Some(socket) = Socket::get(fd, Log::cycle()) else {
            // SAFETY: the socket is ours and nothing else holds it.
            unsafe { libc::close(fd) };
            return self.lost("no free connection");
        };
        let data: *mut RedisHub = self;
        socket.set_data(data.cast());
        socket.set_handler(Some(hub_event));
        // nginx tells an idle connection when it exits (a reload, a quit).
        socket.set_idle(true);
        self.socket = Some(socket);
        self.state = State::Connecting;
        self.out.clear();
        self.input.clear();
        if rc == Connect::Done {
            return self.transport_ready();
        }
        let watched = self.socket.as_ref().is_some_and(|s| {
            s.write().add_timer(self.connect_timeout);
            s.watch_write(true)
        });
        if !watched {
            self.lost("cannot watch the connection");
        }
    }

    /// TCP is connected: the TLS handshake, or straight on.
    fn transport_ready(&mut self) {
        let (Some(tls), Some(s)) = (self.tls.as_ref(), self.socket.as_ref()) else {
            return self.connected();
        };
        self.state = State::Handshaking;
        match link::start_tls(s, tls, Some(handshake_done)) {
            Err(why) => self.lost(&why),
            Ok(true) => self.handshaked(),
            Ok(false) => {
                // nginx's handshake handler takes the events until it
                // ends, under the connect timeout.
                s.write().add_timer(self.connect_timeout);
            }
        }
    }

    /// The TLS handshake ended: the server's certificate is checked as
    /// `proxy_ssl_verify` checks it.
    fn handshaked(&mut self) {
        let (Some(tls), Some(s)) = (self.tls.as_ref(), self.socket.as_ref()) else {
            return;
        };
        s.write().del_timer();
        if let Err(why) = link::check_tls(s, tls) {
            return self.lost(&why);
        }
        // The events are the hub's again.
        s.set_handler(Some(hub_event));
        self.connected();
    }

    /// The connection is made: AUTH, then SUBSCRIBE to every channel.
    fn connected(&mut self) {
        if let Some(s) = self.socket.as_ref() {
            s.write().del_timer();
        }
        self.state = State::Up;
        if let Some(pw) = &self.auth {
            pubsub::auth(&mut self.out, pw);
        }
        self.auth_pending = self.auth.is_some();
        pubsub::subscribe(&mut self.out, self.channels.names().map(str::as_bytes));
        if !self.socket.as_ref().is_some_and(|s| s.watch_read(true)) {
            return self.lost("cannot watch the connection");
        }
        self.flush();
    }

    /// Sends what is queued, as far as the socket takes it.
    fn flush(&mut self) {
        if self.state != State::Up {
            return;
        }
        while !self.out.is_empty() {
            let Some(sock) = self.socket.as_ref() else { break };
            match link::io(sock, self.tls.is_some(), Io::Send(&self.out)).map_err(why) {
                Ok(0) => break,
                Ok(n) => drop(self.out.drain(..n)),
                Err(e) => return self.lost(&e),
            }
        }
        let more = !self.out.is_empty();
        if !self.socket.as_ref().is_some_and(|s| s.watch_write(more)) {
            self.lost("cannot watch the connection");
        }
    }

    fn on_event(&mut self, timedout: bool) {
        if self.socket.as_ref().is_some_and(Socket::close_requested) {
            // nginx is exiting: the subscriptions end, the connection closes.
            let all = self.channels.everyone();
            self.close();
            self.sink.closing(&all);
            return;
        }
        match self.state {
            State::Down => {}
            State::Connecting if timedout => self.lost("timed out connecting"),
            // (nginx's handshake handler has the events until it ends.)
            State::Handshaking => {}
            State::Connecting => match self.socket.as_ref().map(|s| socket_error(s.fd())) {
                Some(Ok(())) => self.transport_ready(),
                Some(Err(e)) => self.lost(&format!("connecting failed: {e}")),
                None => {}
            },
            State::Up => {
                self.flush();
                self.read();
            }
        }
    }

    /// Reads until the socket (and TLS) has nothing more: with TLS, bytes
    /// may wait in OpenSSL where no readiness event tells of them.
    fn read(&mut self) {
        let mut buf = vec![0u8; 64 * 1024];
        while self.state == State::Up {
            let Some(sock) = self.socket.as_ref() else { return };
            match link::io(sock, self.tls.is_some(), Io::Recv(&mut buf)).map_err(why) {
                Ok(0) => return,
                Ok(n) => self.input.extend_from_slice(&buf[..n]),
                Err(e) => return self.lost(&e),
            }
            if let Err(e) = self.take_pushes() {
                return match self.auth_refused.take() {
                    Some(why) => self.refused(&why),
                    None => self.lost(&e),
                };
            }
        }
    }

    /// Everything whole in the input: publications go to their subscribers.
    fn take_pushes(&mut self) -> Result<(), String> {
        let mut at = 0;
        let result = loop {
            match pubsub::next(&self.input[at..]) {
                Ok(None) => break Ok(()),
                Err(e) => break Err(e.to_string()),
                Ok(Some((push, used))) => {
                    at += used;
                    match push {
                        Push::Message { channel, payload } => {
                            let to = std::str::from_utf8(&channel).ok().and_then(|c| self.channels.get(c));
                            if let Some((name, to)) = to {
                                self.sink.notify(to, name, &payload);
                            }
                        }
                        Push::Subscribed(channel) => {
                            if !std::mem::replace(&mut self.live, true) && std::mem::replace(&mut self.was_up, true) {
                                let all = self.channels.settled();
                                self.sink.reconnected(&all);
                            }
                            if let Ok(c) = std::str::from_utf8(&channel) {
                                let to = self.channels.confirm(c);
                                self.sink.subscribed(&to);
                            }
                        }
                        Push::Unsubscribed(_) => {}
                        Push::Status => {
                            if std::mem::take(&mut self.auth_pending) {
                                if let Some(k) = self.auth_key {
                                    authfail::accepted(k);
                                }
                            }
                        }
                        Push::Error(msg) if std::mem::take(&mut self.auth_pending) => {
                            // A wrong password: nothing works on this connection.
                            let why = format!("AUTH was refused: {}", String::from_utf8_lossy(&msg));
                            self.auth_refused = Some(why.clone());
                            break Err(why);
                        }
                        Push::Error(msg) => log!(
                            NGX_LOG_ERR,
                            Log::cycle(),
                            "cache: redis refused a subscription on upstream \"{}\": {}",
                            self.upstream,
                            String::from_utf8_lossy(&msg)
                        ),
                    }
                }
            }
        };
        self.input.drain(..at.min(self.input.len()));
        result
    }
}

impl Hub for RedisHub {
    fn subscribe(&mut self, channel: &str, who: ReqToken) -> bool {
        let added = self.channels.add(channel, who);
        if added == Added::First && self.state == State::Up {
            pubsub::subscribe(&mut self.out, [channel.as_bytes()]);
            self.flush();
        }
        if self.state == State::Down && !self.retry.pending() {
            self.connect();
        }
        added == Added::Active
    }

    fn unsubscribe(&mut self, channel: &str, who: ReqToken) {
        if !self.channels.remove(channel, who) {
            return;
        }
        if self.channels.is_empty() {
            // Nobody listens any more: the connection goes too.
            self.close();
        } else if self.state == State::Up {
            pubsub::unsubscribe(&mut self.out, channel.as_bytes());
            self.flush();
        }
    }
}

/// What a broken connection says in the log.
fn why(e: IoError) -> String {
    match e {
        IoError::Closed => "redis closed the connection".to_owned(),
        IoError::Failed(why) => why,
    }
}

/// Read/write readiness (or the connect timeout) of the subscribing connection.
extern "C" fn hub_event(ev: *mut ngx_event_t) {
    guard(Log::cycle(), "cache subscribe event", (), || {
        // SAFETY: the connection's data is the RedisHub that owns it (leaked
        // for the worker's life; it closes the connection before it lets it go).
        let (h, timedout) = unsafe {
            let Some(ev) = Event::from_raw(ev) else { return };
            let timedout = ev.take_timedout();
            let c = ev.data() as *mut ngx_connection_t;
            (&mut *((*c).data as *mut RedisHub), timedout)
        };
        h.on_event(timedout);
    })
}

/// nginx's TLS handshake ended (well or not, or timed out).
extern "C" fn handshake_done(c: *mut ngx_connection_t) {
    guard(Log::cycle(), "cache subscribe handshake", (), || {
        // SAFETY: the connection's data is the RedisHub that owns it.
        let h = unsafe { &mut *((*c).data as *mut RedisHub) };
        if h.state == State::Handshaking {
            h.handshaked();
        }
    })
}

/// The connection is made again.
extern "C" fn retry_event(ev: *mut ngx_event_t) {
    guard(Log::cycle(), "cache subscribe retry", (), || {
        // SAFETY: the timer's data is the RedisHub that owns it.
        let h = unsafe {
            let Some(ev) = Event::from_raw(ev) else { return };
            ev.take_timedout();
            &mut *(ev.data() as *mut RedisHub)
        };
        if h.state == State::Down && !h.channels.is_empty() && !exiting() {
            h.connect();
        }
    })
}
