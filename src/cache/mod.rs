//! The cache gateway: `cache_pass` to Redis through nginx's upstream, built
//! the way nginx's memcached module is: `create_request` writes the RESP
//! commands, `process_header` reads the reply header, the input filter
//! streams a value to the client. Everything nginx users know about
//! upstreams (balancers, `keepalive`, `max_fails`, `$upstream_*`) applies.
//!
//! GET and HEAD read (`GET key`), PUT and POST store the request body
//! (`SET key body [EX n]`), DELETE deletes (`DEL key`). `$cache_db` selects
//! the database and `cache_auth` authenticates, in the same round trip.

use std::ffi::{c_char, c_void};
use std::mem;
use std::ptr;

use gateway_core::redis::{self, Command, Event, Exchange, ReplyError};
use gateway_core::resp;

use crate::ffi::*;
use crate::sqldb::conf::sqldb_srv_conf;

pub struct CacheLocConf {
    pub upstream: ngx_http_upstream_conf_t,
    pass_set: bool,
    /// `cache_pass` with variables: the value names an upstream or is host:port.
    pass_var: *mut ngx_http_complex_value_t,
    /// `cache_auth`.
    auth: *mut ngx_http_complex_value_t,
    next_upstream_set: bool,
}

/// Locations with `cache_pass`, checked once every variable is known.
struct PendingPass {
    claim: Claim,
    /// The upstream a literal `cache_pass` names.
    upstream: *mut ngx_http_upstream_srv_conf_t,
}

pub struct CacheMainConf {
    pending: Vec<PendingPass>,
    key: ngx_int_t,
    db: ngx_int_t,
    exptime: ngx_int_t,
}

unsafe extern "C" fn create_main_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: nginx passes the live configuration.
    guard(unsafe { (*cf).log }, "cache create_main_conf", ptr::null_mut(), || {
        let conf = CacheMainConf {
            pending: Vec::new(),
            key: -1,
            db: -1,
            exptime: -1,
        };
        // SAFETY: cf->pool is the configuration pool.
        unsafe { pool_alloc((*cf).pool, conf) }.map_or(ptr::null_mut(), |p| p.as_ptr().cast())
    })
}

unsafe extern "C" fn create_loc_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: nginx passes the live configuration.
    guard(unsafe { (*cf).log }, "cache create_loc_conf", ptr::null_mut(), || {
        // SAFETY: ngx_http_upstream_conf_t is plain C data for which all-zero is "unset".
        let mut u: ngx_http_upstream_conf_t = unsafe { mem::zeroed() };
        u.connect_timeout = CONF_UNSET_MSEC;
        u.send_timeout = CONF_UNSET_MSEC;
        u.read_timeout = CONF_UNSET_MSEC;
        u.buffer_size = usize::MAX;
        u.socket_keepalive = CONF_UNSET;
        let conf = CacheLocConf {
            upstream: u,
            pass_set: false,
            pass_var: ptr::null_mut(),
            auth: ptr::null_mut(),
            next_upstream_set: false,
        };
        // SAFETY: cf->pool is the configuration pool.
        unsafe { pool_alloc((*cf).pool, conf) }.map_or(ptr::null_mut(), |p| p.as_ptr().cast())
    })
}

