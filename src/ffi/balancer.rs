//! A module's balancer in front of an upstream block's own (round robin,
//! `least_conn`, `hash` ...): the block's per-request init runs first, and
//! what it left on the request's peer (`Inner`) is kept and asked when the
//! module wants it; nginx calls the module's `Wrapper` for the peer.

use std::ffi::c_void;
use std::ptr::NonNull;

use super::*;

/// The balancer underneath, as its per-request init left it.
pub struct Inner {
    data: *mut c_void,
    get: ngx_event_get_peer_pt,
    free: ngx_event_free_peer_pt,
    set_session: ngx_event_set_peer_session_pt,
    save_session: ngx_event_save_peer_session_pt,
    /// The current peer is its pick: it is told when the peer is freed.
    used: bool,
}

impl Inner {
    /// Runs the block's per-request `init` (nginx's round robin's when
    /// None) for the request, and takes what it set on the peer.
    pub fn init(
        r: &mut Req,
        us: &mut ngx_http_upstream_srv_conf_t,
        init: ngx_http_upstream_init_peer_pt,
    ) -> Option<Inner> {
        let rc = match init {
            // SAFETY: the block's own init, for a live request with an
            // upstream and the block it is made for.
            Some(f) => unsafe { f(r.as_ptr(), us) },
            // SAFETY: as above, nginx's round robin.
            None => unsafe { ngx_http_upstream_init_round_robin_peer(r.as_ptr(), us) },
        };
        if rc != OK {
            return None;
        }
        let peer = r.upstream()?.peer();
        Some(Inner {
            data: peer.data,
            get: peer.get,
            free: peer.free,
            set_session: peer.set_session,
            save_session: peer.save_session,
            used: false,
        })
    }

    /// Its next server, set on the peer (OK), or what it answered.
    pub fn get(&mut self, pc: &mut ngx_peer_connection_t) -> ngx_int_t {
        let Some(get) = self.get else { return ERROR };
        // SAFETY: the balancer's own function, with the data it set up.
        let rc = unsafe { get(pc, self.data) };
        self.used = rc == OK;
        rc
    }

    /// The next peer is not its pick (until `get` says otherwise).
    pub fn set_unused(&mut self) {
        self.used = false;
    }

    /// Tells it that its pick is done with (`state`: 0, or nginx's
    /// NGX_PEER_FAILED ...); nothing when the peer was not its pick.
    pub fn free(&mut self, pc: &mut ngx_peer_connection_t, state: ngx_uint_t) {
        if !std::mem::take(&mut self.used) {
            return;
        }
        if let Some(free) = self.free {
            // SAFETY: the balancer's own function, with its data.
            unsafe { free(pc, self.data, state) };
        }
    }

    /// It keeps TLS sessions (set, save).
    pub fn sessions(&self) -> (bool, bool) {
        (self.set_session.is_some(), self.save_session.is_some())
    }

    /// Its TLS session for its pick (none for another peer).
    pub fn set_session(&self, pc: &mut ngx_peer_connection_t) -> ngx_int_t {
        match (self.used, self.set_session) {
            // SAFETY: the balancer's own function, with its data.
            (true, Some(f)) => unsafe { f(pc, self.data) },
            _ => OK,
        }
    }

    pub fn save_session(&self, pc: &mut ngx_peer_connection_t) {
        if let (true, Some(f)) = (self.used, self.save_session) {
            // SAFETY: the balancer's own function, with its data.
            unsafe { f(pc, self.data) }
        }
    }
}

/// A module's balancer, per request (its data lives in the request's pool).
pub trait Wrapper: Sized {
    /// The entry points' names (for the panic guard's line).
    const GET: &'static str;
    const FREE: &'static str;
    const SET_SESSION: &'static str = "set_session";
    const SAVE_SESSION: &'static str = "save_session";

    fn get(&mut self, pc: &mut ngx_peer_connection_t, log: Log) -> ngx_int_t;
    fn free(&mut self, pc: &mut ngx_peer_connection_t, state: ngx_uint_t);
    fn set_session(&mut self, _pc: &mut ngx_peer_connection_t) -> ngx_int_t {
        OK
    }
    fn save_session(&mut self, _pc: &mut ngx_peer_connection_t) {}
}

/// Puts the wrapper on the request's peer: `data` (in the request's pool,
/// as long as the request) is what nginx hands back. The TLS session hooks
/// are set as `sessions` says (those of the balancer underneath).
pub fn install<W: Wrapper>(peer: &mut ngx_peer_connection_t, data: NonNull<W>, sessions: (bool, bool)) {
    peer.data = data.as_ptr().cast();
    peer.get = Some(get_shim::<W>);
    peer.free = Some(free_shim::<W>);
    peer.set_session = sessions.0.then_some(set_session_shim::<W> as _);
    peer.save_session = sessions.1.then_some(save_session_shim::<W> as _);
}

/// The wrapper and peer nginx passes.
///
/// # Safety
/// `pc` is a live request's peer and `data` the wrapper `install` put on it.
unsafe fn wrapper_of<'a, W>(
    pc: *mut ngx_peer_connection_t,
    data: *mut c_void,
) -> (&'a mut ngx_peer_connection_t, &'a mut W, Log) {
    // SAFETY: as the caller promises; the peer's log is the request's.
    unsafe { (&mut *pc, &mut *(data as *mut W), Log::from_raw((*pc).log)) }
}

