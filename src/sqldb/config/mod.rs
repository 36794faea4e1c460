//! The database gateway's configuration: what its directives build, how a
//! location inherits from the levels around it, and the module's typed
//! access to it (ngx's traits).

pub mod auth;
mod commands;
pub mod directives;
pub mod replay;
pub mod upstream;

use std::ffi::{CStr, CString};
use std::rc::Rc;

use gateway_core::method::QuerySet;
use gateway_core::rewrite::Rule as RewriteRule;
use gateway_core::target::Target;
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, HttpModuleServerConf};

pub use commands::Commands;

use super::driver::{Settings, Statement};
use crate::ffi::conf::{ComplexValue, ConfError, Position};
use crate::ffi::*;

pub const RDS_CONTENT_TYPE: &str = "application/x-gateway-dbd-stream";
pub const DEFAULT_CONNECT_TIMEOUT: ngx_msec_t = 10_000;
pub const DEFAULT_RESULT_TIMEOUT: ngx_msec_t = 30_000;
pub const DEFAULT_LISTEN_HEARTBEAT: ngx_msec_t = 15_000;
pub const DEFAULT_JWT_LEEWAY: time_t = 30;

/// The database gateway's nginx module (its `HttpModule` impl, which
/// names the module's static, is in lib.rs, with that static).
pub struct Sqldb;

// SAFETY: the create functions below make exactly these types.
unsafe impl HttpModuleMainConf for Sqldb {
    type MainConf = MainConf;
}
// SAFETY: as above.
unsafe impl HttpModuleServerConf for Sqldb {
    type ServerConf = SrvConf;
}
// SAFETY: as above.
unsafe impl HttpModuleLocationConf for Sqldb {
    type LocationConf = LocConf;
}

/// The request side's entry points that directives install (content
/// handler, balancer wrapper, variable getter): the request layer implements
/// this, lib.rs links them.
pub trait Entries {
    const CONTENT: ngx_http_handler_pt;
    const PEER_INIT: ngx_http_upstream_init_peer_pt;
    /// `$sqldb_jwt_claim_NAME`'s getter.
    const CLAIM: ngx_http_get_variable_pt;
    /// Content handlers of other modules a location cannot have beside this one.
    const OTHERS: &'static [(ngx_http_handler_pt, &'static str)];
}

/// `sqldb_output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Rds,
    Text,
    Value,
    BinaryValue,
    Json,
    Csv,
    None,
}

impl Output {
    pub const ALL: [(&'static str, Output); 7] = [
        ("rds", Output::Rds),
        ("text", Output::Text),
        ("value", Output::Value),
        ("binary_value", Output::BinaryValue),
        ("json", Output::Json),
        ("csv", Output::Csv),
        ("none", Output::None),
    ];

    /// The Content-Type of the output (None: the location's default_type).
    pub fn content_type(self) -> Option<&'static str> {
        match self {
            Output::Rds => Some(RDS_CONTENT_TYPE),
            Output::Text => Some("text/plain"),
            Output::Json => Some("application/json"),
            Output::Csv => Some("text/csv"),
            _ => None,
        }
    }
}

/// One address of one `sqldb_server` line, with its finished connection string.
pub struct ServerAddr {
    pub sockaddr: Vec<u8>,
    /// nginx's copy of it (see Addr::at).
    pub at: usize,
    /// The address as text ("127.0.0.1:5432"), in configuration memory
    /// (nginx's balancers and `$upstream_addr` point at it).
    pub name: ngx_str_t,
    pub conninfo: CString,
}

impl ServerAddr {
    pub fn name_text(&self) -> String {
        String::from_utf8_lossy(self.name.as_bytes()).into_owned()
    }
}

/// The module's server configuration; only used inside `upstream` blocks.
pub struct SrvConf {
    pub addrs: Vec<ServerAddr>,
    /// How many `sqldb_server` lines the block has.
    pub servers: usize,
    /// The balancer's per-request init, wrapped by the request side's.
    pub balancer_init: ngx_http_upstream_init_peer_pt,
    /// `sqldb_keepalive`, `sqldb_pipeline`, `sqldb_keep_role`: what each
    /// worker's pool of the upstream follows (driver::worker holds the pool).
    pub settings: Settings,
    /// The upstream's name.
    pub name: String,
    keepalive_set: bool,
    pipeline_set: bool,
    keep_role_set: bool,
}

impl SrvConf {
    /// The server line of a peer the balancer picked: by nginx's pointer
    /// to the address (two lines may have the same address and different
    /// parameters), else by the address itself (a balancer that copies it).
    pub fn addr_index(&self, at: usize, sockaddr: &[u8]) -> Option<usize> {
        let by_ptr = self.addrs.iter().position(|a| a.at == at);
        by_ptr.or_else(|| self.addrs.iter().position(|a| a.sockaddr == sockaddr))
    }
}