unsafe extern "C" fn merge_loc_conf(cf: *mut ngx_conf_t, parent: *mut c_void, child: *mut c_void) -> *mut c_char {
    // SAFETY: nginx passes the live configuration.
    guard(unsafe { (*cf).log }, "cache merge_loc_conf", CONF_ERROR, || {
        // SAFETY: nginx passes two CacheLocConf made by create_loc_conf.
        let (prev, conf) = unsafe { (&*(parent as *const CacheLocConf), &mut *(child as *mut CacheLocConf)) };
        let (p, u) = (&prev.upstream, &mut conf.upstream);
        for (c, pv) in [
            (&mut u.connect_timeout, p.connect_timeout),
            (&mut u.send_timeout, p.send_timeout),
            (&mut u.read_timeout, p.read_timeout),
        ] {
            if *c == CONF_UNSET_MSEC {
                *c = if pv == CONF_UNSET_MSEC { 60_000 } else { pv };
            }
        }
        if u.buffer_size == usize::MAX {
            // SAFETY: ngx_pagesize is set at nginx start-up.
            u.buffer_size = if p.buffer_size == usize::MAX {
                unsafe { ngx_pagesize }
            } else {
                p.buffer_size
            };
        }
        if !conf.next_upstream_set {
            conf.next_upstream_set = prev.next_upstream_set;
            u.next_upstream = if prev.next_upstream_set {
                p.next_upstream
            } else {
                (NGX_HTTP_UPSTREAM_FT_ERROR | NGX_HTTP_UPSTREAM_FT_TIMEOUT) as ngx_uint_t
            };
        }
        if u.socket_keepalive == CONF_UNSET {
            u.socket_keepalive = if p.socket_keepalive == CONF_UNSET {
                0
            } else {
                p.socket_keepalive
            };
        }
        if conf.auth.is_null() {
            conf.auth = prev.auth;
        }
        // An `if` block (or limit_except) without cache_pass of its own passes
        // its location's requests to the same backend.
        // SAFETY: during the merge cf->ctx holds the child's configurations.
        let noname = unsafe {
            (*http_conf_get::<ngx_http_core_loc_conf_t>(cf, ptr::addr_of!(ngx_http_core_module), ConfSlot::Loc))
                .noname()
                != 0
        };
        if noname && u.upstream.is_null() && conf.pass_var.is_null() {
            u.upstream = p.upstream;
            conf.pass_var = prev.pass_var;
        }
        // What a cache never does: buffer to disk, pass the client's headers.
        u.buffering = 0;
        u.ignore_client_abort = 0;
        u.pass_request_headers = 0;
        u.pass_request_body = 0;
        u.intercept_errors = 1;
        u.force_ranges = 1;
        u.set_intercept_404(1);
        u.module = static_str("cache");
        CONF_OK
    })
}

/// `cache_pass upstream | host:port | unix:/path | $variable`
unsafe extern "C" fn cmd_cache_pass(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: conf is this module's CacheLocConf; cf is live.
    guard(unsafe { (*cf).log }, "cmd_cache_pass", CONF_ERROR, || unsafe {
        let lcf = &mut *(conf as *mut CacheLocConf);
        if lcf.pass_set {
            return conf_error(cf, format_args!("\"cache_pass\" directive is duplicate"));
        }
        lcf.pass_set = true;
        let known = [(Some(crate::sqldb::handler::content_handler as _), "\"sqldb_pass\"")];
        let claim = match claim_content_handler(cf, "cache_pass", Some(content_handler), &known) {
            Ok(c) => c,
            Err(e) => return e,
        };
        let mut value = conf_args(cf)[1];
        if ngx_http_script_variables_count(&mut value) > 0 {
            match compile_complex(cf, &mut value) {
                Some(cv) => lcf.pass_var = cv,
                None => return CONF_ERROR,
            }
        } else {
            let mut url: ngx_url_t = mem::zeroed();
            url.url = value;
            url.set_no_resolve(1);
            let uscf = ngx_http_upstream_add(cf, &mut url, 0);
            if uscf.is_null() {
                return CONF_ERROR;
            }
            lcf.upstream.upstream = uscf;
        }
        let mcf =
            &mut *http_conf_get::<CacheMainConf>(cf, ptr::addr_of!(ngx_http_gateway_cache_module), ConfSlot::Main);
        mcf.pending.push(PendingPass {
            claim,
            upstream: lcf.upstream.upstream,
        });
        CONF_OK
    })
}

/// `cache_auth password` (may contain variables)
unsafe extern "C" fn cmd_cache_auth(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: conf is this module's CacheLocConf; cf is live.
    guard(unsafe { (*cf).log }, "cmd_cache_auth", CONF_ERROR, || unsafe {
        let lcf = &mut *(conf as *mut CacheLocConf);
        if !lcf.auth.is_null() {
            return conf_error(cf, format_args!("\"cache_auth\" directive is duplicate"));
        }
        match compile_complex(cf, &mut conf_args(cf)[1].clone()) {
            Some(cv) => lcf.auth = cv,
            None => return CONF_ERROR,
        }
        CONF_OK
    })
}

