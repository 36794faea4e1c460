//! Outbound connections of the module's own (not a request's upstream,
//! which nginx's upstream code connects): the cache's pipelined and
//! subscribing connections to Redis and the database driver's cancel
//! requests. nginx makes them as it makes its upstream connections
//! (`ngx_event_connect_peer`): its socket and connection, its reads and
//! writes (`c->recv`, `c->send`, which TLS replaces by its own), TLS with
//! nginx's context (as `proxy_ssl*` does it), and `ngx_close_connection`.
//! Each has a log of its own, a copy of the cycle's whose lines end as
//! nginx's upstream lines do: "while connecting to upstream" (or what else
//! the connection was doing), then the server.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::io;
use std::ptr::NonNull;

use super::*;

/// What nginx's lines about a connection say it was doing (its words for
/// its own upstream connections).
const CONNECTING: &CStr = c"connecting to upstream";
const HANDSHAKING: &CStr = c"SSL handshaking to upstream";
const SENDING: &CStr = c"sending request to upstream";
const READING: &CStr = c"reading upstream";

/// nginx's words for a connection to a server that timed out.
pub const TIMED_OUT: &str = "upstream timed out (110: Connection timed out)";

/// Room for a server's address as text ("unix:" and a socket's path at
/// most; nginx's NGX_SOCKADDR_STRLEN is less).
const NAME_ROOM: usize = 160;

/// TLS to a server: nginx's context, as a location's settings made it, and
/// what to check.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsClient {
    pub ssl: *mut ngx_ssl_t,
    pub verify: bool,
    pub server_name: bool,
    /// The name to verify and send.
    pub name: Vec<u8>,
}

/// Where a nonblocking connect stands once started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connect {
    Done,
    InProgress,
}

/// Why a connection is broken.
#[derive(Debug)]
pub enum IoError {
    /// The server closed it.
    Closed,
    Failed(String),
}

impl IoError {
    /// The log's words for it (nginx's, for a closed connection).
    pub fn why(self) -> String {
        match self {
            IoError::Closed => "upstream prematurely closed connection".to_owned(),
            IoError::Failed(why) => why,
        }
    }
}

/// Where a connection goes, and how.
pub struct Peer<'a> {
    /// The server's address: a sockaddr's bytes (IPv4, IPv6 or a Unix
    /// socket).
    pub sockaddr: &'a [u8],
    /// SO_KEEPALIVE.
    pub keepalive: bool,
    /// TCP_NODELAY (TCP only: nginx leaves it off on Unix sockets). nginx
    /// turns it on for its upstream connections once they are kept or
    /// start TLS: for a connection that writes again while what it wrote
    /// before is not answered yet, which Nagle's algorithm would hold back.
    pub nodelay: bool,
    /// Where nginx writes why a connect failed at once: a request's log
    /// (the line then names the request, as nginx's upstream lines do), or
    /// None for the connection's own.
    pub log: Option<Log>,
}

/// A connect that did not start. nginx has logged why, "while connecting
/// to upstream"; this says it in a few words, for a line of the caller's
/// that tells what the failure comes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectError(&'static str);

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// A connection of the module's own to a server, watched by nginx.
pub struct Outbound {
    socket: Socket,
    /// Its log and the server's name, which nginx's lines about it use
    /// (freed by `close`, after the connection).
    named: NonNull<Named>,
}

/// A connection's own log, and the server's name that its lines end with.
/// nginx holds pointers to both (the connection's log, and the log's
/// data), so they stay where `Named::new` put them, in their box.
struct Named {
    log: ngx_log_t,
    name: ngx_str_t,
    text: [u8; NAME_ROOM],
    addr: libc::sockaddr_storage,
    socklen: libc::socklen_t,
}

