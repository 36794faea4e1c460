//! Redis Cluster's replies on arbitrary bytes: `resp::value` (the whole
//! `CLUSTER SLOTS` reply), `cluster::parse_slots` and the map built from
//! it, `cluster::parse_redirect`.
//!
//! What must hold: no panic; a value is reported only once all of it is
//! in (every shorter prefix of it is incomplete, never an error, and the
//! same bytes followed by others give the same value and length); a map
//! built from any reply names, for every slot, a node it lists; a
//! redirection reads back the same from its own text; `resp::Scan`, fed
//! the bytes in pieces, finds the end of every whole value `value` finds.

use gateway_core::cluster::{parse_redirect, parse_slots, Topology, SLOTS};
use gateway_core::resp::{value, Scan};

/// The most a reply may take here (the module's bound is 4 MiB).
const LIMIT: usize = 1 << 16;

pub fn cluster_slots(data: &[u8]) {
    if let Some(text) = data.strip_prefix(b"redirect ") {
        redirect(text);
        return;
    }
    let whole = value(data, LIMIT);
    let Ok(Some((v, used))) = &whole else { return };
    assert!(*used <= data.len());
    let step = (*used / 64).max(1);
    for k in (0..*used).step_by(step) {
        assert_eq!(
            value(&data[..k], LIMIT),
            Ok(None),
            "a prefix of {k} bytes of a whole value"
        );
    }
    assert_eq!(
        value(&data[..*used], LIMIT),
        whole,
        "the value depends on bytes after it"
    );
    let mut scan = Scan::default();
    let mut found = None;
    for k in (0..=data.len()).step_by(step) {
        if let Ok(Some(len)) = scan.feed(&data[..k], LIMIT) {
            found = Some(len);
            break;
        }
    }
    let found = found.or_else(|| scan.feed(data, LIMIT).ok().flatten());
    assert_eq!(found, Some(*used), "Scan finds the end of the value");
    let Ok(ranges) = parse_slots(v) else { return };
    let Ok(seed) = "127.0.0.1:1".parse() else { return };
    let mut t = Topology::with_seeds(vec![seed]);
    if t.rebuild(&ranges, seed).is_ok() {
        assert!(!t.needs_refresh());
        for slot in 0..SLOTS as u16 {
            if let Some(a) = t.owner(slot) {
                assert!(t.nodes().contains(&a) && t.trusts(a));
            }
        }
        for r in &ranges {
            assert!(t.owner(r.start).is_some() && t.owner(r.end).is_some());
        }
    }
}

fn redirect(text: &[u8]) {
    let Some(r) = parse_redirect(text) else { return };
    assert!(usize::from(r.slot) < SLOTS && r.port > 0);
    let again = parse_redirect(r.to_string().as_bytes());
    assert_eq!(again.as_ref(), Some(&r), "{r}");
    let _ = r.addr("10.0.0.1:7000".parse().ok());
}
