//! nginx's upstream of a request (`ngx_http_upstream_t`): its callbacks,
//! its state in `$upstream_*`, its peer, its buffer.

use std::ffi::c_void;
use std::ptr;

use super::*;

/// The upstream of a request.
#[repr(transparent)]
pub struct Upstream(ngx_http_upstream_t);

/// The callbacks of an upstream module, installed together.
#[derive(Clone, Copy)]
pub struct Callbacks {
    pub create_request: unsafe extern "C" fn(*mut ngx_http_request_t) -> ngx_int_t,
    pub reinit_request: unsafe extern "C" fn(*mut ngx_http_request_t) -> ngx_int_t,
    pub process_header: unsafe extern "C" fn(*mut ngx_http_request_t) -> ngx_int_t,
    pub abort_request: unsafe extern "C" fn(*mut ngx_http_request_t),
    pub finalize_request: unsafe extern "C" fn(*mut ngx_http_request_t, ngx_int_t),
}

/// Callbacks for a module with nothing to do at that step (they touch
/// nothing: no guard is needed).
pub extern "C" fn nothing_to_create(_r: *mut ngx_http_request_t) -> ngx_int_t {
    OK
}

/// A `process_header` that is never reached (the module reads the replies
/// itself).
pub extern "C" fn no_header(_r: *mut ngx_http_request_t) -> ngx_int_t {
    ERROR
}

pub extern "C" fn nothing_to_abort(_r: *mut ngx_http_request_t) {}

impl Upstream {
    pub fn raw_mut(&mut self) -> &mut ngx_http_upstream_t {
        &mut self.0
    }

    /// Sets what nginx's upstream code calls, the configuration it uses,
    /// and how `$upstream_addr` names the server ("postgres://", "redis://").
    /// `conf` is the location's upstream settings, in configuration memory
    /// (nginx reads them, and does not write them).
    pub fn install(
        &mut self,
        conf: *const ngx_http_upstream_conf_t,
        schema: &'static str,
        tag: *const ngx_module_t,
        cb: Callbacks,
    ) {
        let u = &mut self.0;
        u.conf = conf.cast_mut();
        u.schema = static_str(schema);
        u.output.tag = tag as ngx_buf_tag_t;
        u.create_request = Some(cb.create_request);
        u.reinit_request = Some(cb.reinit_request);
        u.process_header = Some(cb.process_header);
        u.abort_request = Some(cb.abort_request);
        u.finalize_request = Some(cb.finalize_request);
    }

    /// The module that installed it (its buffers' tag).
    pub fn tag(&self) -> *const ngx_module_t {
        self.0.output.tag as *const ngx_module_t
    }

    /// The upstream block the request's server comes from, unless the
    /// address was named at run time (a variable's value, which may come
    /// from a client: never a label of its own).
    fn named_block(&self) -> Option<&ngx_http_upstream_srv_conf_t> {
        // SAFETY: u->resolved is null or in the request's pool.
        let address = unsafe { self.0.resolved.as_ref() }.is_some_and(|r| !r.sockaddr.is_null());
        // SAFETY: u->upstream is null or an upstream block of the
        // configuration (found by name when a variable named one).
        unsafe { self.0.upstream.as_ref() }.filter(|_| !address)
    }

    /// The upstream block's name (`host:port` for one made of a literal
    /// address); empty without one (see named_block).
    pub fn name(&self) -> String {
        match self.named_block() {
            Some(us) => {
                let host = String::from_utf8_lossy(us.host.as_bytes()).into_owned();
                if us.port != 0 {
                    format!("{host}:{}", us.port)
                } else {
                    host
                }
            }
            None => String::new(),
        }
    }

    /// A number that stands for `name()` in this worker: the upstream
    /// block's address, 0 where the name is empty.
    pub fn name_key(&self) -> usize {
        self.named_block().map_or(0, |us| us as *const _ as usize)
    }

    /// TLS to the server, with the context of the configuration installed;
    /// `name` is the server's name to verify and to send (SNI), unless the
    /// configuration's `ssl_name` says otherwise.
    pub fn set_ssl(&mut self, name: ngx_str_t) {
        self.0.set_ssl(1);
        self.0.ssl_name = name;
    }

    /// The host of the server named at run time (`set_resolved`).
    pub fn resolved_host(&self) -> Option<ngx_str_t> {
        // SAFETY: a resolved structure set by set_resolved lives in the
        // request's pool.
        unsafe { self.0.resolved.as_ref() }.map(|r| r.host)
    }