impl Named {
    /// The address and its text, and a copy of the cycle's log that ends
    /// its lines with `log_line_end`. None when the bytes are not a socket
    /// address.
    fn new(sockaddr: &[u8]) -> Option<NonNull<Named>> {
        let len = sockaddr.len();
        let storage = std::mem::size_of::<libc::sockaddr_storage>();
        if len < std::mem::size_of::<libc::sa_family_t>() || len > storage {
            return None;
        }
        // SAFETY: a plain read of the cycle's log (Log::cycle), copied.
        let log = unsafe { Log::cycle().as_ptr().as_ref() }.copied()?;
        // SAFETY: all-zero is a valid value of each of these C structs and
        // arrays (pointers null, lengths 0).
        let mut n: Box<Named> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: `len` bytes into a storage of at least that many (checked).
        unsafe {
            std::ptr::copy_nonoverlapping(
                sockaddr.as_ptr(),
                (&mut n.addr as *mut libc::sockaddr_storage).cast(),
                len,
            )
        };
        n.socklen = len as libc::socklen_t;
        // SAFETY: a socket address of its length, aligned as any is (in a
        // sockaddr_storage); nginx writes at most NAME_ROOM bytes of text.
        let written = unsafe {
            ngx_sock_ntop(
                (&mut n.addr as *mut libc::sockaddr_storage).cast(),
                n.socklen,
                n.text.as_mut_ptr(),
                NAME_ROOM,
                1,
            )
        };
        let n = NonNull::from(Box::leak(n));
        // SAFETY: the box just leaked, which nothing else uses yet; the
        // pointers taken into it stay valid until `Outbound::close` (or
        // `drop_named`) frees it.
        unsafe {
            let me = &mut *n.as_ptr();
            me.name = ngx_str_t {
                len: written.min(NAME_ROOM),
                data: me.text.as_mut_ptr(),
            };
            me.log = log;
            me.log.handler = Some(log_line_end);
            me.log.data = n.as_ptr().cast();
            me.log.action = std::ptr::null_mut();
            me.log.connection = 0;
        }
        Some(n)
    }
}

/// Frees a connection's log and name, once nothing of nginx's points at
/// them any more.
///
/// # Safety
/// `named` came from `Named::new` and is not used after.
unsafe fn drop_named(named: NonNull<Named>) {
    // SAFETY: as the caller promises: the box Named::new leaked.
    drop(unsafe { Box::from_raw(named.as_ptr()) });
}

impl Outbound {
    /// nginx's socket and connection for `peer`, its connect started
    /// (nonblocking), with TCP_NODELAY and SO_KEEPALIVE as `peer` asks.
    /// Its events carry `data` to `handler` once its owner watches them.
    pub fn connect(
        peer: &Peer<'_>,
        handler: ngx_event_handler_pt,
        data: *mut c_void,
    ) -> Result<(Outbound, Connect), ConnectError> {
        let Some(named) = Named::new(peer.sockaddr) else {
            crate::log!(
                NGX_LOG_ALERT,
                peer.log.unwrap_or_else(Log::cycle),
                "connect() of {} bytes that are no socket address",
                peer.sockaddr.len()
            );
            return Err(ConnectError("connect() failed"));
        };
        let (rc, c) = {
            // SAFETY: Named::new's box, live until the Outbound closes (or
            // below, on failure); nothing else uses it yet.
            let me = unsafe { &mut *named.as_ptr() };
            // SAFETY: all-zero is a peer connection with nothing set
            // (pointers null, no local address, SOCK_STREAM).
            let mut pc: ngx_peer_connection_t = unsafe { std::mem::zeroed() };
            pc.sockaddr = (&mut me.addr as *mut libc::sockaddr_storage).cast();
            pc.socklen = me.socklen;
            pc.name = &mut me.name;
            pc.get = Some(ngx_event_get_peer);
            pc.set_so_keepalive(peer.keepalive.into());
            // nginx's lines for reads and writes that fail on the socket (a
            // server that resets the connection, say) are at info: the
            // owner's line says so, error included, at its level (TLS
            // raises it: see start_tls).
            pc.set_log_error(ngx_connection_log_error_e_NGX_ERROR_INFO as _);
            me.log.action = CONNECTING.as_ptr() as *mut c_char;
            let own: *mut ngx_log_t = &mut me.log;
            let log = peer.log.map_or(own, Log::as_ptr);
            pc.log = log;
            // SAFETY: pc's address, name and log are live for the call (the
            // caller's log: Log's promise); nginx's connection array and
            // event loop are this thread's. The caller's log says what it
            // is doing for the call only.
            let rc = unsafe {
                let was = (*log).action;
                (*log).action = CONNECTING.as_ptr() as *mut c_char;
                let rc = ngx_event_connect_peer(&mut pc);
                if log != own {
                    (*log).action = was;
                }
                rc
            };
            (rc, NonNull::new(pc.connection))
        };
        let c = match (rc, c) {
            (OK | AGAIN, Some(c)) => c,
            _ => {
                // SAFETY: nothing of nginx's points at it: it closed the
                // connection it may have made (ngx_event_connect_peer).
                unsafe { drop_named(named) };
                return Err(ConnectError(match rc {
                    DECLINED => "connect() failed",
                    BUSY => "no live upstreams",
                    _ => "no socket or no free connection",
                }));
            }
        };
        // SAFETY: nginx's new connection, which nothing else uses; its own
        // log lives as long as the Outbound, which closes the connection
        // before it frees the log.
        let socket = unsafe {
            let own = &mut (*named.as_ptr()).log;
            own.connection = c.as_ref().number;
            Socket::adopt(c, Log::from_raw(own))
        };
        if peer.nodelay {
            // (Best effort: nginx logs a failure; on a Unix socket it does
            // nothing.)
            // SAFETY: a live connection of nginx's.
            unsafe { ngx_tcp_nodelay(socket.as_ptr()) };
        }
        socket.set_data(data);
        socket.set_handler(handler);
        let rc = if rc == OK { Connect::Done } else { Connect::InProgress };
        Ok((Outbound { socket, named }, rc))
    }

