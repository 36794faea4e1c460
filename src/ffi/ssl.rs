//! nginx's TLS contexts for connections to upstream servers (the cache's
//! `cache_ssl_*`), made as nginx's proxy module makes its own: TLS 1.2 and
//! 1.3, a client certificate for mutual TLS, trusted certificates for
//! verifying the server's. nginx's upstream code does the rest (handshake,
//! verification, server name, sessions) once a request's upstream has it.

use std::ptr::NonNull;

use super::conf::ConfError;
use super::pool::Zeroable;
use super::*;

// SAFETY: ngx_ssl_t is a pointer, a log pointer and numbers; all-zero is the
// state nginx's own modules allocate it in (ngx_pcalloc).
unsafe impl Zeroable for ngx_ssl_t {}

/// The files a context is made of.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SslFiles {
    /// Client certificate and its key (mutual TLS).
    pub certificate: Option<(Vec<u8>, Vec<u8>)>,
    /// Certificates that the server's must chain to.
    pub trusted: Option<Vec<u8>>,
    pub verify_depth: ngx_int_t,
    /// Sessions of new connections are kept to resume later ones.
    pub session_reuse: bool,
}

impl Conf<'_> {
    /// A TLS client context in configuration memory, freed with it. On
    /// failure nginx has logged why (a file that does not load, say).
    pub fn ssl_context(&self, files: &SslFiles) -> Result<NonNull<ngx_ssl_t>, ConfError> {
        let pool = self.pool();
        let ssl = pool.calloc::<ngx_ssl_t>().ok_or(ConfError::Logged)?;
        let cf = self.raw() as *const ngx_conf_t as *mut ngx_conf_t;
        // nginx's functions take the file names as strings they may rewrite
        // (made absolute against the prefix) and hand to OpenSSL as C
        // strings: copies in configuration memory, with a NUL after them.
        let name = |b: &[u8]| {
            let mut s = pool.str(&[b, b"\0"].concat()).ok_or(ConfError::Logged)?;
            s.len -= 1;
            Ok::<_, ConfError>(s)
        };
        let certificate = match &files.certificate {
            Some((c, k)) => Some((name(c)?, name(k)?)),
            None => None,
        };
        let trusted = match &files.trusted {
            Some(t) => Some(name(t)?),
            None => None,
        };
        // SAFETY: ssl is zeroed configuration memory of the right type; cf
        // is the configuration being read; the cleanup frees the context
        // with the configuration's pool, as nginx's modules do.
        unsafe {
            (*ssl.as_ptr()).log = self.raw().log;
            let protocols = (NGX_SSL_TLSv1_2 | NGX_SSL_TLSv1_3) as ngx_uint_t;
            if ngx_ssl_create(ssl.as_ptr(), protocols, std::ptr::null_mut()) != NGX_OK as ngx_int_t {
                return Err(ConfError::Logged);
            }
            let cln = ngx_pool_cleanup_add(pool.as_ptr(), 0);
            if cln.is_null() {
                ngx_ssl_cleanup_ctx(ssl.as_ptr().cast());
                return Err(ConfError::Logged);
            }
            (*cln).handler = Some(ngx_ssl_cleanup_ctx);
            (*cln).data = ssl.as_ptr().cast();
            // Sessions (TLS 1.3's arrive after the handshake) are kept by
            // nginx's callback, for the upstream code to resume.
            if ngx_ssl_client_session_cache(cf, ssl.as_ptr(), files.session_reuse as ngx_uint_t) != NGX_OK as ngx_int_t
            {
                return Err(ConfError::Logged);
            }
            if let Some((mut cert, mut key)) = certificate {
                if ngx_ssl_certificate(cf, ssl.as_ptr(), &mut cert, &mut key, std::ptr::null_mut())
                    != NGX_OK as ngx_int_t
                {
                    return Err(ConfError::Logged);
                }
            }
            if let Some(mut trusted) = trusted {
                if ngx_ssl_trusted_certificate(cf, ssl.as_ptr(), &mut trusted, files.verify_depth)
                    != NGX_OK as ngx_int_t
                {
                    return Err(ConfError::Logged);
                }
            }
        }
        Ok(ssl)
    }
}
