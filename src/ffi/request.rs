//! An HTTP request: its configuration, context, variables, body, response
//! and the client connection's events.

use std::ffi::{c_void, CStr};
use std::mem;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, Ordering};

use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule};

use super::conf::ComplexValue;
pub use super::hold::Posted;
use super::*;

/// A request (`ngx_http_request_t`), as a handler receives it.
#[repr(transparent)]
pub struct Req(ngx_http_request_t);

/// The per-request context of a module: the slot `r->ctx[module]` holds a
/// `Ctx` or nothing.
///
/// # Safety
/// Implement only for a module whose context slot is written by
/// `Req::set_ctx::<Self>` alone.
pub unsafe trait RequestCtx {
    type Ctx;
    fn module() -> &'static ngx_module_t;
}

/// The modules whose request contexts set_ctx made: a filter's own error
/// page must not take them away (see Req::through_filters).
static KEPT: [AtomicPtr<ngx_module_t>; 4] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 4];

/// Why a gateway location does not answer a request that an output
/// filter's error page redirected to it while a first answer to the same
/// request is still being sent (Req::answer_under_way).
pub const FILTER_REDIRECT: &str = "an output filter's error page (error_page) redirected the request here while \
     an answer to it (the gateway's, or an upstream's) was being sent: not served; nginx ends the request";

thread_local! {
    /// The request whose output filters the module runs now (through_filters).
    static FILTERING: std::cell::Cell<*mut ngx_http_request_t> = const { std::cell::Cell::new(std::ptr::null_mut()) };
}

fn keep_across_filters(m: &'static ngx_module_t) {
    let p = (m as *const ngx_module_t).cast_mut();
    for slot in &KEPT {
        match slot.compare_exchange(std::ptr::null_mut(), p, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(cur) if cur == p => return,
            Err(_) => {}
        }
    }
}

impl Req {
    /// # Safety
    /// `r` must be a live request that outlives `'a`, and no other reference
    /// to it may be used while this one is. Nothing may finalize it during
    /// `'a` unless an outer `hold` keeps it (`hold` is the way to lend a
    /// request to code that may end it).
    pub unsafe fn from_raw<'a>(r: *mut ngx_http_request_t) -> &'a mut Req {
        // SAFETY: see above; Req is a transparent wrapper.
        unsafe { &mut *(r as *mut Req) }
    }

    pub fn as_ptr(&self) -> *mut ngx_http_request_t {
        &self.0 as *const _ as *mut _
    }

    pub fn raw(&self) -> &ngx_http_request_t {
        &self.0
    }

    pub fn raw_mut(&mut self) -> &mut ngx_http_request_t {
        &mut self.0
    }

    /// The client connection for `f`, borrowed for the call only (it is
    /// nginx's, not part of the request struct: see Event::with). Every `f`
    /// here reads or writes its fields and calls nothing back.
    fn connection<T>(&self, f: impl FnOnce(&mut ngx_connection_t) -> T) -> T {
        // SAFETY: a live request has a live client connection, used by one
        // handler at a time on this thread; `f` makes no other reference
        // to it.
        f(unsafe { &mut *self.0.connection })
    }

    /// Bytes written to the client connection so far.
    pub fn bytes_sent(&self) -> i64 {
        self.connection(|c| c.sent)
    }

    /// The client connection, as a pointer (for calls that outlive the request).
    pub fn connection_ptr(&self) -> *mut ngx_connection_t {
        self.0.connection
    }

    /// The client connection's log (with the request's context in lines).
    pub fn log(&self) -> Log {
        // SAFETY: the connection's log lives as long as the connection.
        unsafe { Log::from_raw(self.connection(|c| c.log)) }
    }

    /// Lines logged from now on name this request (as ngx_http_set_log_request does).
    pub fn set_log_request(&self) {
        // SAFETY: an http connection's log is live, and its data is its
        // ngx_http_log_ctx_t.
        unsafe {
            if let Some(log) = self.connection(|c| c.log).as_ref() {
                if let Some(ctx) = (log.data as *mut ngx_http_log_ctx_t).as_mut() {
                    ctx.current_request = self.as_ptr();
                }
            }
        }
    }

    /// What the error log says the request was doing ("... while reading result").
    pub fn set_log_action(&self, action: &'static CStr) {
        // SAFETY: the connection's log is live; the text is static.
        if let Some(log) = unsafe { self.connection(|c| c.log).as_mut() } {
            log.action = action.as_ptr() as *mut _;
        }
    }

    /// The client connection broke (nginx will not send more to it).
    pub fn client_error(&self) -> bool {
        self.connection(|c| c.error() != 0)
    }

