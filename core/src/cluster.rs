//! Redis Cluster without any I/O: which of the 16384 hash slots a key is
//! in, the replies that say where a slot lives (`CLUSTER SLOTS`, the
//! `-MOVED` and `-ASK` errors), and a worker's map of slots to masters.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use crate::resp::Value;

/// How many hash slots a cluster has.
pub const SLOTS: usize = 16384;

/// CRC16 as Redis Cluster computes it (XMODEM: polynomial 0x1021, initial
/// value 0, no reflection, no final xor).
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The part of a key that is hashed: between the first `{` and the first
/// `}` after it, when that is not empty; otherwise the whole key.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    match key[open + 1..].iter().position(|&b| b == b'}') {
        Some(len) if len > 0 => &key[open + 1..open + 1 + len],
        _ => key,
    }
}

/// The hash slot of a key.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) & (SLOTS as u16 - 1)
}

/// Which redirection a node answered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedirectKind {
    /// The slot lives elsewhere now: the map is out of date.
    Moved,
    /// The slot is being migrated and the key is not here: ask the other
    /// node once (after `ASKING`), without changing the map.
    Ask,
}

/// `-MOVED slot host:port` or `-ASK slot host:port`. An empty host means
/// the host of the node that answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    pub kind: RedirectKind,
    pub slot: u16,
    pub host: String,
    pub port: u16,
}

impl Redirect {
    /// The node to go to; `answered` is the node that sent the redirect.
    /// `None` when the host is a name rather than an address.
    pub fn addr(&self, answered: Option<SocketAddr>) -> Option<SocketAddr> {
        node_addr(&self.host, self.port, answered)
    }
}

impl fmt::Display for Redirect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            RedirectKind::Moved => "MOVED",
            RedirectKind::Ask => "ASK",
        };
        write!(f, "{kind} {} {}:{}", self.slot, self.host, self.port)
    }
}

/// The redirection an error reply is, if it is one (the message without its `-`).
pub fn parse_redirect(message: &[u8]) -> Option<Redirect> {
    let text = std::str::from_utf8(message).ok()?;
    let mut words = text.split(' ');
    let kind = match words.next()? {
        "MOVED" => RedirectKind::Moved,
        "ASK" => RedirectKind::Ask,
        _ => return None,
    };
    let slot = parse_slot(words.next()?)?;
    let endpoint = words.next()?;
    if words.next().is_some() {
        return None;
    }
    // host:port, the host possibly an IPv6 address with colons of its own.
    let (host, port) = endpoint.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some(Redirect {
        kind,
        slot,
        host: host.to_owned(),
        port: parse_port(port)?,
    })
}

fn parse_slot(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u16>().ok().filter(|&n| usize::from(n) < SLOTS)
}

fn parse_port(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u16>().ok().filter(|&p| p > 0)
}

/// A node's address from a host and a port: an IP address, or empty for
/// the host of the node that answered.
fn node_addr(host: &str, port: u16, answered: Option<SocketAddr>) -> Option<SocketAddr> {
    if host.is_empty() {
        return answered.map(|a| SocketAddr::new(a.ip(), port));
    }
    host.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, port))
}

/// One entry of `CLUSTER SLOTS`: a range of slots and its master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub start: u16,
    pub end: u16,
    pub host: String,
    pub port: u16,
}

/// Why a `CLUSTER SLOTS` reply cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotsError {
    /// Not the shape Redis documents (an array of [start, end, [host,
    /// port, id, ...], replicas...]).
    Shape(&'static str),
    /// A node named by a host name: the gateway connects to addresses.
    Hostname(String),
    /// No slot is served at all.
    Empty,
}

impl fmt::Display for SlotsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SlotsError::Shape(what) => write!(f, "invalid CLUSTER SLOTS reply: {what}"),
            SlotsError::Hostname(h) => write!(
                f,
                "CLUSTER SLOTS names node \"{h}\", which is not an IP address (set cluster-preferred-endpoint-type ip)"
            ),
            SlotsError::Empty => f.write_str("CLUSTER SLOTS says that no slot is served"),
        }
    }
}

