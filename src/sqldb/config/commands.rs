//! The database gateway's directives as nginx reads them: the command
//! table of its module (`ngx_http_gateway_module`, which lib.rs defines),
//! beside the handlers it names.

use std::marker::PhantomData;
use std::mem::offset_of;

use super::{auth, directives, replay, upstream, Entries, LocConf, MainConf};
use crate::ffi::conf::{command, set_size_slot, set_timeout_slot, LOC, LOC_ANY, SRV};
use crate::ffi::*;

/// The command table, with the request side's entry points `E`.
pub struct Commands<E>(PhantomData<E>);

impl<E: Entries> Commands<E> {
    /// Every directive, then the null command that ends nginx's tables
    /// (`ffi::conf::commands` checks it is there).
    pub const TABLE: &'static [ngx_command_t] = &[
        command(
            "sqldb_server\0",
            NGX_HTTP_UPS_CONF | NGX_CONF_1MORE,
            upstream::cmd_sqldb_server,
            SRV,
            0,
        ),
        command(
            "sqldb_pass\0",
            NGX_HTTP_LOC_CONF | NGX_HTTP_LIF_CONF | NGX_CONF_TAKE1,
            directives::cmd_sqldb_pass::<E>,
            LOC,
            0,
        ),
        command(
            "sqldb_query\0",
            LOC_ANY | NGX_HTTP_LIF_CONF | NGX_CONF_1MORE,
            directives::cmd_sqldb_query,
            LOC,
            0,
        ),
        command(
            "sqldb_target\0",
            LOC_ANY | NGX_HTTP_LIF_CONF | NGX_CONF_1MORE,
            directives::cmd_sqldb_target,
            LOC,
            0,
        ),
        command(
            "sqldb_connect_timeout\0",
            LOC_ANY | NGX_CONF_TAKE1,
            set_timeout_slot,
            LOC,
            offset_of!(LocConf, connect_timeout),
        ),
        command(
            "sqldb_result_timeout\0",
            LOC_ANY | NGX_CONF_TAKE1,
            set_timeout_slot,
            LOC,
            offset_of!(LocConf, result_timeout),
        ),
        command(
            "sqldb_listen\0",
            NGX_HTTP_LOC_CONF | NGX_HTTP_LIF_CONF | NGX_CONF_TAKE1,
            directives::cmd_sqldb_listen,
            LOC,
            0,
        ),
        command(
            "sqldb_listen_heartbeat\0",
            LOC_ANY | NGX_CONF_TAKE1,
            set_timeout_slot,
            LOC,
            offset_of!(LocConf, listen_heartbeat),
        ),
        command(
            "sqldb_listen_replay\0",
            NGX_HTTP_LOC_CONF | NGX_HTTP_LIF_CONF | NGX_CONF_TAKE1,
            replay::cmd_sqldb_listen_replay,
            LOC,
            0,
        ),
        command(
            "sqldb_listen_retry\0",
            LOC_ANY | NGX_CONF_TAKE1,
            set_timeout_slot,
            LOC,
            offset_of!(LocConf, listen_retry),
        ),
        command(
            "sqldb_listen_buffers_max\0",
            NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1,
            set_size_slot,
            NGX_HTTP_MAIN_CONF_OFFSET,
            offset_of!(MainConf, listen_buffers_max),
        ),
        command(
            "sqldb_keepalive\0",
            NGX_HTTP_UPS_CONF | NGX_CONF_1MORE,
            upstream::cmd_sqldb_keepalive,
            SRV,
            0,
        ),
        command(
            "sqldb_pipeline\0",
            NGX_HTTP_UPS_CONF | NGX_CONF_TAKE123,
            upstream::cmd_sqldb_pipeline,
            SRV,
            0,
        ),
        command(
            "sqldb_keep_role\0",
            NGX_HTTP_UPS_CONF | NGX_CONF_TAKE1,
            upstream::cmd_sqldb_keep_role,
            SRV,
            0,
        ),
        command(
            "sqldb_output\0",
            LOC_ANY | NGX_HTTP_LIF_CONF | NGX_CONF_TAKE1,
            directives::cmd_sqldb_output,
            LOC,
            0,
        ),
        command(
            "sqldb_set\0",
            LOC_ANY | NGX_CONF_TAKE3 | NGX_CONF_TAKE4,
            directives::cmd_sqldb_set,
            LOC,
            0,
        ),
        command(
            "sqldb_rewrite\0",
            LOC_ANY | NGX_HTTP_LIF_CONF | NGX_CONF_2MORE,
            directives::cmd_sqldb_rewrite,
            LOC,
            0,
        ),
        command(
            "sqldb_escape\0",
            LOC_ANY | NGX_CONF_TAKE12,
            directives::cmd_sqldb_escape,
            LOC,
            0,
        ),
        command(
            "sqldb_stream\0",
            LOC_ANY | NGX_CONF_FLAG,
            ngx_conf_set_flag_slot,
            LOC,
            offset_of!(LocConf, stream),
        ),
        command(
            "sqldb_stream_connections\0",
            LOC_ANY | NGX_CONF_TAKE1,
            directives::cmd_sqldb_stream_connections,
            LOC,
            0,
        ),
        command(
            "sqldb_prepare\0",
            LOC_ANY | NGX_CONF_FLAG,
            ngx_conf_set_flag_slot,
            LOC,
            offset_of!(LocConf, prepare),
        ),
        command(
            "sqldb_next_upstream\0",
            LOC_ANY | NGX_CONF_1MORE,
            directives::cmd_sqldb_next_upstream,
            LOC,
            0,
        ),
        command(
            "sqldb_jwt_key\0",
            LOC_ANY | NGX_CONF_TAKE12,
            auth::cmd_sqldb_jwt_key,
            LOC,
            0,
        ),
        command(
            "sqldb_jwt_leeway\0",
            LOC_ANY | NGX_CONF_TAKE1,
            ngx_conf_set_sec_slot,
            LOC,
            offset_of!(LocConf, jwt_leeway),
        ),
        command(
            "sqldb_jwt_role_claim\0",
            LOC_ANY | NGX_CONF_TAKE1,
            auth::cmd_sqldb_jwt_role_claim,
            LOC,
            0,
        ),
        command(
            "sqldb_anonymous_role\0",
            LOC_ANY | NGX_CONF_TAKE1,
            auth::cmd_sqldb_anonymous_role,
            LOC,
            0,
        ),
        command(
            "sqldb_setting\0",
            LOC_ANY | NGX_CONF_TAKE2,
            auth::cmd_sqldb_setting,
            LOC,
            0,
        ),
        ngx_command_t::empty(),
    ];
}
