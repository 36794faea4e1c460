//! Configuration of the database gateway: `sqldb_server` inside `upstream`,
//! `sqldb_pass`, `sqldb_query`, the timeouts, and their merge rules.

use std::ffi::{c_char, c_void, CString};
use std::mem;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ptr;

use gateway_core::conninfo::{self, Keywords, Target};
use gateway_core::method::{parse_methods, QuerySet};
use gateway_core::sql::has_several_statements;
use gateway_core::template::{self, Piece};

use super::conn::Pool;
use super::output::Output;
use super::pq::check_conninfo;
use super::vars::{self, EscapeRule, SetRule};
use gateway_core::rewrite::Rule as RewriteRule;

use crate::ffi::*;
use crate::ngx_http_gateway_module as MODULE;

pub const DEFAULT_CONNECT_TIMEOUT: ngx_msec_t = 10_000;
pub const DEFAULT_RESULT_TIMEOUT: ngx_msec_t = 30_000;
const DEFAULT_PORT: u16 = 5432;

/// One address of one `sqldb_server` line, with its finished connection string.
pub struct ServerAddr {
    pub sockaddr: Vec<u8>,
    /// The address as text ("127.0.0.1:5432"), in configuration memory.
    pub name: ngx_str_t,
    pub conninfo: CString,
}

/// The module's server configuration; only used inside `upstream` blocks.
pub struct SrvConf {
    pub addrs: Vec<ServerAddr>,
    /// How many `sqldb_server` lines the block has.
    pub servers: usize,
    /// The balancer's per-request init, wrapped by ours.
    pub balancer_init: ngx_http_upstream_init_peer_pt,
    /// `sqldb_keepalive` and, in each worker, its idle connections.
    pub pool: Pool,
    keepalive_set: bool,
}

impl SrvConf {
    /// Which address a balancer picked.
    pub fn addr_index(&self, sockaddr: &[u8]) -> Option<usize> {
        self.addrs.iter().position(|a| a.sockaddr == sockaddr)
    }
}

/// One `sqldb_query` template.
pub struct Template {
    pub pieces: Vec<TemplatePiece>,
    /// Names the template's prepared statement on every connection.
    pub id: usize,
    /// That name, as libpq takes it.
    pub statement: CString,
    /// The SQL text has no untyped variables: the same statement every time.
    pub constant: bool,
    /// A constant text that holds several statements.
    pub several: bool,
    /// Typed parameters ($var::type) in the template.
    pub params: usize,
}

pub enum TemplatePiece {
    /// SQL text, with untyped variables substituted.
    Text(*mut ngx_http_complex_value_t),
    /// A bound parameter: its value, and what stands for it in the text ("$1::int").
    Param(*mut ngx_http_complex_value_t, Vec<u8>),
}

/// Compiles a template: text pieces and typed parameters.
///
/// # Safety
/// `cf` must be the live configuration being parsed.
unsafe fn compile_template(cf: *mut ngx_conf_t, text: &[u8]) -> Result<Template, String> {
    let mut pieces = Vec::new();
    let mut constant = true;
    let mut sql = Vec::new();
    let mut params = 0;
    for piece in template::split(text) {
        let (source, placeholder) = match piece {
            Piece::Text(t) => (t, None),
            Piece::Param { var, ty } => {
                params += 1;
                (
                    format!("${var}").into_bytes(),
                    Some(format!("${params}::{ty}").into_bytes()),
                )
            }
        };
        // SAFETY: cf is live; the compiled value keeps pointing at pool memory.
        let cv = unsafe {
            let mut value = pool_str((*cf).pool, &source).ok_or("out of memory")?;
            compile_complex(cf, &mut value).ok_or("")?
        };
        match placeholder {
            Some(ph) => {
                sql.extend_from_slice(&ph);
                pieces.push(TemplatePiece::Param(cv, ph));
            }
            None => {
                // SAFETY: cv was just compiled.
                constant &= unsafe { (*cv).lengths.is_null() };
                sql.extend_from_slice(&source);
                pieces.push(TemplatePiece::Text(cv));
            }
        }
    }
    let several = constant && has_several_statements(&sql);
    if several && params > 0 {
        return Err("typed parameters need a query of one statement".into());
    }
    let id = pieces.as_ptr() as usize;
    let statement = CString::new(format!("ngx_gateway_{id:x}")).map_err(|_| "bad statement name")?;
    Ok(Template {
        pieces,
        id,
        statement,
        constant,
        several,
        params,
    })
}

