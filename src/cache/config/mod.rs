//! The cache gateway's configuration: `cache_pass`, `cache_auth`, the
//! timeouts and buffer, `cache_next_upstream`, and the `$cache_*`
//! variables it reads.

pub mod cluster;
mod commands;
pub mod sentinel;
pub mod target;
mod tls;

pub use commands::Commands;
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf};
pub(crate) use tls::{
    cmd_cache_ssl_certificate, cmd_cache_ssl_certificate_key, cmd_cache_ssl_trusted_certificate, cmd_cache_ssl_verify,
};

use crate::common::upstream::OwnerOf;
use crate::ffi::conf::{ComplexValue, ConfError, Position};
use crate::ffi::*;
use crate::log;

/// The cache gateway's nginx module (its `HttpModule` impl, which names
/// the module's static, is in lib.rs, with that static).
pub struct Cache;

// SAFETY: the create functions below make exactly these types.
unsafe impl HttpModuleMainConf for Cache {
    type MainConf = CacheMainConf;
}
// SAFETY: as above.
unsafe impl HttpModuleLocationConf for Cache {
    type LocationConf = CacheLocConf;
}

/// The request side's content handler, and those of other modules a
/// location cannot have beside it (linked in lib.rs).
pub trait Entries {
    /// The peer init of `cache_cluster` blocks.
    const PEER_INIT: ngx_http_upstream_init_peer_pt;
    /// The peer init of `cache_sentinel` blocks.
    const SENTINEL_PEER_INIT: ngx_http_upstream_init_peer_pt;
    /// The owner of a block that another gateway's lines make.
    const OWNER_OF: OwnerOf;
    const CONTENT: ngx_http_handler_pt;
    const OTHERS: &'static [(ngx_http_handler_pt, &'static str)];
}

pub struct CacheLocConf {
    pub upstream: ngx_http_upstream_conf_t,
    pass_set: bool,
    /// `cache_pass` with variables: the value names an upstream or is host:port.
    pub pass_var: Option<ComplexValue>,
    /// `cache_auth`.
    pub auth: Option<ComplexValue>,
    /// `cache_subscribe CHANNEL`: GET subscribes (server-sent events).
    pub subscribe: Option<ComplexValue>,
    /// `cache_subscribe_heartbeat`.
    pub subscribe_heartbeat: ngx_msec_t,
    /// `cache_subscribe_retry`: the streams' `retry:` field (unset: none).
    pub subscribe_retry: ngx_msec_t,
    /// `cache_pipeline`: requests share pipelined connections (pipe.rs).
    pub pipeline: ngx_flag_t,
    /// `cache_publish CHANNEL`: POST publishes its body.
    pub publish: Option<ComplexValue>,
    /// `cache_stream_add KEY`: POST or PUT appends its body to a stream.
    pub stream_add: Option<ComplexValue>,
    /// `cache_stream KEY`: GET reads a stream (server-sent events).
    pub stream: Option<ComplexValue>,
    /// `$http_last_event_id`, for `cache_stream`.
    pub stream_last_id: Option<ComplexValue>,
    /// `cache_stream_add`'s `maxlen=`.
    pub stream_maxlen: u64,
    /// `cache_escape_key`: keys are sent escaped (core's `redis::escape_key`).
    pub escape_key: ngx_flag_t,
    /// `cache_gzip_flag`: not 0, a value is answered with
    /// `Content-Encoding: gzip`.
    pub gzip_flag: ngx_int_t,
    next_upstream_set: bool,
    /// `cache_ssl` (the TLS settings live in `upstream`, as nginx's
    /// upstream code reads them, and in the files below).
    pub ssl: ngx_flag_t,
    pub ssl_verify_depth: ngx_int_t,
    ssl_trusted_certificate: Option<tls::FileAt>,
    ssl_certificate: Option<tls::FileAt>,
    ssl_certificate_key: Option<tls::FileAt>,
    /// What the TLS settings of this location are, as one text ("" for
    /// none): locations passing to the same upstream must agree on it.
    tls: String,
    /// Where `cache_ssl_verify` was written (for `nginx -t`'s messages).
    ssl_verify_at: Option<Position>,
    /// `cache_ssl_name` as written, and whether it is a literal (no
    /// variables): a Sentinel set's own connections verify it.
    pub ssl_name_text: Option<(Vec<u8>, bool)>,
    /// `cache_target`: where reads of a `cache_sentinel` set go (None:
    /// not written; the master).
    pub target: Option<target::Target>,
    /// `cache_replica_max_lag`.
    pub replica_max_lag: ngx_msec_t,
    /// Where `cache_subscribe` or `cache_publish` was written.
    channel_at: Option<Position>,
}