/// One `sqldb_query` template.
pub struct Template {
    pub pieces: Vec<TemplatePiece>,
    /// Prepared under this name on every connection, when constant.
    pub statement: Rc<Statement>,
    /// The SQL text has no untyped variables: the same statement every time.
    pub constant: bool,
    /// That text, when constant (and free of NUL bytes): requests share it.
    pub sql: Option<Rc<CStr>>,
    /// A constant text that holds several statements.
    pub several: bool,
    /// Where its `sqldb_query` is.
    pub at: Position,
    /// It may change its session beyond its sync point (core's
    /// `sql::changes_session`).
    pub changes_session: bool,
    /// Typed parameters ($var::type) in the template.
    pub params: usize,
}

pub enum TemplatePiece {
    /// SQL text, with untyped variables substituted.
    Text(ComplexValue),
    /// A bound parameter: its value, and what stands for it in the text ("$1::int").
    Param(ComplexValue, Vec<u8>),
}

/// `sqldb_set`: which cell.
#[derive(Debug, Clone)]
pub enum Column {
    Index(usize),
    Name(Vec<u8>),
}

/// `sqldb_set $var ROW COLUMN [required]`.
#[derive(Clone)]
pub struct SetRule {
    pub index: ngx_int_t,
    pub name: String,
    pub row: usize,
    pub column: Column,
    pub required: bool,
}

/// `sqldb_escape $dst [[=]$src]`.
#[derive(Clone)]
pub struct EscapeRule {
    pub dst: ngx_int_t,
    /// The value to escape; none: the variable's own value.
    pub src: Option<ComplexValue>,
    /// An empty value is `''` rather than NULL.
    pub empty_string: bool,
}

pub struct LocConf {
    /// What `u->conf` points to for requests of this location.
    pub upstream: ngx_http_upstream_conf_t,
    pub pass_set: bool,
    /// `sqldb_pass $var`: the value names an upstream at run time.
    pub pass_var: Option<ComplexValue>,
    /// `sqldb_pass NAME`: resolved once every upstream block is read.
    pub pass_name: Vec<u8>,
    pub queries: QuerySet<Rc<Template>>,
    /// `sqldb_target`: the role of the server, by request method.
    pub targets: QuerySet<Target>,
    pub connect_timeout: ngx_msec_t,
    pub result_timeout: ngx_msec_t,
    /// `sqldb_prepare`: prepare constant templates once per connection.
    pub prepare: ngx_flag_t,
    /// `sqldb_next_upstream`: NGX_HTTP_UPSTREAM_FT_* bits.
    pub next_upstream: Option<ngx_uint_t>,
    pub output: Option<Output>,
    /// `sqldb_stream`: send rows as they arrive.
    pub stream: ngx_flag_t,
    /// `sqldb_stream_connections`: a stream starts only while streams hold
    /// fewer of its upstream's connections (in the worker) than this
    /// (None: half of `sqldb_keepalive max`).
    pub stream_connections: Option<usize>,
    pub sets: Vec<SetRule>,
    pub rewrites: Vec<RewriteRule>,
    pub escapes: Vec<EscapeRule>,
    /// `sqldb_listen CHANNEL`: requests subscribe to the channel.
    pub listen: Option<(ComplexValue, Position)>,
    /// `sqldb_listen_heartbeat`: a comment line this often.
    pub listen_heartbeat: ngx_msec_t,
    /// `sqldb_listen_replay`: the events after a client's last id.
    pub listen_replay: Option<Rc<replay::Replay>>,
    /// `sqldb_listen_retry`: the `retry:` field of the streams (unset: none).
    pub listen_retry: ngx_msec_t,
    /// `sqldb_jwt_key`: requests carry a bearer token, verified here.
    pub jwt: Option<Rc<auth::JwtConf>>,
    /// `sqldb_jwt_leeway` (seconds).
    pub jwt_leeway: time_t,
    /// `sqldb_jwt_role_claim` (a path into the claims).
    pub jwt_role_claim: Option<Rc<Vec<String>>>,
    /// `sqldb_anonymous_role`: the role of requests without a token.
    pub anonymous_role: Option<(Rc<CString>, Position)>,
    /// `sqldb_setting`s.
    pub settings: Vec<auth::Setting>,
    /// What runs before each query (made by the merge).
    pub preamble: Option<Rc<auth::PreambleSql>>,
}

impl LocConf {
    pub fn output(&self) -> Output {
        self.output.unwrap_or(Output::Rds)
    }

    /// The `sqldb_target` of a request method (`any` when none is set).
    pub fn target(&self, method: u32) -> Target {
        self.targets.select(method).copied().unwrap_or_default()
    }
}