impl std::error::Error for SlotsError {}

/// The ranges and masters of a `CLUSTER SLOTS` reply (replicas are not used).
pub fn parse_slots(reply: &Value) -> Result<Vec<Range>, SlotsError> {
    let Value::Array(entries) = reply else {
        return Err(SlotsError::Shape("not an array"));
    };
    let mut ranges = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(fields) = entry else {
            return Err(SlotsError::Shape("an entry is not an array"));
        };
        let slot = |v: Option<&Value>| match v {
            Some(&Value::Integer(n)) if (0..SLOTS as i64).contains(&n) => Ok(n as u16),
            _ => Err(SlotsError::Shape("a slot is not a number from 0 to 16383")),
        };
        let (start, end) = (slot(fields.first())?, slot(fields.get(1))?);
        if start > end {
            return Err(SlotsError::Shape("a range ends before it starts"));
        }
        let Some(Value::Array(master)) = fields.get(2) else {
            return Err(SlotsError::Shape("a range has no master"));
        };
        let host = match master.first() {
            Some(Value::Bulk(h)) => {
                String::from_utf8(h.clone()).map_err(|_| SlotsError::Shape("a host is not text"))?
            }
            _ => return Err(SlotsError::Shape("a master has no host")),
        };
        let port = match master.get(1) {
            Some(&Value::Integer(p)) if (1..=65535).contains(&p) => p as u16,
            _ => return Err(SlotsError::Shape("a master has no port")),
        };
        ranges.push(Range { start, end, host, port });
    }
    Ok(ranges)
}

/// The marker of a slot that no known master serves.
const NONE: u16 = u16::MAX;

/// A worker's map of a cluster: its masters and which serves each slot.
#[derive(Debug, Clone)]
pub struct Topology {
    nodes: Vec<SocketAddr>,
    /// Index into `nodes` for each slot, or `NONE`.
    owner: Vec<u16>,
    known: bool,
    stale: bool,
}

impl Default for Topology {
    fn default() -> Self {
        Topology::new()
    }
}

impl Topology {
    /// A map that knows nothing yet.
    pub fn new() -> Topology {
        Topology {
            nodes: Vec::new(),
            owner: vec![NONE; SLOTS],
            known: false,
            stale: false,
        }
    }

    /// The master of a slot, when the map has one.
    pub fn owner(&self, slot: u16) -> Option<SocketAddr> {
        let i = *self.owner.get(usize::from(slot))?;
        self.nodes.get(usize::from(i)).copied()
    }

    /// The masters the map knows.
    pub fn nodes(&self) -> &[SocketAddr] {
        &self.nodes
    }

    /// No map yet, or one known to be out of date: the next request asks
    /// for `CLUSTER SLOTS`.
    pub fn needs_refresh(&self) -> bool {
        !self.known || self.stale
    }

    /// A redirection or a node that failed: the map is out of date.
    pub fn mark_stale(&mut self) {
        self.stale = true;
    }

    /// Replaces the map with a `CLUSTER SLOTS` reply; `answered` is the
    /// node that sent it (for masters shown with an empty host). Nodes
    /// that no longer serve a slot are forgotten.
    pub fn rebuild(&mut self, ranges: &[Range], answered: Option<SocketAddr>) -> Result<(), SlotsError> {
        if ranges.is_empty() {
            return Err(SlotsError::Empty);
        }
        let mut nodes: Vec<SocketAddr> = Vec::new();
        let mut owner = vec![NONE; SLOTS];
        for r in ranges {
            let addr = node_addr(&r.host, r.port, answered).ok_or_else(|| SlotsError::Hostname(r.host.clone()))?;
            let i = match nodes.iter().position(|&n| n == addr) {
                Some(i) => i,
                None => {
                    nodes.push(addr);
                    nodes.len() - 1
                }
            };
            let Some(slots) = owner.get_mut(usize::from(r.start)..=usize::from(r.end)) else {
                return Err(SlotsError::Shape("a slot is not a number from 0 to 16383"));
            };
            for slot in slots {
                *slot = i as u16;
            }
        }
        self.nodes = nodes;
        self.owner = owner;
        self.known = true;
        self.stale = false;
        Ok(())
    }

