//! A cache request through nginx's upstream, the way nginx's memcached
//! module does it: `create_request` writes the commands (core's
//! `redis::plan`), `process_header` reads the replies up to the command's
//! own, the input filter streams a value to the client. Every reply is read
//! to its exact end (core's `redis::Exchange`) before the connection may be
//! kept.

use std::ffi::c_void;

use gateway_core::cluster::{self as kslot, RedirectKind};
use gateway_core::pubsub;
use gateway_core::redis::{self, Command, Event, Exchange, ReplyError, Setup};
use gateway_core::resp;

use super::authfail;
use super::cluster::{cluster_of, log_refused, log_stop, ClusterReq, MAX_REDIRECTS};
use super::config::{Cache, CacheLocConf, CacheMainConf};
use crate::common::sse::Refused;
use crate::ffi::request::RequestCtx;
use crate::ffi::upstream::Callbacks;
use crate::ffi::*;
use crate::{debug, log};

/// Per-request state.
pub struct Ctx {
    pub(super) r: *mut ngx_http_request_t,
    pub(super) command: Command,
    pub(super) key: Vec<u8>,
    pub(super) db: Option<u32>,
    pub(super) exptime: Option<u64>,
    pub(super) auth: Option<Vec<u8>>,
    /// The password's key in the worker's table of refused ones.
    pub(super) auth_key: Option<u64>,
    /// The reader of the replies (made with the request's bytes).
    exchange: Exchange,
    /// The command's reply is in: its status is known.
    answered: bool,
    /// Bytes of a reply line that arrived in pieces after the value.
    carry: Vec<u8>,
    /// To a Redis Cluster (`cache_cluster on`).
    pub(super) cluster: Option<ClusterReq>,
    /// The request body's length, as it was before any of it was sent
    /// (the commands are built again for each node of a cluster).
    body_len: Option<usize>,
    /// On a shared, pipelined connection (`cache_pipeline`).
    pub(super) shared: Option<Box<super::shared::SharedReq>>,
}

// SAFETY: the module's context slot is written by Req::set_ctx::<Cache>
// only (start), with a Ctx.
unsafe impl RequestCtx for Cache {
    type Ctx = Ctx;
    fn module() -> &'static ngx_module_t {
        <Cache as ngx::http::HttpModule>::module()
    }
}

/// The request's context (taken once per entry point).
pub(super) fn ctx_of<'a>(r: &Req) -> Option<&'a mut Ctx> {
    // SAFETY: the slot holds a Ctx (RequestCtx); each entry point takes it once.
    unsafe { r.ctx::<Cache>() }
}

/// Why a cache request cannot start.
#[derive(Debug)]
enum StartError {
    NotAllowed,
    EmptyKey,
    BadChannel(String),
    BadDb(String),
    BadExptime(String),
    ClusterDb(u32),
    NoBackend(String),
    /// An upstream another gateway owns (its value, and the owner's lines).
    ForeignUpstream(String, &'static str),
    /// See FILTER_REDIRECT.
    AnswerUnderWay,
    /// Redis refused the `cache_auth` password less than a second ago.
    AuthRefused,
    Nginx,
}

impl StartError {
    fn status(&self) -> ngx_int_t {
        match self {
            StartError::NotAllowed => HTTP_NOT_ALLOWED,
            StartError::EmptyKey
            | StartError::BadChannel(_)
            | StartError::BadDb(_)
            | StartError::BadExptime(_)
            | StartError::ClusterDb(_) => HTTP_BAD_REQUEST,
            StartError::AuthRefused => HTTP_BAD_GATEWAY,
            _ => HTTP_INTERNAL_SERVER_ERROR,
        }
    }

