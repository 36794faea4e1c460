//! ngx_gateway: an nginx module that puts PostgreSQL (`sqldb_*`) and Redis
//! (`cache_*`) behind nginx locations.
//!
//! This file links the pieces into the two nginx modules: their directives
//! and callbacks (from `sqldb::config`, `cache::config`), and the request
//! side's entry points that the configuration installs.
//!
//! Layout, each part using only those below it:
//! - `ffi`: raw nginx pointers turned into safe types, once.
//! - `common`: what both gateways use (request tokens, subscription hubs
//!   and their server-sent events, upstream ownership).
//! - `sqldb::driver`, `cache::driver`: connections to PostgreSQL (libpq on
//!   nginx's events) and to Redis, and the routing of their replies; they
//!   know requests only as tokens.
//! - `sqldb::config`, `cache::config`: what the directives build.
//! - `sqldb::request`, `cache::request`: requests, from the content handler
//!   to the response.
//!
//! `sqldb` and `cache` import nothing from each other: this file links
//! them where one must know of the other (content handlers a location
//! cannot have together, upstream blocks one of them owns).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

#[macro_use]
pub mod ffi;
pub mod cache;
pub mod common;
pub mod metrics;
pub mod sqldb;
pub mod status;

use std::mem::offset_of;
use std::ptr;

use ffi::conf::command;
use ffi::*;
use sqldb::config as sc;

const LOC_ANY: u32 = NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF;
const LOC: usize = NGX_HTTP_LOC_CONF_OFFSET;
const SRV: usize = NGX_HTTP_SRV_CONF_OFFSET;

/// The database gateway's entry points, for its configuration.
struct SqldbEntries;

impl sc::Entries for SqldbEntries {
    const CONTENT: ngx_http_handler_pt = Some(sqldb::request::content_handler);
    const PEER_INIT: ngx_http_upstream_init_peer_pt = Some(sqldb::request::peer_init);
    const CLAIM: ngx_http_get_variable_pt = Some(sqldb::request::claim_variable);
    const OTHERS: &'static [(ngx_http_handler_pt, &'static str)] = &[(Some(cache::content_handler), "\"cache_pass\"")];
}

/// The cache gateway's entry points, for its configuration.
struct CacheEntries;

impl cache::config::Entries for CacheEntries {
    const OWNER_OF: common::upstream::OwnerOf = sqldb::config::upstream::owner_of;
    const CONTENT: ngx_http_handler_pt = Some(cache::content_handler);
    const PEER_INIT: ngx_http_upstream_init_peer_pt = Some(cache::request::balancer::init_peer);
    const SENTINEL_PEER_INIT: ngx_http_upstream_init_peer_pt = Some(cache::request::sentinel::init_peer);
    const OTHERS: &'static [(ngx_http_handler_pt, &'static str)] =
        &[(Some(sqldb::request::content_handler), "\"sqldb_pass\"")];
}