/// `cache_next_upstream error | timeout | invalid_response | not_found ... | off`
unsafe extern "C" fn cmd_cache_next_upstream(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is this module's CacheLocConf; cf is live.
    guard(unsafe { (*cf).log }, "cmd_cache_next_upstream", CONF_ERROR, || unsafe {
        let lcf = &mut *(conf as *mut CacheLocConf);
        if lcf.next_upstream_set {
            return conf_error(cf, format_args!("\"cache_next_upstream\" directive is duplicate"));
        }
        let keywords = [
            ("error", NGX_HTTP_UPSTREAM_FT_ERROR),
            ("timeout", NGX_HTTP_UPSTREAM_FT_TIMEOUT),
            ("invalid_response", NGX_HTTP_UPSTREAM_FT_INVALID_HEADER),
            ("not_found", NGX_HTTP_UPSTREAM_FT_HTTP_404),
        ];
        let bits = match next_upstream_bits(cf, &keywords) {
            Ok(b) => b,
            Err(e) => return e,
        };
        lcf.next_upstream_set = true;
        lcf.upstream.next_upstream = bits;
        CONF_OK
    })
}

/// True when a variable of that name is defined somewhere (by `set`, ...).
///
/// # Safety
/// `cf` must be the http block's configuration.
unsafe fn variable_defined(cf: *mut ngx_conf_t, name: &[u8]) -> bool {
    // SAFETY: during configuration the core module keeps its variable keys.
    unsafe {
        let cmcf: *mut ngx_http_core_main_conf_t =
            http_conf_get(cf, ptr::addr_of!(ngx_http_core_module), ConfSlot::Main);
        let keys = (*cmcf).variables_keys;
        if keys.is_null() {
            return false;
        }
        (*keys)
            .keys
            .as_slice::<ngx_hash_key_t>()
            .iter()
            .any(|k| bytes(&k.key) == name)
    }
}

/// Every location with `cache_pass` needs `$cache_key`; `$cache_db` and
/// `$cache_exptime` are used when some configuration sets them.
unsafe extern "C" fn postconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
    // SAFETY: cf->ctx is the http block's context during postconfiguration.
    guard(unsafe { (*cf).log }, "cache postconfiguration", ERROR, || unsafe {
        let mcf =
            &mut *http_conf_get::<CacheMainConf>(cf, ptr::addr_of!(ngx_http_gateway_cache_module), ConfSlot::Main);
        let Some(first) = mcf.pending.first() else { return OK };
        if !variable_defined(cf, b"cache_key") {
            log!(
                NGX_LOG_EMERG,
                (*cf).log,
                "\"cache_pass\" needs the $cache_key variable, which no \"set $cache_key ...\" defines, in {}:{}",
                first.claim.file(),
                first.claim.line()
            );
            return ERROR;
        }
        for p in &mcf.pending {
            if !p.upstream.is_null() && sqldb_srv_conf(p.upstream).is_some() {
                log!(
                    NGX_LOG_EMERG,
                    (*cf).log,
                    "\"cache_pass\" names upstream \"{}\", which has \"sqldb_server\" lines (use \"sqldb_pass\") in {}:{}",
                    String::from_utf8_lossy(bytes(&(*p.upstream).host)),
                    p.claim.file(),
                    p.claim.line()
                );
                return ERROR;
            }
            if !check_claims(cf, std::slice::from_ref(&p.claim)) {
                return ERROR;
            }
        }
        let index = |name: &'static str| {
            if !variable_defined(cf, name.as_bytes()) {
                return -1;
            }
            let mut n = static_str(name);
            ngx_http_get_variable_index(cf, &mut n)
        };
        mcf.key = index("cache_key");
        mcf.db = index("cache_db");
        mcf.exptime = index("cache_exptime");
        if mcf.key == ERROR {
            return ERROR;
        }
        mcf.pending.clear();
        OK
    })
}

// ------------------------------------------------------------- request ----

/// Per-request state.
struct Ctx {
    r: *mut ngx_http_request_t,
    command: Command,
    key: Vec<u8>,
    db: Option<u32>,
    exptime: Option<u64>,
    auth: Option<Vec<u8>>,
    /// The reader of the replies (made with the request's bytes).
    exchange: Exchange,
    /// The command's reply is in: its status is known.
    answered: bool,
    /// Bytes of a reply line that arrived in pieces after the value.
    carry: Vec<u8>,
    /// The request's commands, kept alive for nginx's output chain.
    head: Vec<u8>,
    tail: Vec<u8>,
}