/// Locations with `cache_pass`, checked once every variable is known.
struct PendingPass {
    claim: Claim,
    /// The location's configuration (merged by the time it is checked).
    lcf: *const CacheLocConf,
    /// The upstream a literal `cache_pass` names.
    upstream: *mut ngx_http_upstream_srv_conf_t,
}

#[derive(Default)]
pub struct CacheMainConf {
    pending: Vec<PendingPass>,
    /// Indexes of `$cache_key`, `$cache_db`, `$cache_exptime` (-1: not defined).
    pub key: ngx_int_t,
    pub db: ngx_int_t,
    pub exptime: ngx_int_t,
    /// Upstream blocks with `cache_cluster`.
    pub clusters: Vec<Box<cluster::Cluster>>,
    /// Upstream blocks with `cache_sentinel` (or `cache_sentinel_auth`).
    pub sentinels: Vec<Box<sentinel::Sentinel>>,
    /// `cache_subscribe_buffers_max`: bytes that may wait for this
    /// worker's `cache_subscribe` subscribers, all together
    /// (NGX_CONF_UNSET_SIZE: the default).
    pub subscribe_buffers_max: usize,
    /// Blocks another gateway owns (Entries::OWNER_OF).
    pub owner_of: Option<OwnerOf>,
}

impl CacheMainConf {
    /// The other gateway that owns a block, if one does.
    pub fn foreign_owner(&self, uscf: &ngx_http_upstream_srv_conf_t) -> Option<crate::common::upstream::Owner> {
        self.owner_of.and_then(|f| f(uscf))
    }
}

create_conf_handler! {
    pub(crate) fn create_main_conf<E: Entries> = "cache create_main_conf",
    || CacheMainConf {
        key: -1,
        db: -1,
        exptime: -1,
        subscribe_buffers_max: CONF_UNSET_SIZE,
        owner_of: Some(E::OWNER_OF),
        ..CacheMainConf::default()
    }
}

create_conf_handler! {
    pub(crate) fn create_loc_conf = "cache create_loc_conf",
    || {
        let mut u: ngx_http_upstream_conf_t = crate::ffi::pool::zeroed();
        u.connect_timeout = CONF_UNSET_MSEC;
        u.send_timeout = CONF_UNSET_MSEC;
        u.read_timeout = CONF_UNSET_MSEC;
        u.buffer_size = CONF_UNSET_SIZE;
        u.socket_keepalive = CONF_UNSET;
        u.ssl_verify = CONF_UNSET;
        u.ssl_server_name = CONF_UNSET;
        u.ssl_session_reuse = CONF_UNSET;
        u.ssl_name = CONF_UNSET_PTR.cast();
        CacheLocConf {
            upstream: u,
            pass_set: false,
            pass_var: None,
            auth: None,
            subscribe: None,
            stream: None,
            stream_last_id: None,
            subscribe_heartbeat: CONF_UNSET_MSEC,
            subscribe_retry: CONF_UNSET_MSEC,
            pipeline: CONF_UNSET,
            publish: None,
            stream_add: None,
            stream_maxlen: gateway_core::streams::DEFAULT_MAXLEN,
            escape_key: CONF_UNSET,
            gzip_flag: CONF_UNSET,
            next_upstream_set: false,
            ssl: CONF_UNSET,
            ssl_verify_depth: CONF_UNSET,
            ssl_trusted_certificate: None,
            ssl_certificate: None,
            ssl_certificate_key: None,
            tls: String::new(),
            ssl_verify_at: None,
            ssl_name_text: None,
            target: None,
            replica_max_lag: CONF_UNSET_MSEC,
            channel_at: None,
        }
    }
}

