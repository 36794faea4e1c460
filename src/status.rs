//! `gateway_status`: the gateway's metrics, summed over every worker, as
//! Prometheus text (exposition format 0.0.4) or, with `?format=json`, as
//! JSON. The series live in a shared memory zone (core's metrics table),
//! which every worker updates in place and which outlives reloads.

use gateway_core::metrics::{Memo, SLOT_SIZE};
use std::cell::RefCell;

use crate::ffi::conf::{command, ConfError, LOC};
use crate::ffi::shm;
use crate::ffi::*;
use crate::metrics::{table, SeriesKey};

/// Series the zone holds (about 140 bytes each, a megabyte in all).
const SLOTS: usize = 7000;
/// The zone: the slots and the slab allocator's own pages.
const ZONE_SIZE: usize = SLOTS * SLOT_SIZE + 64 * 1024;
const ZONE_NAME: &str = "ngx_gateway_metrics";

/// The location configuration: `gateway_status` given.
pub struct StatusLocConf {
    on: bool,
}

create_conf_handler! {
    pub(crate) fn create_loc_conf = "status create_loc_conf",
    || StatusLocConf { on: false }
}

directive_handler! {
    /// `gateway_status;`
    pub(crate) fn cmd_gateway_status = "cmd_gateway_status",
    |cf: Conf, lcf: &mut StatusLocConf| {
        if lcf.on {
            return Err(crate::ffi::conf::duplicate("gateway_status"));
        }
        lcf.on = true;
        cf.claim_content_handler("gateway_status", Some(content_handler), &[])
            .map_err(|_| ConfError::Logged)?;
        Ok(())
    }
}

/// The command table of `ngx_http_gateway_status_module`, then the null
/// command that ends nginx's tables.
pub const COMMANDS: &[ngx_command_t] = &[
    command(
        "gateway_status\0",
        NGX_HTTP_LOC_CONF | NGX_CONF_NOARGS,
        cmd_gateway_status,
        LOC,
        0,
    ),
    ngx_command_t::empty(),
];

conf_step_handler! {
    /// Declares the zone (each configuration read; nginx keeps the old one's
    /// memory when name, size and module are the same).
    pub(crate) fn postconfiguration = "status postconfiguration",
    |c: Conf| {
        let tag = std::ptr::addr_of!(crate::ngx_http_gateway_status_module);
        shm::add_zeroed_zone::<{ SLOTS * SLOT_SIZE }>(c, ZONE_NAME, ZONE_SIZE, tag)?;
        c.add_phase_handler(ngx_http_phases_NGX_HTTP_LOG_PHASE, Some(log_handler))
    }
}

cycle_handler! {
    /// Each worker (or the single process) takes the table of its own
    /// cycle's zone: a zone of a reload that failed is never used.
    pub(crate) fn init_process(cycle, _log) = "status init_process", {
        let tag = std::ptr::addr_of!(crate::ngx_http_gateway_status_module);
        if let Some(data) = shm::zone_data(cycle, tag) {
            crate::metrics::set_table(data.cast(), SLOTS);
        }
        OK
    }
}

request_handler! {
    /// GET (or HEAD) the metrics.
    fn content_handler(r) -> ngx_int_t = ("status content handler", HTTP_INTERNAL_SERVER_ERROR) {
        if r.method() & (NGX_HTTP_GET | NGX_HTTP_HEAD) == 0 {
            return HTTP_NOT_ALLOWED;
        }
        let rc = r.discard_body();
        if rc != OK {
            return rc;
        }
        let Some(t) = table() else {
            return HTTP_INTERNAL_SERVER_ERROR;
        };
        let json = r.args().split(|b| *b == b'&').any(|a| a == b"format=json");
        let (body, ctype) = if json {
            (t.json().into_bytes(), "application/json")
        } else {
            (t.prometheus().into_bytes(), "text/plain; version=0.0.4; charset=utf-8")
        };
        r.set_content_type(ctype);
        r.send_body(200, body)
    }
}

request_handler! {
    /// Counts each request of the two gateways once it is done (nginx's log
    /// phase: main requests, and subrequests with `log_subrequest on`), by
    /// its final status, with `$upstream_response_time` as its duration.
    fn log_handler(r) -> ngx_int_t = ("status log handler", OK) {
        count(r);
        OK
    }
}

thread_local! {
    /// The series this worker has counted before, by (upstream, status,
    /// command): a request then builds no label strings.
    static KNOWN: RefCell<Memo<SeriesKey>> = RefCell::new(Memo::default());
}

/// Counts a request of either gateway in its own series: the gateway that
/// served it says what they are.
fn count(r: &mut Req) {
    let Some(t) = table() else { return };
    let sqldb = std::ptr::addr_of!(crate::ngx_http_gateway_module);
    let cache = std::ptr::addr_of!(crate::ngx_http_gateway_cache_module);
    // The upstream tells which gateway served the request, also after an
    // error_page sent it to another location; a request that ended before
    // it had one (400, 405, ...) is told by its location's handler.
    let (module, block) = match r.upstream_ref() {
        Some(u) if u.tag() == sqldb || u.tag() == cache => (u.tag(), u.name_key()),
        // (An upstream made but not set up yet: a request refused before.)
        _ => {
            let h = r.core_loc_conf().handler.map_or(0, |f| f as usize);
            if h == crate::sqldb::request::content_handler as *const () as usize {
                (sqldb, 0)
            } else if h == crate::cache::content_handler as *const () as usize {
                (cache, 0)
            } else {
                return;
            }
        }
    };
    KNOWN.with_borrow_mut(|known| {
        if module == sqldb {
            crate::sqldb::request::count_request(r, t, known, block);
        } else {
            crate::cache::request::count_request(r, t, known, block);
        }
    });
}
