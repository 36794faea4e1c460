//! Which gateway an upstream block belongs to. A gateway whose own lines
//! make a block (`sqldb_server`) owns it; the other gateway must not pass
//! requests to it. lib.rs hands each gateway the other's `OwnerOf`, so that
//! neither names the other.

use crate::ffi::ngx_http_upstream_srv_conf_t;

/// The gateway that owns a block, as its directives name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// The directive whose lines make the block (`sqldb_server`).
    pub server: &'static str,
    /// The directive that passes requests to it (`sqldb_pass`).
    pub pass: &'static str,
}

/// The owner of a block, when a gateway's own lines make it.
pub type OwnerOf = fn(&ngx_http_upstream_srv_conf_t) -> Option<Owner>;
