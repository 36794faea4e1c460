//! The cache gateway's requests: the content handler reads what the
//! location and the request ask (command, key, database, password,
//! backend) and hands the request to one of three paths: nginx's upstream,
//! a connection per request (upstream.rs, with cluster.rs for
//! `cache_cluster`); the driver's shared, pipelined connections
//! (pipelined.rs); or a `cache_subscribe` stream (subscribe.rs).

use gateway_core::cluster as kslot;
use gateway_core::pubsub;
use gateway_core::redis::{self, Command, Exchange};
use gateway_core::streams;

use crate::cache::config::{Cache, CacheLocConf, CacheMainConf};
use crate::cache::driver::authfail;
use crate::cache::error::{Error, Kind};
use crate::common::failure::{log_failure, Failure};
use crate::common::sse::Refused;
use crate::ffi::net::TlsClient;
use crate::ffi::request::RequestCtx;
use crate::ffi::*;
use cluster::ClusterReq;
pub use series::count_request;
use upstream::{filter, filter_init, CALLBACKS};

pub mod balancer;
mod cluster;
mod pipelined;
pub mod sentinel;
mod series;
mod stream;
mod subscribe;
mod upstream;

/// What the log line of a `NOREPLICAS` refusal adds.
pub(super) const NO_REPLICAS: &str =
    ": the master takes no writes while fewer replicas than its min-replicas-to-write are in step";

/// Per-request state.
pub struct Ctx {
    pub(super) command: Command,
    pub(super) key: Vec<u8>,
    pub(super) db: Option<u32>,
    pub(super) exptime: Option<u64>,
    /// `XADD`'s trimming and its `event` field (`cache_stream_add`).
    pub(super) maxlen: u64,
    pub(super) event: Option<Vec<u8>>,
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
    pub(super) shared: Option<pipelined::SharedReq>,
    /// To a Sentinel set's master (`cache_sentinel`).
    pub(super) sentinel: Option<sentinel::SentinelReq>,
    /// The last try found no server to take the request now (a Sentinel
    /// set without a master or replica for it, or whose master failed the
    /// try; a master refusing writes, `NOREPLICAS`): a 502, 503 or 504 the
    /// request ends with says when to ask again (`tell_retry`).
    pub(super) retry_after: bool,
}

// SAFETY: the module's context slot is written by Req::set_ctx::<Cache>
// only (start), with a Ctx.
unsafe impl RequestCtx for Cache {
    type Ctx = Ctx;
    fn module() -> &'static ngx_module_t {
        <Cache as ngx::http::HttpModule>::module()
    }
}

/// A request that ends in 502, 503 or 504 after a try that found no server
/// to take it now (`Ctx::retry_after`): the response says to ask again in a
/// second (`Retry-After: 1`), once. False when nginx had no memory for the
/// header.
pub(super) fn tell_retry(r: &mut Req, status: ngx_int_t) -> bool {
    let gateway_error =
        status == HTTP_BAD_GATEWAY || status == HTTP_SERVICE_UNAVAILABLE || status == HTTP_GATEWAY_TIME_OUT;
    if !gateway_error || r.header_sent() {
        return true;
    }
    let due = ctx_of(r).is_some_and(|ctx| std::mem::take(&mut ctx.retry_after));
    !due || r.add_header("Retry-After", "1")
}

/// The request's context, borrowed with the request.
pub(super) fn ctx_of(r: &mut Req) -> Option<&mut Ctx> {
    r.ctx_mut::<Cache>()
}

/// `cache_gzip_flag`: a value is answered with `Content-Encoding: gzip`
/// (false when nginx had no memory for the header).
fn gzip_flagged(r: &mut Req) -> bool {
    r.loc_conf::<Cache>().gzip_flag == 0 || r.set_content_encoding_gzip()
}

request_handler! {
    pub(crate) fn content_handler(r) -> ngx_int_t = ("cache content handler", HTTP_INTERNAL_SERVER_ERROR) {
        match start(r) {
            Ok(rc) => rc,
            Err(e) => {
                if *e.kind() == Kind::AuthRefused {
                    crate::debug!(r.log(), "cache: {e}");
                }
                log_failure(r.log(), "cache", &e);
                e.status()
            }
        }
    }
}

/// A variable's value, when it is set and not empty.
fn variable(r: &mut Req, index: ngx_int_t) -> Option<Vec<u8>> {
    r.variable(index).filter(|v| !v.is_empty()).map(<[u8]>::to_vec)
}