    /// One log line: client mistakes at info, as nginx logs them.
    fn log(&self, log: Log) {
        match self {
            StartError::NotAllowed | StartError::Nginx => {}
            // (The refusal was logged, once a minute at most.)
            StartError::AuthRefused => {
                crate::debug!(log, "cache: redis refused the password less than a second ago")
            }
            StartError::EmptyKey => log!(NGX_LOG_INFO, log, "cache: the \"$cache_key\" variable is empty"),
            StartError::BadChannel(v) => log!(
                NGX_LOG_INFO,
                log,
                "cache: channel \"{}\" is not 1 to {} visible ASCII characters",
                v.escape_default(),
                gateway_core::pubsub::CHANNEL_MAX
            ),
            StartError::BadDb(v) => log!(
                NGX_LOG_INFO,
                log,
                "cache: \"$cache_db\" is not a database number (0 to {}): \"{v}\"",
                redis::MAX_DB
            ),
            StartError::ClusterDb(n) => log!(
                NGX_LOG_INFO,
                log,
                "cache: \"$cache_db\" is {n}, but a Redis Cluster has database 0 only"
            ),
            StartError::BadExptime(v) => {
                log!(
                    NGX_LOG_INFO,
                    log,
                    "cache: \"$cache_exptime\" is not a number of seconds: \"{v}\""
                )
            }
            StartError::NoBackend(v) => log!(
                NGX_LOG_ERR,
                log,
                "cache: \"cache_pass\" value \"{v}\" names no known backend"
            ),
            StartError::AnswerUnderWay => log!(NGX_LOG_ERR, log, "cache: {}", crate::ffi::FILTER_REDIRECT),
            StartError::ForeignUpstream(v, lines) => log!(
                NGX_LOG_ERR,
                log,
                "cache: \"cache_pass\" value \"{v}\" names an upstream of \"{lines}\" lines"
            ),
        }
    }
}

pub(crate) extern "C" fn content_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls the content handler with a live request.
    let r = unsafe { Req::from_raw(r) };
    guard(
        r.log(),
        "cache content handler",
        HTTP_INTERNAL_SERVER_ERROR,
        || match start(r) {
            Ok(rc) => rc,
            Err(e) => {
                e.log(r.log());
                e.status()
            }
        },
    )
}

/// A variable's value, when it is set and not empty.
fn variable(r: &mut Req, index: ngx_int_t) -> Option<Vec<u8>> {
    r.variable(index).filter(|v| !v.is_empty()).map(<[u8]>::to_vec)
}