fn merge_or<T: PartialEq + Copy>(conf: &mut T, prev: T, unset: T, default: T) {
    if *conf == unset {
        *conf = if prev == unset { default } else { prev };
    }
}

impl CacheLocConf {
    /// The `cache_auth` password when it has no variables (Some(None):
    /// none, or an empty one); None when it has variables.
    pub fn auth_literal(&self) -> Option<Option<Vec<u8>>> {
        match self.auth {
            None => Some(None),
            Some(cv) => cv.constant().map(|v| Some(v.to_vec()).filter(|v| !v.is_empty())),
        }
    }

    /// `cache_subscribe` and `cache_publish` need `cache_pass` beside them.
    fn check_channel(&self) -> Result<(), ConfError> {
        // (Found when the levels are merged: named at the directive's line.)
        let at = |m: String| match &self.channel_at {
            Some(p) => ConfError::At(m, p.clone()),
            None => m.into(),
        };
        let name = match (&self.subscribe, &self.publish, &self.stream_add, &self.stream) {
            (Some(_), _, _, _) => "cache_subscribe",
            (_, Some(_), _, _) => "cache_publish",
            (_, _, Some(_), _) => "cache_stream_add",
            (_, _, _, Some(_)) => "cache_stream",
            _ => return Ok(()),
        };
        if self.upstream.upstream.is_null() && self.pass_var.is_none() {
            return Err(at(format!("\"{name}\" needs \"cache_pass\" in the same location")));
        }
        if self.subscribe.is_some() || self.stream.is_some() {
            if self.pass_var.is_some() {
                return Err(at(format!(
                    "\"{name}\" needs \"cache_pass\" to name an upstream or an address, not a variable"
                )));
            }
            // SAFETY: the upstream block lives in configuration memory.
            let servers = unsafe { self.upstream.upstream.as_ref() }.map_or(std::ptr::null_mut(), |u| u.servers);
            if servers.is_null() {
                return Err(at(format!("\"{name}\" needs \"cache_pass\" to name an upstream block or one address (a host name of several addresses is neither)")));
            }
        }
        Ok(())
    }

    fn merge(&mut self, prev: &CacheLocConf, conf: Conf) {
        let (p, u) = (&prev.upstream, &mut self.upstream);
        merge_or(&mut u.connect_timeout, p.connect_timeout, CONF_UNSET_MSEC, 60_000);
        merge_or(&mut u.send_timeout, p.send_timeout, CONF_UNSET_MSEC, 60_000);
        merge_or(&mut u.read_timeout, p.read_timeout, CONF_UNSET_MSEC, 60_000);
        merge_or(&mut u.buffer_size, p.buffer_size, CONF_UNSET_SIZE, pagesize());
        merge_or(&mut u.socket_keepalive, p.socket_keepalive, CONF_UNSET, 0);
        merge_or(&mut self.pipeline, prev.pipeline, CONF_UNSET, 1);
        merge_or(&mut self.escape_key, prev.escape_key, CONF_UNSET, 1);
        merge_or(&mut self.gzip_flag, prev.gzip_flag, CONF_UNSET, 0);
        if !self.next_upstream_set {
            self.next_upstream_set = prev.next_upstream_set;
            u.next_upstream = if prev.next_upstream_set {
                p.next_upstream
            } else {
                (NGX_HTTP_UPSTREAM_FT_ERROR | NGX_HTTP_UPSTREAM_FT_TIMEOUT) as ngx_uint_t
            };
        }
        self.auth = self.auth.or(prev.auth);
        self.target = self.target.or(prev.target);
        merge_or(
            &mut self.replica_max_lag,
            prev.replica_max_lag,
            CONF_UNSET_MSEC,
            target::MAX_LAG,
        );
        merge_or(
            &mut self.subscribe_heartbeat,
            prev.subscribe_heartbeat,
            CONF_UNSET_MSEC,
            15_000,
        );
        merge_or(
            &mut self.subscribe_retry,
            prev.subscribe_retry,
            CONF_UNSET_MSEC,
            CONF_UNSET_MSEC,
        );
        // An `if` block (or limit_except) without cache_pass of its own
        // passes its location's requests to the same backend.
        let noname = conf.location_unnamed();
        if noname && u.upstream.is_null() && self.pass_var.is_none() {
            u.upstream = p.upstream;
            self.pass_var = prev.pass_var;
        }
        // What a cache never does: buffer to disk, pass the client's headers.
        u.buffering = 0;
        u.ignore_client_abort = 0;
        u.pass_request_headers = 0;
        u.pass_request_body = 0;
        u.intercept_errors = 1;
        // (A publish's answer is not a value to take parts of.)
        u.force_ranges = ngx_flag_t::from(self.publish.is_none() && self.stream_add.is_none()) as _;
        u.set_intercept_404(1);
        u.module = static_str("cache");
    }
}