/// A variable's value, if it is set and not empty. A variable that `set`
/// defines elsewhere but not for this request is simply unset here (not
/// nginx's "using uninitialized variable" warning on every request).
///
/// # Safety
/// `r` must be live; `index` a variable index of this configuration.
unsafe fn variable(r: *mut ngx_http_request_t, index: ngx_int_t) -> Option<Vec<u8>> {
    if index < 0 {
        return None;
    }
    // SAFETY: see above; r->variables and cmcf->variables have a slot per index.
    unsafe {
        let i = index as usize;
        let stored = &*(*r).variables.add(i);
        if stored.valid() == 0 {
            let cmcf = *(*r).main_conf.add(ngx_http_core_module.ctx_index) as *mut ngx_http_core_main_conf_t;
            let var = &(*cmcf).variables.as_slice::<ngx_http_variable_t>()[i];
            if var.flags & NGX_HTTP_VAR_CHANGEABLE as ngx_uint_t != 0 {
                return None;
            }
        }
        let v = ngx_http_get_indexed_variable(r, index as ngx_uint_t);
        if v.is_null() || (*v).not_found() != 0 || (*v).len() == 0 {
            return None;
        }
        Some((*v).as_bytes().to_vec())
    }
}

pub(crate) unsafe extern "C" fn content_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls the content handler with a live request.
    guard(
        unsafe { client_log(r) },
        "cache content handler",
        HTTP_INTERNAL_SERVER_ERROR,
        || unsafe { start(r) },
    )
}

unsafe fn start(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: r is live; the configuration belongs to it.
    unsafe {
        let log = client_log(r);
        let lcf = &mut *request_loc_conf::<CacheLocConf>(r, ptr::addr_of!(ngx_http_gateway_cache_module));
        let mcf = &*(*(*r).main_conf.add(ngx_http_gateway_cache_module.ctx_index) as *const CacheMainConf);
        let method = (*r).method as u32;
        let command = if method & (NGX_HTTP_GET | NGX_HTTP_HEAD) != 0 {
            Command::Get
        } else if method & (NGX_HTTP_PUT | NGX_HTTP_POST) != 0 {
            Command::Set
        } else if method & NGX_HTTP_DELETE != 0 {
            Command::Del
        } else {
            return HTTP_NOT_ALLOWED;
        };
        // Values that come from the client are the client's mistakes: 400,
        // logged at "info" as nginx logs client errors.
        let Some(key) = variable(r, mcf.key) else {
            log!(NGX_LOG_INFO, log, "cache: the \"$cache_key\" variable is empty");
            return HTTP_BAD_REQUEST;
        };
        let db = match variable(r, mcf.db).map(|v| (redis::parse_db(&v), v)) {
            None => None,
            Some((Ok(db), _)) => db,
            Some((Err(_), v)) => {
                let text = String::from_utf8_lossy(&v);
                log!(
                    NGX_LOG_INFO,
                    log,
                    "cache: \"$cache_db\" is not a database number: \"{text}\""
                );
                return HTTP_BAD_REQUEST;
            }
        };
        let exptime = match (command, variable(r, mcf.exptime)) {
            (Command::Set, Some(v)) => match redis::parse_exptime(&v) {
                Ok(t) => t,
                Err(_) => {
                    let text = String::from_utf8_lossy(&v);
                    log!(
                        NGX_LOG_INFO,
                        log,
                        "cache: \"$cache_exptime\" is not a number of seconds: \"{text}\""
                    );
                    return HTTP_BAD_REQUEST;
                }
            },
            _ => None,
        };
        let auth = if lcf.auth.is_null() {
            None
        } else {
            let mut v = ngx_str_t {
                len: 0,
                data: ptr::null_mut(),
            };
            if ngx_http_complex_value(r, lcf.auth, &mut v) != OK {
                return HTTP_INTERNAL_SERVER_ERROR;
            }
            Some(bytes(&v).to_vec())
        };

        if ngx_http_upstream_create(r) != OK {
            return HTTP_INTERNAL_SERVER_ERROR;
        }
        let u = (*r).upstream;
        if !lcf.pass_var.is_null() {
            if let Err(status) = resolve(r, lcf.pass_var) {
                return status;
            }
        }
        (*u).conf = &mut lcf.upstream;
        (*u).schema = static_str("redis://");
        (*u).output.tag = ptr::addr_of_mut!(ngx_http_gateway_cache_module).cast();
        (*u).create_request = Some(create_request);
        (*u).reinit_request = Some(reinit_request);
        (*u).process_header = Some(process_header);
        (*u).abort_request = Some(abort_request);
        (*u).finalize_request = Some(finalize_request);
        (*u).input_filter_init = Some(filter_init);
        (*u).input_filter = Some(filter);

        let ctx = Ctx {
            r,
            command,
            key,
            db,
            exptime,
            auth,
            exchange: Exchange::new(Vec::new(), command, Vec::new()),
            answered: false,
            carry: Vec::new(),
            head: Vec::new(),
            tail: Vec::new(),
        };
        let Some(ctx) = pool_alloc((*r).pool, ctx) else {
            return HTTP_INTERNAL_SERVER_ERROR;
        };
        (*u).input_filter_ctx = ctx.as_ptr().cast();
        *(*r).ctx.add(ngx_http_gateway_cache_module.ctx_index) = ctx.as_ptr().cast();

        if command == Command::Set {
            let rc = ngx_http_read_client_request_body(r, Some(ngx_http_upstream_init));
            if rc >= NGX_HTTP_SPECIAL_RESPONSE as ngx_int_t {
                return rc;
            }
            return DONE;
        }
        let rc = ngx_http_discard_request_body(r);
        if rc != OK {
            return rc;
        }
        if ngx_http_set_content_type(r) != OK {
            return HTTP_INTERNAL_SERVER_ERROR;
        }
        let main = (*r).main;
        (*main).set_count((*main).count() + 1);
        ngx_http_upstream_init(r);
        DONE
    }
}

