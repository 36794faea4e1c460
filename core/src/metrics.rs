//! The gateway's metrics: a table of counters and gauges that every worker
//! process updates in place (it lives in nginx's shared memory; here it is
//! any slice of slots), and its renderings as Prometheus text (exposition
//! format 0.0.4) and as JSON.
//!
//! A slot holds one series: its family, its label values and its value.
//! Slots are claimed once and never freed; a series is found by hashing its
//! family and labels and probing from there. Claiming is lock-free: a slot
//! goes from empty to being written (one process wins the compare-and-swap)
//! to ready, and readers use only ready slots. A table that is full drops
//! new series (counted, and shown as `ngx_gateway_metrics_dropped_total`).

mod render;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU8, Ordering};

/// What kind of value a family holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    /// Observations in seconds (stored in microseconds): buckets, sum, count.
    Histogram,
}

/// A metric family: its name (without `ngx_gateway_`), help, kind and
/// label names.
#[derive(Debug)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    pub labels: &'static [&'static str],
}

macro_rules! families {
    ($($id:ident = $name:literal, $kind:ident, [$($l:literal),*], $help:literal;)*) => {
        /// The families, by number.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(u16)]
        pub enum Id { $($id),* }
        pub static FAMILIES: &[Family] = &[$(Family {
            name: $name,
            help: $help,
            kind: Kind::$kind,
            labels: &[$($l),*],
        }),*];
    };
}

families! {
    SqldbConnections = "sqldb_connections", Gauge, ["upstream", "server", "state"],
        "Database connections by state (connecting, idle, busy).";
    SqldbPipelineDepth = "sqldb_pipeline_depth", Gauge, ["upstream", "server"],
        "Requests queued on the database connections (sent or waiting to be).";
    SqldbRequests = "sqldb_requests_total", Counter, ["upstream", "status"],
        "Database gateway requests by HTTP status.";
    SqldbQueryDuration = "sqldb_query_duration_seconds", Histogram, ["upstream"],
        "Time from a query's start to its whole result.";
    SqldbCancels = "sqldb_cancels_total", Counter, ["upstream"],
        "Cancel requests sent for queries of requests that left or timed out.";
    SqldbConnects = "sqldb_connects_total", Counter, ["upstream", "server"],
        "Database connections opened.";
    SqldbReconnects = "sqldb_reconnects_total", Counter, ["upstream", "server"],
        "Database connections lost, then opened again.";
    SqldbPrepares = "sqldb_prepared_statements_total", Counter, ["upstream"],
        "Statements prepared on database connections.";
    CacheRequests = "cache_requests_total", Counter, ["upstream", "command", "status"],
        "Cache gateway requests by command and HTTP status.";
    CacheHits = "cache_hits_total", Counter, ["upstream"],
        "Cache reads that found their key.";
    CacheMisses = "cache_misses_total", Counter, ["upstream"],
        "Cache reads that did not find their key.";
    CacheDuration = "cache_request_duration_seconds", Histogram, ["upstream", "command"],
        "Time from a cache request's start to its reply.";
    Subscribers = "subscribers", Gauge, ["source"],
        "Clients subscribed to server-sent events (source: sqldb_listen, cache_subscribe, cache_stream).";
    EventsSent = "events_sent_total", Counter, ["source"],
        "Server-sent events written to subscribers.";
    Dropped = "metrics_dropped_total", Counter, [],
        "Series not recorded because the metrics table was full.";
    SubscribersDropped = "subscribers_dropped_total", Counter, ["source", "reason"],
        "Subscribers of server-sent events dropped (reason: behind, buffers_max, error).";
    CacheSentinelMaster = "cache_sentinel_master", Gauge, ["upstream", "set", "master"],
        "Workers whose confirmed master of a Sentinel set is this address.";
    CacheSentinelSwitches = "cache_sentinel_switches_total", Counter, ["upstream", "set"],
        "Master switches of a Sentinel set, counted by each worker that followed one.";
}

/// Histogram bucket bounds, in microseconds (rendered in seconds).
pub const BUCKETS_US: [i64; 12] = [
    500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 5_000_000,
];