    pub fn socket(&self) -> &Socket {
        &self.socket
    }

    /// What nginx's lines about the connection say it is doing.
    fn set_action(&self, action: &'static CStr) {
        // SAFETY: the connection's own log (Named), live until close; nginx
        // only reads it, between calls of this thread.
        unsafe { (*self.named.as_ptr()).log.action = action.as_ptr() as *mut c_char };
    }

    /// The outcome of the connect, once the socket is writable.
    pub fn connect_result(&self) -> Result<(), String> {
        let mut err: c_int = 0;
        let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
        // SAFETY: a getsockopt into a local int of its size.
        let rc = unsafe {
            libc::getsockopt(
                self.socket.fd(),
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                (&mut err as *mut c_int).cast(),
                &mut len,
            )
        };
        let err = match (rc, err) {
            (0, 0) => return Ok(()),
            (0, err) => err,
            _ => io::Error::last_os_error().raw_os_error().unwrap_or(0),
        };
        Err(format!("connect() failed {}", os_error(err)))
    }

    /// Starts the TLS handshake on the connected socket: Ok(true) when it
    /// ended at once (`check_tls` next), Ok(false) while nginx's handshake
    /// handler has the events (it calls `done` when it ends, well or not).
    pub fn start_tls(&mut self, tls: &TlsClient, done: ngx_connection_handler_pt) -> Result<bool, String> {
        let c = self.socket.as_ptr();
        self.set_action(HANDSHAKING);
        // SAFETY: our own connection and nginx's TLS context, which lives
        // as long as the configuration; OpenSSL copies the name.
        let rc = unsafe {
            // nginx keeps a connection's TLS state in its pool.
            (*c).pool = ngx_create_pool(256, (*c).log);
            if (*c).pool.is_null() || ngx_ssl_create_connection(tls.ssl, c, NGX_SSL_CLIENT as ngx_uint_t) != OK {
                return Err("cannot start TLS".to_owned());
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
                    return Err("the TLS server name holds a NUL".to_owned());
                };
                SSL_ctrl(conn, SSL_CTRL_SET_TLSEXT_HOSTNAME as _, 0, name.as_ptr() as *mut _);
            }
            (*(*c).ssl).handler = done;
            // Only nginx's lines say why TLS failed (the owner's, that it
            // did): at error, as for nginx's upstream connections.
            (*c).set_log_error(ngx_connection_log_error_e_NGX_ERROR_ERR as _);
            ngx_ssl_handshake(c)
        };
        Ok(rc != AGAIN)
    }

    /// After the handshake: the server's certificate, checked as
    /// `proxy_ssl_verify` checks it.
    pub fn check_tls(&self, tls: &TlsClient) -> Result<(), String> {
        let c = self.socket.as_ptr();
        // SAFETY: our own connection, whose TLS state nginx made.
        unsafe {
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
                        Err(format!(
                            "upstream SSL certificate verify error: ({rc}:{})",
                            why.to_string_lossy()
                        ))
                    } else if ngx_ssl_check_host(c, &mut name) != OK {
                        Err(format!(
                            "upstream SSL certificate does not match \"{}\"",
                            String::from_utf8_lossy(&tls.name)
                        ))
                    } else {
                        Ok(())
                    }
                }
                _ => Err("the TLS handshake failed or timed out".to_owned()),
            }
        }
    }

    /// Sends what the socket takes of `bytes`: how much, 0 when it would
    /// block, or why the connection is broken.
    pub fn send(&self, bytes: &[u8]) -> Result<usize, IoError> {
        self.io(bytes.as_ptr() as *mut u8, bytes.len(), false)
    }

    /// Reads into `buf`: how much, 0 when nothing is there now, or why the
    /// connection is broken (closed by the server included).
    pub fn recv(&self, buf: &mut [u8]) -> Result<usize, IoError> {
        self.io(buf.as_mut_ptr(), buf.len(), true)
    }

    /// One read or write through the connection's own functions: nginx's
    /// for a socket (`ngx_recv`, `ngx_send`), OpenSSL's through nginx once
    /// the TLS handshake is done.
    fn io(&self, p: *mut u8, len: usize, recv: bool) -> Result<usize, IoError> {
        let c = self.socket.as_ptr();
        self.set_action(if recv { READING } else { SENDING });
        // SAFETY: nginx set the connection's recv and send when it made it
        // (and the TLS handshake replaced them); the buffer is the caller's,
        // of the length given.
        let (n, tls) = unsafe {
            let f = if recv { (*c).recv } else { (*c).send };
            (f.map_or(ERROR, |f| f(c, p, len)), !(*c).ssl.is_null())
        };
        // (Read first: nothing in between may change it.)
        let err = io::Error::last_os_error().raw_os_error().unwrap_or(0);
        match n {
            n if n > 0 => Ok(n as usize),
            0 if recv => Err(IoError::Closed),
            0 => Ok(0),
            AGAIN => Ok(0),
            // (nginx has logged why, at its level.)
            _ if tls => Err(IoError::Failed(
                if recv {
                    "SSL_read() failed"
                } else {
                    "SSL_write() failed"
                }
                .to_owned(),
            )),
            // (nginx's line is at info: this one says why.)
            _ => Err(IoError::Failed(format!(
                "{}() failed {}",
                if recv { "recv" } else { "send" },
                os_error(err)
            ))),
        }
    }

    /// Closes the connection, and frees its TLS state at once (no
    /// close_notify sent or awaited).
    pub fn close(self) {
        let Outbound { socket, named } = self;
        let c = socket.as_ptr();
        // SAFETY: our own connection; its TLS state, if any, is nginx's.
        let pool = unsafe {
            if let Some(ssl) = (*c).ssl.as_mut() {
                ssl.set_no_wait_shutdown(1);
                ssl.set_no_send_shutdown(1);
                ngx_ssl_shutdown(c);
            }
            std::mem::replace(&mut (*c).pool, std::ptr::null_mut())
        };
        socket.close();
        if !pool.is_null() {
            // SAFETY: the pool made for the connection's TLS state, which
            // is freed; nothing else refers to it.
            unsafe { ngx_destroy_pool(pool) };
        }
        // SAFETY: the connection that logged to it is closed.
        unsafe { drop_named(named) };
    }
}