pub struct LocConf {
    /// What `u->conf` points to for requests of this location.
    pub upstream: ngx_http_upstream_conf_t,
    pub pass_set: bool,
    /// `sqldb_pass $var`: the value names an upstream at run time.
    pub pass_var: *mut ngx_http_complex_value_t,
    /// `sqldb_pass NAME`: resolved once every upstream block is read.
    pass_name: Vec<u8>,
    pub queries: QuerySet<*const Template>,
    pub connect_timeout: ngx_msec_t,
    pub result_timeout: ngx_msec_t,
    /// `sqldb_prepare`: prepare constant templates once per connection.
    pub prepare: ngx_flag_t,
    /// `sqldb_next_upstream`: NGX_HTTP_UPSTREAM_FT_* bits.
    pub next_upstream: ngx_uint_t,
    /// `sqldb_output`: an `Output` code.
    pub output: ngx_uint_t,
    /// `sqldb_stream`: send rows as they arrive.
    pub stream: ngx_flag_t,
    pub sets: Vec<SetRule>,
    pub rewrites: Vec<RewriteRule>,
    pub escapes: Vec<EscapeRule>,
}

/// A `sqldb_pass NAME` waiting for every upstream block to be read.
struct PendingPass {
    lcf: *mut LocConf,
    /// Where the directive is; none for an `if` block that inherits it.
    claim: Option<Claim>,
}

pub struct MainConf {
    pending: Vec<PendingPass>,
    /// Indexes of the `$sqldb_*` variables (vars::NAMES order).
    pub vars: [ngx_int_t; 5],
}

impl Default for MainConf {
    fn default() -> Self {
        MainConf {
            pending: Vec::new(),
            vars: [-1; 5],
        }
    }
}

pub(crate) unsafe extern "C" fn create_main_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: cf->pool is the configuration pool.
    guard(unsafe { (*cf).log }, "create_main_conf", ptr::null_mut(), || {
        unsafe { pool_alloc((*cf).pool, MainConf::default()) }.map_or(ptr::null_mut(), |p| p.as_ptr().cast())
    })
}

pub(crate) unsafe extern "C" fn create_srv_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: nginx passes the live configuration.
    guard(unsafe { (*cf).log }, "create_srv_conf", ptr::null_mut(), || {
        let conf = SrvConf {
            addrs: Vec::new(),
            servers: 0,
            balancer_init: None,
            pool: Pool::default(),
            keepalive_set: false,
        };
        // SAFETY: cf->pool is the configuration pool.
        unsafe { pool_alloc((*cf).pool, conf) }.map_or(ptr::null_mut(), |p| p.as_ptr().cast())
    })
}

pub(crate) unsafe extern "C" fn create_loc_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: nginx passes the live configuration.
    guard(unsafe { (*cf).log }, "create_loc_conf", ptr::null_mut(), || {
        let conf = LocConf {
            // SAFETY: ngx_http_upstream_conf_t is plain C data for which all-zero is "unset".
            upstream: unsafe { mem::zeroed() },
            pass_set: false,
            pass_var: ptr::null_mut(),
            pass_name: Vec::new(),
            queries: QuerySet::default(),
            connect_timeout: CONF_UNSET_MSEC,
            result_timeout: CONF_UNSET_MSEC,
            prepare: CONF_UNSET,
            next_upstream: CONF_UNSET_UINT,
            output: CONF_UNSET_UINT,
            stream: CONF_UNSET,
            sets: Vec::new(),
            rewrites: Vec::new(),
            escapes: Vec::new(),
        };
        // SAFETY: cf->pool is the configuration pool.
        unsafe { pool_alloc((*cf).pool, conf) }.map_or(ptr::null_mut(), |p| p.as_ptr().cast())
    })
}

fn merge_msec(conf: &mut ngx_msec_t, prev: ngx_msec_t, default: ngx_msec_t) {
    if *conf == CONF_UNSET_MSEC {
        *conf = if prev == CONF_UNSET_MSEC { default } else { prev };
    }
}