merge_conf_handler! {
    pub(crate) fn merge_loc_conf = "cache merge_loc_conf",
    |conf: Conf, prev: &CacheLocConf, this: &mut CacheLocConf| {
        this.merge(prev, conf);
        this.merge_ssl(prev, conf)?;
        this.check_channel()
    }
}

directive_handler! {
    /// `cache_pass upstream | host:port | unix:/path | $variable`
    pub(crate) fn cmd_cache_pass<E: Entries> = "cmd_cache_pass",
    |cf: Conf, lcf: &mut CacheLocConf| {
        if lcf.pass_set {
            return Err(crate::ffi::conf::duplicate("cache_pass"));
        }
        lcf.pass_set = true;
        let claim = cf
            .claim_content_handler("cache_pass", E::CONTENT, E::OTHERS)
            .map_err(|_| ConfError::Logged)?;
        let value = cf.args()[1];
        if cf.has_variables(value) {
            lcf.pass_var = Some(cf.compile(value).ok_or(ConfError::Logged)?);
        } else {
            lcf.upstream.upstream = cf.upstream_add(value).ok_or(ConfError::Logged)?.as_ptr();
        }
        let lcf_ptr: *const CacheLocConf = lcf;
        let upstream = lcf.upstream.upstream;
        cf.with_main_conf::<Cache, _>(|mcf| mcf.pending.push(PendingPass { claim, lcf: lcf_ptr, upstream }));
        Ok(())
    }
}

directive_handler! {
    /// `cache_auth password` (may contain variables)
    pub(crate) fn cmd_cache_auth = "cmd_cache_auth",
    |cf: Conf, lcf: &mut CacheLocConf| {
        if lcf.auth.is_some() {
            return Err(crate::ffi::conf::duplicate("cache_auth"));
        }
        lcf.auth = Some(cf.compile(cf.args()[1]).ok_or(ConfError::Logged)?);
        Ok(())
    }
}

/// `cache_subscribe CHANNEL` and `cache_publish CHANNEL` (with variables):
/// the channel of a location, one of the two.
fn channel_directive(cf: Conf, lcf: &mut CacheLocConf, publish: bool) -> Result<(), ConfError> {
    let name = if publish { "cache_publish" } else { "cache_subscribe" };
    if lcf.subscribe.is_some() || lcf.publish.is_some() || lcf.stream_add.is_some() || lcf.stream.is_some() {
        let other = if lcf.publish.is_some() {
            "cache_publish"
        } else if lcf.stream_add.is_some() {
            "cache_stream_add"
        } else if lcf.stream.is_some() {
            "cache_stream"
        } else {
            "cache_subscribe"
        };
        return Err(if other == name {
            crate::ffi::conf::duplicate(name)
        } else {
            format!("\"{name}\" and \"{other}\" in one location").into()
        });
    }
    let value = cf.args()[1];
    if !cf.has_variables(value) && !gateway_core::pubsub::valid_channel(value) {
        return Err(format!(
            "invalid channel \"{}\" in \"{name}\" directive (1 to {} visible ASCII characters)",
            String::from_utf8_lossy(value),
            gateway_core::pubsub::CHANNEL_MAX
        )
        .into());
    }
    let cv = Some(cf.compile(value).ok_or(ConfError::Logged)?);
    lcf.channel_at = Some(cf.position());
    if publish {
        lcf.publish = cv;
    } else {
        lcf.subscribe = cv;
    }
    Ok(())
}