/// Bytes of label values a slot holds (values joined by NUL).
pub const LABELS_MAX: usize = 110;

const EMPTY: u32 = 0;
const WRITING: u32 = 1;
const READY: u32 = 2;

/// One series. The layout is fixed (it lives in shared memory that
/// processes of one nginx binary share).
#[repr(C)]
pub struct Slot {
    state: AtomicU32,
    family: AtomicU32,
    labels_len: AtomicU32,
    /// Which part of a histogram: 0 sum, 1 count, 2.. bucket i-2 (and the
    /// last, +Inf); 0 for counters and gauges.
    part: AtomicU32,
    value: AtomicI64,
    labels: [AtomicU8; LABELS_MAX],
}

/// The size of a slot, for sizing the shared zone.
pub const SLOT_SIZE: usize = std::mem::size_of::<Slot>();

impl Slot {
    fn label_bytes(&self) -> impl Iterator<Item = u8> + '_ {
        let len = (self.labels_len.load(Ordering::Relaxed) as usize).min(LABELS_MAX);
        self.labels[..len].iter().map(|b| b.load(Ordering::Relaxed))
    }

    fn labels_are(&self, want: &[u8]) -> bool {
        self.labels_len.load(Ordering::Relaxed) as usize == want.len() && self.label_bytes().eq(want.iter().copied())
    }
}

/// A table over slots (all zero when new).
pub struct Table<'a> {
    slots: &'a [Slot],
}

/// Where a series lives, to update it again without looking it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeriesRef(usize);

fn hash(family: u32, part: u32, labels: &[u8]) -> u64 {
    // FNV-1a: short keys, no adversary choosing them (label values come
    // from the configuration and from nginx's own status codes).
    let mut h = Fnv::default();
    h.write(&family.to_le_bytes());
    h.write(&part.to_le_bytes());
    h.write(labels);
    h.finish()
}

/// Label values joined by NUL, cut to what a slot holds (at a character
/// boundary).
pub fn join_labels(values: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push(0);
        }
        out.extend(v.bytes().filter(|b| *b != 0));
    }
    if out.len() > LABELS_MAX {
        let mut cut = LABELS_MAX;
        while cut > 0 && (out[cut] & 0xC0) == 0x80 {
            cut -= 1;
        }
        out.truncate(cut);
    }
    out
}

/// FNV-1a: a series' slot in the table, and the memo's small keys.
#[derive(Debug)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The memo's hasher: a word at a time (its keys are a few integers and a
/// short string, looked up several times for every request), for one
/// process's map only: never for a slot's place in the shared table. (The
/// token cache's too: its keys are tokens whose signature was checked.)
#[derive(Default)]
pub struct WordHash(u64);

impl WordHash {
    const K: u64 = 0x517c_c1b7_2722_0a95;

    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::K);
    }
}

impl Hasher for WordHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let mut last = [0u8; 8];
        let rest = chunks.remainder();
        last[..rest.len()].copy_from_slice(rest);
        self.add(u64::from_le_bytes(last) ^ (rest.len() as u64) << 59);
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
}

/// Entries a memo holds at most; it starts again empty past that.
pub const MEMO_MAX: usize = 4096;

/// The series one process has found before, by a key of its own that
/// stands for the label values (with the family and, for a histogram, the
/// part): updating a series it knows builds no label bytes and probes no
/// slots. One key must always stand for the same label values. The series
/// of a key are found with one lookup of the key, and the keys used last
/// with none: a request's counter and histogram share theirs, and a
/// connection's gauges go back and forth between a few states, whose keys
/// would otherwise be hashed on each change.
#[derive(Debug)]
pub struct Memo<K> {
    /// The address of the slots the entries are of.
    table: usize,
    /// Each key's place in `series`.
    index: HashMap<K, usize, BuildHasherDefault<WordHash>>,
    /// The series of each key: (family, part, where).
    series: Vec<Vec<(u16, u32, SeriesRef)>>,
    /// The keys used last, and their places (`next`: the one replaced next).
    recent: [Option<(K, usize)>; RECENT],
    next: usize,
    /// Series held, over all keys.
    entries: usize,
}