extern "C" fn get_shim<W: Wrapper>(pc: *mut ngx_peer_connection_t, data: *mut c_void) -> ngx_int_t {
    // SAFETY: nginx calls the peer's get with the peer and the data install set.
    let (pc, w, log) = unsafe { wrapper_of::<W>(pc, data) };
    guard(log, W::GET, ERROR, || w.get(pc, log))
}

extern "C" fn free_shim<W: Wrapper>(pc: *mut ngx_peer_connection_t, data: *mut c_void, state: ngx_uint_t) {
    // SAFETY: as for get.
    let (pc, w, log) = unsafe { wrapper_of::<W>(pc, data) };
    guard(log, W::FREE, (), || w.free(pc, state))
}

extern "C" fn set_session_shim<W: Wrapper>(pc: *mut ngx_peer_connection_t, data: *mut c_void) -> ngx_int_t {
    // SAFETY: as for get.
    let (pc, w, log) = unsafe { wrapper_of::<W>(pc, data) };
    guard(log, W::SET_SESSION, OK, || w.set_session(pc))
}

extern "C" fn save_session_shim<W: Wrapper>(pc: *mut ngx_peer_connection_t, data: *mut c_void) {
    // SAFETY: as for get.
    let (pc, w, log) = unsafe { wrapper_of::<W>(pc, data) };
    guard(log, W::SAVE_SESSION, (), || w.save_session(pc))
}

/// The peer's own callbacks and data, while `not_failed` stands in for
/// them.
struct Forgiven {
    get: ngx_event_get_peer_pt,
    free: ngx_event_free_peer_pt,
    data: *mut c_void,
}

/// The peer's next free (nginx's next-upstream step after a try, or the
/// end of the request) does not count as the server's failure:
/// NGX_PEER_FAILED becomes NGX_PEER_NEXT, as nginx's own step frees a
/// server that answered 403 or 404 (a server that answered, and is not
/// counted against `max_fails`). That free, or a `get` before it, puts the
/// peer's own callbacks and data back first. False when the pool has no
/// memory for it (the peer is left as it was).
pub fn not_failed(pool: &Pool, pc: &mut ngx_peer_connection_t) -> bool {
    let own = Forgiven {
        get: pc.get,
        free: pc.free,
        data: pc.data,
    };
    let Some(f) = pool.alloc(own) else { return false };
    pc.get = Some(forgiven_get);
    pc.free = Some(forgiven_free);
    pc.data = f.as_ptr().cast();
    true
}

/// Puts the peer's own callbacks and data back (`not_failed`).
///
/// # Safety
/// `data` is the Forgiven that `not_failed` put on the peer (in the
/// request's pool).
unsafe fn restore(
    pc: &mut ngx_peer_connection_t,
    data: *mut c_void,
) -> (ngx_event_get_peer_pt, ngx_event_free_peer_pt, *mut c_void) {
    // SAFETY: as the caller promises.
    let f = unsafe { &*(data as *const Forgiven) };
    pc.get = f.get;
    pc.free = f.free;
    pc.data = f.data;
    (f.get, f.free, f.data)
}

extern "C" fn forgiven_get(pc: *mut ngx_peer_connection_t, data: *mut c_void) -> ngx_int_t {
    // SAFETY: nginx calls the peer's get with the peer and the data
    // not_failed set; the peer's log is the request's.
    let (pc, log) = unsafe { (&mut *pc, Log::from_raw((*pc).log)) };
    guard(log, "peer get", ERROR, || {
        // SAFETY: as above.
        let (get, _, data) = unsafe { restore(pc, data) };
        match get {
            // SAFETY: the balancer's own function, with its own data.
            Some(get) => unsafe { get(pc, data) },
            None => ERROR,
        }
    })
}

extern "C" fn forgiven_free(pc: *mut ngx_peer_connection_t, data: *mut c_void, state: ngx_uint_t) {
    // SAFETY: nginx calls the peer's free with the peer and the data
    // not_failed set; the peer's log is the request's.
    let (pc, log) = unsafe { (&mut *pc, Log::from_raw((*pc).log)) };
    guard(log, "peer free", (), || {
        // SAFETY: as above.
        let (_, free, data) = unsafe { restore(pc, data) };
        let failed = NGX_PEER_FAILED as ngx_uint_t;
        let state = if state & failed != 0 {
            (state & !failed) | NGX_PEER_NEXT as ngx_uint_t
        } else {
            state
        };
        if let Some(free) = free {
            // SAFETY: the balancer's own function, with its own data.
            unsafe { free(pc, data, state) }
        }
    })
}

/// The peer's current address (sockaddr bytes).
pub fn chosen(pc: &ngx_peer_connection_t) -> &[u8] {
    if pc.sockaddr.is_null() {
        return &[];
    }
    // SAFETY: a balancer set the address, socklen bytes long.
    unsafe { std::slice::from_raw_parts(pc.sockaddr as *const u8, pc.socklen as usize) }
}

/// The peer's name, copied (for messages: a request that only takes a
/// connection never needs it).
pub fn chosen_name(pc: &ngx_peer_connection_t) -> String {
    if pc.sockaddr.is_null() {
        return String::new();
    }
    // SAFETY: a balancer set the name with the address.
    unsafe { pc.name.as_ref() }.map_or_else(String::new, |n| String::from_utf8_lossy(n.as_bytes()).into_owned())
}