fn start(r: &mut Req) -> Result<ngx_int_t, StartError> {
    let lcf: &CacheLocConf = r.loc_conf::<Cache>();
    let mcf: &CacheMainConf = r.main_conf::<Cache>();
    r.disable_not_modified();
    if r.answer_under_way() {
        return Err(StartError::AnswerUnderWay);
    }
    if lcf.subscribe.is_some() {
        if let Some(cv) = lcf.auth {
            let pw = r.complex_value(cv).ok_or(StartError::Nginx)?;
            if !authfail::may_try(authfail::key(&authfail::block_scope(lcf.upstream.upstream), pw)) {
                return Err(StartError::AuthRefused);
            }
        }
        return super::subscriber::start(r, lcf).map_err(|e| match e {
            Refused::BadChannel(v) => StartError::BadChannel(v),
            Refused::NotAllowed => StartError::NotAllowed,
            Refused::Nginx => StartError::Nginx,
        });
    }
    let method = r.method();
    let command = if let Some(cv) = lcf.publish {
        if method & NGX_HTTP_POST == 0 {
            return Err(StartError::NotAllowed);
        }
        let channel = r.complex_value(cv).ok_or(StartError::Nginx)?.to_vec();
        if !pubsub::valid_channel(&channel) {
            return Err(StartError::BadChannel(String::from_utf8_lossy(&channel).into_owned()));
        }
        Command::Publish
    } else if method & (NGX_HTTP_GET | NGX_HTTP_HEAD) != 0 {
        Command::Get
    } else if method & (NGX_HTTP_PUT | NGX_HTTP_POST) != 0 {
        Command::Set
    } else if method & NGX_HTTP_DELETE != 0 {
        Command::Del
    } else {
        return Err(StartError::NotAllowed);
    };
    // Values that come from the client are the client's mistakes.
    let key = match lcf.publish {
        // (Checked above.)
        Some(cv) => r.complex_value(cv).ok_or(StartError::Nginx)?.to_vec(),
        None => variable(r, mcf.key).ok_or(StartError::EmptyKey)?,
    };
    let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
    // Channels are the server's, whatever its database.
    let db = match variable(r, mcf.db).filter(|_| command != Command::Publish) {
        None => None,
        Some(v) => redis::parse_db(&v).map_err(|_| StartError::BadDb(text(&v)))?,
    };
    let exptime = match (command, variable(r, mcf.exptime)) {
        (Command::Set, Some(v)) => redis::parse_exptime(&v).map_err(|_| StartError::BadExptime(text(&v)))?,
        _ => None,
    };
    // A password whose variables are all empty is none: no AUTH.
    let auth = match lcf.auth {
        None => None,
        Some(cv) => Some(r.complex_value(cv).ok_or(StartError::Nginx)?.to_vec()).filter(|p| !p.is_empty()),
    };
    let backend = match lcf.pass_var {
        Some(cv) => Some(r.complex_value(cv).ok_or(StartError::Nginx)?.to_vec()),
        None => None,
    };
    let umcf = r.main_conf::<ngx::http::NgxHttpUpstreamModule>();
    let pool = r.pool();
    let u = r.create_upstream().ok_or(StartError::Nginx)?;
    let block = match &backend {
        Some(name) => resolve(u, pool, umcf, name, mcf.owner_of)?,
        None => lcf.upstream.upstream.cast_const(),
    };
    // A password Redis refused less than a second ago: 502 at once.
    let auth_key = auth.as_deref().map(|pw| match backend.as_deref() {
        Some(name) if block.is_null() => authfail::key(name, pw),
        _ => authfail::key(&authfail::block_scope(block), pw),
    });
    if auth_key.is_some_and(|k| !authfail::may_try(k)) {
        return Err(StartError::AuthRefused);
    }
    let mut conf: *const ngx_http_upstream_conf_t = &lcf.upstream;
    let mut cluster = None;
    if cluster_of(mcf, block).is_some() {
        if let Some(n) = db {
            return Err(StartError::ClusterDb(n));
        }
        // A request-private copy of the settings: redirections go on
        // through nginx's next-upstream step, whatever cache_next_upstream
        // says (a SET or DEL that was redirected has not run).
        let mut copy = lcf.upstream;
        copy.next_upstream |= (NGX_HTTP_UPSTREAM_FT_INVALID_HEADER | NGX_HTTP_UPSTREAM_FT_NON_IDEMPOTENT) as ngx_uint_t;
        conf = pool.alloc(copy).ok_or(StartError::Nginx)?.as_ptr();
        cluster = Some(ClusterReq {
            slot: kslot::key_slot(&key),
            retry_invalid: lcf.upstream.next_upstream & NGX_HTTP_UPSTREAM_FT_INVALID_HEADER as ngx_uint_t != 0,
            ..ClusterReq::default()
        });
    }
    let tls = !lcf.upstream.ssl.is_null();
    // A request with `$cache_db` goes over the shared connections even with
    // `cache_pipeline off`: there a database is confirmed before any
    // command runs in it (a refused SELECT followed, in the same round
    // trip, by the command would run the command in another database).
    let shared = (lcf.pipeline != 0 || db.is_some()) && cluster.is_none();
    u.install(
        conf,
        if tls { "rediss://" } else { "redis://" },
        <Cache as ngx::http::HttpModule>::module(),
        CALLBACKS,
    );
    if tls && !shared {
        // The name to verify and send: the host part of cache_pass, as
        // proxy_pass's is for proxy_ssl_name.
        // SAFETY: a literal cache_pass's upstream block lives in the configuration.
        let name = u
            .resolved_host()
            .or_else(|| unsafe { lcf.upstream.upstream.as_ref() }.map(|us| us.host))
            .unwrap_or_default();
        u.set_ssl(name);
    }

    let rp = r.as_ptr();
    let ctx = Ctx {
        r: rp,
        command,
        key,
        db,
        exptime,
        auth,
        auth_key,
        exchange: Exchange::new(Vec::new(), command, Vec::new()),
        answered: false,
        carry: Vec::new(),
        cluster,
        body_len: None,
        shared: shared.then(|| Box::new(super::shared::SharedReq::new(rp))),
    };
    let ctx = r.set_ctx::<Cache>(ctx).ok_or(StartError::Nginx)?;
    if command == Command::Publish {
        r.set_content_type("application/json");
    }
    if shared {
        // SAFETY: null, or an upstream block of the configuration, which
        // outlives its requests.
        let block = unsafe { block.as_ref() };
        return super::shared::start(r, block).ok_or(StartError::Nginx);
    }
    let u = r.upstream().ok_or(StartError::Nginx)?;
    u.set_input_filter(filter_init, filter, ctx.as_ptr().cast());

    if command.sends_body() {
        let rc = r.read_body(Some(ngx_http_upstream_init));
        return Ok(if rc >= NGX_HTTP_SPECIAL_RESPONSE as ngx_int_t {
            rc
        } else {
            DONE
        });
    }
    let rc = r.discard_body();
    if rc != OK {
        return Ok(rc);
    }
    if !r.set_content_type_by_extension() {
        return Err(StartError::Nginx);
    }
    r.count_up();
    r.upstream_init();
    Ok(DONE)
}