static mut SQLDB_COMMANDS: [ngx_command_t; 28] = [
    command(
        "sqldb_server\0",
        NGX_HTTP_UPS_CONF | NGX_CONF_1MORE,
        sc::upstream::cmd_sqldb_server,
        SRV,
        0,
    ),
    command(
        "sqldb_pass\0",
        NGX_HTTP_LOC_CONF | NGX_HTTP_LIF_CONF | NGX_CONF_TAKE1,
        sc::directives::cmd_sqldb_pass::<SqldbEntries>,
        LOC,
        0,
    ),
    command(
        "sqldb_query\0",
        LOC_ANY | NGX_HTTP_LIF_CONF | NGX_CONF_1MORE,
        sc::directives::cmd_sqldb_query,
        LOC,
        0,
    ),
    command(
        "sqldb_target\0",
        LOC_ANY | NGX_HTTP_LIF_CONF | NGX_CONF_1MORE,
        sc::directives::cmd_sqldb_target,
        LOC,
        0,
    ),
    command(
        "sqldb_connect_timeout\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ffi::conf::set_timeout_slot,
        LOC,
        offset_of!(sc::LocConf, connect_timeout),
    ),
    command(
        "sqldb_result_timeout\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ffi::conf::set_timeout_slot,
        LOC,
        offset_of!(sc::LocConf, result_timeout),
    ),
    command(
        "sqldb_listen\0",
        NGX_HTTP_LOC_CONF | NGX_HTTP_LIF_CONF | NGX_CONF_TAKE1,
        sc::directives::cmd_sqldb_listen,
        LOC,
        0,
    ),
    command(
        "sqldb_listen_heartbeat\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ffi::conf::set_timeout_slot,
        LOC,
        offset_of!(sc::LocConf, listen_heartbeat),
    ),
    command(
        "sqldb_listen_replay\0",
        NGX_HTTP_LOC_CONF | NGX_HTTP_LIF_CONF | NGX_CONF_TAKE1,
        sc::replay::cmd_sqldb_listen_replay,
        LOC,
        0,
    ),
    command(
        "sqldb_listen_retry\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ffi::conf::set_timeout_slot,
        LOC,
        offset_of!(sc::LocConf, listen_retry),
    ),
    command(
        "sqldb_listen_buffers_max\0",
        NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1,
        ffi::conf::set_size_slot,
        NGX_HTTP_MAIN_CONF_OFFSET,
        offset_of!(sc::MainConf, listen_buffers_max),
    ),
    command(
        "sqldb_keepalive\0",
        NGX_HTTP_UPS_CONF | NGX_CONF_1MORE,
        sc::upstream::cmd_sqldb_keepalive,
        SRV,
        0,
    ),
    command(
        "sqldb_pipeline\0",
        NGX_HTTP_UPS_CONF | NGX_CONF_TAKE123,
        sc::upstream::cmd_sqldb_pipeline,
        SRV,
        0,
    ),
    command(
        "sqldb_keep_role\0",
        NGX_HTTP_UPS_CONF | NGX_CONF_TAKE1,
        sc::upstream::cmd_sqldb_keep_role,
        SRV,
        0,
    ),
    command(
        "sqldb_output\0",
        LOC_ANY | NGX_HTTP_LIF_CONF | NGX_CONF_TAKE1,
        sc::directives::cmd_sqldb_output,
        LOC,
        0,
    ),
    command(
        "sqldb_set\0",
        LOC_ANY | NGX_CONF_TAKE3 | NGX_CONF_TAKE4,
        sc::directives::cmd_sqldb_set,
        LOC,
        0,
    ),
    command(
        "sqldb_rewrite\0",
        LOC_ANY | NGX_HTTP_LIF_CONF | NGX_CONF_2MORE,
        sc::directives::cmd_sqldb_rewrite,
        LOC,
        0,
    ),
    command(
        "sqldb_escape\0",
        LOC_ANY | NGX_CONF_TAKE12,
        sc::directives::cmd_sqldb_escape,
        LOC,
        0,
    ),
    command(
        "sqldb_stream\0",
        LOC_ANY | NGX_CONF_FLAG,
        ngx_conf_set_flag_slot,
        LOC,
        offset_of!(sc::LocConf, stream),
    ),
    command(
        "sqldb_stream_connections\0",
        LOC_ANY | NGX_CONF_TAKE1,
        sc::directives::cmd_sqldb_stream_connections,
        LOC,
        0,
    ),
    command(
        "sqldb_prepare\0",
        LOC_ANY | NGX_CONF_FLAG,
        ngx_conf_set_flag_slot,
        LOC,
        offset_of!(sc::LocConf, prepare),
    ),
    command(
        "sqldb_next_upstream\0",
        LOC_ANY | NGX_CONF_1MORE,
        sc::directives::cmd_sqldb_next_upstream,
        LOC,
        0,
    ),
    command(
        "sqldb_jwt_key\0",
        LOC_ANY | NGX_CONF_TAKE12,
        sc::auth::cmd_sqldb_jwt_key,
        LOC,
        0,
    ),
    command(
        "sqldb_jwt_leeway\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ngx_conf_set_sec_slot,
        LOC,
        offset_of!(sc::LocConf, jwt_leeway),
    ),
    command(
        "sqldb_jwt_role_claim\0",
        LOC_ANY | NGX_CONF_TAKE1,
        sc::auth::cmd_sqldb_jwt_role_claim,
        LOC,
        0,
    ),
    command(
        "sqldb_anonymous_role\0",
        LOC_ANY | NGX_CONF_TAKE1,
        sc::auth::cmd_sqldb_anonymous_role,
        LOC,
        0,
    ),
    command(
        "sqldb_setting\0",
        LOC_ANY | NGX_CONF_TAKE2,
        sc::auth::cmd_sqldb_setting,
        LOC,
        0,
    ),
    ngx_command_t::empty(),
];