    /// Sets the filter that passes the response body on, with the request
    /// as its data (Req::set_input_filter).
    pub(super) fn set_input_filter(
        &mut self,
        init: unsafe extern "C" fn(*mut c_void) -> ngx_int_t,
        filter: unsafe extern "C" fn(*mut c_void, isize) -> ngx_int_t,
        r: *mut ngx_http_request_t,
    ) {
        self.0.input_filter_init = Some(init);
        self.0.input_filter = Some(filter);
        self.0.input_filter_ctx = r.cast();
    }

    /// The server is named at run time (`*_pass $variable`): an upstream
    /// block by name, or an address.
    pub fn set_resolved(&mut self, pool: &Pool, host: ngx_str_t, addr: Option<&ngx_addr_t>, port: u16) -> bool {
        let Some(res) = pool.calloc::<ngx_http_upstream_resolved_t>() else {
            return false;
        };
        // SAFETY: res is fresh zeroed memory of the request's pool.
        let res_ref = unsafe { &mut *res.as_ptr() };
        res_ref.host = host;
        match addr {
            Some(a) => {
                res_ref.sockaddr = a.sockaddr;
                res_ref.socklen = a.socklen;
                res_ref.name = a.name;
                res_ref.naddrs = 1;
                res_ref.port = port as in_port_t;
            }
            None => res_ref.no_port = 1,
        }
        self.0.resolved = res.as_ptr();
        true
    }

    /// The server is a numeric `host:port` or `unix:/path` named at run
    /// time (no name is resolved). False when the value is not one.
    pub fn set_resolved_address(&mut self, pool: &Pool, value: &[u8]) -> bool {
        if value.is_empty() {
            return false;
        }
        let Some(text) = pool.str(value) else { return false };
        // SAFETY: an all-zero ngx_url_t is its initial state; what nginx
        // parses lands in the request's pool, which outlives the upstream.
        unsafe {
            let mut url: ngx_url_t = std::mem::zeroed();
            url.url = text;
            url.set_no_resolve(1);
            if ngx_parse_url(pool.as_ptr(), &mut url) != OK || url.naddrs == 0 {
                return false;
            }
            self.set_resolved(pool, url.host, Some(&*url.addrs), url.port)
        }
    }

    pub fn set_state(&mut self, st: &mut ngx_http_upstream_state_t) {
        self.0.state = st;
    }

    /// Milliseconds since this try started.
    pub fn elapsed(&self) -> ngx_msec_t {
        current_msec().wrapping_sub(self.0.start_time)
    }

    pub fn restart_clock(&mut self) {
        self.0.start_time = current_msec();
    }

    pub fn peer(&mut self) -> &mut ngx_peer_connection_t {
        &mut self.0.peer
    }

    /// Asks the balancer for a server (`peer.get`), for a module that
    /// connects itself: OK, BUSY (no live server) or DECLINED. A
    /// connection that nginx's `keepalive` kept for the server (from a
    /// request that used nginx's upstream code) is closed: it is not used.
    pub fn get_peer(&mut self) -> ngx_int_t {
        let pc = &mut self.0.peer;
        let Some(get) = pc.get else { return ERROR };
        // SAFETY: the balancer's own function with the data its init set up.
        let rc = unsafe { get(pc, pc.data) };
        if rc == DONE {
            // SAFETY: a connection nginx's keepalive cache handed over,
            // closed as that cache closes its own: TLS state freed at once,
            // then its pool, then the connection.
            unsafe {
                let c = std::mem::replace(&mut pc.connection, ptr::null_mut());
                if let Some(conn) = c.as_mut() {
                    if let Some(ssl) = conn.ssl.as_mut() {
                        ssl.set_no_wait_shutdown(1);
                        ssl.set_no_send_shutdown(1);
                        ngx_ssl_shutdown(c);
                    }
                    if !conn.pool.is_null() {
                        ngx_destroy_pool(conn.pool);
                        conn.pool = ptr::null_mut();
                    }
                    ngx_close_connection(c);
                }
            }
            return OK;
        }
        rc
    }

    /// The try's `$upstream_addr`: the server the balancer chose.
    pub fn note_peer(&mut self) {
        let name = self.0.peer.name;
        if let Some(st) = self.state() {
            st.peer = name;
        }
    }

    /// When the first try started (`*_next_upstream_timeout`).
    pub fn first_start(&self) -> ngx_msec_t {
        self.0.peer.start_time
    }

    /// The location's upstream settings.
    pub fn conf(&self) -> Option<&ngx_http_upstream_conf_t> {
        // SAFETY: the configuration outlives its requests.
        unsafe { self.0.conf.as_ref() }
    }

    /// Asks the balancer for a server and a connection (nginx's own code).
    pub fn connect_peer(&mut self) -> ngx_int_t {
        // SAFETY: the peer is the request's, set up by nginx's upstream.
        unsafe { ngx_event_connect_peer(&mut self.0.peer) }
    }