    pub fn method(&self) -> u32 {
        self.0.method as u32
    }

    pub fn method_name(&self) -> &[u8] {
        self.0.method_name.as_bytes()
    }

    /// The response status (0 before one is set).
    pub fn status(&self) -> ngx_uint_t {
        self.0.headers_out.status
    }

    /// The request's upstream, read only (also once it is finished: nginx
    /// keeps it until the request is freed).
    pub fn upstream_ref(&self) -> Option<&Upstream> {
        // SAFETY: r->upstream is null or an upstream in the request's pool.
        unsafe { self.0.upstream.cast::<Upstream>().as_ref() }
    }

    /// The sum of `$upstream_response_time` over the tries, in ms (None
    /// when no try finished).
    pub fn upstream_response_ms(&self) -> Option<ngx_msec_t> {
        // SAFETY: upstream_states is null or an array of states in the
        // request's pool.
        let a = unsafe { self.0.upstream_states.as_ref() }?;
        if a.elts.is_null() {
            return None;
        }
        // SAFETY: nelts states of this type (nginx's array).
        let states = unsafe { std::slice::from_raw_parts(a.elts as *const ngx_http_upstream_state_t, a.nelts) };
        states
            .iter()
            .map(|s| s.response_time)
            .filter(|t| *t != ngx_msec_t::MAX)
            .fold(None, |sum, t| Some(sum.unwrap_or(0) + t))
    }

    /// The value of the request's `Authorization` header.
    pub fn authorization(&self) -> Option<&[u8]> {
        // SAFETY: headers_in.authorization is null or nginx's entry of the
        // header, in the request's pool.
        let h = unsafe { self.0.headers_in.authorization.as_ref()? };
        Some(h.value.as_bytes())
    }

    /// Adds a response header (before the header is sent); false when
    /// nginx has no memory for it.
    pub fn add_header(&mut self, name: &'static str, value: &'static str) -> bool {
        !self.push_header(name, value).is_null()
    }

    /// Adds `Content-Encoding: gzip` as the response's encoding (before the
    /// header is sent), as nginx's filters read it: gunzip decodes the body
    /// for a client that does not take gzip, gzip leaves it alone. False
    /// when nginx has no memory for it.
    pub fn set_content_encoding_gzip(&mut self) -> bool {
        let h = self.push_header("Content-Encoding", "gzip");
        self.0.headers_out.content_encoding = h;
        !h.is_null()
    }

    /// A new element of the response's header list (null when nginx has no
    /// memory for it), every field not named here zero (nginx 1.23 and
    /// later link headers of one name through `next`).
    fn push_header(&mut self, name: &'static str, value: &'static str) -> *mut ngx_table_elt_t {
        // SAFETY: the response's header list, of ngx_table_elt_t, in the
        // request's pool; a pushed element is memory for one, zeroed here.
        let Some(h) = (unsafe {
            let h = ngx_list_push(&mut self.0.headers_out.headers) as *mut ngx_table_elt_t;
            if !h.is_null() {
                std::ptr::write_bytes(h, 0, 1);
            }
            h.as_mut()
        }) else {
            return std::ptr::null_mut();
        };
        h.hash = 1;
        h.key = static_str(name);
        h.value = static_str(value);
        h
    }

    /// The client's connection is watched for its close (nginx then
    /// finalizes the request), as for a request that waits for an upstream.
    pub fn set_read_handler_test_reading(&mut self) {
        self.0.read_event_handler = Some(ngx_http_test_reading);
    }

    /// Asks for a write event once the client's connection can take more
    /// (after output that did not all go out).
    pub fn watch_writable(&mut self) -> bool {
        // SAFETY: a live request's client connection and its write event.
        unsafe { ngx_handle_write_event(self.connection(|c| c.write), 0) == OK }
    }

    /// The query string (after `?`).
    pub fn args(&self) -> &[u8] {
        self.0.args.as_bytes()
    }

    /// Sends status, headers (Content-Type set before) and `body`, moved
    /// into the request's pool; what to finalize the request with.
    pub fn send_body(&mut self, status: ngx_uint_t, body: Vec<u8>) -> ngx_int_t {
        self.send_whole(status, body.len(), |pool, last| {
            super::buf::memory_chain(pool, body, Some(last))
        })
    }

    /// As `send_body`, with a body already in the request's pool
    /// (`Pool::str`'s copy of one made in a buffer that is used again).
    pub fn send_pooled_body(&mut self, status: ngx_uint_t, body: ngx_str_t) -> ngx_int_t {
        self.send_whole(status, body.len, |pool, last| {
            super::buf::pooled_chain(pool, body, Some(last))
        })
    }

