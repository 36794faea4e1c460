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

use std::ffi::c_int;
use std::ptr::NonNull;

use gateway_core::pubsub::{self, Push};

use super::config::{Cache, CacheLocConf};
use crate::ffi::conf::ComplexValue;
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

/// TLS to the server (`cache_ssl`): nginx's context, as the location's
/// requests use it, and what to check.
struct Tls {
    ssl: *mut ngx_ssl_t,
    verify: bool,
    server_name: bool,
    /// The name to verify and send (`cache_ssl_name`, else the upstream's).
    name: Vec<u8>,
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
    subscribe::start(
        r,
        &channel,
        pubsub::valid_channel,
        lcf.subscribe_heartbeat,
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
    let tls = if lcf.upstream.ssl.is_null() {
        None
    } else {
        // SAFETY: cache_ssl_name, compiled into configuration memory.
        let name = match unsafe { ComplexValue::from_raw(lcf.upstream.ssl_name) } {
            Some(cv) => r.complex_value(cv)?.to_vec(),
            None => us.host.as_bytes().to_vec(),
        };
        Some(Tls {
            ssl: lcf.upstream.ssl,
            verify: lcf.upstream.ssl_verify == 1,
            server_name: lcf.upstream.ssl_server_name == 1,
            name,
        })
    };
    let h = RedisHub::new(
        name,
        addrs,
        auth.clone(),
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
        tls: Option<Tls>,
        connect_timeout: ngx_msec_t,
        sink: &'static dyn ListenSink,
    ) -> Box<RedisHub> {
        let mut h = Box::new(RedisHub {
            upstream,
            addrs,
            next: 0,
            auth,
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
        let Some(s) = self.socket.take() else { return };
        // SAFETY: the hub's own connection; its TLS state, if any, is
        // nginx's, freed at once (no close_notify sent or awaited).
        let pool = unsafe {
            let c = s.as_ptr();
            if let Some(ssl) = (*c).ssl.as_mut() {
                ssl.set_no_wait_shutdown(1);
                ssl.set_no_send_shutdown(1);
                ngx_ssl_shutdown(c);
            }
            std::mem::replace(&mut (*c).pool, std::ptr::null_mut())
        };
        s.close();
        if !pool.is_null() {
            // SAFETY: the pool made for the connection's TLS state, which
            // is freed; nothing else refers to it.
            unsafe { ngx_destroy_pool(pool) };
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
        let c = s.as_ptr();
        self.state = State::Handshaking;
        // SAFETY: the hub's own connection and nginx's TLS context, which
        // lives as long as the configuration; OpenSSL copies the name.
        let rc = unsafe {
            // nginx keeps a connection's TLS state in its pool.
            (*c).pool = ngx_create_pool(256, (*c).log);
            if (*c).pool.is_null() || ngx_ssl_create_connection(tls.ssl, c, NGX_SSL_CLIENT as ngx_uint_t) != OK {
                return self.lost("cannot start TLS");
            }
            let conn = (*(*c).ssl).connection;
            // Writes may be retried with the queue grown (moved).
            SSL_ctrl(
                conn,
                SSL_CTRL_MODE as _,
                (SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_ENABLE_PARTIAL_WRITE) as _,
                std::ptr::null_mut(),
            );
            if tls.server_name {
                let Ok(name) = std::ffi::CString::new(tls.name.clone()) else {
                    return self.lost("the TLS server name holds a NUL");
                };
                SSL_ctrl(conn, SSL_CTRL_SET_TLSEXT_HOSTNAME as _, 0, name.as_ptr() as *mut _);
            }
            (*(*c).ssl).handler = Some(handshake_done);
            ngx_ssl_handshake(c)
        };
        if rc == AGAIN {
            // nginx's handshake handler takes the events until it ends,
            // under the connect timeout.
            s.write().add_timer(self.connect_timeout);
            return;
        }
        self.handshaked();
    }

    /// The TLS handshake ended: the server's certificate is checked as
    /// `proxy_ssl_verify` checks it.
    fn handshaked(&mut self) {
        let (Some(tls), Some(s)) = (self.tls.as_ref(), self.socket.as_ref()) else {
            return;
        };
        let c = s.as_ptr();
        s.write().del_timer();
        // SAFETY: the hub's own connection, whose TLS state nginx made.
        let verdict = unsafe {
            match (*c).ssl.as_ref() {
                Some(ssl) if ssl.handshaked() != 0 => {
                    let rc = SSL_get_verify_result(ssl.connection);
                    let mut name = ngx_str_t {
                        len: tls.name.len(),
                        data: tls.name.as_ptr() as *mut u8,
                    };
                    if !tls.verify {
                        Ok(())
                    } else if rc != X509_V_OK as std::ffi::c_long {
                        let why = std::ffi::CStr::from_ptr(X509_verify_cert_error_string(rc));
                        Err(format!("certificate verify error: ({rc}:{})", why.to_string_lossy()))
                    } else if ngx_ssl_check_host(c, &mut name) != OK {
                        Err(format!(
                            "certificate does not match \"{}\"",
                            String::from_utf8_lossy(&tls.name)
                        ))
                    } else {
                        Ok(())
                    }
                }
                _ => Err("the TLS handshake failed or timed out".to_owned()),
            }
        };
        if let Err(why) = verdict {
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
            match self.io(Io::Send) {
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
            match self.io(Io::Recv(&mut buf)) {
                Ok(0) => return,
                Ok(n) => self.input.extend_from_slice(&buf[..n]),
                Err(e) => return self.lost(&e),
            }
            if let Err(e) = self.take_pushes() {
                return self.lost(&e);
            }
        }
    }

    /// One send of the queue or one read into a buffer: the bytes moved, 0
    /// when the socket would block, or why the connection is broken.
    fn io(&mut self, what: Io<'_>) -> Result<usize, String> {
        let Some(s) = self.socket.as_ref() else {
            return Ok(0);
        };
        let (c, fd) = (s.as_ptr(), s.fd());
        let tls = self.tls.is_some();
        let recv = matches!(what, Io::Recv(_));
        loop {
            // SAFETY: plain socket calls on the hub's own socket, or nginx's
            // TLS calls on its own connection (made by the handshake), each
            // with a buffer of the length given.
            let n = unsafe {
                match (&what, tls) {
                    (Io::Send, false) => libc::send(fd, self.out.as_ptr().cast(), self.out.len(), libc::MSG_NOSIGNAL),
                    (Io::Send, true) => ngx_ssl_write(c, self.out.as_mut_ptr(), self.out.len()),
                    (Io::Recv(b), false) => libc::recv(fd, b.as_ptr() as *mut _, b.len(), 0),
                    (Io::Recv(b), true) => ngx_ssl_recv(c, b.as_ptr() as *mut u8, b.len()),
                }
            };
            if n > 0 {
                return Ok(n as usize);
            }
            if n == 0 && recv {
                return Err("redis closed the connection".to_owned());
            }
            if tls {
                return match n as ngx_int_t {
                    AGAIN => Ok(0),
                    // (nginx has logged why, at its level.)
                    _ => Err(format!(
                        "a TLS error while {}",
                        if recv { "reading" } else { "sending" }
                    )),
                };
            }
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::WouldBlock => return Ok(0),
                std::io::ErrorKind::Interrupted => continue,
                _ => return Err(format!("{} failed: {e}", if recv { "reading" } else { "sending" })),
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
                        Push::Status => self.auth_pending = false,
                        Push::Error(msg) if std::mem::take(&mut self.auth_pending) => {
                            // A wrong password: nothing works on this connection.
                            break Err(format!("AUTH was refused: {}", String::from_utf8_lossy(&msg)));
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

/// What `io` does.
enum Io<'a> {
    Send,
    Recv(&'a mut [u8]),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Connect {
    Done,
    InProgress,
}

/// A nonblocking socket for the address, and its connect started.
pub(super) fn nonblocking_connect(sockaddr: &[u8]) -> Result<(c_int, Connect), std::io::Error> {
    if sockaddr.len() < std::mem::size_of::<libc::sa_family_t>() {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    }
    // SAFETY: the address starts with its family (any sockaddr does);
    // read unaligned from the bytes.
    let family = unsafe { std::ptr::read_unaligned(sockaddr.as_ptr() as *const libc::sa_family_t) };
    // SAFETY: plain socket calls on a socket of our own, with an address
    // of its stated length.
    unsafe {
        let fd = libc::socket(
            c_int::from(family),
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        );
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if c_int::from(family) != libc::AF_UNIX {
            let one: c_int = 1;
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                (&one as *const c_int).cast(),
                std::mem::size_of::<c_int>() as libc::socklen_t,
            );
        }
        let rc = libc::connect(fd, sockaddr.as_ptr().cast(), sockaddr.len() as libc::socklen_t);
        if rc == 0 {
            return Ok((fd, Connect::Done));
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINPROGRESS) {
            return Ok((fd, Connect::InProgress));
        }
        libc::close(fd);
        Err(e)
    }
}

/// The outcome of a nonblocking connect, once the socket is writable.
pub(super) fn socket_error(fd: c_int) -> Result<(), std::io::Error> {
    let mut err: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: a getsockopt into a local int of its size.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut err as *mut c_int).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if err != 0 {
        return Err(std::io::Error::from_raw_os_error(err));
    }
    Ok(())
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