pub(crate) unsafe extern "C" fn merge_loc_conf(
    cf: *mut ngx_conf_t,
    parent: *mut c_void,
    child: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx passes the live configuration.
    guard(unsafe { (*cf).log }, "merge_loc_conf", CONF_ERROR, || {
        // SAFETY: nginx passes two LocConf made by create_loc_conf.
        let (prev, conf) = unsafe { (&*(parent as *const LocConf), &mut *(child as *mut LocConf)) };
        // An `if` block (or limit_except) without sqldb_pass of its own serves
        // its location's requests: it passes them to the same upstream.
        // SAFETY: during the merge cf->ctx holds the child's configurations.
        let noname = unsafe {
            (*http_conf_get::<ngx_http_core_loc_conf_t>(cf, ptr::addr_of!(ngx_http_core_module), ConfSlot::Loc))
                .noname()
                != 0
        };
        if noname && !conf.pass_set && (!prev.pass_name.is_empty() || !prev.pass_var.is_null()) {
            conf.pass_var = prev.pass_var;
            conf.pass_name = prev.pass_name.clone();
            if !conf.pass_name.is_empty() {
                // SAFETY: the main configuration is ours and lives as long as cf.
                let mcf = unsafe { &mut *http_conf_get::<MainConf>(cf, ptr::addr_of!(MODULE), ConfSlot::Main) };
                mcf.pending.push(PendingPass { lcf: conf, claim: None });
            }
        }
        // A level with any sqldb_query of its own ignores every outer one.
        if conf.queries.is_empty() {
            conf.queries = prev.queries.clone();
        }
        merge_msec(&mut conf.connect_timeout, prev.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        merge_msec(&mut conf.result_timeout, prev.result_timeout, DEFAULT_RESULT_TIMEOUT);
        // Rules of the outer level apply where a level has none of its own.
        // (Pointers only: the outer level's configuration outlives ours.)
        if conf.sets.is_empty() {
            conf.sets = prev.sets.iter().map(SetRule::clone_rule).collect();
        }
        if conf.rewrites.is_empty() {
            conf.rewrites = prev.rewrites.clone();
        }
        if conf.escapes.is_empty() {
            conf.escapes = prev.escapes.iter().map(EscapeRule::clone_rule).collect();
        }
        if conf.output == CONF_UNSET_UINT {
            conf.output = if prev.output == CONF_UNSET_UINT { 0 } else { prev.output };
        }
        if conf.stream == CONF_UNSET {
            conf.stream = if prev.stream == CONF_UNSET { 0 } else { prev.stream };
        }
        if conf.prepare == CONF_UNSET {
            conf.prepare = if prev.prepare == CONF_UNSET { 1 } else { prev.prepare };
        }
        if conf.next_upstream == CONF_UNSET_UINT {
            conf.next_upstream = if prev.next_upstream == CONF_UNSET_UINT {
                (NGX_HTTP_UPSTREAM_FT_ERROR | NGX_HTTP_UPSTREAM_FT_TIMEOUT) as ngx_uint_t
            } else {
                prev.next_upstream
            };
        }
        let u = &mut conf.upstream;
        u.connect_timeout = conf.connect_timeout;
        u.read_timeout = conf.result_timeout;
        u.send_timeout = conf.result_timeout;
        u.next_upstream = conf.next_upstream;
        u.module = static_str("sqldb");
        CONF_OK
    })
}

fn socket_addr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: nginx's parsed addresses point at a sockaddr of their family.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let sin = &*(sa as *const libc::sockaddr_in);
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
            }
            libc::AF_INET6 => {
                let sin6 = &*(sa as *const libc::sockaddr_in6);
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                Some(SocketAddr::new(IpAddr::V6(ip), u16::from_be(sin6.sin6_port)))
            }
            _ => None,
        }
    }
}

/// Server parameters that nginx's balancers read (as the `server` directive has them).
struct ServerParams {
    weight: ngx_uint_t,
    max_fails: ngx_uint_t,
    fail_timeout: time_t,
    backup: bool,
    down: bool,
}