/// `cache_pass $variable`: the value names an upstream block (of `server`
/// lines), or is a numeric `host:port` / `unix:/path`; anything else is no
/// known backend.
unsafe fn resolve(r: *mut ngx_http_request_t, cv: *mut ngx_http_complex_value_t) -> Result<(), ngx_int_t> {
    // SAFETY: r is live with an upstream.
    unsafe {
        let log = client_log(r);
        let mut value = ngx_str_t {
            len: 0,
            data: ptr::null_mut(),
        };
        if ngx_http_complex_value(r, cv, &mut value) != OK {
            return Err(HTTP_INTERNAL_SERVER_ERROR);
        }
        let name = bytes(&value);
        let text = || String::from_utf8_lossy(name).into_owned();
        let resolved =
            ngx_pcalloc((*r).pool, mem::size_of::<ngx_http_upstream_resolved_t>()) as *mut ngx_http_upstream_resolved_t;
        if resolved.is_null() {
            return Err(HTTP_INTERNAL_SERVER_ERROR);
        }
        let umcf = *(*r).main_conf.add(ngx_http_upstream_module.ctx_index) as *mut ngx_http_upstream_main_conf_t;
        let ups = (*umcf).upstreams.as_slice::<*mut ngx_http_upstream_srv_conf_t>();
        let block = ups
            .iter()
            .copied()
            .find(|&u| (*u).port == 0 && bytes(&(*u).host).eq_ignore_ascii_case(name));
        if let Some(uscf) = block {
            if sqldb_srv_conf(uscf).is_some() {
                log!(
                    NGX_LOG_ERR,
                    log,
                    "cache: \"cache_pass\" value \"{}\" names an upstream of \"sqldb_server\" lines",
                    text()
                );
                return Err(HTTP_INTERNAL_SERVER_ERROR);
            }
            (*resolved).host = value;
            (*resolved).no_port = 1;
        } else {
            let mut url: ngx_url_t = mem::zeroed();
            url.url = value;
            url.set_no_resolve(1);
            if name.is_empty() || ngx_parse_url((*r).pool, &mut url) != OK || url.naddrs == 0 {
                log!(
                    NGX_LOG_ERR,
                    log,
                    "cache: \"cache_pass\" value \"{}\" names no known backend",
                    text()
                );
                return Err(HTTP_INTERNAL_SERVER_ERROR);
            }
            let a = &*url.addrs;
            (*resolved).sockaddr = a.sockaddr;
            (*resolved).socklen = a.socklen;
            (*resolved).name = a.name;
            (*resolved).naddrs = 1;
            (*resolved).host = url.host;
            (*resolved).port = url.port;
        }
        (*(*r).upstream).resolved = resolved;
        Ok(())
    }
}

