//! The cache gateway's directives as nginx reads them: the command table
//! of its module (`ngx_http_gateway_cache_module`, which lib.rs defines),
//! beside the handlers it names.

use std::marker::PhantomData;
use std::mem::offset_of;

use super::*;
use crate::ffi::conf::{command, set_size_slot, set_timeout_slot, LOC, LOC_ANY};

/// The command table, with the request side's entry points `E`.
pub struct Commands<E>(PhantomData<E>);

impl<E: Entries> Commands<E> {
    /// Every directive, then the null command that ends nginx's tables
    /// (`ffi::conf::commands` checks it is there).
    pub const TABLE: &'static [ngx_command_t] = &[
        command(
            "cache_pass\0",
            NGX_HTTP_LOC_CONF | NGX_HTTP_LIF_CONF | NGX_CONF_TAKE1,
            cmd_cache_pass::<E>,
            LOC,
            0,
        ),
        command("cache_auth\0", LOC_ANY | NGX_CONF_TAKE1, cmd_cache_auth, LOC, 0),
        command(
            "cache_subscribe\0",
            NGX_HTTP_LOC_CONF | NGX_CONF_TAKE1,
            cmd_cache_subscribe,
            LOC,
            0,
        ),
        command(
            "cache_subscribe_heartbeat\0",
            LOC_ANY | NGX_CONF_TAKE1,
            set_timeout_slot,
            LOC,
            offset_of!(CacheLocConf, subscribe_heartbeat),
        ),
        command(
            "cache_subscribe_retry\0",
            LOC_ANY | NGX_CONF_TAKE1,
            set_timeout_slot,
            LOC,
            offset_of!(CacheLocConf, subscribe_retry),
        ),
        command(
            "cache_subscribe_buffers_max\0",
            NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1,
            set_size_slot,
            NGX_HTTP_MAIN_CONF_OFFSET,
            offset_of!(CacheMainConf, subscribe_buffers_max),
        ),
        command(
            "cache_publish\0",
            NGX_HTTP_LOC_CONF | NGX_CONF_TAKE1,
            cmd_cache_publish,
            LOC,
            0,
        ),
        command(
            "cache_stream\0",
            NGX_HTTP_LOC_CONF | NGX_CONF_TAKE1,
            cmd_cache_stream,
            LOC,
            0,
        ),
        command(
            "cache_stream_add\0",
            NGX_HTTP_LOC_CONF | NGX_CONF_TAKE12,
            cmd_cache_stream_add,
            LOC,
            0,
        ),
        command(
            "cache_connect_timeout\0",
            LOC_ANY | NGX_CONF_TAKE1,
            set_timeout_slot,
            LOC,
            offset_of!(CacheLocConf, upstream.connect_timeout),
        ),
        command(
            "cache_send_timeout\0",
            LOC_ANY | NGX_CONF_TAKE1,
            set_timeout_slot,
            LOC,
            offset_of!(CacheLocConf, upstream.send_timeout),
        ),
        command(
            "cache_read_timeout\0",
            LOC_ANY | NGX_CONF_TAKE1,
            set_timeout_slot,
            LOC,
            offset_of!(CacheLocConf, upstream.read_timeout),
        ),
        command(
            "cache_buffer_size\0",
            LOC_ANY | NGX_CONF_TAKE1,
            cmd_cache_buffer_size,
            LOC,
            0,
        ),
        command(
            "cache_next_upstream\0",
            LOC_ANY | NGX_CONF_1MORE,
            cmd_cache_next_upstream,
            LOC,
            0,
        ),
        command(
            "cache_cluster\0",
            NGX_HTTP_UPS_CONF | NGX_CONF_TAKE1,
            cluster::cmd_cache_cluster::<E>,
            NGX_HTTP_MAIN_CONF_OFFSET,
            0,
        ),
        command(
            "cache_sentinel\0",
            NGX_HTTP_UPS_CONF | NGX_CONF_TAKE1,
            sentinel::cmd_cache_sentinel::<E>,
            NGX_HTTP_MAIN_CONF_OFFSET,
            0,
        ),
        command(
            "cache_sentinel_auth\0",
            NGX_HTTP_UPS_CONF | NGX_CONF_TAKE1,
            sentinel::cmd_cache_sentinel_auth,
            NGX_HTTP_MAIN_CONF_OFFSET,
            0,
        ),
        command(
            "cache_target\0",
            LOC_ANY | NGX_CONF_TAKE1,
            target::cmd_cache_target,
            LOC,
            0,
        ),
        command(
            "cache_replica_max_lag\0",
            LOC_ANY | NGX_CONF_TAKE1,
            set_timeout_slot,
            LOC,
            offset_of!(CacheLocConf, replica_max_lag),
        ),
        command(
            "cache_pipeline\0",
            LOC_ANY | NGX_CONF_FLAG,
            ngx_conf_set_flag_slot,
            LOC,
            offset_of!(CacheLocConf, pipeline),
        ),
        command(
            "cache_escape_key\0",
            LOC_ANY | NGX_CONF_FLAG,
            ngx_conf_set_flag_slot,
            LOC,
            offset_of!(CacheLocConf, escape_key),
        ),
        command(
            "cache_gzip_flag\0",
            LOC_ANY | NGX_CONF_TAKE1,
            ngx_conf_set_num_slot,
            LOC,
            offset_of!(CacheLocConf, gzip_flag),
        ),
        command(
            "cache_socket_keepalive\0",
            LOC_ANY | NGX_CONF_FLAG,
            ngx_conf_set_flag_slot,
            LOC,
            offset_of!(CacheLocConf, upstream.socket_keepalive),
        ),
        command(
            "cache_ssl\0",
            LOC_ANY | NGX_CONF_FLAG,
            ngx_conf_set_flag_slot,
            LOC,
            offset_of!(CacheLocConf, ssl),
        ),
        command(
            "cache_ssl_verify\0",
            LOC_ANY | NGX_CONF_FLAG,
            cmd_cache_ssl_verify,
            LOC,
            0,
        ),
        command(
            "cache_ssl_verify_depth\0",
            LOC_ANY | NGX_CONF_TAKE1,
            ngx_conf_set_num_slot,
            LOC,
            offset_of!(CacheLocConf, ssl_verify_depth),
        ),
        command(
            "cache_ssl_trusted_certificate\0",
            LOC_ANY | NGX_CONF_TAKE1,
            cmd_cache_ssl_trusted_certificate,
            LOC,
            0,
        ),
        command(
            "cache_ssl_name\0",
            LOC_ANY | NGX_CONF_TAKE1,
            ngx_http_set_complex_value_slot,
            LOC,
            offset_of!(CacheLocConf, upstream.ssl_name),
        ),
        command(
            "cache_ssl_server_name\0",
            LOC_ANY | NGX_CONF_FLAG,
            ngx_conf_set_flag_slot,
            LOC,
            offset_of!(CacheLocConf, upstream.ssl_server_name),
        ),
        command(
            "cache_ssl_certificate\0",
            LOC_ANY | NGX_CONF_TAKE1,
            cmd_cache_ssl_certificate,
            LOC,
            0,
        ),
        command(
            "cache_ssl_certificate_key\0",
            LOC_ANY | NGX_CONF_TAKE1,
            cmd_cache_ssl_certificate_key,
            LOC,
            0,
        ),
        command(
            "cache_ssl_session_reuse\0",
            LOC_ANY | NGX_CONF_FLAG,
            ngx_conf_set_flag_slot,
            LOC,
            offset_of!(CacheLocConf, upstream.ssl_session_reuse),
        ),
        ngx_command_t::empty(),
    ];
}