/// A `sqldb_pass NAME` waiting for every upstream block to be read.
pub struct PendingPass {
    pub lcf: *mut LocConf,
    /// Where the directive is; none for an `if` block that inherits it.
    pub claim: Option<Claim>,
}

/// The `$sqldb_*` variables the gateway fills in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Var {
    Columns,
    Rows,
    Affected,
    Query,
    Error,
}

impl Var {
    pub const ALL: [(Var, &'static str); 5] = [
        (Var::Columns, "sqldb_columns"),
        (Var::Rows, "sqldb_rows"),
        (Var::Affected, "sqldb_affected"),
        (Var::Query, "sqldb_query"),
        (Var::Error, "sqldb_error"),
    ];
}

#[derive(Default)]
pub struct MainConf {
    pub pending: Vec<PendingPass>,
    /// Indexes of the `$sqldb_*` variables (Var::ALL order).
    pub vars: [ngx_int_t; 5],
    /// `sqldb_listen_buffers_max`: bytes that may wait for this worker's
    /// `sqldb_listen` subscribers, all together (NGX_CONF_UNSET_SIZE: the
    /// default).
    pub listen_buffers_max: usize,
}

impl MainConf {
    pub fn var(&self, v: Var) -> ngx_int_t {
        self.vars[v as usize]
    }
}

create_conf_handler! {
    pub(crate) fn create_main_conf = "create_main_conf",
    || MainConf {
        vars: [-1; 5],
        listen_buffers_max: CONF_UNSET_SIZE,
        ..MainConf::default()
    }
}

create_conf_handler! {
    pub(crate) fn create_srv_conf = "create_srv_conf",
    || SrvConf {
        addrs: Vec::new(),
        servers: 0,
        balancer_init: None,
        settings: Settings::default(),
        name: String::new(),
        keepalive_set: false,
        pipeline_set: false,
        keep_role_set: false,
    }
}

create_conf_handler! {
    pub(crate) fn create_loc_conf = "create_loc_conf",
    || LocConf {
        upstream: crate::ffi::pool::zeroed(),
        pass_set: false,
        pass_var: None,
        pass_name: Vec::new(),
        queries: QuerySet::default(),
        targets: QuerySet::default(),
        connect_timeout: CONF_UNSET_MSEC,
        result_timeout: CONF_UNSET_MSEC,
        prepare: CONF_UNSET,
        next_upstream: None,
        output: None,
        stream: CONF_UNSET,
        stream_connections: None,
        sets: Vec::new(),
        rewrites: Vec::new(),
        escapes: Vec::new(),
        listen: None,
        listen_heartbeat: CONF_UNSET_MSEC,
        listen_replay: None,
        listen_retry: CONF_UNSET_MSEC,
        jwt: None,
        jwt_leeway: CONF_UNSET as time_t,
        jwt_role_claim: None,
        anonymous_role: None,
        settings: Vec::new(),
        preamble: None,
    }
}

fn merge_msec(conf: &mut ngx_msec_t, prev: ngx_msec_t, default: ngx_msec_t) {
    if *conf == CONF_UNSET_MSEC {
        *conf = if prev == CONF_UNSET_MSEC { default } else { prev };
    }
}

fn merge_flag(conf: &mut ngx_flag_t, prev: ngx_flag_t, default: ngx_flag_t) {
    if *conf == CONF_UNSET {
        *conf = if prev == CONF_UNSET { default } else { prev };
    }
}

/// Rules of an outer level apply where a level has none of its own.
fn merge_list<T: Clone>(conf: &mut Vec<T>, prev: &[T]) {
    if conf.is_empty() {
        conf.extend_from_slice(prev);
    }
}

impl LocConf {
    fn merge(&mut self, prev: &LocConf, conf: Conf) -> Result<(), ConfError> {
        if let (Some((_, at)), false) = (&self.listen, self.queries.is_empty()) {
            return Err(ConfError::At(
                "\"sqldb_listen\" and \"sqldb_query\" cannot be in the same location".to_owned(),
                at.clone(),
            ));
        }
        // A level with any sqldb_query of its own ignores every outer one.
        if self.queries.is_empty() && self.listen.is_none() {
            self.queries = prev.queries.clone();
        }
        // The same for sqldb_target.
        if self.targets.is_empty() {
            self.targets = prev.targets.clone();
        }
        merge_msec(&mut self.connect_timeout, prev.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        merge_msec(&mut self.result_timeout, prev.result_timeout, DEFAULT_RESULT_TIMEOUT);
        merge_msec(
            &mut self.listen_heartbeat,
            prev.listen_heartbeat,
            DEFAULT_LISTEN_HEARTBEAT,
        );
        // (No `retry:` line unless set.)
        if self.listen_retry == CONF_UNSET_MSEC {
            self.listen_retry = prev.listen_retry;
        }
        self.check_replay()?;
        merge_flag(&mut self.stream, prev.stream, 0);
        self.stream_connections = self.stream_connections.or(prev.stream_connections);
        merge_flag(&mut self.prepare, prev.prepare, 1);
        merge_list(&mut self.sets, &prev.sets);
        merge_list(&mut self.rewrites, &prev.rewrites);
        // Every level's escapes apply: one left out would let a value in as
        // the client sent it. A rule of this level for the same variable
        // takes the place of the outer one.
        let outer = prev
            .escapes
            .iter()
            .filter(|p| self.escapes.iter().all(|e| e.dst != p.dst));
        self.escapes.splice(0..0, outer.cloned().collect::<Vec<_>>());
        self.output = self.output.or(prev.output);
        self.merge_auth(prev)?;
        if let (Some((_, at)), false) = (&self.listen, self.pass_set) {
            return Err(ConfError::At(
                "\"sqldb_listen\" needs \"sqldb_pass\" in the same location".to_owned(),
                at.clone(),
            ));
        }
        let default_next = (NGX_HTTP_UPSTREAM_FT_ERROR | NGX_HTTP_UPSTREAM_FT_TIMEOUT) as ngx_uint_t;
        self.next_upstream = Some(self.next_upstream.or(prev.next_upstream).unwrap_or(default_next));
        // An `if` block (or limit_except) without sqldb_pass of its own
        // serves its location's requests: it passes them to the same upstream.
        let noname = conf.location_unnamed();
        if noname && !self.pass_set && (!prev.pass_name.is_empty() || prev.pass_var.is_some()) {
            self.pass_var = prev.pass_var;
            self.pass_name = prev.pass_name.clone();
            if !self.pass_name.is_empty() {
                conf.with_main_conf::<Sqldb, _>(|mcf| mcf.pending.push(PendingPass { lcf: self, claim: None }));
            }
        }
        let u = &mut self.upstream;
        u.connect_timeout = self.connect_timeout;
        u.read_timeout = self.result_timeout;
        u.send_timeout = self.result_timeout;
        u.next_upstream = self.next_upstream.unwrap_or(default_next);
        u.module = static_str("sqldb");
        if let Some(t) = self.queries.iter().find(|t| t.several) {
            if self.output == Some(Output::BinaryValue) {
                return Err(ConfError::At("\"sqldb_output binary_value\" needs queries of one statement: a query of several statements answers in text"
                    .to_owned(), t.at.clone()));
            }
        }
        Ok(())
    }
}

impl LocConf {
    /// The JWT directives and settings: inherited level by level, and the
    /// preamble they make.
    fn merge_auth(&mut self, prev: &LocConf) -> Result<(), ConfError> {
        if self.jwt.is_none() {
            self.jwt = prev.jwt.clone();
        }
        if self.jwt_leeway == CONF_UNSET as time_t {
            self.jwt_leeway = if prev.jwt_leeway == CONF_UNSET as time_t {
                DEFAULT_JWT_LEEWAY
            } else {
                prev.jwt_leeway
            };
        }
        if self.jwt_role_claim.is_none() {
            self.jwt_role_claim = Some(
                prev.jwt_role_claim
                    .clone()
                    .unwrap_or_else(|| Rc::new(vec!["role".to_owned()])),
            );
        }
        if self.anonymous_role.is_none() {
            self.anonymous_role = prev.anonymous_role.clone();
        }
        merge_list(&mut self.settings, &prev.settings);
        if let (true, Some((_, at)), None) = (self.pass_set, &self.anonymous_role, &self.jwt) {
            return Err(ConfError::At(
                "\"sqldb_anonymous_role\" needs \"sqldb_jwt_key\"".to_owned(),
                at.clone(),
            ));
        }
        let bound = self.jwt.is_some() || !self.settings.is_empty();
        if let (true, Some(t)) = (bound, self.queries.iter().find(|t| t.several)) {
            return Err(ConfError::At("a query of several statements cannot run with \"sqldb_jwt_key\" or \"sqldb_setting\": the role and settings would not bind all of its statements (write one statement, or call a function)"
                .to_owned(), t.at.clone()));
        }
        if let (Some(_), Some((_, at))) = (&self.jwt, &self.listen) {
            return Err(ConfError::At(
                "\"sqldb_listen\" does not check the tokens of \"sqldb_jwt_key\"; put it in a location without it"
                    .to_owned(),
                at.clone(),
            ));
        }
        self.preamble = auth::PreambleSql::build(self.jwt.is_some(), self.settings.len()).map(Rc::new);
        Ok(())
    }
}

merge_conf_handler! {
    pub(crate) fn merge_loc_conf = "merge_loc_conf",
    |conf: Conf, prev: &LocConf, this: &mut LocConf| this.merge(prev, conf)
}
