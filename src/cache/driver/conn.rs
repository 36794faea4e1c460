//! One connection to Redis, as the driver's users share it: the pipelined
//! connections (pipe.rs) and the subscribing hubs (hub.rs). It connects
//! (nonblocking, under `cache_connect_timeout`), makes TLS when
//! `cache_ssl` asks for it, sends what its owner queued and reads what
//! came; its owner reads the replies out of `input` and says what they
//! mean. Its events go to its owner through `Owner`.

use std::ffi::c_void;

use crate::ffi::net::{Connect, ConnectError, Outbound, Peer, TlsClient, TIMED_OUT};
use crate::ffi::*;

/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 64 * 1024;
/// The room a connection keeps in its buffers between uses.
const KEEP_ROOM: usize = 256 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// No socket: not made yet, or lost.
    Down,
    Connecting,
    /// The TLS handshake (`cache_ssl`).
    Handshaking,
    Up,
}

/// What a step of the transport comes to, for its owner.
#[derive(Debug)]
pub enum Step {
    /// Nothing for the owner (a handshake under way).
    Wait,
    /// Connected (and TLS checked): the owner's first bytes may go.
    Up,
    /// Readable or writable while up.
    Ready,
    /// The connection failed or was lost: why, in the log's words.
    Lost(String),
    /// nginx is exiting and asks its idle connections to close.
    Exit,
}

/// Where a connection goes.
pub struct Dial<'a> {
    pub addr: &'a [u8],
    pub tls: Option<&'a TlsClient>,
    pub connect_timeout: ngx_msec_t,
    /// SO_KEEPALIVE (`cache_socket_keepalive`).
    pub keepalive: bool,
    /// The log of the request the connection is made for, if any: nginx's
    /// line for a connect that fails at once names the request.
    pub log: Option<Log>,
}

pub struct RedisConn {
    sock: Option<Outbound>,
    tls: Option<TlsClient>,
    state: State,
    connect_timeout: ngx_msec_t,
    /// Bytes to send, from `out_at` on.
    pub out: Vec<u8>,
    out_at: usize,
    /// Bytes read, from `in_at` on not used yet.
    pub input: Vec<u8>,
    pub in_at: usize,
    /// What each read goes into.
    rbuf: Box<[u8]>,
    /// The last loss was a timeout (connecting or in the TLS handshake).
    timed_out: bool,
}