    fn send_whole(
        &mut self,
        status: ngx_uint_t,
        len: usize,
        chain: impl FnOnce(&Pool, bool) -> Option<*mut ngx_chain_t>,
    ) -> ngx_int_t {
        self.set_status(status);
        self.set_content_length(len as off_t);
        let rc = self.send_header();
        if rc == ERROR || rc > OK || self.header_only() {
            return rc;
        }
        if len == 0 {
            // The header waits in nginx's buffer until the last buffer goes
            // out: an empty body still ends the response.
            return self.send_last();
        }
        let last = self.is_main();
        match chain(&self.pool(), last) {
            // SAFETY: the chain was built in the request's pool.
            Some(chain) => unsafe { self.output_filter(chain) },
            None => ERROR,
        }
    }

    pub fn is_main(&self) -> bool {
        std::ptr::eq(self.0.main, &self.0)
    }

    pub fn header_only(&self) -> bool {
        self.0.header_only() != 0
    }

    /// The response's header has gone out.
    pub fn header_sent(&self) -> bool {
        self.0.header_sent() != 0
    }

    pub fn pool(&self) -> Pool {
        // SAFETY: a live request's pool lives as long as the request.
        unsafe { Pool::from_raw(self.0.pool) }.expect("a request has a pool")
    }