directive_handler! {
    /// `cache_subscribe CHANNEL`
    pub(crate) fn cmd_cache_subscribe = "cmd_cache_subscribe",
    |cf: Conf, lcf: &mut CacheLocConf| channel_directive(cf, lcf, false)
}

directive_handler! {
    /// `cache_publish CHANNEL`
    pub(crate) fn cmd_cache_publish = "cmd_cache_publish",
    |cf: Conf, lcf: &mut CacheLocConf| channel_directive(cf, lcf, true)
}

directive_handler! {
    /// `cache_stream_add KEY [maxlen=N]`
    pub(crate) fn cmd_cache_stream_add = "cmd_cache_stream_add",
    |cf: Conf, lcf: &mut CacheLocConf| {
        if lcf.subscribe.is_some() || lcf.publish.is_some() || lcf.stream_add.is_some() || lcf.stream.is_some() {
            return Err("\"cache_stream_add\" directive is duplicate, or beside \"cache_subscribe\", \"cache_publish\" or \"cache_stream\"".to_owned().into());
        }
        let args = cf.args();
        if let Some(arg) = args.get(2) {
            lcf.stream_maxlen = gateway_core::streams::parse_maxlen_arg(arg).ok_or_else(|| {
                format!(
                    "invalid parameter \"{}\" in \"cache_stream_add\" directive (maxlen=N, N from 1 to {}, Redis's range)",
                    String::from_utf8_lossy(arg),
                    gateway_core::streams::MAXLEN_MAX
                )
            })?;
        }
        lcf.stream_add = Some(cf.compile(args[1]).ok_or(ConfError::Logged)?);
        lcf.channel_at = Some(cf.position());
        Ok(())
    }
}

directive_handler! {
    /// `cache_stream KEY`
    pub(crate) fn cmd_cache_stream = "cmd_cache_stream",
    |cf: Conf, lcf: &mut CacheLocConf| {
        if lcf.subscribe.is_some() || lcf.publish.is_some() || lcf.stream_add.is_some() || lcf.stream.is_some() {
            return Err("\"cache_stream\" directive is duplicate, or beside \"cache_subscribe\", \"cache_publish\" or \"cache_stream_add\"".to_owned().into());
        }
        let value = cf.args()[1];
        if value.is_empty() {
            return Err("empty key in \"cache_stream\" directive".to_owned().into());
        }
        lcf.stream = Some(cf.compile(value).ok_or(ConfError::Logged)?);
        lcf.stream_last_id = Some(cf.compile(b"$http_last_event_id").ok_or(ConfError::Logged)?);
        lcf.channel_at = Some(cf.position());
        Ok(())
    }
}

/// The smallest `cache_buffer_size`. nginx reads a reply's header into the
/// buffer without moving what is used out of it, so the replies before
/// the command's own (`+OK` to AUTH, `+PONG`, `+OK` to SELECT: 17 bytes)
/// and the first line of the command's (`$536870912\r\n` at most for a
/// value; Redis's usual error lines, such as the 68 bytes of
/// `-WRONGTYPE ...`) must fit in it together.
pub const MIN_BUFFER_SIZE: usize = 128;

directive_handler! {
    /// `cache_buffer_size size`: nginx's size slot, and at least `MIN_BUFFER_SIZE`.
    pub(crate) fn cmd_cache_buffer_size = "cmd_cache_buffer_size",
    |cf: Conf, lcf: &mut CacheLocConf| {
        // (nginx's own words for these two, as its size slot has them.)
        if lcf.upstream.buffer_size != CONF_UNSET_SIZE {
            return Err(crate::ffi::conf::duplicate("cache_buffer_size"));
        }
        let size = cf
            .parse_size(cf.args()[1])
            .ok_or_else(|| "\"cache_buffer_size\" directive invalid value".to_owned())?;
        if size < MIN_BUFFER_SIZE {
            return Err(format!(
                "\"cache_buffer_size\" must be at least {MIN_BUFFER_SIZE} bytes (the first lines of Redis's replies to a request must fit in it), not {size}"
            )
            .into());
        }
        lcf.upstream.buffer_size = size;
        Ok(())
    }
}