/// `sqldb_server ADDRESS [weight=N] [max_fails=N] [fail_timeout=T] [backup] [down] keyword=value ...`
pub(crate) unsafe extern "C" fn cmd_sqldb_server(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is this module's SrvConf of the enclosing upstream block; cf is live.
    guard(unsafe { (*cf).log }, "cmd_sqldb_server", CONF_ERROR, || unsafe {
        let srv = &mut *(conf as *mut SrvConf);
        let uscf: *mut ngx_http_upstream_srv_conf_t =
            http_conf_get(cf, ptr::addr_of!(ngx_http_upstream_module), ConfSlot::Srv);
        let args = conf_args(cf);
        let address = args[1];

        let mut params = ServerParams {
            weight: 1,
            max_fails: 1,
            fail_timeout: 10,
            backup: false,
            down: false,
        };
        let mut keywords = Keywords::default();
        let flags = (*uscf).flags;
        for arg in &args[2..] {
            let a = bytes(arg);
            let text = String::from_utf8_lossy(a);
            let (needed, ok) = if let Some(v) = a.strip_prefix(b"weight=") {
                let n = ngx_atoi(v.as_ptr() as *mut u8, v.len());
                params.weight = n as ngx_uint_t;
                (NGX_HTTP_UPSTREAM_WEIGHT, n > 0)
            } else if let Some(v) = a.strip_prefix(b"max_fails=") {
                let n = ngx_atoi(v.as_ptr() as *mut u8, v.len());
                params.max_fails = n as ngx_uint_t;
                (NGX_HTTP_UPSTREAM_MAX_FAILS, n >= 0)
            } else if let Some(v) = a.strip_prefix(b"fail_timeout=") {
                let mut s = ngx_str_t {
                    len: v.len(),
                    data: v.as_ptr() as *mut u8,
                };
                let t = ngx_parse_time(&mut s, 1);
                params.fail_timeout = t as time_t;
                (NGX_HTTP_UPSTREAM_FAIL_TIMEOUT, t >= 0)
            } else if a == b"backup" {
                params.backup = true;
                (NGX_HTTP_UPSTREAM_BACKUP, true)
            } else if a == b"down" {
                params.down = true;
                (NGX_HTTP_UPSTREAM_DOWN, true)
            } else {
                if let Err(e) = keywords.push_arg(&text) {
                    return conf_error(cf, format_args!("\"sqldb_server\" directive: {e}"));
                }
                continue;
            };
            if flags & needed as ngx_uint_t == 0 {
                return conf_error(
                    cf,
                    format_args!("balancing method does not support parameter \"{text}\""),
                );
            }
            if !ok {
                return conf_error(cf, format_args!("invalid parameter \"{text}\""));
            }
        }

        let mut url: ngx_url_t = mem::zeroed();
        url.url = address;
        url.default_port = keywords.port().unwrap_or(DEFAULT_PORT);
        if ngx_parse_url((*cf).pool, &mut url) != OK {
            let err = if url.err.is_null() {
                "invalid address".into()
            } else {
                std::ffi::CStr::from_ptr(url.err).to_string_lossy()
            };
            return conf_error(
                cf,
                format_args!(
                    "{} in \"{}\" of the \"sqldb_server\" directive",
                    err,
                    String::from_utf8_lossy(bytes(&address))
                ),
            );
        }

        let unix = bytes(&address).starts_with(b"unix:");
        if !unix && url.no_port() == 0 && keywords.port().is_some() {
            return conf_error(
                cf,
                format_args!(
                    "\"port=\" conflicts with the port of the address \"{}\" in the \"sqldb_server\" directive",
                    String::from_utf8_lossy(bytes(&address))
                ),
            );
        }
        let host = String::from_utf8_lossy(bytes(&url.host)).into_owned();
        for i in 0..url.naddrs {
            let a = &*url.addrs.add(i);
            let target_addr;
            let dir;
            let target = if i32::from((*a.sockaddr).sa_family) == libc::AF_UNIX {
                dir = String::from_utf8_lossy(&bytes(&address)[5..]).into_owned();
                Target::Unix { dir: &dir }
            } else {
                target_addr = match socket_addr(a.sockaddr as *const libc::sockaddr) {
                    Some(s) => s,
                    None => return conf_error(cf, format_args!("unsupported address family in \"sqldb_server\"")),
                };
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                let name = if bare.parse::<IpAddr>().is_ok() {
                    None
                } else {
                    Some(host.as_str())
                };
                Target::Tcp {
                    addr: target_addr,
                    name,
                }
            };
            let conninfo = match CString::new(conninfo::build(&target, &keywords)) {
                Ok(c) => c,
                Err(_) => return conf_error(cf, format_args!("\"sqldb_server\" parameters contain a NUL byte")),
            };
            // libpq's own reading of the keywords, now rather than at the first request.
            if let Err(e) = check_conninfo(&conninfo) {
                return conf_error(cf, format_args!("\"sqldb_server\" directive: {e}"));
            }
            let sockaddr = std::slice::from_raw_parts(a.sockaddr as *const u8, a.socklen as usize).to_vec();
            srv.addrs.push(ServerAddr {
                sockaddr,
                name: a.name,
                conninfo,
            });
        }

        if (*uscf).servers.is_null() {
            return conf_error(
                cf,
                format_args!("\"sqldb_server\" directive is allowed only inside an \"upstream\" block"),
            );
        }
        let us = ngx_array_push((*uscf).servers) as *mut ngx_http_upstream_server_t;
        if us.is_null() {
            return CONF_ERROR;
        }
        ptr::write_bytes(us, 0, 1);
        (*us).name = url.url;
        (*us).addrs = url.addrs;
        (*us).naddrs = url.naddrs;
        (*us).weight = params.weight;
        (*us).max_fails = params.max_fails;
        (*us).fail_timeout = params.fail_timeout;
        (*us).set_backup(params.backup as u32);
        (*us).down = params.down as ngx_uint_t;
        srv.servers += 1;
        CONF_OK
    })
}

