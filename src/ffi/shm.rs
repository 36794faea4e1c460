//! Shared memory zones of the module's own: declared while the
//! configuration is read, set up by nginx once it maps them, found again
//! by each worker in its cycle.

use std::ffi::c_void;

use super::conf::ConfError;
use super::*;

/// Declares a zone of `size` bytes named `name` for module `tag`, whose
/// data is `N` zeroed bytes of it (nginx keeps the old configuration's
/// memory, data included, when name, size and module are the same).
pub fn add_zeroed_zone<const N: usize>(
    cf: Conf,
    name: &str,
    size: usize,
    tag: *const ngx_module_t,
) -> Result<(), ConfError> {
    let mut name = cf.pool().str(name.as_bytes()).ok_or(ConfError::Logged)?;
    // SAFETY: the configuration being read; name lives in its pool.
    let zone = unsafe { ngx_shared_memory_add(cf.raw_ptr(), &mut name, size, tag as *mut c_void) };
    // SAFETY: nginx returns a zone of this cycle's list, or null.
    let zone = unsafe { zone.as_mut() }.ok_or(ConfError::Logged)?;
    zone.init = Some(zeroed_zone_init::<N>);
    Ok(())
}

/// A zone's init callback that gives it `N` zeroed bytes from its slab
/// allocator as its data, or keeps the data of the configuration before (a
/// reload).
extern "C" fn zeroed_zone_init<const N: usize>(zone: *mut ngx_shm_zone_t, old: *mut c_void) -> ngx_int_t {
    guard(Log::cycle(), "zone init", ERROR, || {
        // SAFETY: nginx passes the zone it mapped; its shm.addr starts with
        // the slab pool nginx set up in it.
        let Some(zone) = (unsafe { zone.as_mut() }) else {
            return ERROR;
        };
        let data = if !old.is_null() {
            old
        } else {
            let shpool = zone.shm.addr as *mut ngx_slab_pool_t;
            // SAFETY: the zone's own slab pool, set up by nginx.
            let p = unsafe { ngx_slab_calloc(shpool, N) };
            if p.is_null() {
                return ERROR;
            }
            // SAFETY: as above; data is where nginx's modules keep their
            // zone's root.
            unsafe { (*shpool).data = p };
            p
        };
        zone.data = data;
        OK
    })
}

/// The data of the zone of module `tag` in a cycle (set up: not null).
pub fn zone_data(cycle: &ngx_cycle_t, tag: *const ngx_module_t) -> Option<*mut c_void> {
    let mut part: *const ngx_list_part_t = &cycle.shared_memory.part;
    // SAFETY: nginx's list of the cycle's zones: parts of nelts zones.
    while let Some(p) = unsafe { part.as_ref() } {
        // SAFETY: as above.
        let zones = unsafe { std::slice::from_raw_parts(p.elts as *const ngx_shm_zone_t, p.nelts) };
        if let Some(z) = zones
            .iter()
            .find(|z| z.tag as *const ngx_module_t == tag && !z.data.is_null())
        {
            return Some(z.data);
        }
        part = p.next;
    }
    None
}
