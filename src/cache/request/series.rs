//! The cache gateway's series in `gateway_status`, counted at the log
//! phase: requests by upstream, command and status, GET's hits and misses
//! (what Redis answered), and durations (the length of a
//! `cache_subscribe` or `cache_stream` stream is not one).

use gateway_core::metrics::{join_labels, Id, Memo, Table};

use crate::cache::config::Cache;
use crate::ffi::*;
use crate::metrics::{upstream_label, SeriesKey};

/// Counts a finished request of the upstream `block` (0: none).
pub fn count_request(r: &mut Req, t: Table, known: &mut Memo<SeriesKey>, block: usize) {
    // What Redis answered (`$upstream_status` of the last try): a miss
    // that error_page turned into a 200 is still a miss, and a Range of a
    // value found (206, 416) still a hit.
    let answered = r.upstream().and_then(|u| u.state()).map(|st| st.status);
    let status = r.status();
    let lcf = r.loc_conf::<Cache>();
    let m = r.method();
    let command = if lcf.publish.is_some() {
        "PUBLISH"
    } else if lcf.stream_add.is_some() {
        "XADD"
    } else if lcf.subscribe.is_some() {
        "SUBSCRIBE"
    } else if lcf.stream.is_some() {
        "XREAD"
    } else if m & (NGX_HTTP_GET | NGX_HTTP_HEAD) != 0 {
        "GET"
    } else if m & (NGX_HTTP_PUT | NGX_HTTP_POST) != 0 {
        "SET"
    } else if m & NGX_HTTP_DELETE != 0 {
        "DEL"
    } else {
        "-"
    };
    let stream = lcf.subscribe.is_some() || lcf.stream.is_some();
    let us = r.upstream_response_ms().filter(|_| !stream).map(|ms| ms as i64 * 1000);
    let upstream = || upstream_label(r, block);
    let key = (block, status, command);
    let labels = || join_labels(&[&upstream(), command, &status.to_string()]);
    t.add_known(known, key, Id::CacheRequests, labels, 1);
    if command == "GET" {
        match answered.unwrap_or(0) {
            200 => t.add_known(known, key, Id::CacheHits, || join_labels(&[&upstream()]), 1),
            404 => t.add_known(known, key, Id::CacheMisses, || join_labels(&[&upstream()]), 1),
            _ => {}
        }
    }
    if let Some(us) = us {
        t.observe_known(
            known,
            key,
            Id::CacheDuration,
            || join_labels(&[&upstream(), command]),
            us,
        );
    }
}