const CALLBACKS: Callbacks = Callbacks {
    create_request,
    reinit_request,
    process_header,
    abort_request,
    finalize_request,
};

/// `cache_pass $variable`: the value names an upstream block (of `server`
/// lines), or is a numeric `host:port` / `unix:/path`; anything else is no
/// known backend. The upstream block, when it is one.
fn resolve(
    u: &mut Upstream,
    pool: Pool,
    umcf: &ngx_http_upstream_main_conf_t,
    name: &[u8],
    owner_of: Option<crate::common::upstream::OwnerOf>,
) -> Result<*const ngx_http_upstream_srv_conf_t, StartError> {
    let text = || String::from_utf8_lossy(name).into_owned();
    // SAFETY: the upstream module's array of upstream configurations.
    let ups = unsafe { umcf.upstreams.as_slice::<*mut ngx_http_upstream_srv_conf_t>() };
    // SAFETY: the upstream configurations live as long as the configuration.
    let block = ups
        .iter()
        .filter_map(|&u| unsafe { u.as_ref() })
        .find(|u| u.port == 0 && u.host.as_bytes().eq_ignore_ascii_case(name));
    let owner = block.and_then(|b| owner_of.and_then(|f| f(b)));
    match block {
        Some(_) if owner.is_some() => Err(StartError::ForeignUpstream(text(), owner.map_or("", |o| o.server))),
        Some(b) => {
            let host = pool.str(name).ok_or(StartError::Nginx)?;
            u.set_resolved(pool, host, None, 0)
                .then_some(b as *const ngx_http_upstream_srv_conf_t)
                .ok_or(StartError::Nginx)
        }
        None if u.set_resolved_address(pool, name) => Ok(std::ptr::null()),
        None => Err(StartError::NoBackend(text())),
    }
}

/// A number for the next request's PING token: never the same twice in a
/// worker (a counter), and not guessable from the ones before (the counter
/// goes through a keyed mix: splitmix64 of a secret per-worker seed, read
/// from /dev/urandom, plus the counter). A server that sends stale bytes
/// cannot forge the echo the next request waits for.
pub(super) fn next_ping() -> u64 {
    use std::io::Read;
    thread_local! {
        static STATE: std::cell::Cell<(u64, u64)> = std::cell::Cell::new({
            let mut seed = [0u8; 8];
            let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut seed));
            let seed = match read {
                Ok(()) => u64::from_ne_bytes(seed),
                Err(_) => {
                    let t = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos() as u64);
                    t ^ (u64::from(std::process::id()) << 32)
                }
            };
            (seed, 0)
        });
    }
    STATE.with(|s| {
        let (seed, n) = s.get();
        s.set((seed, n.wrapping_add(1)));
        // splitmix64: a bijection of the counter, so never the same twice.
        let mut z = seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    })
}

/// The commands (core's `redis::plan`): the head, the request body for
/// SET, the tail.
extern "C" fn create_request(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx's upstream calls this with a live request.
    let r = unsafe { Req::from_raw(r) };
    guard(r.log(), "cache create_request", ERROR, || {
        let Some(ctx) = ctx_of(r) else { return ERROR };
        if build_request(r, ctx) {
            OK
        } else {
            ERROR
        }
    })
}