    /// `-MOVED slot addr`: the slot is served by `addr` now (a node that
    /// may be new); the rest of the map is likely out of date too.
    pub fn moved(&mut self, slot: u16, addr: SocketAddr) {
        let i = match self.nodes.iter().position(|&n| n == addr) {
            Some(i) => i,
            // (16384 masters at most: one per slot.)
            None if self.nodes.len() < SLOTS => {
                self.nodes.push(addr);
                self.nodes.len() - 1
            }
            None => return,
        };
        if let Some(o) = self.owner.get_mut(usize::from(slot)) {
            *o = i as u16;
        }
        self.stale = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_test_vector() {
        // The check value of CRC-16/XMODEM, as Redis's cluster spec gives it.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
    }

    #[test]
    fn slots_that_redis_cli_reports() {
        // `redis-cli cluster keyslot <key>` on a Redis 7.0 cluster node.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"hello"), 866);
        assert_eq!(key_slot(b"123456789"), 0x31C3 & 16383);
    }

    #[test]
    fn hash_tags() {
        assert_eq!(hash_tag(b"{user1000}.following"), b"user1000");
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"{user1000}.followers"));
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hash_tag(b"{bar"), b"{bar");
        assert_eq!(hash_tag(b"nobraces"), b"nobraces");
        assert_eq!(key_slot(b"a{foo}b"), key_slot(b"foo"));
    }

    #[test]
    fn redirects() {
        let r = parse_redirect(b"MOVED 3999 127.0.0.1:6381").unwrap();
        assert_eq!(
            r,
            Redirect {
                kind: RedirectKind::Moved,
                slot: 3999,
                host: "127.0.0.1".into(),
                port: 6381
            }
        );
        assert_eq!(r.addr(None), Some("127.0.0.1:6381".parse().unwrap()));
        assert_eq!(r.to_string(), "MOVED 3999 127.0.0.1:6381");
        let r = parse_redirect(b"ASK 16383 ::1:7000").unwrap();
        assert_eq!((r.kind, r.slot, r.port), (RedirectKind::Ask, 16383, 7000));
        assert_eq!(r.addr(None), Some("[::1]:7000".parse().unwrap()));
        // An empty host is the host of the node that answered.
        let r = parse_redirect(b"MOVED 1 :7002").unwrap();
        assert_eq!(r.addr(None), None);
        assert_eq!(
            r.addr(Some("10.0.0.5:7000".parse().unwrap())),
            Some("10.0.0.5:7002".parse().unwrap())
        );
        // A name is not an address.
        assert_eq!(parse_redirect(b"MOVED 1 redis-3:7002").unwrap().addr(None), None);
        for bad in [
            &b"ERR wrong"[..],
            b"MOVED",
            b"MOVED 16384 127.0.0.1:1",
            b"MOVED -1 127.0.0.1:1",
            b"MOVED 1 127.0.0.1",
            b"MOVED 1 127.0.0.1:0",
            b"MOVED 1 127.0.0.1:65536",
            b"MOVED 1 127.0.0.1:1 x",
            b"ASK x 127.0.0.1:1",
            b"MOVED\xff 1 127.0.0.1:1",
            b"moved 1 127.0.0.1:1",
        ] {
            assert_eq!(parse_redirect(bad), None, "{bad:?}");
        }
    }

    fn node(host: &str, port: i64, id: &str) -> Value {
        Value::Array(vec![
            Value::Bulk(host.into()),
            Value::Integer(port),
            Value::Bulk(id.into()),
            Value::Array(vec![]),
        ])
    }

    fn range(start: i64, end: i64, nodes: Vec<Value>) -> Value {
        let mut v = vec![Value::Integer(start), Value::Integer(end)];
        v.extend(nodes);
        Value::Array(v)
    }

    #[test]
    fn cluster_slots_replies() {
        let reply = Value::Array(vec![
            range(
                0,
                5460,
                vec![node("127.0.0.1", 7000, "a"), node("127.0.0.1", 7004, "b")],
            ),
            range(5461, 10922, vec![node("127.0.0.1", 7001, "c")]),
            range(10923, 16383, vec![node("", 7002, "d")]),
        ]);
        let ranges = parse_slots(&reply).unwrap();
        assert_eq!(ranges.len(), 3);
        assert_eq!(
            ranges[0],
            Range {
                start: 0,
                end: 5460,
                host: "127.0.0.1".into(),
                port: 7000
            }
        );
        let mut t = Topology::new();
        assert!(t.needs_refresh());
        assert_eq!(t.owner(0), None);
        let asked: SocketAddr = "127.0.0.9:7001".parse().unwrap();
        t.rebuild(&ranges, Some(asked)).unwrap();
        assert!(!t.needs_refresh());
        assert_eq!(t.owner(0), Some("127.0.0.1:7000".parse().unwrap()));
        assert_eq!(t.owner(5461), Some("127.0.0.1:7001".parse().unwrap()));
        assert_eq!(t.owner(key_slot(b"foo")), Some("127.0.0.9:7002".parse().unwrap()));
        assert_eq!(t.nodes().len(), 3);
        // MOVED teaches a new node and marks the map out of date.
        let new: SocketAddr = "127.0.0.1:7006".parse().unwrap();
        t.moved(12182, new);
        assert_eq!(t.owner(12182), Some(new));
        assert_eq!(t.owner(12181), Some("127.0.0.9:7002".parse().unwrap()));
        assert!(t.needs_refresh());
        // A new map forgets nodes that serve nothing.
        t.rebuild(&ranges[..2], None).unwrap();
        assert_eq!(t.owner(12182), None);
        assert_eq!(t.nodes().len(), 2);
        // Metadata of Redis 7 or none (Redis 6) alike.
        let old = Value::Array(vec![range(
            0,
            16383,
            vec![Value::Array(vec![Value::Bulk(b"::1".to_vec()), Value::Integer(7000)])],
        )]);
        let r = parse_slots(&old).unwrap();
        t.rebuild(&r, None).unwrap();
        assert_eq!(t.owner(100), Some("[::1]:7000".parse().unwrap()));
    }

    #[test]
    fn bad_cluster_slots_replies() {
        let bad = [
            Value::Integer(1),
            Value::Array(vec![Value::Integer(1)]),
            Value::Array(vec![range(0, 16384, vec![node("127.0.0.1", 1, "a")])]),
            Value::Array(vec![range(5, 4, vec![node("127.0.0.1", 1, "a")])]),
            Value::Array(vec![range(-1, 4, vec![node("127.0.0.1", 1, "a")])]),
            Value::Array(vec![range(0, 4, vec![])]),
            Value::Array(vec![range(0, 4, vec![node("127.0.0.1", 0, "a")])]),
            Value::Array(vec![range(0, 4, vec![node("127.0.0.1", 65536, "a")])]),
            Value::Array(vec![range(0, 4, vec![Value::Array(vec![Value::Integer(1)])])]),
        ];
        for v in bad {
            assert!(matches!(parse_slots(&v), Err(SlotsError::Shape(_))), "{v:?}");
        }
        let mut t = Topology::new();
        assert_eq!(t.rebuild(&[], None), Err(SlotsError::Empty));
        let outside = Range {
            start: 16000,
            end: 16384,
            host: "127.0.0.1".into(),
            port: 1,
        };
        assert!(matches!(t.rebuild(&[outside], None), Err(SlotsError::Shape(_))));
        let named = parse_slots(&Value::Array(vec![range(0, 1, vec![node("redis-1", 7000, "a")])])).unwrap();
        assert_eq!(t.rebuild(&named, None), Err(SlotsError::Hostname("redis-1".into())));
        // An empty host with nobody to take it from.
        let empty = parse_slots(&Value::Array(vec![range(0, 1, vec![node("", 7000, "a")])])).unwrap();
        assert_eq!(t.rebuild(&empty, None), Err(SlotsError::Hostname(String::new())));
        assert!(t.needs_refresh());
    }
}
