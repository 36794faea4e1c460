//! The metrics table that every worker writes to: core's table over the
//! slots of the shared memory zone that `status` sets up. Here so that the
//! driver and the request code can count without knowing about the zone.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use gateway_core::metrics::{join_labels, Memo, Slot, Table};

use crate::ffi::{ngx_uint_t, Req};

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

/// What stands for a request's label values in the log phase's memo: its
/// upstream block (see `Upstream::name_key`; 0 for none), final status,
/// and command ("" where the gateway has none).
pub type SeriesKey = (usize, ngx_uint_t, &'static str);

/// The upstream's name for the labels (none for a request that had no
/// upstream block).
pub fn upstream_label(r: &Req, block: usize) -> String {
    match r.upstream_ref() {
        Some(u) if block != 0 => u.name(),
        _ => String::new(),
    }
}

/// Adds `delta` to a counter or gauge.
pub fn add(id: gateway_core::metrics::Id, labels: &[&str], delta: i64) {
    if let Some(t) = table() {
        t.add(id, labels, delta);
    }
}

/// Adds `delta` to a counter or gauge that `memo` may know by `key` (see
/// core's `Memo`): the labels are joined and looked up only the first time.
pub fn add_known<K: std::hash::Hash + Eq + Copy>(
    memo: &mut Memo<K>,
    key: K,
    id: gateway_core::metrics::Id,
    labels: &[&str],
    delta: i64,
) {
    if let Some(t) = table() {
        t.add_known(memo, key, id, || join_labels(labels), delta);
    }
}

/// Where the table is (the zone's init, in the master before the workers
/// start, and again on each reload).
pub(crate) fn set_table(slots: *mut Slot, len: usize) {
    TABLE_LEN.store(len, Ordering::Release);
    TABLE.store(slots, Ordering::Release);
}
