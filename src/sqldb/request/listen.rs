//! `sqldb_listen CHANNEL`: the request subscribes to a channel of the
//! upstream's listening connection (driver::listen) and gets each NOTIFY on
//! it as a server-sent event while it stays (crate::common::sse).

use gateway_core::sse as format;

use crate::common::sse::{self, Fanout, Refused};
use crate::ffi::*;
use crate::sqldb::config::{LocConf, Sqldb, SrvConf};

/// The fan-out of `sqldb_listen`'s events.
pub static FANOUT: Fanout = Fanout::new("sqldb_listen", 0, "sqldb_listen_buffers_max", "sqldb", || {
    <Sqldb as ngx::http::HttpModule>::module()
});

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
    sse::start(
        r,
        &channel,
        format::valid_channel,
        sse::Source {
            block,
            every: lcf.listen_heartbeat,
            buffers_max,
            retry: lcf.listen_retry,
        },
        &FANOUT,
        |_| srv.listener(&FANOUT),
    )
}
