//! nginx memory pools: values moved into a pool live until nginx destroys
//! it (a request's pool at the request's end, the configuration's at a
//! reload), and are dropped then.

use std::ffi::c_void;
use std::mem;
use std::ptr::{self, NonNull};

use super::*;

/// A pool of nginx's (a request's, a connection's or the configuration's):
/// a handle, not a copy (each comes from what owns the pool: `Req::pool`,
/// `Conf::pool`).
#[derive(Debug)]
pub struct Pool(NonNull<ngx_pool_t>);

unsafe extern "C" fn drop_value<T>(data: *mut c_void) {
    guard(Log::cycle(), "pool cleanup", (), || {
        // SAFETY: registered by Pool::alloc only, for a T written at `data`
        // and dropped here once, when the pool is destroyed.
        unsafe { ptr::drop_in_place(data as *mut T) }
    });
}

impl Pool {
    /// # Safety
    /// `pool` must be a live pool that outlives every use of the handle.
    pub unsafe fn from_raw(pool: *mut ngx_pool_t) -> Option<Pool> {
        NonNull::new(pool).map(Pool)
    }

    pub fn as_ptr(&self) -> *mut ngx_pool_t {
        self.0.as_ptr()
    }

    /// Moves `value` into the pool; it is dropped when the pool is
    /// destroyed. The pointer is valid as long as the pool.
    pub fn alloc<T>(&self, value: T) -> Option<NonNull<T>> {
        const { assert!(mem::align_of::<T>() <= NGX_ALIGNMENT) };
        // SAFETY: the pool is live; ngx_palloc returns memory aligned to
        // NGX_ALIGNMENT (checked above) or null.
        let p = NonNull::new(unsafe { ngx_palloc(self.as_ptr(), mem::size_of::<T>()) } as *mut T)?;
        if mem::needs_drop::<T>() {
            // SAFETY: the pool is live.
            let cln = NonNull::new(unsafe { ngx_pool_cleanup_add(self.as_ptr(), 0) })?;
            // SAFETY: cln is a fresh cleanup record of the pool, p fresh
            // memory for one T; the cleanup drops it once, at the end.
            unsafe {
                ptr::write(p.as_ptr(), value);
                (*cln.as_ptr()).handler = Some(drop_value::<T>);
                (*cln.as_ptr()).data = p.as_ptr().cast();
            }
        } else {
            // SAFETY: p is fresh memory for one T.
            unsafe { ptr::write(p.as_ptr(), value) };
        }
        Some(p)
    }

    /// An address as nginx's peers hold it: the sockaddr, its length and
    /// its text (`127.0.0.1:7000`, `[::1]:7000`), all in the pool. The same
    /// address always gives the same bytes (nginx's keepalive cache
    /// compares them).
    pub fn peer_addr(&self, addr: std::net::SocketAddr) -> Option<(*mut sockaddr, socklen_t, *mut ngx_str_t)> {
        use std::net::SocketAddr;
        let (sa, len) = match addr {
            SocketAddr::V4(a) => {
                // SAFETY: all-zero is a valid sockaddr_in (padding included).
                let mut sin: libc::sockaddr_in = unsafe { mem::zeroed() };
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = a.port().to_be();
                sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
                let p = self.alloc(sin)?;
                (p.as_ptr().cast::<sockaddr>(), mem::size_of::<libc::sockaddr_in>())
            }
            SocketAddr::V6(a) => {
                // SAFETY: all-zero is a valid sockaddr_in6.
                let mut sin6: libc::sockaddr_in6 = unsafe { mem::zeroed() };
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_port = a.port().to_be();
                sin6.sin6_addr.s6_addr = a.ip().octets();
                let p = self.alloc(sin6)?;
                (p.as_ptr().cast::<sockaddr>(), mem::size_of::<libc::sockaddr_in6>())
            }
        };
        let name = self.str(addr.to_string().as_bytes())?;
        let name = self.alloc(name)?;
        Some((sa, len as socklen_t, name.as_ptr()))
    }

    /// Copies bytes into the pool, as an ngx_str_t that lives as long as it.
    pub fn str(&self, b: &[u8]) -> Option<ngx_str_t> {
        // SAFETY: the pool is live; a non-null result has room for b.len() bytes.
        let data = unsafe { ngx_pnalloc(self.as_ptr(), b.len().max(1)) } as *mut u8;
        if data.is_null() {
            return None;
        }
        // SAFETY: see above; the regions are distinct.
        unsafe { ptr::copy_nonoverlapping(b.as_ptr(), data, b.len()) };
        Some(ngx_str_t { len: b.len(), data })
    }

    /// Zeroed memory for one C struct of nginx's (a buffer, a resolved
    /// address ...), valid as long as the pool.
    pub fn calloc<T: Zeroable>(&self) -> Option<NonNull<T>> {
        // SAFETY: the pool is live; zeroed memory is a valid T (Zeroable).
        NonNull::new(unsafe { ngx_pcalloc(self.as_ptr(), mem::size_of::<T>()) } as *mut T)
    }

    /// A chain link of the pool.
    pub fn chain_link(&self) -> Option<NonNull<ngx_chain_t>> {
        // SAFETY: the pool is live.
        NonNull::new(unsafe { ngx_alloc_chain_link(self.as_ptr()) })
    }
}

/// The pool of the cycle the worker runs (its configuration's): what is
/// moved into it goes when the worker ends (or, without a master process,
/// when a reload's configuration replaces it).
pub fn cycle_pool() -> Option<Pool> {
    // SAFETY: the current cycle, set before any module runs and live while
    // it is current; its pool lives as long as it.
    unsafe { ngx_cycle.as_ref().and_then(|c| Pool::from_raw(c.pool)) }
}

/// nginx's C structs for which all-zero bytes are a valid, empty value.
///
/// # Safety
/// Implement only for plain C data with that property.
pub unsafe trait Zeroable {}

// SAFETY: plain C structs of nginx that it allocates zeroed itself.
unsafe impl Zeroable for ngx_buf_t {}
// SAFETY: as above.
unsafe impl Zeroable for ngx_http_upstream_resolved_t {}
// SAFETY: as above.
unsafe impl Zeroable for ngx_http_complex_value_t {}
// SAFETY: as above (ngx_http_upstream_conf_t is all numbers and pointers).
unsafe impl Zeroable for ngx_http_upstream_conf_t {}
// SAFETY: as above (an event's initial state is all zero: no timer, not posted).
unsafe impl Zeroable for ngx_event_t {}
// SAFETY: as above (ngx_get_connection zeroes a connection it hands out).
unsafe impl Zeroable for ngx_connection_t {}

/// An all-zero value of a C struct: nginx's "unset" for configuration data.
pub fn zeroed<T: Zeroable>() -> T {
    // SAFETY: all-zero bytes are a valid T (Zeroable).
    unsafe { std::mem::zeroed() }
}