static SQLDB_CTX: ngx_http_module_t = ngx_http_module_t {
    preconfiguration: Some(sc::upstream::preconfiguration::<SqldbEntries>),
    postconfiguration: Some(sc::upstream::postconfiguration::<SqldbEntries>),
    create_main_conf: Some(sc::create_main_conf),
    init_main_conf: None,
    create_srv_conf: Some(sc::create_srv_conf),
    merge_srv_conf: None,
    create_loc_conf: Some(sc::create_loc_conf),
    merge_loc_conf: Some(sc::merge_loc_conf),
};

#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_http_gateway_module: ngx_module_t = ngx_module_t {
    ctx: ptr::addr_of!(SQLDB_CTX) as *mut _,
    commands: ptr::addr_of_mut!(SQLDB_COMMANDS) as *mut _,
    type_: NGX_HTTP_MODULE as ngx_uint_t,
    init_module: Some(init_module),
    ..ngx_module_t::default()
};

cycle_handler! {
    /// Says which module this is, once per configuration loaded (start-up
    /// and each reload), at notice level as nginx says its own version.
    fn init_module(_cycle, log) = "init_module", {
        log!(
            NGX_LOG_NOTICE,
            log,
            "ngx_gateway/{} (built for nginx {})",
            env!("CARGO_PKG_VERSION"),
            NGINX_VERSION.to_string_lossy()
        );
        OK
    }
}

use cache::config as cc;

