//! The database gateway's series in `gateway_status`, counted at the log
//! phase: requests by upstream and status, and their durations (a
//! `sqldb_listen` stream's length is not one).

use gateway_core::metrics::{join_labels, Id, Memo, Table};

use crate::ffi::*;
use crate::metrics::{upstream_label, SeriesKey};
use crate::sqldb::config::Sqldb;

/// Counts a finished request of the upstream `block` (0: none).
pub fn count_request(r: &mut Req, t: Table, known: &mut Memo<SeriesKey>, block: usize) {
    let status = r.status();
    let stream = r.loc_conf::<Sqldb>().listen.is_some();
    let us = r.upstream_response_ms().filter(|_| !stream).map(|ms| ms as i64 * 1000);
    let upstream = || upstream_label(r, block);
    let key = (block, status, "");
    let labels = || join_labels(&[&upstream(), &status.to_string()]);
    t.add_known(known, key, Id::SqldbRequests, labels, 1);
    if let Some(us) = us {
        t.observe_known(known, key, Id::SqldbQueryDuration, || join_labels(&[&upstream()]), us);
    }
}
