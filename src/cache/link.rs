//! The transport of the module's own Redis connections (the subscribing
//! ones, subscriber.rs, and the shared, pipelined ones, pipe.rs): a
//! nonblocking connect, TLS with nginx's context as `cache_ssl*` set it
//! up, and reads and writes through either.

use std::ffi::c_int;

use super::config::CacheLocConf;
use crate::ffi::conf::ComplexValue;
use crate::ffi::*;

/// TLS to the server (`cache_ssl`): nginx's context, as the location's
/// requests use it, and what to check.
#[derive(Clone, PartialEq, Eq)]
pub struct Tls {
    pub ssl: *mut ngx_ssl_t,
    pub verify: bool,
    pub server_name: bool,
    /// The name to verify and send (`cache_ssl_name`, else `host`).
    pub name: Vec<u8>,
}

impl Tls {
    /// The location's TLS settings (Some(None): no `cache_ssl`); None
    /// when `cache_ssl_name` cannot be evaluated.
    pub fn of_location(r: &mut Req, lcf: &CacheLocConf, host: &[u8]) -> Option<Option<Tls>> {
        if lcf.upstream.ssl.is_null() {
            return Some(None);
        }
        // SAFETY: cache_ssl_name, compiled into configuration memory.
        let name = match unsafe { ComplexValue::from_raw(lcf.upstream.ssl_name) } {
            Some(cv) => r.complex_value(cv)?.to_vec(),
            None => host.to_vec(),
        };
        Some(Some(Tls {
            ssl: lcf.upstream.ssl,
            verify: lcf.upstream.ssl_verify == 1,
            server_name: lcf.upstream.ssl_server_name == 1,
            name,
        }))
    }
}

/// What `io` does.
pub enum Io<'a> {
    Send(&'a [u8]),
    Recv(&'a mut [u8]),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connect {
    Done,
    InProgress,
}

/// A nonblocking socket for the address, and its connect started.
pub fn nonblocking_connect(sockaddr: &[u8]) -> Result<(c_int, Connect), std::io::Error> {
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

/// TCP keepalive on a socket (`cache_socket_keepalive`).
pub fn set_keepalive(fd: c_int) {
    let one: c_int = 1;
    // SAFETY: a setsockopt on the caller's socket with a local int of its size.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_KEEPALIVE,
            (&one as *const c_int).cast(),
            std::mem::size_of::<c_int>() as libc::socklen_t,
        )
    };
}

/// The outcome of a nonblocking connect, once the socket is writable.
pub fn socket_error(fd: c_int) -> Result<(), std::io::Error> {
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

/// Starts the TLS handshake on a connected socket: Ok(true) when it ended
/// at once (`check_tls` next), Ok(false) while nginx's handshake handler
/// has the events (it calls `done` when it ends, well or not).
pub fn start_tls(s: &Socket, tls: &Tls, done: ngx_connection_handler_pt) -> Result<bool, String> {
    let c = s.as_ptr();
    // SAFETY: the caller's own connection and nginx's TLS context, which
    // lives as long as the configuration; OpenSSL copies the name.
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
pub fn check_tls(s: &Socket, tls: &Tls) -> Result<(), String> {
    let c = s.as_ptr();
    // SAFETY: the caller's own connection, whose TLS state nginx made.
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

/// Closes the socket, and frees its TLS state at once (no close_notify
/// sent or awaited).
pub fn close(s: Socket) {
    // SAFETY: the caller's own connection; its TLS state, if any, is nginx's.
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
        // SAFETY: the pool made for the connection's TLS state, which is
        // freed; nothing else refers to it.
        unsafe { ngx_destroy_pool(pool) };
    }
}

/// Why a connection is broken.
#[derive(Debug)]
pub enum IoError {
    /// The server closed it.
    Closed,
    Failed(String),
}

/// One send or one read, plain or through TLS: the bytes moved, 0 when
/// the socket would block, or why the connection is broken.
pub fn io(s: &Socket, tls: bool, what: Io<'_>) -> Result<usize, IoError> {
    let (c, fd) = (s.as_ptr(), s.fd());
    let recv = matches!(what, Io::Recv(_));
    loop {
        // SAFETY: plain socket calls on the caller's own socket, or nginx's
        // TLS calls on its own connection (made by the handshake), each
        // with a buffer of the length given.
        let n = unsafe {
            match (&what, tls) {
                (Io::Send(b), false) => libc::send(fd, b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL),
                (Io::Send(b), true) => ngx_ssl_write(c, b.as_ptr() as *mut u8, b.len()),
                (Io::Recv(b), false) => libc::recv(fd, b.as_ptr() as *mut _, b.len(), 0),
                (Io::Recv(b), true) => ngx_ssl_recv(c, b.as_ptr() as *mut u8, b.len()),
            }
        };
        if n > 0 {
            return Ok(n as usize);
        }
        if n == 0 && recv {
            return Err(IoError::Closed);
        }
        if tls {
            return match n as ngx_int_t {
                AGAIN => Ok(0),
                // (nginx has logged why, at its level.)
                _ => Err(IoError::Failed(format!(
                    "a TLS error while {}",
                    if recv { "reading" } else { "sending" }
                ))),
            };
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::WouldBlock => return Ok(0),
            std::io::ErrorKind::Interrupted => continue,
            _ => {
                return Err(IoError::Failed(format!(
                    "{}() failed ({e})",
                    if recv { "recv" } else { "send" }
                )))
            }
        }
    }
}