/// An OS error as nginx writes it: "(111: Connection refused)".
fn os_error(err: c_int) -> String {
    let mut text = [0u8; 128];
    // SAFETY: nginx writes at most the room given and returns the end of
    // what it wrote.
    let end = unsafe { ngx_strerror(err, text.as_mut_ptr(), text.len()) };
    let n = (end as usize).saturating_sub(text.as_ptr() as usize).min(text.len());
    format!("({err}: {})", String::from_utf8_lossy(&text[..n]))
}

/// Ends nginx's lines about one of the connections, as its upstream lines
/// end: what it was doing (" while connecting to upstream"), and the
/// server (", upstream: 127.0.0.1:6379").
extern "C" fn log_line_end(log: *mut ngx_log_t, buf: *mut u8, len: usize) -> *mut u8 {
    guard(Log::cycle(), "outbound connection log", buf, || {
        // SAFETY: nginx passes the log whose line it writes (a Named's,
        // whose data is the Named, live while its connection is) and the
        // room left in the line.
        let (log, room) = unsafe { (&*log, std::slice::from_raw_parts_mut(buf, len)) };
        let mut at = 0;
        if !log.action.is_null() {
            put(room, &mut at, b" while ");
            // SAFETY: actions are static C strings (set_action).
            put(room, &mut at, unsafe { CStr::from_ptr(log.action) }.to_bytes());
        }
        // SAFETY: as above: the log's data is its Named.
        if let Some(named) = unsafe { (log.data as *const Named).as_ref() } {
            put(room, &mut at, b", upstream: ");
            put(room, &mut at, &named.text[..named.name.len]);
        }
        // SAFETY: `at` is within the room nginx gave.
        unsafe { buf.add(at) }
    })
}