/// `sqldb_pass NAME | $variable`
pub(crate) unsafe extern "C" fn cmd_sqldb_pass(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is this module's LocConf; cf is live.
    guard(unsafe { (*cf).log }, "cmd_sqldb_pass", CONF_ERROR, || unsafe {
        let lcf = &mut *(conf as *mut LocConf);
        if lcf.pass_set {
            return conf_error(cf, format_args!("\"sqldb_pass\" directive is duplicate"));
        }
        lcf.pass_set = true;
        let known = [(Some(crate::cache::content_handler as _), "\"cache_pass\"")];
        let claim = match claim_content_handler(cf, "sqldb_pass", Some(super::handler::content_handler), &known) {
            Ok(c) => c,
            Err(e) => return e,
        };

        let mut value = conf_args(cf)[1];
        if value.len == 0 {
            return conf_error(cf, format_args!("empty upstream name in \"sqldb_pass\" directive"));
        }
        if ngx_http_script_variables_count(&mut value) > 0 {
            match compile_complex(cf, &mut value) {
                Some(cv) => lcf.pass_var = cv,
                None => return CONF_ERROR,
            }
        } else {
            lcf.pass_name = bytes(&value).to_vec();
        }
        let mcf = &mut *http_conf_get::<MainConf>(cf, ptr::addr_of!(MODULE), ConfSlot::Main);
        mcf.pending.push(PendingPass {
            lcf,
            claim: Some(claim),
        });
        CONF_OK
    })
}

/// `sqldb_query [METHOD ...] "template"`
pub(crate) unsafe extern "C" fn cmd_sqldb_query(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is this module's LocConf; cf is live.
    guard(unsafe { (*cf).log }, "cmd_sqldb_query", CONF_ERROR, || unsafe {
        let lcf = &mut *(conf as *mut LocConf);
        let args = conf_args(cf);
        let template = args[args.len() - 1];
        if template.len == 0 {
            return conf_error(cf, format_args!("empty query in \"sqldb_query\" directive"));
        }
        let methods = match parse_methods(args[1..args.len() - 1].iter().map(|a| bytes(a))) {
            Ok(m) => m,
            Err(e) => return conf_error(cf, format_args!("\"sqldb_query\" directive: {e}")),
        };
        let tmpl = match compile_template(cf, bytes(&template)) {
            Ok(t) => t,
            Err(e) if e.is_empty() => return CONF_ERROR,
            Err(e) => return conf_error(cf, format_args!("\"sqldb_query\" directive: {e}")),
        };
        let Some(tmpl) = pool_alloc((*cf).pool, tmpl) else {
            return CONF_ERROR;
        };
        if let Err(e) = lcf.queries.add(methods, tmpl.as_ptr().cast_const()) {
            return conf_error(cf, format_args!("\"sqldb_query\" directive {e}"));
        }
        CONF_OK
    })
}

/// Our SrvConf of an upstream block, if the block declared any `sqldb_server`.
///
/// # Safety
/// `uscf` must be a live upstream configuration.
pub unsafe fn sqldb_srv_conf(uscf: *mut ngx_http_upstream_srv_conf_t) -> Option<&'static mut SrvConf> {
    // SAFETY: srv_conf is null for implicit upstreams, else the block's srv_conf array.
    unsafe {
        let confs = (*uscf).srv_conf;
        if confs.is_null() {
            return None;
        }
        let srv = *confs.add((*ptr::addr_of!(MODULE)).ctx_index) as *mut SrvConf;
        if srv.is_null() || (*srv).servers == 0 {
            return None;
        }
        Some(&mut *srv)
    }
}