impl RedisConn {
    pub fn new() -> RedisConn {
        RedisConn {
            sock: None,
            tls: None,
            state: State::Down,
            connect_timeout: 0,
            out: Vec::new(),
            out_at: 0,
            input: Vec::new(),
            in_at: 0,
            rbuf: vec![0; READ_CHUNK].into_boxed_slice(),
            timed_out: false,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn is_up(&self) -> bool {
        self.state == State::Up
    }

    pub fn is_connecting(&self) -> bool {
        matches!(self.state, State::Connecting | State::Handshaking)
    }

    /// The connection was lost to a timeout (cache_connect_timeout, which
    /// the TLS handshake is under too).
    pub fn timed_out(&self) -> bool {
        self.timed_out
    }

    pub fn socket(&self) -> Option<&Socket> {
        self.sock.as_ref().map(Outbound::socket)
    }

    /// Starts a connection; its events go to owner `O` with `data`. Up when
    /// it connected at once (and needs no TLS handshake), else Wait, or
    /// Lost (why) when it cannot go on; an error when the connect did not
    /// start (nginx has logged why).
    /// What its owner queued before stays queued.
    pub fn open<O: Owner>(&mut self, to: &Dial<'_>, data: *mut c_void) -> Result<Step, ConnectError> {
        if let Some(s) = self.sock.take() {
            s.close();
        }
        self.tls = to.tls.cloned();
        self.connect_timeout = to.connect_timeout;
        self.timed_out = false;
        let peer = Peer {
            sockaddr: to.addr,
            keepalive: to.keepalive,
            // Requests are written while those before them wait for their
            // replies (and TLS's short records): none waits for an ACK.
            nodelay: true,
            log: to.log,
        };
        let (sock, rc) = Outbound::connect(&peer, Some(socket_event::<O>), data)?;
        self.sock = Some(sock);
        self.state = State::Connecting;
        if rc == Connect::Done {
            return Ok(self.transport_ready::<O>());
        }
        let timeout = self.connect_timeout;
        let watched = self.socket().is_some_and(|s| {
            s.write().add_timer(timeout);
            s.watch_write(true)
        });
        if !watched {
            return Ok(self.lost("cannot watch the connection"));
        }
        Ok(Step::Wait)
    }

    /// A failure: the owner, told, closes the connection (its state says
    /// until then what the connection was doing).
    fn lost(&mut self, why: &str) -> Step {
        Step::Lost(why.to_owned())
    }

    /// TCP is connected: the TLS handshake, or straight on.
    fn transport_ready<O: Owner>(&mut self) -> Step {
        let (Some(tls), Some(sock)) = (self.tls.as_ref(), self.sock.as_mut()) else {
            return self.connected();
        };
        self.state = State::Handshaking;
        match sock.start_tls(tls, Some(handshake_done::<O>)) {
            Err(why) => self.lost(&why),
            Ok(true) => self.handshaked::<O>(),
            Ok(false) => {
                // nginx's handshake handler has the events until it ends,
                // under the connect timeout.
                sock.socket().write().add_timer(self.connect_timeout);
                Step::Wait
            }
        }
    }

    /// The TLS handshake ended: the certificate is checked, and the
    /// events are the connection's again.
    fn handshaked<O: Owner>(&mut self) -> Step {
        let (Some(tls), Some(sock)) = (self.tls.as_ref(), self.sock.as_ref()) else {
            return Step::Wait;
        };
        let s = sock.socket();
        // (nginx's handshake handler ends on its timer's event.)
        let timedout = s.write().take_timedout() | s.read().take_timedout();
        s.write().del_timer();
        if let Err(why) = sock.check_tls(tls) {
            if timedout {
                self.timed_out = true;
                return self.lost(&format!("{TIMED_OUT} in the TLS handshake"));
            }
            return self.lost(&why);
        }
        // (nginx's handshake handler had taken the events over.)
        sock.socket().set_handler(Some(socket_event::<O>));
        self.connected()
    }

    fn connected(&mut self) -> Step {
        self.state = State::Up;
        if let Some(s) = self.socket() {
            s.write().del_timer();
            if !s.watch_read(true) {
                return self.lost("cannot watch the connection");
            }
        }
        Step::Up
    }

    /// A readiness event (or the connect timeout) of the socket.
    pub fn on_event<O: Owner>(&mut self, timedout: bool) -> Step {
        if self.socket().is_some_and(Socket::close_requested) {
            return Step::Exit;
        }
        match self.state {
            State::Down | State::Handshaking => Step::Wait,
            State::Connecting if timedout => {
                self.timed_out = true;
                self.lost(TIMED_OUT)
            }
            State::Connecting => match self.sock.as_ref().map(Outbound::connect_result) {
                Some(Ok(())) => self.transport_ready::<O>(),
                Some(Err(why)) => self.lost(&why),
                None => Step::Wait,
            },
            State::Up => Step::Ready,
        }
    }

    /// nginx's TLS handshake ended (well or not, or timed out).
    pub fn on_handshake<O: Owner>(&mut self) -> Step {
        if self.state == State::Handshaking {
            self.handshaked::<O>()
        } else {
            Step::Wait
        }
    }

    /// Sends what is queued, as far as the socket takes it: the bytes that
    /// went out, or why the connection is broken.
    pub fn flush(&mut self) -> Result<usize, String> {
        if self.state != State::Up {
            return Ok(0);
        }
        let mut sent = 0;
        while self.out_at < self.out.len() {
            let Some(sock) = self.sock.as_ref() else { break };
            match sock.send(&self.out[self.out_at..]) {
                Ok(0) => break,
                Ok(n) => {
                    self.out_at += n;
                    sent += n;
                }
                Err(e) => return Err(e.why()),
            }
        }
        if self.out_at == self.out.len() {
            self.out.clear();
            self.out_at = 0;
            // A large body's room is not kept for the connection's life.
            self.out.shrink_to(KEEP_ROOM);
        }
        let more = self.out_at < self.out.len();
        if !self.socket().is_some_and(|s| s.watch_write(more)) {
            return Err("cannot watch the connection".to_owned());
        }
        Ok(sent)
    }

    /// One read into `input` (what was used of it, before `in_at`, is let
    /// go first): the bytes read, 0 when nothing is there now, or why the
    /// connection is broken. A plain socket that gave less than was asked
    /// has nothing more for now; TLS may hold more than the socket shows.
    pub fn read(&mut self) -> Result<usize, String> {
        if self.in_at == self.input.len() {
            self.input.clear();
            self.input.shrink_to(KEEP_ROOM);
            self.in_at = 0;
        } else if self.in_at > 0 {
            self.input.drain(..self.in_at);
            self.in_at = 0;
        }
        let Some(sock) = self.sock.as_ref() else { return Ok(0) };
        match sock.recv(&mut self.rbuf[..]) {
            Ok(n) => {
                self.input.extend_from_slice(&self.rbuf[..n]);
                Ok(n)
            }
            Err(e) => Err(e.why()),
        }
    }

    /// A read that filled the buffer: there may be more at once.
    pub fn read_was_full(&self, n: usize) -> bool {
        self.tls.is_some() || n == self.rbuf.len()
    }

    /// Stops or resumes watching for replies.
    pub fn watch_read(&self, on: bool) -> bool {
        self.socket().is_some_and(|s| s.watch_read(on))
    }

    /// Closes the socket (and its TLS state); what was queued or read goes.
    pub fn close(&mut self) {
        if let Some(s) = self.sock.take() {
            s.close();
        }
        self.state = State::Down;
        self.out = Vec::new();
        self.out_at = 0;
        self.input = Vec::new();
        self.in_at = 0;
    }
}

impl Default for RedisConn {
    fn default() -> Self {
        RedisConn::new()
    }
}

/// The owner of connections: what their events come to.
pub trait Owner {
    /// The entry points' names, for the panic guard's log line: a socket
    /// event, and the end of a TLS handshake.
    const EVENT: &'static str;
    const HANDSHAKE: &'static str;

    /// What the steps leave for others (deliveries), taken while the owner
    /// is lent and handed on once it is not.
    type Out;

    /// Runs `f` on the owner of an event's data and the index of its
    /// connection there, lent for the call only (no other reference to the
    /// owner is alive meanwhile); None when the owner is gone.
    ///
    /// # Safety
    /// `data` is what the owner gave `RedisConn::open` (or its timers).
    unsafe fn lend<T>(data: *mut c_void, f: impl FnOnce(&mut Self, usize) -> T) -> Option<T>;

    fn conn(&mut self, i: usize) -> &mut RedisConn;

    /// A step of connection `i` came to this.
    fn step(&mut self, i: usize, step: Step);

    /// A panic in a step: the connection is closed, its users told.
    fn panicked(&mut self, i: usize);

    /// What the steps left for others.
    fn take_out(&mut self) -> Self::Out;

    /// Hands on what `take_out` took, the owner not lent any more: it may
    /// be used again, freed or reused meanwhile.
    fn deliver(out: Self::Out);
}

/// Runs `f` on an owner for one of its events (`data`, as its sockets and
/// timers carry it), under the panic guard: collect, then deliver. What
/// the step leaves for others is taken while the owner is lent, and
/// delivered once the loan has ended.
pub fn run_owner<O: Owner>(data: *mut c_void, entry: &str, f: impl FnOnce(&mut O, usize)) {
    let stepped = guard(Log::cycle(), entry, None, || {
        let step = |o: &mut O, i| {
            fault_point("connection step");
            f(o, i);
            o.take_out()
        };
        // SAFETY: the event's data is the owner's (Owner).
        Some(unsafe { O::lend(data, step) })
    });
    let panicked = |o: &mut O, i| {
        o.panicked(i);
        o.take_out()
    };
    let out = match stepped {
        Some(out) => out,
        // SAFETY: as above: a panic in the step does not free the owner
        // (and its loan ended as the panic unwound).
        None => unsafe { O::lend(data, panicked) },
    };
    if let Some(out) = out {
        O::deliver(out);
    }
}

event_handler! {
    /// Read/write readiness, or the connect timeout.
    fn socket_event<O: Owner>(ev) = "redis connection event", {
        let timedout = ev.take_timedout();
        // SAFETY: the event is one of a RedisConn's socket (open).
        let data = unsafe { ev.connection_data() };
        run_owner::<O>(data, O::EVENT, |o, i| {
            let step = o.conn(i).on_event::<O>(timedout);
            o.step(i, step);
        });
    }
}

handshake_handler! {
    /// nginx's TLS handshake ended (well or not, or timed out) on one of a
    /// RedisConn's connections, whose data is its owner's (open).
    fn handshake_done<O: Owner>(data) = "redis connection handshake", {
        run_owner::<O>(data, O::HANDSHAKE, |o, i| {
            let step = o.conn(i).on_handshake::<O>();
            o.step(i, step);
        });
    }
}