    /// What is sent to the server: a chain built in the request's pool.
    pub fn set_request_bufs(&mut self, chain: Chain<'_>) {
        self.0.request_bufs = chain.into_raw();
    }

    pub fn set_header_sent(&mut self) {
        self.0.set_header_sent(1);
    }

    /// nginx's upstream cleanup is not to run (the module finishes itself).
    pub fn drop_cleanup(&mut self) {
        // SAFETY: cleanup, when set, points at the request pool's cleanup handler slot.
        if let Some(c) = unsafe { self.0.cleanup.as_mut() } {
            *c = None;
        }
        self.0.cleanup = ptr::null_mut();
    }

    /// Gives the peer back to the balancer (with NGX_PEER_FAILED or not).
    pub fn free_peer(&mut self, state: ngx_uint_t) {
        if self.0.peer.sockaddr.is_null() {
            return;
        }
        if let Some(free) = self.0.peer.free {
            // SAFETY: the peer's data is what its balancer set up for it.
            unsafe { free(&mut self.0.peer, self.0.peer.data, state) };
        }
        self.0.peer.sockaddr = ptr::null_mut();
        self.0.peer.connection = ptr::null_mut();
    }
}

/// The reply side of a request's upstream: what the server sent, and what
/// the answer says. None of it calls back into a module (no balancer), so
/// it may be held beside the module's context of the request
/// (`Req::upstream_and_ctx`). `Upstream` has all of it too.
#[repr(transparent)]
pub struct Reply(ngx_http_upstream_t);

impl std::ops::Deref for Upstream {
    type Target = Reply;
    fn deref(&self) -> &Reply {
        // SAFETY: both are transparent wrappers of ngx_http_upstream_t.
        unsafe { &*(self as *const Upstream as *const Reply) }
    }
}

impl std::ops::DerefMut for Upstream {
    fn deref_mut(&mut self) -> &mut Reply {
        // SAFETY: as above.
        unsafe { &mut *(self as *mut Upstream as *mut Reply) }
    }
}

impl Reply {
    /// Appends a buffer of `data` (memory that lives as long as the
    /// request) to the output chain.
    fn append_out(&mut self, pool: &Pool, data: &[u8]) -> bool {
        // SAFETY: the upstream's free buffers are of the request's pool.
        let cl = unsafe { ngx_chain_get_free_buf(pool.as_ptr(), &mut self.0.free_bufs) };
        // SAFETY: a fresh link with a buffer, from nginx.
        let Some(link) = (unsafe { cl.as_mut() }) else {
            return false;
        };
        // SAFETY: as above.
        let out = unsafe { &mut *link.buf };
        out.set_flush(1);
        out.set_memory(1);
        out.pos = data.as_ptr() as *mut u8;
        out.last = out.pos.wrapping_add(data.len());
        out.tag = self.0.output.tag;
        // SAFETY: out_bufs is a chain of the request's pool; appended at the end.
        unsafe {
            let mut ll: *mut *mut ngx_chain_t = &mut self.0.out_bufs;
            while !(*ll).is_null() {
                ll = &mut (**ll).next;
            }
            *ll = cl;
        }
        true
    }

    /// The current try's entry in `$upstream_*`.
    pub fn state(&mut self) -> Option<&mut ngx_http_upstream_state_t> {
        // SAFETY: the state lives in the request's pool's states array.
        unsafe { self.0.state.as_mut() }
    }

    /// The server the balancer chose: its address bytes and name.
    pub fn peer_addr(&self) -> Option<(&[u8], ngx_str_t)> {
        let pc = &self.0.peer;
        if pc.sockaddr.is_null() || pc.name.is_null() {
            return None;
        }
        // SAFETY: the balancer set the address (socklen bytes) and the
        // name, which live as long as the configuration or the request.
        unsafe {
            Some((
                std::slice::from_raw_parts(pc.sockaddr as *const u8, pc.socklen as usize),
                *pc.name,
            ))
        }
    }

    /// Tries the balancer has left for the request.
    pub fn tries(&mut self) -> &mut ngx_uint_t {
        &mut self.0.peer.tries
    }

    /// The try that ends now (process_header's NGX_HTTP_UPSTREAM_INVALID_HEADER)
    /// is not the server's failure: its balancer is not told it failed
    /// (balancer::not_failed). False when the pool has no memory for it.
    pub fn not_failed(&mut self, pool: &Pool) -> bool {
        super::balancer::not_failed(pool, &mut self.0.peer)
    }