/// Keys a memo finds without hashing them.
const RECENT: usize = 4;

impl<K: Hash + Eq> Default for Memo<K> {
    fn default() -> Self {
        Memo {
            table: 0,
            index: HashMap::default(),
            series: Vec::new(),
            recent: std::array::from_fn(|_| None),
            next: 0,
            entries: 0,
        }
    }
}

impl<K: Hash + Eq + Copy> Memo<K> {
    fn clear(&mut self) {
        self.index.clear();
        self.series.clear();
        self.recent = [None; RECENT];
        self.entries = 0;
    }

    /// The place of `key`'s series (made when new).
    fn place(&mut self, key: K) -> usize {
        for (k, i) in self.recent.iter().flatten() {
            if *k == key {
                return *i;
            }
        }
        let i = match self.index.get(&key) {
            Some(&i) => i,
            None => {
                if self.index.len() >= MEMO_MAX {
                    self.clear();
                }
                self.series.push(Vec::new());
                self.index.insert(key, self.series.len() - 1);
                self.series.len() - 1
            }
        };
        self.recent[self.next] = Some((key, i));
        self.next = (self.next + 1) % RECENT;
        i
    }

    /// The series of `key` (found with `find` the first time).
    fn get(
        &mut self,
        t: &Table<'_>,
        id: Id,
        part: u32,
        key: K,
        find: impl FnOnce() -> Option<SeriesRef>,
    ) -> Option<SeriesRef> {
        let addr = t.slots.as_ptr() as usize;
        if self.table != addr {
            self.clear();
            self.table = addr;
        }
        let family = id as u16;
        let i = self.place(key);
        if let Some(&(_, _, r)) = self.series[i].iter().find(|(f, p, _)| *f == family && *p == part) {
            return Some(r);
        }
        let r = find()?;
        if self.entries >= MEMO_MAX {
            self.clear();
        }
        let i = self.place(key);
        self.series[i].push((family, part, r));
        self.entries += 1;
        Some(r)
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }
}