/// Finds the upstream block that a name refers to, if it has `sqldb_server` lines.
///
/// # Safety
/// `umcf` must be the live upstream main configuration.
pub unsafe fn find_upstream(
    umcf: *mut ngx_http_upstream_main_conf_t,
    name: &[u8],
) -> Option<*mut ngx_http_upstream_srv_conf_t> {
    // SAFETY: umcf->upstreams is an array of upstream configuration pointers.
    unsafe {
        let ups = (*umcf).upstreams.as_slice::<*mut ngx_http_upstream_srv_conf_t>();
        ups.iter()
            .copied()
            .find(|&u| bytes(&(*u).host).eq_ignore_ascii_case(name) && sqldb_srv_conf(u).is_some())
    }
}

/// After the whole http block is read: resolve `sqldb_pass NAME`, check each
/// sqldb upstream, and put our peer init around each one's balancer.
pub(crate) unsafe extern "C" fn postconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
    // SAFETY: cf->ctx is the http block's context during postconfiguration.
    guard(unsafe { (*cf).log }, "postconfiguration", ERROR, || unsafe {
        let umcf: *mut ngx_http_upstream_main_conf_t =
            http_conf_get(cf, ptr::addr_of!(ngx_http_upstream_module), ConfSlot::Main);
        let ups = (*umcf).upstreams.as_slice::<*mut ngx_http_upstream_srv_conf_t>();
        for &uscf in ups {
            let Some(srv) = sqldb_srv_conf(uscf) else { continue };
            let total = (*(*uscf).servers).nelts;
            if total != srv.servers {
                let name = String::from_utf8_lossy(bytes(&(*uscf).host));
                log!(
                    NGX_LOG_EMERG,
                    (*cf).log,
                    "upstream \"{name}\" mixes \"server\" and \"sqldb_server\" in {}:{}",
                    std::ffi::CStr::from_ptr((*uscf).file_name as *const c_char).to_string_lossy(),
                    (*uscf).line
                );
                return ERROR;
            }
            if srv.balancer_init.is_none() {
                srv.balancer_init = (*uscf).peer.init;
                (*uscf).peer.init = Some(super::handler::peer_init);
            }
        }

        let mcf = &mut *http_conf_get::<MainConf>(cf, ptr::addr_of!(MODULE), ConfSlot::Main);
        if vars::postconfiguration(cf, mcf) != OK {
            return ERROR;
        }
        for p in mcf.pending.drain(..) {
            if p.claim
                .as_ref()
                .is_some_and(|c| !check_claims(cf, std::slice::from_ref(c)))
            {
                return ERROR;
            }
            let name = &(*p.lcf).pass_name;
            if name.is_empty() {
                continue;
            }
            match find_upstream(umcf, name) {
                Some(uscf) => (*p.lcf).upstream.upstream = uscf,
                // Reported once, where the directive is (an `if` block inherits it).
                None => {
                    let Some(claim) = &p.claim else { continue };
                    log!(
                        NGX_LOG_EMERG,
                        (*cf).log,
                        "\"sqldb_pass\" names upstream \"{}\", which has no \"sqldb_server\" in {}:{}",
                        String::from_utf8_lossy(name),
                        claim.file(),
                        claim.line()
                    );
                    return ERROR;
                }
            }
        }
        OK
    })
}

