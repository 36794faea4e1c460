//! `gateway_status`: the gateway's metrics, summed over every worker, as
//! Prometheus text (exposition format 0.0.4) or, with `?format=json`, as
//! JSON. The series live in a shared memory zone (core's metrics table),
//! which every worker updates in place and which outlives reloads.

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use gateway_core::metrics::{Id, Slot, Table, SLOT_SIZE};

use crate::ffi::conf::{conf_step, create_conf, directive, ConfError};
use crate::ffi::*;

/// Series the zone holds (about 140 bytes each, a megabyte in all).
const SLOTS: usize = 7000;
/// The zone: the slots and the slab allocator's own pages.
const ZONE_SIZE: usize = SLOTS * SLOT_SIZE + 64 * 1024;
const ZONE_NAME: &str = "ngx_gateway_metrics";

/// The table in the zone, once nginx has mapped it (set in the master
/// before the workers start; each worker inherits it).
static TABLE: AtomicPtr<Slot> = AtomicPtr::new(std::ptr::null_mut());
static TABLE_LEN: AtomicUsize = AtomicUsize::new(0);

/// The metrics table every worker writes to (None outside an http block or
/// before nginx mapped the zone).
pub fn table() -> Option<Table<'static>> {
    let p = TABLE.load(Ordering::Acquire);
    let len = TABLE_LEN.load(Ordering::Acquire);
    if p.is_null() || len == 0 {
        return None;
    }
    // SAFETY: p points at `len` slots in shared memory that nginx maps
    // before any worker starts and unmaps only when the configuration that
    // made it is gone; slots are made of atomics, which any process may
    // read and write at once.
    Some(Table::new(unsafe { std::slice::from_raw_parts(p, len) }))
}

/// Adds `delta` to a counter or gauge.
pub fn add(id: Id, labels: &[&str], delta: i64) {
    if let Some(t) = table() {
        t.add(id, labels, delta);
    }
}

/// Records a duration (a histogram's observation).
pub fn observe(id: Id, labels: &[&str], since_ms: ngx_msec_t) {
    if let Some(t) = table() {
        let us = current_msec().saturating_sub(since_ms) as i64 * 1000;
        t.observe(id, labels, us);
    }
}

/// The location configuration: `gateway_status` given.
pub struct StatusLocConf {
    on: bool,
}

pub(crate) extern "C" fn create_loc_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: nginx passes the configuration being read.
    unsafe { create_conf(cf, "status create_loc_conf", || StatusLocConf { on: false }) }
}

/// `gateway_status;`
pub(crate) extern "C" fn cmd_gateway_status(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    let body = |cf: Conf, lcf: &mut StatusLocConf| {
        if lcf.on {
            return Err("\"gateway_status\" directive is duplicate".to_owned().into());
        }
        lcf.on = true;
        cf.claim_content_handler("gateway_status", Some(content_handler), &[])
            .map_err(|_| ConfError::Logged)?;
        Ok(())
    };
    // SAFETY: nginx passes the configuration being read and this module's
    // StatusLocConf (the directive's slot).
    unsafe { directive(cf, conf, "cmd_gateway_status", body) }
}

/// Declares the zone (each configuration read; nginx keeps the old one's
/// memory when name, size and module are the same).
pub(crate) extern "C" fn postconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
    let body = |c: Conf| {
        let mut name = c.pool().str(ZONE_NAME.as_bytes()).ok_or(ConfError::Logged)?;
        let tag = std::ptr::addr_of_mut!(crate::ngx_http_gateway_status_module).cast();
        let cfp = c.raw() as *const ngx_conf_t as *mut ngx_conf_t;
        // SAFETY: the configuration being read; name lives in its pool.
        let zone = unsafe { ngx_shared_memory_add(cfp, &mut name, ZONE_SIZE, tag) };
        // SAFETY: nginx returns a zone of this cycle's list, or null.
        let zone = unsafe { zone.as_mut() }.ok_or(ConfError::Logged)?;
        zone.init = Some(zone_init);
        Ok(())
    };
    // SAFETY: nginx passes the configuration being read.
    unsafe { conf_step(cf, "status postconfiguration", body) }
}

/// Sets the zone up once nginx has mapped it: a table of zeroed slots from
/// its slab allocator, or the one of the configuration before (a reload).
extern "C" fn zone_init(zone: *mut ngx_shm_zone_t, old: *mut c_void) -> ngx_int_t {
    // SAFETY: nginx passes the zone it mapped; its shm.addr starts with the
    // slab pool nginx set up in it.
    let zone = unsafe { &mut *zone };
    let log = Log::cycle();
    guard(log, "status zone_init", ERROR, || {
        let slots = if !old.is_null() {
            old
        } else {
            let shpool = zone.shm.addr as *mut ngx_slab_pool_t;
            // SAFETY: the zone's own slab pool, set up by nginx; zeroed
            // memory is an empty table.
            let p = unsafe { ngx_slab_calloc(shpool, SLOTS * SLOT_SIZE) };
            if p.is_null() {
                return ERROR;
            }
            // SAFETY: as above; data is where nginx's modules keep their
            // zone's root.
            unsafe { (*shpool).data = p };
            p
        };
        zone.data = slots;
        TABLE_LEN.store(SLOTS, Ordering::Release);
        TABLE.store(slots.cast(), Ordering::Release);
        OK
    })
}

/// GET (or HEAD) the metrics.
extern "C" fn content_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls the content handler with a live request.
    let r = unsafe { Req::from_raw(r) };
    guard(r.log(), "status content handler", HTTP_INTERNAL_SERVER_ERROR, || {
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
    })
}