/// The request's commands and the reader of their replies (again for each
/// node of a cluster: what goes before the command depends on the node).
pub(super) fn build_request(r: &mut Req, ctx: &mut Ctx) -> bool {
    {
        let (body, len) = if ctx.command.sends_body() {
            r.body_bufs()
        } else {
            (Vec::new(), 0)
        };
        let len = *ctx.body_len.get_or_insert(len);
        let plan = redis::plan(
            &redis::Request {
                command: ctx.command,
                key: &ctx.key,
                auth: ctx.auth.as_deref(),
                db: ctx.db,
                exptime: ctx.exptime,
                ping: next_ping(),
                cluster: ctx.cluster.as_ref().map(|c| c.steps),
            },
            len,
        );
        ctx.exchange = plan.exchange;
        let mut chain = Chain::new(r.pool());
        let built = chain.push_bytes(plan.head).is_some()
            && body.into_iter().all(|b| chain.push(b).is_some())
            && (plan.tail.is_empty() || chain.push_bytes(plan.tail).is_some());
        if !built {
            return false;
        }
        chain.mark_flush();
        let Some(u) = r.upstream() else { return false };
        u.set_request_bufs(chain.into_raw());
        true
    }
}

extern "C" fn reinit_request(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx's upstream calls this with a live request.
    let r = unsafe { Req::from_raw(r) };
    guard(r.log(), "cache reinit_request", ERROR, || {
        if let Some(ctx) = ctx_of(r) {
            ctx.exchange.restart();
            ctx.answered = false;
            ctx.carry.clear();
        }
        OK
    })
}

extern "C" fn abort_request(_r: *mut ngx_http_request_t) {}

extern "C" fn finalize_request(_r: *mut ngx_http_request_t, _rc: ngx_int_t) {}