fn start(r: &mut Req) -> Result<ngx_int_t, Error> {
    let lcf: &CacheLocConf = r.loc_conf::<Cache>();
    let mcf: &CacheMainConf = r.main_conf::<Cache>();
    r.disable_not_modified();
    if r.answer_under_way() {
        return Err(Kind::AnswerUnderWay.into());
    }
    if lcf.subscribe.is_some() || lcf.stream.is_some() {
        if let Some(cv) = lcf.auth {
            let pw = r.complex_value(cv).ok_or(Kind::Nginx)?;
            if !authfail::may_try(authfail::key(&authfail::block_scope(lcf.upstream.upstream), pw)) {
                return Err(Kind::AuthRefused.into());
            }
        }
        if lcf.stream.is_some() {
            return stream::start(r, lcf).map_err(|e| {
                Error::from(match e {
                    stream::Refusal::BadLastId(v) => Kind::BadLastEventId(v),
                    stream::Refusal::Sse(Refused::BadChannel(v)) => Kind::BadStreamKey(v, stream::KEY_MAX),
                    stream::Refusal::Sse(Refused::NotAllowed) => Kind::NotAllowed,
                    stream::Refusal::Sse(Refused::Nginx) => Kind::Nginx,
                })
            });
        }
        return subscribe::start(r, lcf).map_err(|e| {
            Error::from(match e {
                Refused::BadChannel(v) => Kind::BadChannel(v),
                Refused::NotAllowed => Kind::NotAllowed,
                Refused::Nginx => Kind::Nginx,
            })
        });
    }
    let method = r.method();
    let command = if let Some(cv) = lcf.publish {
        if method & NGX_HTTP_POST == 0 {
            return Err(Kind::NotAllowed.into());
        }
        let channel = r.complex_value(cv).ok_or(Kind::Nginx)?.to_vec();
        if !pubsub::valid_channel(&channel) {
            return Err(Error::from(Kind::BadChannel(
                String::from_utf8_lossy(&channel).into_owned(),
            )));
        }
        Command::Publish
    } else if lcf.stream_add.is_some() {
        if method & (NGX_HTTP_POST | NGX_HTTP_PUT) == 0 {
            return Err(Kind::NotAllowed.into());
        }
        Command::StreamAdd
    } else if method & (NGX_HTTP_GET | NGX_HTTP_HEAD) != 0 {
        Command::Get
    } else if method & (NGX_HTTP_PUT | NGX_HTTP_POST) != 0 {
        Command::Set
    } else if method & NGX_HTTP_DELETE != 0 {
        Command::Del
    } else {
        return Err(Kind::NotAllowed.into());
    };
    // Values that come from the client are the client's mistakes.
    let key = match lcf.publish.or(lcf.stream_add) {
        // (A channel was checked above.)
        Some(cv) => r.complex_value(cv).ok_or(Kind::Nginx)?.to_vec(),
        // Escaped here, so that every command and a cluster's slot have the
        // bytes that are sent.
        None => {
            let key = variable(r, mcf.key).ok_or(Kind::EmptyKey)?;
            if lcf.escape_key != 0 {
                redis::escape_key(key)
            } else {
                key
            }
        }
    };
    if key.is_empty() {
        return Err(Kind::EmptyStreamKey.into());
    }
    let event = match command {
        Command::StreamAdd => streams::query_arg(r.args(), b"event").filter(|e| !e.is_empty()),
        _ => None,
    };
    let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
    // Channels are the server's, whatever its database.
    let db = match variable(r, mcf.db).filter(|_| command != Command::Publish) {
        None => None,
        Some(v) => redis::parse_db(&v).map_err(|_| Kind::BadDb(text(&v)))?,
    };
    let exptime = match (command, variable(r, mcf.exptime)) {
        (Command::Set, Some(v)) => redis::parse_exptime(&v).map_err(|_| Kind::BadExptime(text(&v)))?,
        _ => None,
    };
    // A password whose variables are all empty is none: no AUTH.
    let auth = match lcf.auth {
        None => None,
        Some(cv) => Some(r.complex_value(cv).ok_or(Kind::Nginx)?.to_vec()).filter(|p| !p.is_empty()),
    };
    let backend = match lcf.pass_var {
        Some(cv) => Some(r.complex_value(cv).ok_or(Kind::Nginx)?.to_vec()),
        None => None,
    };
    let umcf = r.main_conf::<ngx::http::NgxHttpUpstreamModule>();
    let pool = r.pool();
    let u = r.create_upstream().ok_or(Kind::Nginx)?;
    let block = match &backend {
        Some(name) => resolve(u, &pool, umcf, name, mcf.owner_of)?,
        None => lcf.upstream.upstream.cast_const(),
    };
    // A password Redis refused less than a second ago: 502 at once.
    let auth_key = auth.as_deref().map(|pw| match backend.as_deref() {
        Some(name) if block.is_null() => authfail::key(name, pw),
        _ => authfail::key(&authfail::block_scope(block), pw),
    });
    if auth_key.is_some_and(|k| !authfail::may_try(k)) {
        return Err(Kind::AuthRefused.into());
    }
    let mut conf: *const ngx_http_upstream_conf_t = &lcf.upstream;
    let mut cluster = None;
    if mcf.cluster_of(block).is_some() {
        if let Some(n) = db {
            return Err(Error::from(Kind::ClusterDb(n)));
        }
        // A request-private copy of the settings: redirections go on
        // through nginx's next-upstream step, whatever cache_next_upstream
        // says (a SET or DEL that was redirected has not run).
        let mut copy = lcf.upstream;
        copy.next_upstream |= (NGX_HTTP_UPSTREAM_FT_INVALID_HEADER | NGX_HTTP_UPSTREAM_FT_NON_IDEMPOTENT) as ngx_uint_t;
        conf = pool.alloc(copy).ok_or(Kind::Nginx)?.as_ptr();
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

    let ctx = Ctx {
        command,
        key,
        db,
        exptime,
        maxlen: lcf.stream_maxlen,
        event,
        auth,
        auth_key,
        exchange: Exchange::new(&[], command, &[]),
        answered: false,
        carry: Vec::new(),
        cluster,
        body_len: None,
        shared: shared.then(|| pipelined::SharedReq::new(crate::common::token::register(r))),
        sentinel: None,
        retry_after: false,
    };
    r.set_ctx::<Cache>(ctx).ok_or(Kind::Nginx)?;
    if matches!(command, Command::Publish | Command::StreamAdd) {
        r.set_content_type("application/json");
    }
    if shared {
        // SAFETY: null, or an upstream block of the configuration, which
        // outlives its requests.
        let block = unsafe { block.as_ref() };
        return pipelined::start(r, block).ok_or_else(|| Kind::Nginx.into());
    }
    if !r.set_input_filter(filter_init, filter) {
        return Err(Kind::Nginx.into());
    }

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
        return Err(Kind::Nginx.into());
    }
    r.count_up();
    r.upstream_init();
    Ok(DONE)
}