impl<'a> Table<'a> {
    /// # Safety-free construction
    /// Any slice of slots will do; zeroed memory is an empty table.
    pub fn new(slots: &'a [Slot]) -> Table<'a> {
        Table { slots }
    }

    /// The slot of a series, claimed when new; None when the table is full.
    /// (Slot 0 is the count of dropped series: it never holds another.)
    fn find(&self, family: u32, part: u32, labels: &[u8]) -> Option<SeriesRef> {
        let n = self.slots.len().checked_sub(1).filter(|n| *n > 0)?;
        let start = (hash(family, part, labels) % n as u64) as usize;
        for i in 0..n {
            let at = 1 + (start + i) % n;
            let s = &self.slots[at];
            let mut spins = 0;
            loop {
                match s.state.load(Ordering::Acquire) {
                    READY => {
                        if s.family.load(Ordering::Relaxed) == family
                            && s.part.load(Ordering::Relaxed) == part
                            && s.labels_are(labels)
                        {
                            return Some(SeriesRef(at));
                        }
                        break;
                    }
                    EMPTY => {
                        if s.state
                            .compare_exchange(EMPTY, WRITING, Ordering::Acquire, Ordering::Relaxed)
                            .is_ok()
                        {
                            s.family.store(family, Ordering::Relaxed);
                            s.part.store(part, Ordering::Relaxed);
                            // Ours alone until READY is stored (published
                            // with it to the readers' Acquire).
                            let labels = &labels[..labels.len().min(LABELS_MAX)];
                            s.labels_len.store(labels.len() as u32, Ordering::Relaxed);
                            for (to, b) in s.labels.iter().zip(labels) {
                                to.store(*b, Ordering::Relaxed);
                            }
                            s.state.store(READY, Ordering::Release);
                            return Some(SeriesRef(at));
                        }
                    }
                    _ => {
                        // Another process is writing this slot: a few
                        // stores. A process that died there leaves it so
                        // for good: give up on the slot after a while.
                        spins += 1;
                        if spins > 1000 {
                            break;
                        }
                        std::hint::spin_loop();
                    }
                }
            }
        }
        None
    }

    fn dropped(&self) {
        if let Some(s) = self.slots.first() {
            s.value.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The series of a counter or gauge.
    pub fn series(&self, id: Id, labels: &[&str]) -> Option<SeriesRef> {
        let r = self.find(id as u32, 0, &join_labels(labels));
        if r.is_none() {
            self.dropped();
        }
        r
    }

    pub fn add_to(&self, r: SeriesRef, delta: i64) {
        if let Some(s) = self.slots.get(r.0) {
            s.value.fetch_add(delta, Ordering::Relaxed);
        }
    }

    /// Adds to a counter or gauge.
    pub fn add(&self, id: Id, labels: &[&str], delta: i64) {
        if let Some(r) = self.series(id, labels) {
            self.add_to(r, delta);
        }
    }

    /// Records one observation of a histogram, in microseconds.
    pub fn observe(&self, id: Id, labels: &[&str], us: i64) {
        let joined = join_labels(labels);
        let bucket = BUCKETS_US.iter().position(|b| us <= *b).unwrap_or(BUCKETS_US.len());
        for (part, delta) in [(0, us), (1, 1), (2 + bucket as u32, 1)] {
            match self.find(id as u32, part, &joined) {
                Some(r) => self.add_to(r, delta),
                None => self.dropped(),
            }
        }
    }

    /// Adds to a counter or gauge known by `key` in `memo`; `labels` (the
    /// values joined, see `join_labels`) is asked for only the first time.
    pub fn add_known<K: Hash + Eq + Copy>(
        &self,
        memo: &mut Memo<K>,
        key: K,
        id: Id,
        labels: impl FnOnce() -> Vec<u8>,
        delta: i64,
    ) {
        match memo.get(self, id, 0, key, || self.find(id as u32, 0, &labels())) {
            Some(r) => self.add_to(r, delta),
            None => self.dropped(),
        }
    }

    /// Records one observation of a histogram known by `key` in `memo`,
    /// in microseconds (`labels` as for `add_known`).
    pub fn observe_known<K: Hash + Eq + Copy>(
        &self,
        memo: &mut Memo<K>,
        key: K,
        id: Id,
        labels: impl FnOnce() -> Vec<u8>,
        us: i64,
    ) {
        let bucket = BUCKETS_US.iter().position(|b| us <= *b).unwrap_or(BUCKETS_US.len());
        let mut labels = Some(labels);
        let mut joined: Option<Vec<u8>> = None;
        for (part, delta) in [(0, us), (1, 1), (2 + bucket as u32, 1)] {
            let find = || {
                let j = joined.get_or_insert_with(|| labels.take().map(|f| f()).unwrap_or_default());
                self.find(id as u32, part, j)
            };
            match memo.get(self, id, part, key, find) {
                Some(r) => self.add_to(r, delta),
                None => self.dropped(),
            }
        }
    }

    /// Every ready series: (family, part, label values, value).
    fn snapshot(&self) -> Vec<(u32, u32, Vec<String>, i64)> {
        let mut out = Vec::new();
        if let Some(s) = self.slots.first() {
            out.push((Id::Dropped as u32, 0, Vec::new(), s.value.load(Ordering::Relaxed)));
        }
        for s in self.slots.iter().skip(1) {
            if s.state.load(Ordering::Acquire) != READY {
                continue;
            }
            let labels = s
                .label_bytes()
                .collect::<Vec<u8>>()
                .split(|b| *b == 0)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .collect();
            out.push((
                s.family.load(Ordering::Relaxed),
                s.part.load(Ordering::Relaxed),
                labels,
                s.value.load(Ordering::Relaxed),
            ));
        }
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_hash_tells_bytes_and_lengths_apart() {
        use std::hash::Hasher;
        let of = |b: &[u8]| {
            let mut h = WordHash::default();
            h.write(b);
            h.finish()
        };
        let inputs: [&[u8]; 7] = [b"", b"\0", b"\0\0", b"a", b"b", b"abcdefgh", b"abcdefgh\0"];
        for (i, a) in inputs.iter().enumerate() {
            for b in &inputs[i + 1..] {
                assert_ne!(of(a), of(b), "{a:?} {b:?}");
            }
        }
    }

    fn slots(n: usize) -> Vec<Slot> {
        (0..n)
            .map(|_| Slot {
                state: AtomicU32::new(0),
                family: AtomicU32::new(0),
                labels_len: AtomicU32::new(0),
                part: AtomicU32::new(0),
                value: AtomicI64::new(0),
                labels: std::array::from_fn(|_| AtomicU8::new(0)),
            })
            .collect()
    }

    #[test]
    fn counters_add_up_per_series() {
        let s = slots(64);
        let t = Table::new(&s);
        t.add(Id::SqldbRequests, &["db", "200"], 1);
        t.add(Id::SqldbRequests, &["db", "200"], 2);
        t.add(Id::SqldbRequests, &["db", "502"], 1);
        t.add(Id::SqldbConnections, &["db", "127.0.0.1:5432", "idle"], 2);
        t.add(Id::SqldbConnections, &["db", "127.0.0.1:5432", "idle"], -1);
        let text = t.prometheus();
        assert!(
            text.contains("ngx_gateway_sqldb_requests_total{upstream=\"db\",status=\"200\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("ngx_gateway_sqldb_requests_total{upstream=\"db\",status=\"502\"} 1\n"));
        assert!(text
            .contains("ngx_gateway_sqldb_connections{upstream=\"db\",server=\"127.0.0.1:5432\",state=\"idle\"} 1\n"));
        assert!(text.contains("# TYPE ngx_gateway_sqldb_requests_total counter\n"));
        assert!(text.contains("# TYPE ngx_gateway_sqldb_connections gauge\n"));
        assert!(text.contains("ngx_gateway_metrics_dropped_total 0\n"));
    }

    #[test]
    fn fnv_is_fnv_1a_and_a_slot_hash_is_its_bytes_in_order() {
        let of = |b: &[u8]| {
            let mut h = Fnv::default();
            h.write(b);
            h.finish()
        };
        assert_eq!(of(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(of(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(of(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(hash(1, 2, b"db"), of(&[1, 0, 0, 0, 2, 0, 0, 0, b'd', b'b']));
    }

    #[test]
    fn keys_taken_in_turn_keep_their_own_series() {
        // More keys than the memo finds without hashing, each used in turn
        // (a connection's gauge states): each still adds to its own series.
        let s = slots(64);
        let t = Table::new(&s);
        let mut memo: Memo<&'static str> = Memo::default();
        let states = ["connecting", "idle", "busy", "closing", "gone", ""];
        for round in 0..5 {
            for (n, st) in states.iter().enumerate() {
                t.add_known(
                    &mut memo,
                    *st,
                    Id::SqldbConnections,
                    || join_labels(&["db", "x", st]),
                    n as i64 + 1,
                );
                let held = if round == 0 { n + 1 } else { states.len() };
                assert_eq!(memo.len(), held);
            }
        }
        let text = t.prometheus();
        for (n, st) in states.iter().enumerate() {
            let w = format!(
                "ngx_gateway_sqldb_connections{{upstream=\"db\",server=\"x\",state=\"{st}\"}} {}\n",
                5 * (n + 1)
            );
            assert!(text.contains(&w), "missing {w} in {text}");
        }
    }

    #[test]
    fn known_series_add_to_the_same_slots_as_by_labels() {
        let s = slots(64);
        let t = Table::new(&s);
        let mut memo: Memo<(usize, u16)> = Memo::default();
        let asked = std::cell::Cell::new(0);
        let labels = |v: &'static str| {
            let asked = &asked;
            move || {
                asked.set(asked.get() + 1);
                join_labels(&["db", v])
            }
        };
        for _ in 0..3 {
            t.add_known(&mut memo, (1, 200), Id::SqldbRequests, labels("200"), 1);
        }
        t.add_known(&mut memo, (1, 502), Id::SqldbRequests, labels("502"), 1);
        t.add(Id::SqldbRequests, &["db", "200"], 1);
        // The same key in another family is another series.
        t.add_known(
            &mut memo,
            (1, 200),
            Id::SqldbConnections,
            || join_labels(&["db", "x", "idle"]),
            2,
        );
        for us in [300, 3_000] {
            t.observe_known(&mut memo, (1, 0), Id::SqldbQueryDuration, || join_labels(&["db"]), us);
        }
        t.observe(Id::SqldbQueryDuration, &["db"], 700);
        assert_eq!(asked.get(), 2, "the labels are built once per series");
        let text = t.prometheus();
        for w in [
            "ngx_gateway_sqldb_requests_total{upstream=\"db\",status=\"200\"} 4\n",
            "ngx_gateway_sqldb_requests_total{upstream=\"db\",status=\"502\"} 1\n",
            "ngx_gateway_sqldb_connections{upstream=\"db\",server=\"x\",state=\"idle\"} 2\n",
            "ngx_gateway_sqldb_query_duration_seconds_bucket{upstream=\"db\",le=\"0.001\"} 2\n",
            "ngx_gateway_sqldb_query_duration_seconds_bucket{upstream=\"db\",le=\"0.005\"} 3\n",
            "ngx_gateway_sqldb_query_duration_seconds_count{upstream=\"db\"} 3\n",
            "ngx_gateway_sqldb_query_duration_seconds_sum{upstream=\"db\"} 0.004\n",
        ] {
            assert!(text.contains(w), "missing {w} in {text}");
        }
        // Another table (another zone): the memo forgets the first one's.
        let s2 = slots(64);
        let t2 = Table::new(&s2);
        t2.add_known(
            &mut memo,
            (1, 200),
            Id::SqldbRequests,
            || join_labels(&["db", "200"]),
            1,
        );
        assert!(t2
            .prometheus()
            .contains("ngx_gateway_sqldb_requests_total{upstream=\"db\",status=\"200\"} 1\n"));
        assert_eq!(memo.len(), 1);
    }

    #[test]
    fn a_memo_of_a_full_table_counts_each_drop_and_stays_bounded() {
        let s = slots(2);
        let t = Table::new(&s);
        let mut memo: Memo<u32> = Memo::default();
        t.add_known(&mut memo, 1, Id::CacheHits, || join_labels(&["a"]), 1);
        for k in 2..(MEMO_MAX as u32 + 10) {
            t.add_known(&mut memo, k, Id::CacheHits, || join_labels(&["b"]), 1);
        }
        assert!(t
            .prometheus()
            .contains(&format!("ngx_gateway_metrics_dropped_total {}\n", MEMO_MAX + 8)));
        assert!(memo.len() <= 1);
        let s3 = slots(MEMO_MAX + 64);
        let t3 = Table::new(&s3);
        for k in 0..(MEMO_MAX as u32 + 10) {
            t3.add_known(&mut memo, k, Id::CacheHits, || join_labels(&["c"]), 1);
        }
        assert!(memo.len() <= MEMO_MAX);
        assert!(t3.prometheus().contains(&format!(
            "ngx_gateway_cache_hits_total{{upstream=\"c\"}} {}\n",
            MEMO_MAX + 10
        )));
    }

    #[test]
    fn a_second_table_over_the_same_slots_sees_the_same_series() {
        // Two workers map the same shared memory.
        let s = slots(16);
        Table::new(&s).add(Id::CacheHits, &["r"], 5);
        let t2 = Table::new(&s);
        t2.add(Id::CacheHits, &["r"], 1);
        assert!(t2
            .prometheus()
            .contains("ngx_gateway_cache_hits_total{upstream=\"r\"} 6\n"));
    }

    #[test]
    fn histograms_are_cumulative_in_seconds() {
        let s = slots(64);
        let t = Table::new(&s);
        for us in [300, 700, 3_000, 2_000_000, 9_000_000] {
            t.observe(Id::SqldbQueryDuration, &["db"], us);
        }
        let text = t.prometheus();
        let want = [
            "ngx_gateway_sqldb_query_duration_seconds_bucket{upstream=\"db\",le=\"0.0005\"} 1\n",
            "ngx_gateway_sqldb_query_duration_seconds_bucket{upstream=\"db\",le=\"0.001\"} 2\n",
            "ngx_gateway_sqldb_query_duration_seconds_bucket{upstream=\"db\",le=\"0.005\"} 3\n",
            "ngx_gateway_sqldb_query_duration_seconds_bucket{upstream=\"db\",le=\"1\"} 3\n",
            "ngx_gateway_sqldb_query_duration_seconds_bucket{upstream=\"db\",le=\"5\"} 4\n",
            "ngx_gateway_sqldb_query_duration_seconds_bucket{upstream=\"db\",le=\"+Inf\"} 5\n",
            "ngx_gateway_sqldb_query_duration_seconds_sum{upstream=\"db\"} 11.004\n",
            "ngx_gateway_sqldb_query_duration_seconds_count{upstream=\"db\"} 5\n",
        ];
        for w in want {
            assert!(text.contains(w), "missing {w} in {text}");
        }
    }

    #[test]
    fn a_full_table_drops_and_counts() {
        let s = slots(3);
        let t = Table::new(&s);
        t.add(Id::CacheHits, &["a"], 1);
        // Two slots for series (the first counts those dropped).
        t.add(Id::CacheHits, &["b"], 1);
        t.add(Id::CacheHits, &["c"], 1);
        t.add(Id::CacheHits, &["d"], 1);
        let text = t.prometheus();
        assert!(text.contains("ngx_gateway_metrics_dropped_total 2\n"), "{text}");
        assert!(text.contains("ngx_gateway_cache_hits_total{upstream=\"a\"} 1\n"));
        assert!(!text.contains("upstream=\"c\"") && !text.contains("upstream=\"d\""));
    }

    #[test]
    fn labels_are_escaped_and_bounded() {
        let s = slots(8);
        let t = Table::new(&s);
        t.add(Id::CacheHits, &["a\"b\\c\nd"], 1);
        assert!(t.prometheus().contains("{upstream=\"a\\\"b\\\\c\\nd\"} 1\n"));
        let long = "é".repeat(100);
        let j = join_labels(&[&long]);
        assert!(j.len() <= LABELS_MAX);
        assert!(std::str::from_utf8(&j).is_ok());
    }

    #[test]
    fn json_has_the_same_series() {
        let s = slots(32);
        let t = Table::new(&s);
        t.add(Id::CacheRequests, &["r", "GET", "200"], 4);
        t.observe(Id::CacheDuration, &["r", "GET"], 1_500);
        let j = t.json();
        assert!(j.contains(
            "\"ngx_gateway_cache_requests_total\":{\"help\":\"Cache gateway requests by command and HTTP status.\",\
             \"type\":\"counter\",\"series\":[{\"labels\":{\"upstream\":\"r\",\"command\":\"GET\",\"status\":\"200\"},\
             \"value\":4}]}"
        ), "{j}");
        assert!(j.contains("\"buckets\":{\"0.0005\":0,\"0.001\":0,\"0.0025\":1,"), "{j}");
        assert!(j.contains("\"sum\":0.0015,\"count\":1}"), "{j}");
        assert!(j.starts_with('{') && j.ends_with('}'));
    }

    #[test]
    fn concurrent_writers_lose_nothing() {
        let s = slots(256);
        std::thread::scope(|scope| {
            for w in 0..4 {
                let s = &s;
                scope.spawn(move || {
                    let t = Table::new(s);
                    for i in 0..2000 {
                        t.add(Id::SqldbRequests, &["db", &format!("{}", 200 + (i + w) % 7)], 1);
                    }
                });
            }
        });
        let text = Table::new(&s).prometheus();
        let total: i64 = text
            .lines()
            .filter(|l| l.starts_with("ngx_gateway_sqldb_requests_total{"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<i64>().unwrap())
            .sum();
        assert_eq!(total, 8000);
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("ngx_gateway_sqldb_requests_total{"))
                .count(),
            7
        );
    }
}