/// Reads the replies up to the command's own, which sets the status. A
/// reply without a value is read here to the end of the request's last
/// reply, so that a miss keeps its connection too.
extern "C" fn process_header(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx's upstream calls this with a live request.
    let r = unsafe { Req::from_raw(r) };
    guard(r.log(), "cache process_header", ERROR, || {
        let log = r.log();
        let Some(ctx) = ctx_of(r) else { return ERROR };
        let Some(u) = r.upstream() else { return ERROR };
        if let Some(cr) = ctx.cluster.as_mut() {
            cr.spoke = true;
        }
        loop {
            // (A copy: the header and the first bytes of a value, one buffer at most.)
            let buf = u.unread().to_vec();
            let (event, used) = ctx.exchange.step(&buf);
            u.consume(used);
            if ctx.cluster.is_some() {
                // (A CLUSTER SLOTS reply is kept by the exchange as it comes.)
                u.rewind_if_used();
            }
            match event {
                Event::More => return AGAIN,
                Event::Slots(reply) => {
                    let Some(cr) = ctx.cluster.as_mut() else { return ERROR };
                    let Some((t, current)) = cr.topology().zip(cr.current) else {
                        return ERROR;
                    };
                    let rebuilt =
                        kslot::parse_slots(&reply).and_then(|ranges| t.borrow_mut().rebuild(&ranges, current));
                    if let Err(e) = rebuilt {
                        t.borrow_mut().mark_stale();
                        log_stop(log, format_args!("{e}, from redis cluster node {}", cr.node()));
                        cr.stop = true;
                        drop_unread(u);
                        return NGX_HTTP_UPSTREAM_INVALID_HEADER as ngx_int_t;
                    }
                    cr.refreshed = true;
                }
                Event::Redirect(rd) => {
                    let Some(cr) = ctx.cluster.as_mut() else { return ERROR };
                    cr.redirects += 1;
                    match rd.addr(cr.current) {
                        None => {
                            log_stop(
                                log,
                                format_args!(
                                    "redis cluster node {} answered \"{rd}\", which names no IP address",
                                    cr.node()
                                ),
                            );
                            cr.stop = true;
                        }
                        Some(_) if cr.redirects > MAX_REDIRECTS => {
                            log_stop(
                                log,
                                format_args!(
                                    "redis cluster redirected the request more than {MAX_REDIRECTS} times, the last time \"{rd}\" from {}",
                                    cr.node()
                                ),
                            );
                            cr.stop = true;
                        }
                        Some(addr) => {
                            let Some(t) = cr.topology() else { return ERROR };
                            let mut t = t.borrow_mut();
                            let trusted = match rd.kind {
                                RedirectKind::Moved => t.moved(rd.slot, addr),
                                RedirectKind::Ask => t.trusts(addr),
                            };
                            drop(t);
                            if trusted {
                                cr.redirect = Some((addr, rd.kind));
                            } else if !cr.refreshed {
                                // A node the map does not know: no byte goes
                                // there before a seed's map names it. The
                                // request goes to a seed, for a new map
                                // (and its answer: the key's node, or a
                                // redirection checked against that map).
                                cr.refresh = true;
                            } else {
                                debug!(
                                    log,
                                    "cache: redis cluster node {} answered \"{rd}\", refused",
                                    cr.node()
                                );
                                log_refused(
                                    log,
                                    addr,
                                    format_args!("\"{rd}\" from redis cluster node {}", cr.node()),
                                );
                                cr.stop = true;
                            }
                        }
                    }
                    // The connection goes (nginx's next step closes it).
                    drop_unread(u);
                    return NGX_HTTP_UPSTREAM_INVALID_HEADER as ngx_int_t;
                }
                Event::Answer { status, value } => {
                    if let Some(k) = ctx.auth_key {
                        authfail::accepted(k);
                    }
                    // A value that came whole with its header is checked to
                    // its end before the status goes out: one that does not
                    // end with CRLF is a malformed reply (502), not a 200
                    // cut short.
                    if value.is_some() {
                        if let Err(e) = ctx.exchange.check_value_end(u.unread()) {
                            log!(NGX_LOG_ERR, log, "cache: {e}");
                            cluster_garbage(ctx, &e);
                            if let Some(cr) = ctx.cluster.as_mut() {
                                cr.stop |= !cr.retry_invalid;
                            }
                            drop_unread(u);
                            return NGX_HTTP_UPSTREAM_INVALID_HEADER as ngx_int_t;
                        }
                    }
                    ctx.answered = true;
                    u.set_status(ngx_uint_t::from(status));
                    match (value, ctx.exchange.count()) {
                        (Some(n), _) => {
                            u.set_content_length(n as off_t);
                            return OK;
                        }
                        // PUBLISH: the receivers, as JSON (filter_init).
                        (None, Some(n)) => u.set_content_length(pubsub::receivers_json(n).len() as off_t),
                        (None, None) => u.set_content_length(0),
                    }
                }
                Event::Done => {
                    // Only after an answer without a value: the exact end.
                    if u.unread().is_empty() {
                        u.set_keepalive(ctx.exchange.keeps());
                    } else {
                        log!(NGX_LOG_ERR, log, "cache: {}", ReplyError::Unsolicited);
                        cluster_garbage(ctx, &ReplyError::Unsolicited);
                        drop_unread(u);
                    }
                    return OK;
                }
                // A database Redis will not select is the client's: 400,
                // logged at info as nginx logs client errors. What follows
                // the refusal is not read: the connection goes (whatever
                // state it is in, none of it is kept).
                Event::Failed(ReplyError::Refused {
                    setup: Setup::Select,
                    message,
                }) => {
                    log!(
                        NGX_LOG_INFO,
                        log,
                        "cache: redis refused SELECT {} (\"$cache_db\"): {}",
                        ctx.db.unwrap_or_default(),
                        String::from_utf8_lossy(&message)
                    );
                    drop_unread(u);
                    u.set_status(HTTP_BAD_REQUEST as ngx_uint_t);
                    u.set_content_length(0);
                    return OK;
                }
                // A refused password: no other server is tried (it would
                // cost Redis one more connection), and the line comes once
                // a minute at most.
                Event::Failed(e @ ReplyError::Refused { setup: Setup::Auth, .. }) => {
                    let node = u
                        .peer_addr()
                        .map(|(_, n)| String::from_utf8_lossy(n.as_bytes()).into_owned());
                    if let Some(k) = ctx.auth_key {
                        authfail::refused(k, log, format_args!("{e}, by redis {}", node.as_deref().unwrap_or("?")));
                    }
                    if let Some(cr) = ctx.cluster.as_mut() {
                        cr.stop = true;
                    }
                    *u.tries() = 0;
                    drop_unread(u);
                    return NGX_HTTP_UPSTREAM_INVALID_HEADER as ngx_int_t;
                }
                Event::Failed(e) => {
                    log!(NGX_LOG_ERR, log, "cache: {e}");
                    cluster_garbage(ctx, &e);
                    if let Some(cr) = ctx.cluster.as_mut() {
                        cr.stop |= !cr.retry_invalid;
                    }
                    // The connection goes, and what it sent with it
                    // (said once, here, not again by the input filter).
                    drop_unread(u);
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

/// A cluster node that sent what no working node sends: the map may be
/// wrong about it, so the next request asks a seed for a new one.
fn cluster_garbage(ctx: &Ctx, e: &ReplyError) {
    if let Some(t) = ctx.cluster.as_ref().and_then(|cr| cr.topology()) {
        if e.breaks_protocol() {
            t.borrow_mut().mark_stale();
        }
    }
}

/// Drops the bytes read and not used: the connection they came on is not
/// kept, and nothing of them is passed on.
fn drop_unread(u: &mut Upstream) {
    let n = u.unread().len();
    u.consume(n);
}

/// The request of an input filter's data.
///
/// # Safety
/// `data` must be the Ctx `start` gave nginx's upstream for a live request.
unsafe fn filter_request<'a>(data: *mut c_void) -> Option<(&'a mut Ctx, &'a mut Req)> {
    // SAFETY: see above; the Ctx lives in its request's pool.
    unsafe {
        let ctx = &mut *(data as *mut Ctx);
        let r = Req::from_raw(ctx.r);
        Some((ctx, r))
    }
}

extern "C" fn filter_init(data: *mut c_void) -> ngx_int_t {
    guard(Log::cycle(), "cache input_filter_init", ERROR, || {
        // SAFETY: nginx passes the data start gave it.
        let Some((ctx, r)) = (unsafe { filter_request(data) }) else {
            return ERROR;
        };
        let pool = r.pool();
        let Some(u) = r.upstream() else { return ERROR };
        // nginx reads on while the length is not 0: any other value until
        // the exchange ends.
        u.set_length(ctx.exchange.expects_more() as off_t);
        if let (Some(n), true) = (ctx.exchange.count(), ctx.answered) {
            // (Before any bytes after the header: they are replies, not body.)
            if !u.emit_copy(pool, &pubsub::receivers_json(n)) {
                return ERROR;
            }
        }
        OK
    })
}

/// Passes the value's bytes on as they arrive; the CRLF after it and the
/// replies after the command are read and checked, not sent.
extern "C" fn filter(data: *mut c_void, bytes: isize) -> ngx_int_t {
    guard(Log::cycle(), "cache input_filter", ERROR, || {
        // SAFETY: nginx passes the data start gave it.
        let Some((ctx, r)) = (unsafe { filter_request(data) }) else {
            return ERROR;
        };
        let (log, pool) = (r.log(), r.pool());
        let Some(u) = r.upstream() else { return ERROR };
        // SAFETY: the bytes are used within this call only.
        let fresh = unsafe { u.take_new(bytes.max(0) as usize) };
        let carried = !ctx.carry.is_empty();
        let owned;
        let mut input: &[u8] = if carried {
            let mut joined = std::mem::take(&mut ctx.carry);
            joined.extend_from_slice(fresh);
            owned = joined;
            &owned
        } else {
            fresh
        };
        loop {
            let (event, used) = ctx.exchange.step(input);
            match event {
                // (Value bytes are never carried: only partial reply lines are.)
                Event::Value(v) if !carried => {
                    if !u.emit(pool, v) {
                        return ERROR;
                    }
                }
                Event::More => {
                    let rest = &input[used..];
                    if rest.len() > resp::MAX_LINE {
                        log!(NGX_LOG_ERR, log, "cache: redis sent a reply line that is too long");
                        u.set_length(0);
                        return ERROR;
                    }
                    ctx.carry = rest.to_vec();
                    return OK;
                }
                Event::Done => {
                    u.set_length(0);
                    if used == input.len() {
                        u.set_keepalive(ctx.exchange.keeps());
                    } else {
                        log!(NGX_LOG_ERR, log, "cache: {}", ReplyError::Unsolicited);
                        cluster_garbage(ctx, &ReplyError::Unsolicited);
                    }
                    return OK;
                }
                Event::Failed(e) => {
                    log!(NGX_LOG_ERR, log, "cache: {e}");
                    cluster_garbage(ctx, &e);
                    u.set_length(0);
                    // A value that does not end as announced is cut short.
                    return if e == ReplyError::BadValueEnd { ERROR } else { OK };
                }
                Event::Value(_) | Event::Answer { .. } | Event::Slots(_) | Event::Redirect(_) => {
                    log!(NGX_LOG_ALERT, log, "cache: unexpected reply state");
                    u.set_length(0);
                    return ERROR;
                }
            }
            input = &input[used..];
        }
    })
}