/// `cache_pass $variable`: the value names an upstream block (of `server`
/// lines), or is a numeric `host:port` / `unix:/path`; anything else is no
/// known backend. The upstream block, when it is one.
fn resolve(
    u: &mut Upstream,
    pool: &Pool,
    umcf: &ngx_http_upstream_main_conf_t,
    name: &[u8],
    owner_of: Option<crate::common::upstream::OwnerOf>,
) -> Result<*const ngx_http_upstream_srv_conf_t, Error> {
    let text = || String::from_utf8_lossy(name).into_owned();
    let block =
        crate::ffi::conf::upstream_blocks(umcf).find(|u| u.port == 0 && u.host.as_bytes().eq_ignore_ascii_case(name));
    let owner = block.and_then(|b| owner_of.and_then(|f| f(b)));
    match block {
        Some(_) if owner.is_some() => Err(Error::from(Kind::ForeignUpstream(
            text(),
            owner.map_or("", |o| o.server),
        ))),
        Some(b) => {
            let host = pool.str(name).ok_or(Kind::Nginx)?;
            u.set_resolved(pool, host, None, 0)
                .then_some(b as *const ngx_http_upstream_srv_conf_t)
                .ok_or_else(|| Kind::Nginx.into())
        }
        None if u.set_resolved_address(pool, name) => Ok(std::ptr::null()),
        None => Err(Error::from(Kind::NoBackend(text()))),
    }
}

/// The location's TLS settings (Some(None): no `cache_ssl`); None when
/// `cache_ssl_name` cannot be evaluated. `host`: the name when it has none.
fn tls_of_location(r: &mut Req, lcf: &CacheLocConf, host: &[u8]) -> Option<Option<TlsClient>> {
    if lcf.upstream.ssl.is_null() {
        return Some(None);
    }
    // SAFETY: cache_ssl_name, compiled into configuration memory.
    let name = match unsafe { crate::ffi::conf::ComplexValue::from_raw(lcf.upstream.ssl_name) } {
        Some(cv) => r.complex_value(cv)?.to_vec(),
        None => host.to_vec(),
    };
    Some(Some(TlsClient {
        ssl: lcf.upstream.ssl,
        verify: lcf.upstream.ssl_verify == 1,
        server_name: lcf.upstream.ssl_server_name == 1,
        name,
    }))
}