static mut CACHE_COMMANDS: [ngx_command_t; 33] = [
    command(
        "cache_pass\0",
        NGX_HTTP_LOC_CONF | NGX_HTTP_LIF_CONF | NGX_CONF_TAKE1,
        cc::cmd_cache_pass::<CacheEntries>,
        LOC,
        0,
    ),
    command("cache_auth\0", LOC_ANY | NGX_CONF_TAKE1, cc::cmd_cache_auth, LOC, 0),
    command(
        "cache_subscribe\0",
        NGX_HTTP_LOC_CONF | NGX_CONF_TAKE1,
        cc::cmd_cache_subscribe,
        LOC,
        0,
    ),
    command(
        "cache_subscribe_heartbeat\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ffi::conf::set_timeout_slot,
        LOC,
        offset_of!(cc::CacheLocConf, subscribe_heartbeat),
    ),
    command(
        "cache_subscribe_retry\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ffi::conf::set_timeout_slot,
        LOC,
        offset_of!(cc::CacheLocConf, subscribe_retry),
    ),
    command(
        "cache_subscribe_buffers_max\0",
        NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1,
        ffi::conf::set_size_slot,
        NGX_HTTP_MAIN_CONF_OFFSET,
        offset_of!(cc::CacheMainConf, subscribe_buffers_max),
    ),
    command(
        "cache_publish\0",
        NGX_HTTP_LOC_CONF | NGX_CONF_TAKE1,
        cc::cmd_cache_publish,
        LOC,
        0,
    ),
    command(
        "cache_stream\0",
        NGX_HTTP_LOC_CONF | NGX_CONF_TAKE1,
        cc::cmd_cache_stream,
        LOC,
        0,
    ),
    command(
        "cache_stream_add\0",
        NGX_HTTP_LOC_CONF | NGX_CONF_TAKE12,
        cc::cmd_cache_stream_add,
        LOC,
        0,
    ),
    command(
        "cache_connect_timeout\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ffi::conf::set_timeout_slot,
        LOC,
        offset_of!(cc::CacheLocConf, upstream.connect_timeout),
    ),
    command(
        "cache_send_timeout\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ffi::conf::set_timeout_slot,
        LOC,
        offset_of!(cc::CacheLocConf, upstream.send_timeout),
    ),
    command(
        "cache_read_timeout\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ffi::conf::set_timeout_slot,
        LOC,
        offset_of!(cc::CacheLocConf, upstream.read_timeout),
    ),
    command(
        "cache_buffer_size\0",
        LOC_ANY | NGX_CONF_TAKE1,
        cc::cmd_cache_buffer_size,
        LOC,
        0,
    ),
    command(
        "cache_next_upstream\0",
        LOC_ANY | NGX_CONF_1MORE,
        cc::cmd_cache_next_upstream,
        LOC,
        0,
    ),
    command(
        "cache_cluster\0",
        NGX_HTTP_UPS_CONF | NGX_CONF_TAKE1,
        cc::cluster::cmd_cache_cluster::<CacheEntries>,
        NGX_HTTP_MAIN_CONF_OFFSET,
        0,
    ),
    command(
        "cache_sentinel\0",
        NGX_HTTP_UPS_CONF | NGX_CONF_TAKE1,
        cc::sentinel::cmd_cache_sentinel::<CacheEntries>,
        NGX_HTTP_MAIN_CONF_OFFSET,
        0,
    ),
    command(
        "cache_sentinel_auth\0",
        NGX_HTTP_UPS_CONF | NGX_CONF_TAKE1,
        cc::sentinel::cmd_cache_sentinel_auth,
        NGX_HTTP_MAIN_CONF_OFFSET,
        0,
    ),
    command(
        "cache_target\0",
        LOC_ANY | NGX_CONF_TAKE1,
        cc::target::cmd_cache_target,
        LOC,
        0,
    ),
    command(
        "cache_replica_max_lag\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ffi::conf::set_timeout_slot,
        LOC,
        offset_of!(cc::CacheLocConf, replica_max_lag),
    ),
    command(
        "cache_pipeline\0",
        LOC_ANY | NGX_CONF_FLAG,
        ngx_conf_set_flag_slot,
        LOC,
        offset_of!(cc::CacheLocConf, pipeline),
    ),
    command(
        "cache_escape_key\0",
        LOC_ANY | NGX_CONF_FLAG,
        ngx_conf_set_flag_slot,
        LOC,
        offset_of!(cc::CacheLocConf, escape_key),
    ),
    command(
        "cache_gzip_flag\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ngx_conf_set_num_slot,
        LOC,
        offset_of!(cc::CacheLocConf, gzip_flag),
    ),
    command(
        "cache_socket_keepalive\0",
        LOC_ANY | NGX_CONF_FLAG,
        ngx_conf_set_flag_slot,
        LOC,
        offset_of!(cc::CacheLocConf, upstream.socket_keepalive),
    ),
    command(
        "cache_ssl\0",
        LOC_ANY | NGX_CONF_FLAG,
        ngx_conf_set_flag_slot,
        LOC,
        offset_of!(cc::CacheLocConf, ssl),
    ),
    command(
        "cache_ssl_verify\0",
        LOC_ANY | NGX_CONF_FLAG,
        cc::cmd_cache_ssl_verify,
        LOC,
        0,
    ),
    command(
        "cache_ssl_verify_depth\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ngx_conf_set_num_slot,
        LOC,
        offset_of!(cc::CacheLocConf, ssl_verify_depth),
    ),
    command(
        "cache_ssl_trusted_certificate\0",
        LOC_ANY | NGX_CONF_TAKE1,
        cc::cmd_cache_ssl_trusted_certificate,
        LOC,
        0,
    ),
    command(
        "cache_ssl_name\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ngx_http_set_complex_value_slot,
        LOC,
        offset_of!(cc::CacheLocConf, upstream.ssl_name),
    ),
    command(
        "cache_ssl_server_name\0",
        LOC_ANY | NGX_CONF_FLAG,
        ngx_conf_set_flag_slot,
        LOC,
        offset_of!(cc::CacheLocConf, upstream.ssl_server_name),
    ),
    command(
        "cache_ssl_certificate\0",
        LOC_ANY | NGX_CONF_TAKE1,
        cc::cmd_cache_ssl_certificate,
        LOC,
        0,
    ),
    command(
        "cache_ssl_certificate_key\0",
        LOC_ANY | NGX_CONF_TAKE1,
        cc::cmd_cache_ssl_certificate_key,
        LOC,
        0,
    ),
    command(
        "cache_ssl_session_reuse\0",
        LOC_ANY | NGX_CONF_FLAG,
        ngx_conf_set_flag_slot,
        LOC,
        offset_of!(cc::CacheLocConf, upstream.ssl_session_reuse),
    ),
    ngx_command_t::empty(),
];