directive_handler! {
    /// `cache_next_upstream error | timeout | invalid_response | not_found ... | off`
    pub(crate) fn cmd_cache_next_upstream = "cmd_cache_next_upstream",
    |cf: Conf, lcf: &mut CacheLocConf| {
        if lcf.next_upstream_set {
            return Err(crate::ffi::conf::duplicate("cache_next_upstream"));
        }
        let keywords = [
            ("error", NGX_HTTP_UPSTREAM_FT_ERROR),
            ("timeout", NGX_HTTP_UPSTREAM_FT_TIMEOUT),
            ("invalid_response", NGX_HTTP_UPSTREAM_FT_INVALID_HEADER),
            ("not_found", NGX_HTTP_UPSTREAM_FT_HTTP_404),
        ];
        lcf.upstream.next_upstream = cf.next_upstream_bits(&keywords).map_err(|_| ConfError::Logged)?;
        lcf.next_upstream_set = true;
        Ok(())
    }
}

conf_step_handler! {
    /// Every location with `cache_pass` needs `$cache_key`; `$cache_db` and
    /// `$cache_exptime` are used when some configuration sets them.
    pub(crate) fn postconfiguration = "cache postconfiguration",
    postconfigure
}

fn postconfigure(cf: Conf) -> Result<(), ConfError> {
    cf.with_main_conf::<Cache, _>(|mcf| check_main(cf, mcf))
}

/// The main configuration's checks once the http block is read, and the
/// variables' indexes.
fn check_main(cf: Conf, mcf: &mut CacheMainConf) -> Result<(), ConfError> {
    cluster::check(mcf)?;
    // SAFETY: locations' configurations live as long as the configuration.
    let keyed = |p: &&PendingPass| unsafe {
        (*p.lcf).subscribe.is_none()
            && (*p.lcf).publish.is_none()
            && (*p.lcf).stream_add.is_none()
            && (*p.lcf).stream.is_none()
    };
    if let Some(first) = mcf
        .pending
        .iter()
        .find(keyed)
        .filter(|_| !cf.variable_declared(b"cache_key"))
    {
        return Err(format!(
            "\"cache_pass\" needs the $cache_key variable, which no \"set $cache_key ...\" defines, in {}:{}",
            first.claim.file(),
            first.claim.line()
        )
        .into());
    }
    for p in &mcf.pending {
        // SAFETY: the upstream module's configurations live as long as the configuration.
        if let Some(u) = unsafe { p.upstream.as_ref() } {
            if let Some(owner) = mcf.foreign_owner(u) {
                log!(
                    NGX_LOG_EMERG,
                    cf.log(),
                    "\"cache_pass\" names upstream \"{}\", which has \"{}\" lines (use \"{}\") in {}:{}",
                    String::from_utf8_lossy(u.host.as_bytes()),
                    owner.server,
                    owner.pass,
                    p.claim.file(),
                    p.claim.line()
                );
                return Err(ConfError::Logged);
            }
        }
        if !p.claim.holds(&cf) {
            return Err(ConfError::Logged);
        }
    }
    tls::same_tls_per_upstream(&cf, &mcf.pending)?;
    let pending = std::mem::take(&mut mcf.pending);
    sentinel::check(mcf, &pending)?;
    target::check(mcf, &pending)?;
    mcf.pending = pending;
    let index = |name: &str| {
        if !cf.variable_declared(name.as_bytes()) {
            return Ok(-1);
        }
        cf.variable_index(name.as_bytes()).ok_or(ConfError::Logged)
    };
    mcf.key = index("cache_key")?;
    mcf.db = index("cache_db")?;
    mcf.exptime = index("cache_exptime")?;
    mcf.pending.clear();
    Ok(())
}