unsafe fn ctx_of<'a>(r: *mut ngx_http_request_t) -> Option<&'a mut Ctx> {
    // SAFETY: r->ctx has a slot per http module; ours holds a Ctx or null.
    unsafe { (*(*r).ctx.add(ngx_http_gateway_cache_module.ctx_index) as *mut Ctx).as_mut() }
}

/// A memory buffer over `data` (owned by the request's Ctx), in a chain link.
///
/// # Safety
/// `pool` must be live; `data` must outlive the request.
unsafe fn memory_link(pool: *mut ngx_pool_t, data: &[u8]) -> *mut ngx_chain_t {
    // SAFETY: see above.
    unsafe {
        let b = ngx_pcalloc(pool, mem::size_of::<ngx_buf_t>()) as *mut ngx_buf_t;
        let cl = ngx_alloc_chain_link(pool);
        if b.is_null() || cl.is_null() {
            return ptr::null_mut();
        }
        let p = data.as_ptr() as *mut u8;
        (*b).start = p;
        (*b).pos = p;
        (*b).last = p.add(data.len());
        (*b).end = (*b).last;
        (*b).set_memory(1);
        (*cl).buf = b;
        (*cl).next = ptr::null_mut();
        cl
    }
}

/// The commands (core's `redis::plan`): the head, the request body for
/// SET, the tail.
unsafe extern "C" fn create_request(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: r is live with our ctx; the body chain is the request's.
    guard(unsafe { client_log(r) }, "cache create_request", ERROR, || unsafe {
        let Some(ctx) = ctx_of(r) else { return ERROR };
        let pool = (*r).pool;
        let mut body: Vec<*mut ngx_buf_t> = Vec::new();
        let mut len: usize = 0;
        if ctx.command == Command::Set {
            let rb = (*r).request_body;
            let mut cl = if rb.is_null() { ptr::null_mut() } else { (*rb).bufs };
            while !cl.is_null() {
                let b = (*cl).buf;
                len += if (*b).in_file() != 0 && (*b).temporary() == 0 && (*b).memory() == 0 {
                    ((*b).file_last - (*b).file_pos) as usize
                } else {
                    (*b).last.offset_from((*b).pos) as usize
                };
                body.push(b);
                cl = (*cl).next;
            }
        }
        let plan = redis::plan(
            &redis::Request {
                command: ctx.command,
                key: &ctx.key,
                auth: ctx.auth.as_deref(),
                db: ctx.db,
                exptime: ctx.exptime,
            },
            len,
        );
        ctx.head = plan.head;
        ctx.tail = plan.tail;
        ctx.exchange = plan.exchange;
        let first = memory_link(pool, &ctx.head);
        if first.is_null() {
            return ERROR;
        }
        let mut last = first;
        for b in body {
            let cl = ngx_alloc_chain_link(pool);
            if cl.is_null() {
                return ERROR;
            }
            (*cl).buf = b;
            (*cl).next = ptr::null_mut();
            (*last).next = cl;
            last = cl;
        }
        if !ctx.tail.is_empty() {
            let cl = memory_link(pool, &ctx.tail);
            if cl.is_null() {
                return ERROR;
            }
            (*last).next = cl;
        }
        (*(*r).upstream).request_bufs = first;
        OK
    })
}

unsafe extern "C" fn reinit_request(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: r is live.
    guard(unsafe { client_log(r) }, "cache reinit_request", ERROR, || {
        if let Some(ctx) = unsafe { ctx_of(r) } {
            ctx.exchange.restart();
            ctx.answered = false;
            ctx.carry.clear();
        }
        OK
    })
}

