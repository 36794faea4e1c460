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
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use gateway_core::resp::{self, Reply};

use crate::ffi::*;

/// What the request asks of Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    Get,
    Set,
    Del,
}

impl Command {
    fn name(self) -> &'static str {
        match self {
            Command::Get => "GET",
            Command::Set => "SET",
            Command::Del => "DEL",
        }
    }
}

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
    file: String,
    line: usize,
}

pub struct CacheMainConf {
    pending: Vec<PendingPass>,
    key: ngx_int_t,
    db: ngx_int_t,
    exptime: ngx_int_t,
}

unsafe extern "C" fn create_main_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    let conf = CacheMainConf {
        pending: Vec::new(),
        key: -1,
        db: -1,
        exptime: -1,
    };
    // SAFETY: cf->pool is the configuration pool.
    unsafe { pool_alloc((*cf).pool, conf) }.map_or(ptr::null_mut(), |p| p.as_ptr().cast())
}

unsafe extern "C" fn create_loc_conf(cf: *mut ngx_conf_t) -> *mut c_void {
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
}

unsafe extern "C" fn merge_loc_conf(_cf: *mut ngx_conf_t, parent: *mut c_void, child: *mut c_void) -> *mut c_char {
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
    if u.upstream.is_null() && conf.pass_var.is_null() {
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
}

/// `cache_pass upstream | host:port | unix:/path | $variable`
unsafe extern "C" fn cmd_cache_pass(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: conf is this module's CacheLocConf; cf is live.
    unsafe {
        let lcf = &mut *(conf as *mut CacheLocConf);
        if lcf.pass_set {
            return conf_error(cf, format_args!("\"cache_pass\" directive is duplicate"));
        }
        lcf.pass_set = true;
        let clcf: *mut ngx_http_core_loc_conf_t = http_conf_get(cf, ptr::addr_of!(ngx_http_core_module), ConfSlot::Loc);
        (*clcf).handler = Some(content_handler);
        if bytes(&(*clcf).name).last() == Some(&b'/') {
            (*clcf).set_auto_redirect(1);
        }
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
        let file = &*(*cf).conf_file;
        mcf.pending.push(PendingPass {
            file: String::from_utf8_lossy(bytes(&file.file.name)).into_owned(),
            line: file.line,
        });
        CONF_OK
    }
}

/// `cache_auth password` (may contain variables)
unsafe extern "C" fn cmd_cache_auth(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: conf is this module's CacheLocConf; cf is live.
    unsafe {
        let lcf = &mut *(conf as *mut CacheLocConf);
        if !lcf.auth.is_null() {
            return conf_error(cf, format_args!("\"cache_auth\" directive is duplicate"));
        }
        match compile_complex(cf, &mut conf_args(cf)[1].clone()) {
            Some(cv) => lcf.auth = cv,
            None => return CONF_ERROR,
        }
        CONF_OK
    }
}

/// `cache_next_upstream error | timeout | invalid_response | not_found ... | off`
unsafe extern "C" fn cmd_cache_next_upstream(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is this module's CacheLocConf; cf is live.
    unsafe {
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
    }
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
    unsafe {
        let mcf =
            &mut *http_conf_get::<CacheMainConf>(cf, ptr::addr_of!(ngx_http_gateway_cache_module), ConfSlot::Main);
        let Some(first) = mcf.pending.first() else { return OK };
        if !variable_defined(cf, b"cache_key") {
            log!(
                NGX_LOG_EMERG,
                (*cf).log,
                "\"cache_pass\" needs the $cache_key variable, which no \"set $cache_key ...\" defines, in {}:{}",
                first.file,
                first.line
            );
            return ERROR;
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
    }
}

// ------------------------------------------------------------- request ----

/// Per-request state.
struct Ctx {
    r: *mut ngx_http_request_t,
    command: Command,
    key: Vec<u8>,
    db: Option<Vec<u8>>,
    exptime: Option<Vec<u8>>,
    auth: Option<Vec<u8>>,
    /// Replies before the command's own (AUTH, SELECT) still to read.
    skip: usize,
    /// Value bytes still to come, then the 2 bytes of its CRLF.
    rest: u64,
    crlf: usize,
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

unsafe extern "C" fn content_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls the content handler with a live request.
    match catch_unwind(AssertUnwindSafe(|| unsafe { start(r) })) {
        Ok(rc) => rc,
        Err(_) => {
            // SAFETY: r is live.
            log!(NGX_LOG_ALERT, unsafe { client_log(r) }, "cache: internal error (panic)");
            HTTP_INTERNAL_SERVER_ERROR
        }
    }
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
        let Some(key) = variable(r, mcf.key) else {
            log!(NGX_LOG_ERR, log, "cache: the \"$cache_key\" variable is empty");
            return HTTP_BAD_REQUEST;
        };
        let digits = |v: &Option<Vec<u8>>| v.as_ref().is_none_or(|v| v.iter().all(u8::is_ascii_digit));
        let db = variable(r, mcf.db);
        let exptime = if command == Command::Set {
            variable(r, mcf.exptime)
        } else {
            None
        };
        if !digits(&db) || !digits(&exptime) {
            log!(
                NGX_LOG_ERR,
                log,
                "cache: \"$cache_db\" and \"$cache_exptime\" must be numbers"
            );
            return HTTP_BAD_REQUEST;
        }
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

        let skip = auth.is_some() as usize + db.is_some() as usize;
        let ctx = Ctx {
            r,
            command,
            key,
            db,
            exptime,
            auth,
            skip,
            rest: 0,
            crlf: 0,
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

/// `cache_pass $variable`: the value names an upstream block, or is a
/// numeric `host:port` / `unix:/path`; anything else is no known backend.
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
        let resolved =
            ngx_pcalloc((*r).pool, mem::size_of::<ngx_http_upstream_resolved_t>()) as *mut ngx_http_upstream_resolved_t;
        if resolved.is_null() {
            return Err(HTTP_INTERNAL_SERVER_ERROR);
        }
        let umcf = *(*r).main_conf.add(ngx_http_upstream_module.ctx_index) as *mut ngx_http_upstream_main_conf_t;
        let ups = (*umcf).upstreams.as_slice::<*mut ngx_http_upstream_srv_conf_t>();
        let is_block = ups
            .iter()
            .any(|&u| (*u).port == 0 && bytes(&(*u).host).eq_ignore_ascii_case(name));
        if is_block {
            (*resolved).host = value;
            (*resolved).no_port = 1;
        } else {
            let mut url: ngx_url_t = mem::zeroed();
            url.url = value;
            url.set_no_resolve(1);
            if name.is_empty() || ngx_parse_url((*r).pool, &mut url) != OK || url.naddrs == 0 {
                let text = String::from_utf8_lossy(name);
                log!(
                    NGX_LOG_ERR,
                    log,
                    "cache: \"cache_pass\" value \"{text}\" names no known backend"
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

/// The commands: [AUTH pw] [SELECT db] GET/DEL key, or SET key <body> [EX n].
unsafe extern "C" fn create_request(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: r is live with our ctx; the body chain is the request's.
    unsafe {
        let Some(ctx) = ctx_of(r) else { return ERROR };
        let mut head = Vec::with_capacity(64 + ctx.key.len());
        if let Some(pw) = &ctx.auth {
            resp::command(&mut head, &[b"AUTH", pw]);
        }
        if let Some(db) = &ctx.db {
            resp::command(&mut head, &[b"SELECT", db]);
        }
        let pool = (*r).pool;
        let mut body: Vec<*mut ngx_buf_t> = Vec::new();
        match ctx.command {
            Command::Get => resp::command(&mut head, &[b"GET", &ctx.key]),
            Command::Del => resp::command(&mut head, &[b"DEL", &ctx.key]),
            Command::Set => {
                let mut len: i64 = 0;
                let rb = (*r).request_body;
                let mut cl = if rb.is_null() { ptr::null_mut() } else { (*rb).bufs };
                while !cl.is_null() {
                    let b = (*cl).buf;
                    len += if (*b).in_file() != 0 && (*b).temporary() == 0 && (*b).memory() == 0 {
                        (*b).file_last - (*b).file_pos
                    } else {
                        (*b).last.offset_from((*b).pos) as i64
                    };
                    body.push(b);
                    cl = (*cl).next;
                }
                let n = if ctx.exptime.is_some() { 5 } else { 3 };
                resp::array_header(&mut head, n);
                resp::bulk(&mut head, b"SET");
                resp::bulk(&mut head, &ctx.key);
                resp::bulk_header(&mut head, len as usize);
                ctx.tail.extend_from_slice(b"\r\n");
                if let Some(t) = &ctx.exptime {
                    resp::bulk(&mut ctx.tail, b"EX");
                    resp::bulk(&mut ctx.tail, t);
                }
            }
        }
        ctx.head = head;
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
    }
}

unsafe extern "C" fn reinit_request(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: r is live.
    if let Some(ctx) = unsafe { ctx_of(r) } {
        ctx.skip = ctx.auth.is_some() as usize + ctx.db.is_some() as usize;
        ctx.rest = 0;
        ctx.crlf = 0;
    }
    OK
}

unsafe extern "C" fn abort_request(_r: *mut ngx_http_request_t) {}

unsafe extern "C" fn finalize_request(_r: *mut ngx_http_request_t, _rc: ngx_int_t) {}

/// Reads the replies: first those of AUTH and SELECT (each must be +OK),
/// then the command's own, which sets the status.
unsafe extern "C" fn process_header(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: r is live with our ctx; u->buffer holds what was read.
    unsafe {
        let Some(ctx) = ctx_of(r) else { return ERROR };
        let u = (*r).upstream;
        let log = client_log(r);
        let invalid = NGX_HTTP_UPSTREAM_INVALID_HEADER as ngx_int_t;
        loop {
            let b = &mut (*u).buffer;
            let len = b.last.offset_from(b.pos) as usize;
            let buf = std::slice::from_raw_parts(b.pos, len);
            let (reply, used) = resp::reply_header(buf);
            if reply == Reply::Incomplete {
                return AGAIN;
            }
            if ctx.skip > 0 {
                let step = if ctx.skip == 2 || ctx.db.is_none() {
                    "AUTH"
                } else {
                    "SELECT"
                };
                match reply {
                    Reply::Status(_) => {
                        ctx.skip -= 1;
                        b.pos = b.pos.add(used);
                        continue;
                    }
                    Reply::Error(msg) => {
                        let msg = String::from_utf8_lossy(msg);
                        log!(NGX_LOG_ERR, log, "cache: {step} was refused: {msg}");
                    }
                    _ => log!(NGX_LOG_ERR, log, "cache: redis sent an invalid reply to {step}"),
                }
                return invalid;
            }
            let (status, value_len) = match (ctx.command, &reply) {
                (Command::Get, Reply::Bulk(n)) => (HTTP_OK, Some(*n)),
                (Command::Get, Reply::Nil) => (404, None),
                (Command::Set, Reply::Status(s)) if *s == b"OK" => (201, None),
                (Command::Del, Reply::Integer(n)) => (if *n > 0 { 204 } else { 404 }, None),
                (c, Reply::Error(msg)) => {
                    let msg = String::from_utf8_lossy(msg);
                    log!(
                        NGX_LOG_ERR,
                        log,
                        "cache: redis answered {} with an error: {msg}",
                        c.name()
                    );
                    return invalid;
                }
                (c, _) => {
                    log!(NGX_LOG_ERR, log, "cache: redis sent an invalid reply to {}", c.name());
                    return invalid;
                }
            };
            b.pos = b.pos.add(used);
            (*u).headers_in.status_n = status as ngx_uint_t;
            if !(*u).state.is_null() {
                (*(*u).state).status = status as ngx_uint_t;
            }
            match value_len {
                Some(n) => {
                    (*u).headers_in.content_length_n = n as off_t;
                    ctx.rest = n;
                    ctx.crlf = 2;
                }
                None => {
                    (*u).headers_in.content_length_n = 0;
                    (*u).set_keepalive(1);
                }
            }
            return OK;
        }
    }
}

unsafe extern "C" fn filter_init(data: *mut c_void) -> ngx_int_t {
    // SAFETY: data is our Ctx.
    unsafe {
        let ctx = &mut *(data as *mut Ctx);
        let u = (*ctx.r).upstream;
        (*u).length = if ctx.crlf > 0 { (ctx.rest + 2) as off_t } else { 0 };
    }
    OK
}

/// Passes the value's bytes on as they arrive; its CRLF is checked, not sent.
unsafe extern "C" fn filter(data: *mut c_void, bytes: isize) -> ngx_int_t {
    // SAFETY: data is our Ctx; the new bytes are at u->buffer.last.
    unsafe {
        let ctx = &mut *(data as *mut Ctx);
        let r = ctx.r;
        let u = (*r).upstream;
        let b = &mut (*u).buffer;
        let start = b.last;
        let bytes = bytes.max(0) as usize;
        let value = (ctx.rest.min(bytes as u64)) as usize;
        if value > 0 {
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
            (*out).pos = start;
            (*out).last = start.add(value);
            (*out).tag = (*u).output.tag;
            *ll = cl;
            ctx.rest -= value as u64;
        }
        let trailer = std::slice::from_raw_parts(start.add(value), bytes - value);
        let mut bad = trailer.len() > ctx.crlf;
        for &c in trailer.iter().take(ctx.crlf) {
            bad |= c != b"\r\n"[2 - ctx.crlf];
            ctx.crlf -= 1;
        }
        b.last = start.add(bytes);
        (*u).length -= bytes as off_t;
        if bad {
            log!(NGX_LOG_ERR, client_log(r), "cache: redis sent an invalid end of value");
            (*u).length = 0;
            (*u).set_keepalive(0);
        } else if (*u).length <= 0 {
            (*u).length = 0;
            (*u).set_keepalive(1);
        }
        OK
    }
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