    pub fn loc_conf<M: HttpModuleLocationConf>(&self) -> &'static M::LocationConf {
        M::location_conf(&self.0).expect("every http module has a location configuration")
    }

    pub fn main_conf<M: HttpModuleMainConf>(&self) -> &'static M::MainConf {
        M::main_conf(&self.0).expect("every http module has a main configuration")
    }

    pub fn core_loc_conf(&self) -> &'static ngx_http_core_loc_conf_t {
        self.loc_conf::<NgxHttpCoreModule>()
    }

    /// The module's context of this request, borrowed with it: while it is
    /// in use, nothing else can reach the request (nor, through it, the
    /// context).
    pub fn ctx_mut<M: RequestCtx>(&mut self) -> Option<&mut M::Ctx> {
        // SAFETY: r->ctx has a slot per http module; the slot holds an M::Ctx
        // in the request's pool or null (RequestCtx). The reference borrows
        // the request mutably, so no other reference to the context made
        // through it is live at the same time.
        unsafe { (*self.0.ctx.add(M::module().ctx_index) as *mut M::Ctx).as_mut() }
    }

    /// The module's context of this request, for reading.
    pub fn ctx_ref<M: RequestCtx>(&self) -> Option<&M::Ctx> {
        // SAFETY: as ctx_mut; a shared borrow of the request allows no
        // mutable borrow of the context through it meanwhile.
        unsafe { (*self.0.ctx.add(M::module().ctx_index) as *const M::Ctx).as_ref() }
    }

    /// Moves a context into the request's pool and into the module's slot.
    pub fn set_ctx<M: RequestCtx>(&mut self, ctx: M::Ctx) -> Option<NonNull<M::Ctx>> {
        keep_across_filters(M::module());
        let p = self.pool().alloc(ctx)?;
        // SAFETY: r->ctx has a slot per http module; the context lives in
        // the request's pool, as long as the request.
        unsafe { *self.0.ctx.add(M::module().ctx_index) = p.as_ptr().cast::<c_void>() };
        Some(p)
    }

    /// Evaluates a value with variables for this request.
    pub fn complex_value(&mut self, cv: ComplexValue) -> Option<&[u8]> {
        let mut v = ngx_str_t::empty();
        // SAFETY: the value was compiled for this configuration; the result
        // is in the request's pool.
        let rc = unsafe { ngx_http_complex_value(self.as_ptr(), cv.as_ptr(), &mut v) };
        if rc != OK {
            return None;
        }
        if v.len == 0 {
            return Some(&[]);
        }
        // SAFETY: the value is in the request's pool, which outlives the borrow of the request.
        Some(unsafe { std::slice::from_raw_parts(v.data, v.len) })
    }

    /// A variable by index: None when not found. A variable that `set`
    /// defines elsewhere but not for this request is also None (rather than
    /// nginx's "using uninitialized variable" warning on every request).
    pub fn variable(&mut self, index: ngx_int_t) -> Option<&[u8]> {
        let i = usize::try_from(index).ok()?;
        // SAFETY: r->variables has a slot per variable of the configuration.
        let stored = unsafe { &*self.0.variables.add(i) };
        if stored.valid() == 0 {
            let cmcf = self.main_conf::<NgxHttpCoreModule>();
            // SAFETY: the core module's variables, one per index.
            let var = unsafe { &cmcf.variables.as_slice::<ngx_http_variable_t>()[i] };
            if var.flags & NGX_HTTP_VAR_CHANGEABLE as ngx_uint_t != 0 {
                return None;
            }
        }
        // SAFETY: a live request and a variable index of its configuration.
        let v = unsafe { ngx_http_get_indexed_variable(self.as_ptr(), i as ngx_uint_t).as_ref()? };
        (v.not_found() == 0).then(|| v.as_bytes())
    }

    /// Stores a variable's value for the rest of the request (internal
    /// redirects included, so an `error_page` location sees it).
    pub fn set_variable(&mut self, index: ngx_int_t, value: &[u8]) -> bool {
        let Ok(i) = usize::try_from(index) else { return true };
        let Some(s) = self.pool().str(value) else { return false };
        // SAFETY: r->variables has a slot per variable of the configuration;
        // the value is in the request's pool.
        fill_variable(unsafe { &mut *self.0.variables.add(i) }, s);
        true
    }

    /// Reads the request body, then calls `done` (nginx's read_client_request_body).
    pub fn read_body(&mut self, done: ngx_http_client_body_handler_pt) -> ngx_int_t {
        // SAFETY: a live request.
        unsafe { ngx_http_read_client_request_body(self.as_ptr(), done) }
    }

    pub fn discard_body(&mut self) -> ngx_int_t {
        // SAFETY: a live request.
        unsafe { ngx_http_discard_request_body(self.as_ptr()) }
    }

    /// The buffers of the request body as nginx read them, and their size.
    pub fn body_bufs(&self) -> (Vec<NonNull<ngx_buf_t>>, usize) {
        let mut bufs = Vec::new();
        let mut len = 0;
        // SAFETY: the request body and its chain live in the request's pool.
        let mut cl = unsafe { self.0.request_body.as_ref() }.map_or(std::ptr::null_mut(), |rb| rb.bufs);
        // SAFETY: as above.
        while let Some(link) = unsafe { cl.as_ref() } {
            // SAFETY: as above.
            let b = unsafe { &*link.buf };
            len += if b.in_file() != 0 && b.temporary() == 0 && b.memory() == 0 {
                (b.file_last - b.file_pos) as usize
            } else {
                b.last as usize - b.pos as usize
            };
            bufs.extend(NonNull::new(link.buf));
            cl = link.next;
        }
        (bufs, len)
    }

    /// A body that nginx wrote to a temporary file is read back into memory
    /// (one buffer), so that `$request_body` sees it. False when it cannot be.
    pub fn body_into_memory(&mut self) -> bool {
        // SAFETY: the request body lives in the request's pool.
        let Some(rb) = (unsafe { self.0.request_body.as_mut() }) else {
            return true;
        };
        // SAFETY: as above.
        let Some(tf) = (unsafe { rb.temp_file.as_mut() }) else {
            return true;
        };
        let size = tf.file.offset as usize;
        let mut data = vec![0u8; size];
        // SAFETY: the temporary file is open; data has room for size bytes.
        if size > 0 && unsafe { ngx_read_file(&mut tf.file, data.as_mut_ptr(), size, 0) } != size as isize {
            return false;
        }
        let pool = self.pool();
        let Some(b) = buf::memory(&pool, data) else {
            return false;
        };
        // SAFETY: b is a fresh buffer of the request's pool.
        unsafe { (*b.as_ptr()).set_last_buf(1) };
        let mut chain = Chain::new(&pool);
        if chain.push(b).is_none() {
            return false;
        }
        rb.bufs = chain.into_raw();
        rb.buf = b.as_ptr();
        // The file is still deleted with the request's pool.
        rb.temp_file = std::ptr::null_mut();
        true
    }

    /// The request body's bytes (read back from nginx's temporary file
    /// when it wrote one). None when they cannot be had.
    pub fn body_bytes(&mut self) -> Option<Vec<u8>> {
        if !self.body_into_memory() {
            return None;
        }
        let (bufs, len) = self.body_bufs();
        let mut body = Vec::with_capacity(len);
        for b in bufs {
            // SAFETY: memory buffers of the request body, in its pool
            // (body_into_memory left none in a file).
            let b = unsafe { b.as_ref() };
            if !b.pos.is_null() && b.last > b.pos {
                // SAFETY: as above: pos..last are the buffer's bytes.
                body.extend_from_slice(unsafe { std::slice::from_raw_parts(b.pos, b.last as usize - b.pos as usize) });
            }
        }
        Some(body)
    }

    pub fn set_status(&mut self, status: ngx_uint_t) {
        self.0.headers_out.status = status;
    }

    /// -1: unknown (chunked).
    pub fn set_content_length(&mut self, n: off_t) {
        self.0.headers_out.content_length_n = n;
    }

    pub fn set_content_type(&mut self, t: &'static str) {
        let ho = &mut self.0.headers_out;
        ho.content_type = static_str(t);
        ho.content_type_len = t.len();
        ho.content_type_lowcase = std::ptr::null_mut();
    }

    /// Content-Type: the location's `default_type`, whatever the URI's extension.
    pub fn set_default_type(&mut self) {
        let t = self.core_loc_conf().default_type;
        let ho = &mut self.0.headers_out;
        ho.content_type = t;
        ho.content_type_len = t.len;
        ho.content_type_lowcase = std::ptr::null_mut();
    }

    /// Content-Type by the URI's extension (`types`), else `default_type`.
    pub fn set_content_type_by_extension(&mut self) -> bool {
        // SAFETY: a live request.
        unsafe { ngx_http_set_content_type(self.as_ptr()) == OK }
    }

    pub fn set_header_only(&mut self) {
        self.0.set_header_only(1);
    }

    /// Runs nginx's header or body filters. A filter that answers with an
    /// error page of its own (ngx_http_filter_finalize_request: the
    /// not-modified filter's 412, image_filter's 415) clears every
    /// module's context of the request. The contexts set_ctx made are put
    /// back (where nothing else took the slot), so that the handler that
    /// holds the request still finds its state to end the request and to
    /// free what it holds (its timers, its place on a connection).
    fn through_filters(&mut self, f: impl FnOnce(&mut Self) -> ngx_int_t) -> ngx_int_t {
        let mut saved = [std::ptr::null_mut::<c_void>(); KEPT.len()];
        for (slot, m) in saved.iter_mut().zip(&KEPT) {
            let m = m.load(Ordering::Relaxed);
            if !m.is_null() {
                // SAFETY: a module of this library (a static); r->ctx has a
                // slot per http module of the configuration.
                *slot = unsafe { *self.0.ctx.add((*m).ctx_index) };
            }
        }
        let outer = FILTERING.replace(self.as_ptr());
        let rc = f(self);
        FILTERING.set(outer);
        for (saved, m) in saved.iter().zip(&KEPT) {
            if saved.is_null() {
                continue;
            }
            // SAFETY: as above; the saved context is in the request's pool,
            // which the filters do not free.
            unsafe {
                let slot = self.0.ctx.add((*m.load(Ordering::Relaxed)).ctx_index);
                if (*slot).is_null() {
                    *slot = *saved;
                }
            }
        }
        rc
    }

    /// A first answer to the request is under way: the request is inside
    /// the module's own call of its output filters, or an upstream of
    /// nginx's still answers it. A content handler that runs then was
    /// reached through a filter's error page (`error_page` of
    /// image_filter's 415, say). A second answer must not start (nginx
    /// ends the request when the filter returns, as for its own
    /// upstreams; a query would run for nobody).
    pub fn answer_under_way(&self) -> bool {
        FILTERING.get() == self.as_ptr() || self.upstream_in_flight()
    }

    /// An upstream of nginx's (`proxy_pass`, or the cache's own with
    /// `cache_pipeline off`) still answers the request: nginx clears its
    /// cleanup when it ends the upstream, before any error_page of its
    /// status, so a request that comes here with it set was redirected by
    /// a filter's error page while that answer was being sent.
    fn upstream_in_flight(&self) -> bool {
        // SAFETY: r->upstream is null or nginx's upstream, in the request's pool.
        unsafe { self.0.upstream.as_ref() }.is_some_and(|u| !u.cleanup.is_null())
    }

    pub fn send_header(&mut self) -> ngx_int_t {
        // SAFETY: a live request.
        self.through_filters(|r| unsafe { ngx_http_send_header(r.as_ptr()) })
    }

    /// The answer is not a representation with validators (no ETag, no
    /// Last-Modified, not cached): If-Match, If-Unmodified-Since and
    /// If-None-Match are not applied to it, as nginx's proxied answers.
    pub fn disable_not_modified(&mut self) {
        self.0.set_disable_not_modified(1);
    }

    /// Passes a chain to the output filters (null: only flush).
    ///
    /// # Safety
    /// `chain` is null or a chain whose links and buffers live in this
    /// request's pool (or longer).
    pub unsafe fn output_filter(&mut self, chain: *mut ngx_chain_t) -> ngx_int_t {
        // SAFETY: a live request; the caller vouches for the chain.
        self.through_filters(|r| unsafe { ngx_http_output_filter(r.as_ptr(), chain) })
    }

    /// The response ends with no more body (an empty one included).
    /// Sends what is buffered (the header, say) now.
    pub fn send_flush(&mut self) -> ngx_int_t {
        // SAFETY: a live request.
        self.through_filters(|r| unsafe { ngx_http_send_special(r.as_ptr(), NGX_HTTP_FLUSH as ngx_uint_t) })
    }

    pub fn send_last(&mut self) -> ngx_int_t {
        // SAFETY: a live request.
        self.through_filters(|r| unsafe { ngx_http_send_special(r.as_ptr(), NGX_HTTP_LAST as ngx_uint_t) })
    }

    /// Ends the request (nginx's ngx_http_finalize_request). It is not
    /// freed meanwhile: every `&mut Req` is lent by `Req::hold`, whose
    /// reference keeps it (nginx frees it, if this was the end, when the
    /// hold is over), so using it after this call is not undefined, only
    /// pointless.
    pub fn finalize(&mut self, rc: ngx_int_t) {
        // SAFETY: a live request, held (see above): nginx cannot free it
        // during the call.
        unsafe { ngx_http_finalize_request(self.as_ptr(), rc) }
    }

    /// The request's client connection, taken before a handler that may
    /// finalize (and free) the request, to run the subrequests posted
    /// meanwhile once it returns, as nginx's own handlers do.
    pub fn posted(&self) -> Posted {
        Posted::of(self.0.connection)
    }

    /// One more reference to the main request (kept until finalized).
    pub fn count_up(&mut self) {
        // SAFETY: a live request's main request is live.
        let main = unsafe { &mut *self.0.main };
        main.set_count(main.count() + 1);
    }

    /// Reading from the client is not needed any more.
    pub fn block_reading(&mut self) {
        self.0.read_event_handler = Some(ngx_http_block_reading);
    }

    pub fn write_handler(&self) -> ngx_http_event_handler_pt {
        self.0.write_event_handler
    }

    pub fn set_write_handler(&mut self, h: ngx_http_event_handler_pt) {
        self.0.write_event_handler = h;
    }

    /// The client connection's write event.
    pub fn client_write(&self) -> Event<'_> {
        // SAFETY: the client connection's events live as long as it.
        unsafe { Event::from_raw(self.connection(|c| c.write)) }.expect("a connection has events")
    }

    /// Waits until the client can take more: the write event armed, with
    /// nginx's send_timeout (unless `limit_rate` holds the output back:
    /// its timer then runs, as nginx's own writer leaves it).
    pub fn wait_client_writable(&mut self) -> bool {
        let clcf = self.core_loc_conf();
        let wev = self.client_write();
        // SAFETY: the client's write event is live.
        let ok = unsafe { ngx_handle_write_event(wev.as_ptr(), clcf.send_lowat) } == OK;
        if !wev.delayed() {
            wev.add_timer(clcf.send_timeout);
        }
        ok
    }

    /// The client caught up: no more send_timeout. A `limit_rate` timer
    /// stays (without it, output held back would never go).
    pub fn client_caught_up(&mut self) {
        let wev = self.client_write();
        if !wev.delayed() {
            wev.del_timer();
        }
    }

    /// The client did not read within send_timeout: mark the connection.
    pub fn set_client_timed_out(&mut self) {
        self.connection(|c| c.set_timedout(1));
    }

    /// nginx's upstream of the request, once created.
    pub fn upstream(&mut self) -> Option<&mut Upstream> {
        // SAFETY: the upstream lives in the request's pool; Upstream is a
        // transparent wrapper.
        unsafe { (self.0.upstream as *mut Upstream).as_mut() }
    }

    /// The reply side of the request's upstream and the module's context,
    /// together: neither reaches the other, and the reply side calls no
    /// module back (upstream::Reply).
    pub fn upstream_and_ctx<M: RequestCtx>(&mut self) -> Option<(&mut Reply, &mut M::Ctx)> {
        // SAFETY: the upstream and the context are two objects of the
        // request's pool (or null); both references borrow the request.
        unsafe {
            let u = (self.0.upstream as *mut Reply).as_mut()?;
            let ctx = (*self.0.ctx.add(M::module().ctx_index) as *mut M::Ctx).as_mut()?;
            Some((u, ctx))
        }
    }

    /// Sets the upstream's filter that passes the response body on: nginx
    /// calls it with this request (`input_filter_init_handler!`,
    /// `input_filter_handler!`). False without an upstream.
    pub fn set_input_filter(
        &mut self,
        init: unsafe extern "C" fn(*mut c_void) -> ngx_int_t,
        filter: unsafe extern "C" fn(*mut c_void, isize) -> ngx_int_t,
    ) -> bool {
        let r = self.as_ptr();
        let Some(u) = self.upstream() else { return false };
        u.set_input_filter(init, filter, r);
        true
    }

    pub fn create_upstream(&mut self) -> Option<&mut Upstream> {
        // SAFETY: a live request.
        if unsafe { ngx_http_upstream_create(self.as_ptr()) } != OK {
            return None;
        }
        self.upstream()
    }

    /// Starts nginx's upstream (balancer, connection) for the request.
    pub fn upstream_init(&mut self) {
        // SAFETY: a live request with an upstream set up.
        unsafe { ngx_http_upstream_init(self.as_ptr()) }
    }

    /// Sets up the request's upstream for a module that talks to the
    /// server itself (nginx's upstream code is not started): the
    /// `$upstream_*` states, and the balancer of `block` (null: a
    /// round robin over the address `*_pass $variable` gave), as
    /// `ngx_http_upstream_init_request` does.
    pub fn init_upstream_peer(&mut self, block: Option<&ngx_http_upstream_srv_conf_t>) -> bool {
        let r = self.as_ptr();
        // SAFETY: a live request whose upstream was created; the block
        // lives as long as the configuration; the states array goes in the
        // request's pool.
        unsafe {
            let Some(u) = self.0.upstream.as_mut() else {
                return false;
            };
            if self.0.upstream_states.is_null() {
                self.0.upstream_states = ngx_array_create(self.0.pool, 1, mem::size_of::<ngx_http_upstream_state_t>());
                if self.0.upstream_states.is_null() {
                    return false;
                }
            }
            if let Some(us) = block {
                u.upstream = (us as *const ngx_http_upstream_srv_conf_t).cast_mut();
            }
            u.peer.log = (*self.0.connection).log;
            u.peer.set_log_error(ngx_connection_log_error_e_NGX_ERROR_ERR as _);
            let rc = match block {
                Some(us) => match us.peer.init {
                    Some(init) => init(r, (us as *const ngx_http_upstream_srv_conf_t).cast_mut()),
                    None => return false,
                },
                None if !u.resolved.is_null() => ngx_http_upstream_create_round_robin_peer(r, u.resolved),
                None => return false,
            };
            if rc != OK {
                return false;
            }
            u.peer.start_time = ngx_current_msec;
            let tries = (*u.conf).next_upstream_tries;
            if tries != 0 && u.peer.tries > tries {
                u.peer.tries = tries;
            }
        }
        true
    }

    /// For a response that one of the worker's shared connections serves
    /// (an event stream): the request's upstream is `block` (the metrics'
    /// upstream label) with the module's `tag`, and `$upstream_addr`,
    /// `$upstream_status` name the `servers` the stream hears, with 200 (and
    /// 0 for the connect and header times: the connections were there). The
    /// response time is the stream's, set when the request ends.
    pub fn set_stream_upstream(
        &mut self,
        block: Option<&'static ngx_http_upstream_srv_conf_t>,
        tag: &'static ngx_module_t,
        servers: &[String],
    ) -> bool {
        let pool = self.pool();
        let Some(u) = self.create_upstream() else {
            return false;
        };
        let u = u.raw_mut();
        // (The block, or null, lives as long as the configuration.)
        u.upstream = block.map_or(std::ptr::null_mut(), |b| std::ptr::from_ref(b).cast_mut());
        u.output.tag = std::ptr::from_ref(tag) as ngx_buf_tag_t;
        u.start_time = current_msec();
        if self.0.upstream_states.is_null() {
            // SAFETY: a live request; the array goes in its pool.
            self.0.upstream_states = unsafe {
                ngx_array_create(
                    self.0.pool,
                    servers.len().max(1),
                    mem::size_of::<ngx_http_upstream_state_t>(),
                )
            };
            if self.0.upstream_states.is_null() {
                return false;
            }
        }
        for name in servers {
            let Some(peer) = pool.str(name.as_bytes()).and_then(|s| pool.alloc(s)) else {
                return false;
            };
            let Some(st) = self.push_upstream_state() else {
                return false;
            };
            st.status = 200;
            st.peer = peer.as_ptr();
            st.response_time = ngx_msec_t::MAX;
            st.connect_time = 0;
            st.header_time = 0;
        }
        self.add_request_cleanup(super::upstream::stream_upstream_end)
    }

    /// A timer of the request's (it stops when the request's pool goes, or
    /// when the handle is dropped), whose handler finds the request as the
    /// event's data.
    pub fn new_timer(&mut self, handler: ngx_event_handler_pt) -> Option<Timer> {
        let (timer, in_pool) = Timer::new(self.as_ptr().cast(), handler, self.log());
        self.pool().alloc(in_pool)?;
        Some(timer)
    }

    /// Runs `handler(data)` when the request ends, however it ends (nginx's
    /// request cleanups: also when it is terminated, a client gone say).
    /// Adds a cleanup that nginx calls with this request
    /// (`request_cleanup_handler!`).
    pub fn add_request_cleanup(&mut self, handler: unsafe extern "C" fn(*mut std::ffi::c_void)) -> bool {
        let r = self.as_ptr().cast();
        self.add_cleanup(handler, r)
    }

    fn add_cleanup(
        &mut self,
        handler: unsafe extern "C" fn(*mut std::ffi::c_void),
        data: *mut std::ffi::c_void,
    ) -> bool {
        // SAFETY: a live request; the cleanup lives in its pool.
        let Some(cln) = (unsafe { ngx_http_cleanup_add(self.as_ptr(), 0).as_mut() }) else {
            return false;
        };
        cln.handler = Some(handler);
        cln.data = data;
        true
    }

    /// The location has an `error_page` for the status.
    pub fn has_error_page(&self, status: ngx_int_t) -> bool {
        // SAFETY: the location's error pages, an array of
        // ngx_http_err_page_t in configuration memory (or null).
        let pages = unsafe { self.core_loc_conf().error_pages.as_ref() }
            .map_or(&[][..], |a| unsafe { a.as_slice::<ngx_http_err_page_t>() });
        pages.iter().any(|p| p.status == status)
    }

    /// Range requests may take one part of the response, as nginx's
    /// upstreams allow (`force_ranges`): several ranges in a response that
    /// comes in more than one buffer are an error in nginx's range filter,
    /// so such a request gets the whole response.
    pub fn allow_ranges(&mut self) {
        self.0.set_allow_ranges(1);
        self.0.set_single_range(1);
    }

    /// A new try of the request's upstream: a new entry in `$upstream_*`
    /// (its times unknown yet), the try's clock started. False when no
    /// entry could be had.
    pub fn begin_upstream_try(&mut self) -> bool {
        let Some(st) = self.push_upstream_state() else {
            return false;
        };
        st.response_time = ngx_msec_t::MAX;
        st.connect_time = ngx_msec_t::MAX;
        st.header_time = ngx_msec_t::MAX;
        let st: *mut ngx_http_upstream_state_t = st;
        let Some(u) = self.upstream() else { return false };
        // SAFETY: the new state lives in the request's pool's states array.
        u.set_state(unsafe { &mut *st });
        u.restart_clock();
        true
    }

    /// A new entry in `$upstream_*` for another try.
    pub fn push_upstream_state(&mut self) -> Option<&mut ngx_http_upstream_state_t> {
        // SAFETY: the states array lives in the request's pool (created
        // when the upstream first connected).
        unsafe {
            let st = (ngx_array_push(self.0.upstream_states) as *mut ngx_http_upstream_state_t).as_mut()?;
            *st = mem::zeroed();
            Some(st)
        }
    }
}

/// Makes a variable's value slot hold `s` (bytes that live as long as the
/// request), found and cacheable.
pub fn fill_variable(v: &mut ngx_variable_value_t, s: ngx_str_t) {
    v.data = s.data;
    // The bit fields `len:28, valid:1, no_cacheable:1, not_found:1,
    // escape:1` in one word: bindgen's setters write one bit at a time
    // (a loop of 28 for len), and variables are stored for every request.
    // Little-endian, the fields fill the word from its lowest bit.
    #[cfg(target_endian = "little")]
    {
        let word = (s.len as u32 & 0x0fff_ffff) | 1 << 28;
        v._bitfield_1 = __BindgenBitfieldUnit::new(word.to_le_bytes());
        debug_assert!(v.len() as usize == s.len && v.valid() == 1 && v.not_found() == 0);
    }
    #[cfg(not(target_endian = "little"))]
    {
        v.set_len(s.len as u32);
        v.set_valid(1);
        v.set_no_cacheable(0);
        v.set_not_found(0);
        v.set_escape(0);
    }
}