unsafe extern "C" fn abort_request(_r: *mut ngx_http_request_t) {}

unsafe extern "C" fn finalize_request(_r: *mut ngx_http_request_t, _rc: ngx_int_t) {}

/// Reads the replies up to the command's own, which sets the status. A
/// reply without a value is read here to the end of the request's last
/// reply, so that a miss keeps its connection too.
unsafe extern "C" fn process_header(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: r is live with our ctx; u->buffer holds what was read.
    guard(unsafe { client_log(r) }, "cache process_header", ERROR, || unsafe {
        let Some(ctx) = ctx_of(r) else { return ERROR };
        let u = (*r).upstream;
        let log = client_log(r);
        loop {
            let b = &mut (*u).buffer;
            let buf = std::slice::from_raw_parts(b.pos, b.last.offset_from(b.pos) as usize);
            let (event, used) = ctx.exchange.step(buf);
            b.pos = b.pos.add(used);
            match event {
                Event::More => return AGAIN,
                Event::Answer { status, value } => {
                    ctx.answered = true;
                    (*u).headers_in.status_n = status as ngx_uint_t;
                    if !(*u).state.is_null() {
                        (*(*u).state).status = status as ngx_uint_t;
                    }
                    match value {
                        Some(n) => {
                            (*u).headers_in.content_length_n = n as off_t;
                            return OK;
                        }
                        None => (*u).headers_in.content_length_n = 0,
                    }
                }
                Event::Done => {
                    // Only after an answer without a value: the exact end.
                    if b.pos == b.last {
                        (*u).set_keepalive(1);
                    } else {
                        log!(NGX_LOG_ERR, log, "cache: {}", ReplyError::Unsolicited);
                    }
                    return OK;
                }
                Event::Failed(e) => {
                    log!(NGX_LOG_ERR, log, "cache: {e}");
                    // A broken reply after the answer: the answer stands,
                    // the connection goes.
                    return if ctx.answered {
                        OK
                    } else {
                        NGX_HTTP_UPSTREAM_INVALID_HEADER as ngx_int_t
                    };
                }
                Event::Value(_) => return ERROR,
            }
        }
    })
}

unsafe extern "C" fn filter_init(data: *mut c_void) -> ngx_int_t {
    // SAFETY: data is our Ctx, whose request is live.
    guard(cycle_log(), "cache input_filter_init", ERROR, || unsafe {
        let ctx = &mut *(data as *mut Ctx);
        // nginx reads on while the length is not 0: any other value until
        // the exchange ends.
        (*(*ctx.r).upstream).length = ctx.exchange.expects_more() as off_t;
        OK
    })
}

/// Passes the value's bytes on as they arrive; the CRLF after it and the
/// replies after the command are read and checked, not sent.
unsafe extern "C" fn filter(data: *mut c_void, bytes: isize) -> ngx_int_t {
    // SAFETY: data is our Ctx; the new bytes are at u->buffer.last.
    guard(cycle_log(), "cache input_filter", ERROR, || unsafe {
        let ctx = &mut *(data as *mut Ctx);
        let r = ctx.r;
        let u = (*r).upstream;
        let log = client_log(r);
        let b = &mut (*u).buffer;
        let start = b.last;
        let n = bytes.max(0) as usize;
        b.last = start.add(n);
        let fresh = std::slice::from_raw_parts(start, n);
        let carried = !ctx.carry.is_empty();
        let owned;
        let mut input: &[u8] = if carried {
            let mut joined = mem::take(&mut ctx.carry);
            joined.extend_from_slice(fresh);
            owned = joined;
            &owned
        } else {
            fresh
        };
        loop {
            let (event, used) = ctx.exchange.step(input);
            match event {
                Event::Value(v) if !carried => {
                    let mut ll = &mut (*u).out_bufs as *mut *mut ngx_chain_t;
                    while !(*ll).is_null() {
                        ll = &mut (**ll).next;
                    }
                    let cl = ngx_chain_get_free_buf((*r).pool, &mut (*u).free_bufs);
                    if cl.is_null() {
                        return ERROR;
                    }
                    let out = (*cl).buf;
                    (*out).set_flush(1);
                    (*out).set_memory(1);
                    (*out).pos = v.as_ptr() as *mut u8;
                    (*out).last = (*out).pos.add(v.len());
                    (*out).tag = (*u).output.tag;
                    *ll = cl;
                }
                Event::More => {
                    let rest = &input[used..];
                    if rest.len() > resp::MAX_LINE {
                        log!(NGX_LOG_ERR, log, "cache: redis sent a reply line that is too long");
                        (*u).length = 0;
                        return ERROR;
                    }
                    ctx.carry = rest.to_vec();
                    return OK;
                }
                Event::Done => {
                    (*u).length = 0;
                    if used == input.len() {
                        (*u).set_keepalive(1);
                    } else {
                        log!(NGX_LOG_ERR, log, "cache: {}", ReplyError::Unsolicited);
                    }
                    return OK;
                }
                Event::Failed(e) => {
                    log!(NGX_LOG_ERR, log, "cache: {e}");
                    (*u).length = 0;
                    // A value that does not end as announced is cut short.
                    return if e == ReplyError::BadValueEnd { ERROR } else { OK };
                }
                Event::Value(_) | Event::Answer { .. } => {
                    log!(NGX_LOG_ALERT, log, "cache: unexpected reply state");
                    (*u).length = 0;
                    return ERROR;
                }
            }
            input = &input[used..];
        }
    })
}