    /// nginx's next-upstream step takes the failures of `ft` (NGX_HTTP_UPSTREAM_FT_*
    /// bits) from now on, whatever the location's `*_next_upstream` says:
    /// the request's settings become a copy of them (in the pool) with
    /// those bits. False when the pool has no memory for it.
    pub fn next_upstream_on(&mut self, pool: &Pool, ft: ngx_uint_t) -> bool {
        // SAFETY: the settings installed (configuration memory, or a copy
        // in the request's pool).
        let Some(conf) = (unsafe { self.0.conf.as_ref() }) else {
            return false;
        };
        if conf.next_upstream & ft == ft {
            return true;
        }
        let mut copy = *conf;
        copy.next_upstream |= ft;
        let Some(p) = pool.alloc(copy) else { return false };
        self.0.conf = p.as_ptr();
        true
    }

    /// The bytes read and not used yet.
    pub fn unread(&self) -> &[u8] {
        let b = &self.0.buffer;
        if b.pos.is_null() || b.last <= b.pos {
            return &[];
        }
        // SAFETY: pos..last are bytes nginx read into the upstream's buffer.
        unsafe { std::slice::from_raw_parts(b.pos, b.last as usize - b.pos as usize) }
    }

    /// Once every byte read is used, the buffer starts over at its
    /// beginning, so that a reply longer than the buffer can be read
    /// through it in pieces (what was used is not needed again).
    pub fn rewind_if_used(&mut self) {
        let b = &mut self.0.buffer;
        if !b.start.is_null() && b.pos == b.last {
            b.pos = b.start;
            b.last = b.start;
        }
    }

    /// The first `n` bytes of `unread` are used.
    pub fn consume(&mut self, n: usize) {
        let b = &mut self.0.buffer;
        let n = n.min(b.last as usize - b.pos as usize);
        // SAFETY: within the bytes read (checked above).
        b.pos = unsafe { b.pos.add(n) };
    }

    /// Bytes the input filter is handed: `n` new bytes at the buffer's end,
    /// which then become part of it.
    ///
    /// # Safety
    /// The bytes stay where they are until nginx reuses the buffer (after
    /// the filter returns, once what was emitted is sent): `'a` must not
    /// outlive the filter call.
    pub unsafe fn take_new<'a>(&mut self, n: usize) -> &'a [u8] {
        let b = &mut self.0.buffer;
        let start = b.last;
        let n = n.min(b.end as usize - start as usize);
        // SAFETY: nginx read n bytes at last, within the buffer; see above
        // for how long they stay.
        unsafe {
            b.last = start.add(n);
            std::slice::from_raw_parts(start, n)
        }
    }

    /// Passes bytes of the upstream's buffer on to the client (the
    /// non-buffered input filter's way). Bytes from anywhere else are refused.
    pub fn emit(&mut self, pool: &Pool, data: &[u8]) -> bool {
        let b = &self.0.buffer;
        let (start, end) = (data.as_ptr() as usize, data.as_ptr() as usize + data.len());
        if start < b.start as usize || end > b.end as usize {
            return false;
        }
        self.append_out(pool, data)
    }

    /// Passes bytes of the module's own on to the client, copied into the
    /// request's pool.
    pub fn emit_copy(&mut self, pool: &Pool, data: &[u8]) -> bool {
        match pool.str(data) {
            // SAFETY: a copy in the request's pool, which outlives the output.
            Some(s) => self.append_out(pool, unsafe { std::slice::from_raw_parts(s.data, s.len) }),
            None => false,
        }
    }

    pub fn set_status(&mut self, status: ngx_uint_t) {
        self.0.headers_in.status_n = status;
        if let Some(st) = self.state() {
            st.status = status;
        }
    }

    pub fn set_content_length(&mut self, n: off_t) {
        self.0.headers_in.content_length_n = n;
    }

    pub fn set_keepalive(&mut self, on: bool) {
        self.0.set_keepalive(on as u32);
    }

    pub fn set_length(&mut self, n: off_t) {
        self.0.length = n;
    }
}

/// The end of a stream that `set_stream_upstream` set up: its servers'
/// response time is the stream's.
pub(super) unsafe extern "C" fn stream_upstream_end(data: *mut std::ffi::c_void) {
    guard(Log::cycle(), "stream upstream end", (), || {
        // SAFETY: the request the cleanup was added to, still live while
        // its cleanups run; its upstream and states are in its pool.
        unsafe {
            let r = &mut *(data as *mut ngx_http_request_t);
            let (Some(u), Some(a)) = (r.upstream.as_ref(), r.upstream_states.as_ref()) else {
                return;
            };
            if a.elts.is_null() {
                return;
            }
            let took = current_msec().wrapping_sub(u.start_time);
            let states = std::slice::from_raw_parts_mut(a.elts as *mut ngx_http_upstream_state_t, a.nelts);
            for st in states.iter_mut().filter(|st| st.response_time == ngx_msec_t::MAX) {
                st.response_time = took;
            }
        }
    })
}