/// `sqldb_keepalive off | max=N [mode=single|multi] [overflow=ignore|reject] [idle_timeout=T] [requests=N]`
pub(crate) unsafe extern "C" fn cmd_sqldb_keepalive(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is this module's SrvConf of the enclosing upstream block; cf is live.
    guard(unsafe { (*cf).log }, "cmd_sqldb_keepalive", CONF_ERROR, || unsafe {
        let srv = &mut *(conf as *mut SrvConf);
        if srv.keepalive_set {
            return conf_error(cf, format_args!("\"sqldb_keepalive\" directive is duplicate"));
        }
        srv.keepalive_set = true;
        let args = conf_args(cf);
        let pool = &mut srv.pool;
        if args.len() == 2 && bytes(&args[1]) == b"off" {
            pool.max = 0;
            return CONF_OK;
        }
        for arg in &args[1..] {
            let a = bytes(arg);
            let text = String::from_utf8_lossy(a);
            // Values in any letter case, as the C module takes them; max=0 is off.
            let ok = if let Some(v) = a.strip_prefix(b"max=") {
                let n = ngx_atoi(v.as_ptr() as *mut u8, v.len());
                pool.max = n as usize;
                n >= 0
            } else if let Some(v) = a.strip_prefix(b"mode=") {
                pool.single = v.eq_ignore_ascii_case(b"single");
                pool.single || v.eq_ignore_ascii_case(b"multi")
            } else if let Some(v) = a.strip_prefix(b"overflow=") {
                pool.reject = v.eq_ignore_ascii_case(b"reject");
                pool.reject || v.eq_ignore_ascii_case(b"ignore")
            } else if let Some(v) = a.strip_prefix(b"idle_timeout=") {
                let mut s = ngx_str_t {
                    len: v.len(),
                    data: v.as_ptr() as *mut u8,
                };
                let t = ngx_parse_time(&mut s, 0);
                pool.idle_timeout = t as ngx_msec_t;
                t != ERROR && t > 0
            } else if let Some(v) = a.strip_prefix(b"requests=") {
                let n = ngx_atoi(v.as_ptr() as *mut u8, v.len());
                pool.max_requests = n as u64;
                n >= 0
            } else {
                false
            };
            if !ok {
                return conf_error(
                    cf,
                    format_args!("invalid parameter \"{text}\" in \"sqldb_keepalive\" directive"),
                );
            }
        }
        CONF_OK
    })
}

/// `sqldb_next_upstream error | timeout ... | off`
pub(crate) unsafe extern "C" fn cmd_sqldb_next_upstream(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is this module's LocConf; cf is live.
    guard(unsafe { (*cf).log }, "cmd_sqldb_next_upstream", CONF_ERROR, || unsafe {
        let lcf = &mut *(conf as *mut LocConf);
        if lcf.next_upstream != CONF_UNSET_UINT {
            return conf_error(cf, format_args!("\"sqldb_next_upstream\" directive is duplicate"));
        }
        let keywords = [
            ("error", NGX_HTTP_UPSTREAM_FT_ERROR),
            ("timeout", NGX_HTTP_UPSTREAM_FT_TIMEOUT),
        ];
        let bits = match next_upstream_bits(cf, &keywords) {
            Ok(b) => b,
            Err(e) => return e,
        };
        lcf.next_upstream = bits;
        CONF_OK
    })
}

/// `sqldb_pipeline on | off` (upstream): queue requests onto busy connections.
pub(crate) unsafe extern "C" fn cmd_sqldb_pipeline(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is this module's SrvConf of the enclosing upstream block; cf is live.
    guard(unsafe { (*cf).log }, "cmd_sqldb_pipeline", CONF_ERROR, || unsafe {
        let srv = &mut *(conf as *mut SrvConf);
        srv.pool.pipelining = match bytes(&conf_args(cf)[1]) {
            b"on" => true,
            b"off" => false,
            other => {
                let text = String::from_utf8_lossy(other);
                return conf_error(
                    cf,
                    format_args!(
                        "invalid value \"{text}\" in \"sqldb_pipeline\" directive, it must be \"on\" or \"off\""
                    ),
                );
            }
        };
        CONF_OK
    })
}

/// `sqldb_output rds | text | value | binary_value | json | csv | none`
pub(crate) unsafe extern "C" fn cmd_sqldb_output(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is this module's LocConf; cf is live.
    guard(unsafe { (*cf).log }, "cmd_sqldb_output", CONF_ERROR, || unsafe {
        let lcf = &mut *(conf as *mut LocConf);
        if lcf.output != CONF_UNSET_UINT {
            return conf_error(cf, format_args!("\"sqldb_output\" directive is duplicate"));
        }
        let value = bytes(&conf_args(cf)[1]);
        match Output::ALL
            .iter()
            .position(|(name, _)| name.as_bytes().eq_ignore_ascii_case(value))
        {
            Some(code) => lcf.output = code as ngx_uint_t,
            None => {
                let text = String::from_utf8_lossy(value);
                return conf_error(
                    cf,
                    format_args!("invalid value \"{text}\" in \"sqldb_output\" directive, it must be rds, text, value, binary_value, json, csv or none"),
                );
            }
        }
        CONF_OK
    })
}