/// Copies what fits of `bytes` into `room` at `at`.
fn put(room: &mut [u8], at: &mut usize, bytes: &[u8]) {
    let n = bytes.len().min(room.len() - *at);
    room[*at..*at + n].copy_from_slice(&bytes[..n]);
    *at += n;
}

/// Closes the worker's idle outbound connections to `addr`: those nginx's
/// upstream `keepalive` keeps for the next request (a server that is no
/// longer what it was, such as a master a switch has left). Each is closed
/// the way nginx closes idle connections when it shuts down: `close` set,
/// then its read handler, which takes it out of its cache and closes it.
/// Those are told by what keepalive gives a connection it keeps: the
/// cycle's log. Client connections (made by a listening socket) and the
/// module's own (idle ones too, each with a log of its own) are left
/// alone. Returns how many were closed.
pub fn close_idle_outbound_to(addr: std::net::SocketAddr) -> usize {
    // SAFETY: the worker's cycle, live while its events run (the only
    // callers).
    let Some(cycle) = (unsafe { ngx_cycle.as_ref() }) else {
        return 0;
    };
    let (conns, n, kept_log) = (cycle.connections, cycle.connection_n, cycle.log);
    let mut closed = 0;
    for i in 0..n {
        // SAFETY: the cycle's array of connection_n connections; one that
        // is not in use has fd -1 and may have nothing else set, so its
        // other fields are read only once fd says it is in use (as nginx's
        // ngx_close_idle_connections reads them). No reference is kept
        // across the handler below, which may free the connection (back
        // to this array).
        let c = unsafe { conns.add(i) };
        // SAFETY: as above.
        let (fd, rev) = unsafe {
            if (*c).fd == -1 {
                continue;
            }
            let kept = (*c).idle() != 0 && (*c).listening.is_null() && (*c).log == kept_log;
            if !kept || (*c).read.is_null() {
                continue;
            }
            ((*c).fd, (*c).read)
        };
        if peer_of(fd) != Some(addr) {
            continue;
        }
        // SAFETY: an idle connection's read handler is the one its owner
        // set for this (nginx's ngx_close_idle_connections calls it so).
        unsafe {
            let Some(handler) = (*rev).handler else { continue };
            (*c).set_close(1);
            handler(rev);
        }
        closed += 1;
    }
    closed
}

/// The address a socket is connected to.
fn peer_of(fd: ngx_socket_t) -> Option<std::net::SocketAddr> {
    // SAFETY: plain memory for any socket address, and its length.
    let mut sa: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: as above; getpeername writes at most len bytes.
    if unsafe { libc::getpeername(fd, &mut sa as *mut _ as *mut libc::sockaddr, &mut len) } != 0 {
        return None;
    }
    // SAFETY: the bytes getpeername wrote, within the storage.
    let bytes = unsafe { std::slice::from_raw_parts(&sa as *const _ as *const u8, len as usize) };
    super::conf::socket_addr(bytes)
}
