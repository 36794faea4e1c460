//! `sqldb_listen CHANNEL`: the request subscribes to a channel of the
//! upstream's listening connection (driver::listen) and gets each NOTIFY on
//! it as a server-sent event while it stays (crate::subscribe).

use std::ptr::NonNull;

use gateway_core::sse;

use crate::ffi::*;
use crate::sqldb::config::{LocConf, Sqldb, SrvConf};
use crate::sqldb::driver::Hub;
use crate::subscribe::{self, Refused};

/// Starts a subscription; what the content handler returns.
pub fn subscribe(
    r: &mut Req,
    lcf: &LocConf,
    block: *mut ngx_http_upstream_srv_conf_t,
    srv: &mut SrvConf,
) -> Result<ngx_int_t, Refused> {
    let Some((cv, _)) = &lcf.listen else {
        return Err(Refused::Nginx);
    };
    let channel = r.complex_value(*cv).ok_or(Refused::Nginx)?.to_vec();
    let buffers_max = r.main_conf::<Sqldb>().listen_buffers_max;
    subscribe::start(
        r,
        &channel,
        sse::valid_channel,
        subscribe::Source {
            block,
            every: lcf.listen_heartbeat,
            buffers_max,
        },
        &subscribe::SQLDB,
        |_| srv.listener(&subscribe::SQLDB).map(|l| l as NonNull<dyn Hub>),
    )
}