// ------------------------------------------------------------------ module ----

const LOC_ANY: u32 = NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF;

static mut COMMANDS: [ngx_command_t; 9] = [
    crate::command(
        "cache_pass\0",
        NGX_HTTP_LOC_CONF | NGX_HTTP_LIF_CONF | NGX_CONF_TAKE1,
        cmd_cache_pass,
        NGX_HTTP_LOC_CONF_OFFSET,
        0,
    ),
    crate::command(
        "cache_auth\0",
        LOC_ANY | NGX_CONF_TAKE1,
        cmd_cache_auth,
        NGX_HTTP_LOC_CONF_OFFSET,
        0,
    ),
    crate::command(
        "cache_connect_timeout\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ngx_conf_set_msec_slot,
        NGX_HTTP_LOC_CONF_OFFSET,
        mem::offset_of!(CacheLocConf, upstream.connect_timeout),
    ),
    crate::command(
        "cache_send_timeout\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ngx_conf_set_msec_slot,
        NGX_HTTP_LOC_CONF_OFFSET,
        mem::offset_of!(CacheLocConf, upstream.send_timeout),
    ),
    crate::command(
        "cache_read_timeout\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ngx_conf_set_msec_slot,
        NGX_HTTP_LOC_CONF_OFFSET,
        mem::offset_of!(CacheLocConf, upstream.read_timeout),
    ),
    crate::command(
        "cache_buffer_size\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ngx_conf_set_size_slot,
        NGX_HTTP_LOC_CONF_OFFSET,
        mem::offset_of!(CacheLocConf, upstream.buffer_size),
    ),
    crate::command(
        "cache_next_upstream\0",
        LOC_ANY | NGX_CONF_1MORE,
        cmd_cache_next_upstream,
        NGX_HTTP_LOC_CONF_OFFSET,
        0,
    ),
    crate::command(
        "cache_socket_keepalive\0",
        LOC_ANY | NGX_CONF_FLAG,
        ngx_conf_set_flag_slot,
        NGX_HTTP_LOC_CONF_OFFSET,
        mem::offset_of!(CacheLocConf, upstream.socket_keepalive),
    ),
    ngx_command_t::empty(),
];

static CTX: ngx_http_module_t = ngx_http_module_t {
    preconfiguration: None,
    postconfiguration: Some(postconfiguration),
    create_main_conf: Some(create_main_conf),
    init_main_conf: None,
    create_srv_conf: None,
    merge_srv_conf: None,
    create_loc_conf: Some(create_loc_conf),
    merge_loc_conf: Some(merge_loc_conf),
};

#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_http_gateway_cache_module: ngx_module_t = ngx_module_t {
    ctx: ptr::addr_of!(CTX) as *mut _,
    commands: ptr::addr_of_mut!(COMMANDS) as *mut _,
    type_: NGX_HTTP_MODULE as ngx_uint_t,
    ..ngx_module_t::default()
};
