//! Outbound connections of the module's own (not a request's upstream,
//! which nginx's upstream code connects): the cache's pipelined and
//! subscribing connections to Redis and the database driver's cancel
//! requests. A nonblocking connect watched by nginx's events, TLS with
//! nginx's context (as `proxy_ssl*` does it), and reads and writes through
//! either.

use std::ffi::c_int;
use std::io;

use super::*;

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

/// A connection of the module's own to a server, watched by nginx.
pub struct Outbound {
    socket: Socket,
    /// TLS was started on it (reads and writes go through OpenSSL).
    tls: bool,
}

impl Outbound {
    /// A nonblocking socket for the address (TCP_NODELAY on TCP, and
    /// SO_KEEPALIVE when `keepalive`), its connect started, and an nginx
    /// connection watching it. Its events carry `data` to `handler`.
    pub fn connect(
        sockaddr: &[u8],
        keepalive: bool,
        handler: ngx_event_handler_pt,
        data: *mut std::ffi::c_void,
    ) -> Result<(Outbound, Connect), String> {
        let (fd, rc) = nonblocking_connect(sockaddr).map_err(|e| format!("connect() failed ({e})"))?;
        if keepalive {
            set_int_option(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
        }
        let Some(socket) = Socket::get(fd, Log::cycle()) else {
            // SAFETY: the socket is ours and nothing else holds it.
            unsafe { libc::close(fd) };
            return Err("no free connection (worker_connections)".to_owned());
        };
        socket.set_data(data);
        socket.set_handler(handler);
        Ok((Outbound { socket, tls: false }, rc))
    }

    pub fn socket(&self) -> &Socket {
        &self.socket
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
        let e = match (rc, err) {
            (0, 0) => return Ok(()),
            (0, err) => io::Error::from_raw_os_error(err),
            _ => io::Error::last_os_error(),
        };
        Err(format!("connect() failed ({e})"))
    }

    /// Starts the TLS handshake on the connected socket: Ok(true) when it
    /// ended at once (`check_tls` next), Ok(false) while nginx's handshake
    /// handler has the events (it calls `done` when it ends, well or not).
    pub fn start_tls(&mut self, tls: &TlsClient, done: ngx_connection_handler_pt) -> Result<bool, String> {
        let c = self.socket.as_ptr();
        self.tls = true;
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

    fn io(&self, p: *mut u8, len: usize, recv: bool) -> Result<usize, IoError> {
        let (c, fd) = (self.socket.as_ptr(), self.socket.fd());
        loop {
            // SAFETY: plain socket calls on our own socket, or nginx's TLS
            // calls on its own connection (made by the handshake), each
            // with a buffer of the caller's of the length given.
            let n = unsafe {
                match (recv, self.tls) {
                    (false, false) => libc::send(fd, p as *const _, len, libc::MSG_NOSIGNAL),
                    (false, true) => ngx_ssl_write(c, p, len),
                    (true, false) => libc::recv(fd, p.cast(), len, 0),
                    (true, true) => ngx_ssl_recv(c, p, len),
                }
            };
            if n > 0 {
                return Ok(n as usize);
            }
            if n == 0 && recv {
                return Err(IoError::Closed);
            }
            if self.tls {
                return match n as ngx_int_t {
                    AGAIN => Ok(0),
                    // (nginx has logged why, at its level.)
                    _ => Err(IoError::Failed(format!(
                        "a TLS error while {}",
                        if recv { "reading" } else { "sending" }
                    ))),
                };
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => return Ok(0),
                io::ErrorKind::Interrupted => continue,
                _ => {
                    return Err(IoError::Failed(format!(
                        "{}() failed ({e})",
                        if recv { "recv" } else { "send" }
                    )))
                }
            }
        }
    }

    /// Closes the connection, and frees its TLS state at once (no
    /// close_notify sent or awaited).
    pub fn close(self) {
        let c = self.socket.as_ptr();
        // SAFETY: our own connection; its TLS state, if any, is nginx's.
        let pool = unsafe {
            if let Some(ssl) = (*c).ssl.as_mut() {
                ssl.set_no_wait_shutdown(1);
                ssl.set_no_send_shutdown(1);
                ngx_ssl_shutdown(c);
            }
            std::mem::replace(&mut (*c).pool, std::ptr::null_mut())
        };
        self.socket.close();
        if !pool.is_null() {
            // SAFETY: the pool made for the connection's TLS state, which
            // is freed; nothing else refers to it.
            unsafe { ngx_destroy_pool(pool) };
        }
    }
}

/// A nonblocking socket for the address, and its connect started.
fn nonblocking_connect(sockaddr: &[u8]) -> Result<(c_int, Connect), io::Error> {
    if sockaddr.len() < std::mem::size_of::<libc::sa_family_t>() {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: the address starts with its family (any sockaddr does);
    // read unaligned from the bytes.
    let family = c_int::from(unsafe { std::ptr::read_unaligned(sockaddr.as_ptr() as *const libc::sa_family_t) });
    // SAFETY: a plain system call.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    if family != libc::AF_UNIX {
        set_int_option(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
    }
    // SAFETY: our socket, and an address of its stated length.
    let rc = unsafe { libc::connect(fd, sockaddr.as_ptr().cast(), sockaddr.len() as libc::socklen_t) };
    if rc == 0 {
        return Ok((fd, Connect::Done));
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EINPROGRESS) {
        return Ok((fd, Connect::InProgress));
    }
    // SAFETY: our socket, not handed to anyone.
    unsafe { libc::close(fd) };
    Err(e)
}

/// An int socket option (best effort: a socket that does not take it
/// works without).
fn set_int_option(fd: c_int, level: c_int, name: c_int, value: c_int) {
    // SAFETY: a setsockopt on our socket with a local int of its size.
    unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const c_int).cast(),
            std::mem::size_of::<c_int>() as libc::socklen_t,
        )
    };
}
