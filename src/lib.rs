//! ngx_gateway: an nginx module that puts PostgreSQL (`sqldb_*`) and Redis
//! (`cache_*`) behind nginx locations.
//!
//! This file links the pieces into the nginx modules: their command tables
//! (each beside its handlers: `sqldb::config::Commands`,
//! `cache::config::Commands`, `status::COMMANDS`) and callbacks, and the
//! request side's entry points that the configuration installs.
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

use std::ptr;

use ffi::*;
use sqldb::config as sc;

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
    commands: ffi::conf::commands(sc::Commands::<SqldbEntries>::TABLE),
    type_: NGX_HTTP_MODULE as ngx_uint_t,
    init_module: Some(init_module),
    ..ngx_module_t::default()
};

impl ngx::http::HttpModule for sc::Sqldb {
    fn module() -> &'static ngx_module_t {
        // SAFETY: the module's static lives as long as the program; nginx
        // writes its indexes before any configuration is read, and nothing
        // writes it afterwards.
        unsafe { &*ptr::addr_of!(ngx_http_gateway_module) }
    }
}

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
    commands: ffi::conf::commands(cc::Commands::<CacheEntries>::TABLE),
    type_: NGX_HTTP_MODULE as ngx_uint_t,
    init_process: Some(cache::request::sentinel::init_process),
    ..ngx_module_t::default()
};

impl ngx::http::HttpModule for cc::Cache {
    fn module() -> &'static ngx_module_t {
        // SAFETY: as for the database gateway's module above.
        unsafe { &*ptr::addr_of!(ngx_http_gateway_cache_module) }
    }
}

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
    commands: ffi::conf::commands(status::COMMANDS),
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
