//! ngx_gateway: an nginx module that puts PostgreSQL (`sqldb_*`) and Redis
//! (`cache_*`) behind nginx locations.

#[macro_use]
pub mod ffi;
pub mod cache;
pub mod sqldb;

use std::ptr;

use ffi::*;
use sqldb::conf as sc;

/// A directive; `name` ends with NUL because nginx compares names with strcmp.
pub(crate) const fn command(
    name: &'static str,
    type_: u32,
    set: unsafe extern "C" fn(*mut ngx_conf_t, *mut ngx_command_t, *mut std::ffi::c_void) -> *mut std::ffi::c_char,
    conf: usize,
    offset: usize,
) -> ngx_command_t {
    ngx_command_t {
        name: ngx_str_t {
            len: name.len() - 1,
            data: name.as_ptr() as *mut u8,
        },
        type_: type_ as ngx_uint_t,
        set: Some(set),
        conf: conf as ngx_uint_t,
        offset: offset as ngx_uint_t,
        post: ptr::null_mut(),
    }
}

const LOC_ANY: u32 = NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF;

static mut COMMANDS: [ngx_command_t; 15] = [
    command(
        "sqldb_server\0",
        NGX_HTTP_UPS_CONF | NGX_CONF_1MORE,
        sc::cmd_sqldb_server,
        NGX_HTTP_SRV_CONF_OFFSET,
        0,
    ),
    command(
        "sqldb_pass\0",
        NGX_HTTP_LOC_CONF | NGX_HTTP_LIF_CONF | NGX_CONF_TAKE1,
        sc::cmd_sqldb_pass,
        NGX_HTTP_LOC_CONF_OFFSET,
        0,
    ),
    command(
        "sqldb_query\0",
        LOC_ANY | NGX_HTTP_LIF_CONF | NGX_CONF_1MORE,
        sc::cmd_sqldb_query,
        NGX_HTTP_LOC_CONF_OFFSET,
        0,
    ),
    command(
        "sqldb_connect_timeout\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ngx_conf_set_msec_slot,
        NGX_HTTP_LOC_CONF_OFFSET,
        std::mem::offset_of!(sc::LocConf, connect_timeout),
    ),
    command(
        "sqldb_result_timeout\0",
        LOC_ANY | NGX_CONF_TAKE1,
        ngx_conf_set_msec_slot,
        NGX_HTTP_LOC_CONF_OFFSET,
        std::mem::offset_of!(sc::LocConf, result_timeout),
    ),
    command(
        "sqldb_keepalive\0",
        NGX_HTTP_UPS_CONF | NGX_CONF_1MORE,
        sc::cmd_sqldb_keepalive,
        NGX_HTTP_SRV_CONF_OFFSET,
        0,
    ),
    command(
        "sqldb_pipeline\0",
        NGX_HTTP_UPS_CONF | NGX_CONF_TAKE1,
        sc::cmd_sqldb_pipeline,
        NGX_HTTP_SRV_CONF_OFFSET,
        0,
    ),
    command(
        "sqldb_output\0",
        LOC_ANY | NGX_HTTP_LIF_CONF | NGX_CONF_TAKE1,
        sc::cmd_sqldb_output,
        NGX_HTTP_LOC_CONF_OFFSET,
        0,
    ),
    command(
        "sqldb_set\0",
        LOC_ANY | NGX_CONF_TAKE3 | NGX_CONF_TAKE4,
        sqldb::vars::cmd_sqldb_set,
        NGX_HTTP_LOC_CONF_OFFSET,
        0,
    ),
    command(
        "sqldb_rewrite\0",
        LOC_ANY | NGX_HTTP_LIF_CONF | NGX_CONF_2MORE,
        sqldb::vars::cmd_sqldb_rewrite,
        NGX_HTTP_LOC_CONF_OFFSET,
        0,
    ),
    command(
        "sqldb_escape\0",
        LOC_ANY | NGX_CONF_TAKE12,
        sqldb::vars::cmd_sqldb_escape,
        NGX_HTTP_LOC_CONF_OFFSET,
        0,
    ),
    command(
        "sqldb_stream\0",
        LOC_ANY | NGX_CONF_FLAG,
        ngx_conf_set_flag_slot,
        NGX_HTTP_LOC_CONF_OFFSET,
        std::mem::offset_of!(sc::LocConf, stream),
    ),
    command(
        "sqldb_prepare\0",
        LOC_ANY | NGX_CONF_FLAG,
        ngx_conf_set_flag_slot,
        NGX_HTTP_LOC_CONF_OFFSET,
        std::mem::offset_of!(sc::LocConf, prepare),
    ),
    command(
        "sqldb_next_upstream\0",
        LOC_ANY | NGX_CONF_1MORE,
        sc::cmd_sqldb_next_upstream,
        NGX_HTTP_LOC_CONF_OFFSET,
        0,
    ),
    ngx_command_t::empty(),
];

static CTX: ngx_http_module_t = ngx_http_module_t {
    preconfiguration: Some(sqldb::vars::preconfiguration),
    postconfiguration: Some(sc::postconfiguration),
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
    ctx: ptr::addr_of!(CTX) as *mut _,
    commands: ptr::addr_of_mut!(COMMANDS) as *mut _,
    type_: NGX_HTTP_MODULE as ngx_uint_t,
    ..ngx_module_t::default()
};

pub use cache::ngx_http_gateway_cache_module;

// What load_module reads: the modules of this object, their names, no order.
// (ngx's ngx_modules! macro miscounts more than one module.)
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_modules: [*const ngx_module_t; 3] = [
    ptr::addr_of!(ngx_http_gateway_module),
    ptr::addr_of!(ngx_http_gateway_cache_module),
    ptr::null(),
];

#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_module_names: [*const std::ffi::c_char; 3] = [
    c"ngx_http_gateway_module".as_ptr(),
    c"ngx_http_gateway_cache_module".as_ptr(),
    ptr::null(),
];

#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_module_order: [*const std::ffi::c_char; 1] = [ptr::null()];