static CACHE_CTX: ngx_http_module_t = ngx_http_module_t {
    preconfiguration: None,
    postconfiguration: Some(cc::postconfiguration),
    create_main_conf: Some(cc::create_main_conf::<CacheEntries>),
    init_main_conf: None,
    create_srv_conf: None,
    merge_srv_conf: None,
    create_loc_conf: Some(cc::create_loc_conf),
    merge_loc_conf: Some(cc::merge_loc_conf),
};

#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_http_gateway_cache_module: ngx_module_t = ngx_module_t {
    ctx: ptr::addr_of!(CACHE_CTX) as *mut _,
    commands: ptr::addr_of_mut!(CACHE_COMMANDS) as *mut _,
    type_: NGX_HTTP_MODULE as ngx_uint_t,
    init_process: Some(cache::request::sentinel::init_process),
    ..ngx_module_t::default()
};

static mut STATUS_COMMANDS: [ngx_command_t; 2] = [
    command(
        "gateway_status\0",
        NGX_HTTP_LOC_CONF | NGX_CONF_NOARGS,
        status::cmd_gateway_status,
        LOC,
        0,
    ),
    ngx_command_t::empty(),
];

static STATUS_CTX: ngx_http_module_t = ngx_http_module_t {
    preconfiguration: None,
    postconfiguration: Some(status::postconfiguration),
    create_main_conf: None,
    init_main_conf: None,
    create_srv_conf: None,
    merge_srv_conf: None,
    create_loc_conf: Some(status::create_loc_conf),
    merge_loc_conf: None,
};

/// The metrics (`gateway_status` and the shared zone behind it).
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_http_gateway_status_module: ngx_module_t = ngx_module_t {
    ctx: ptr::addr_of!(STATUS_CTX) as *mut _,
    commands: ptr::addr_of_mut!(STATUS_COMMANDS) as *mut _,
    type_: NGX_HTTP_MODULE as ngx_uint_t,
    init_process: Some(status::init_process),
    ..ngx_module_t::default()
};

// What load_module reads: the modules of this object, their names, no order.
// (ngx's ngx_modules! macro miscounts more than one module.)
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_modules: [*const ngx_module_t; 4] = [
    ptr::addr_of!(ngx_http_gateway_module),
    ptr::addr_of!(ngx_http_gateway_cache_module),
    ptr::addr_of!(ngx_http_gateway_status_module),
    ptr::null(),
];

#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_module_names: [*const std::ffi::c_char; 4] = [
    c"ngx_http_gateway_module".as_ptr(),
    c"ngx_http_gateway_cache_module".as_ptr(),
    c"ngx_http_gateway_status_module".as_ptr(),
    ptr::null(),
];

#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_module_order: [*const std::ffi::c_char; 1] = [ptr::null()];
