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
    /// The reply came from a node that is not a seed (not configured).
    NotSeed(SocketAddr),
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
            SlotsError::NotSeed(a) => write!(
                f,
                "CLUSTER SLOTS from {a}, which is not a server of the upstream block, is not used"
            ),
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
///
/// The map is trusted only as far as the configuration: the seeds (the
/// upstream block's `server` addresses) are the only nodes whose
/// `CLUSTER SLOTS` builds it, and a node is one to go to only when it is a
/// seed or a master of a map a seed gave. A redirection cannot add a node.
#[derive(Debug, Clone)]
pub struct Topology {
    /// The configured addresses: the only nodes asked for the map.
    seeds: Vec<SocketAddr>,
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
    /// A map that knows nothing yet, and no seed.
    pub fn new() -> Topology {
        Topology::with_seeds(Vec::new())
    }

    /// A map that knows nothing yet, to be learned from these seeds.
    pub fn with_seeds(seeds: Vec<SocketAddr>) -> Topology {
        Topology {
            seeds,
            nodes: Vec::new(),
            owner: vec![NONE; SLOTS],
            known: false,
            stale: false,
        }
    }

    /// The configured addresses (the upstream block's servers).
    pub fn set_seeds(&mut self, seeds: Vec<SocketAddr>) {
        self.seeds = seeds;
    }

    /// The node is a configured one: its `CLUSTER SLOTS` may build the map.
    pub fn is_seed(&self, addr: SocketAddr) -> bool {
        self.seeds.contains(&addr)
    }

    /// The node may be sent requests (and a password): a seed, or a master
    /// of the map that a seed gave.
    pub fn trusts(&self, addr: SocketAddr) -> bool {
        self.is_seed(addr) || self.nodes.contains(&addr)
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
    /// a seed for `CLUSTER SLOTS`.
    pub fn needs_refresh(&self) -> bool {
        !self.known || self.stale
    }

    /// A redirection or a node that failed: the map is out of date.
    pub fn mark_stale(&mut self) {
        self.stale = true;
    }

    /// Replaces the map with a `CLUSTER SLOTS` reply from `answered`,
    /// which must be a seed (the reply of any other node is refused and
    /// changes nothing); masters shown with an empty host are on its host.
    /// Nodes that no longer serve a slot are forgotten.
    pub fn rebuild(&mut self, ranges: &[Range], answered: SocketAddr) -> Result<(), SlotsError> {
        if !self.is_seed(answered) {
            return Err(SlotsError::NotSeed(answered));
        }
        if ranges.is_empty() {
            return Err(SlotsError::Empty);
        }
        let mut nodes: Vec<SocketAddr> = Vec::new();
        let mut owner = vec![NONE; SLOTS];
        for r in ranges {
            let addr =
                node_addr(&r.host, r.port, Some(answered)).ok_or_else(|| SlotsError::Hostname(r.host.clone()))?;
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

    /// `-MOVED slot addr`: unless the map says so already (a seed that
    /// sent the request on to the slot's master), the map is out of date.
    /// When the node is one the map trusts, the slot is its now (true); a
    /// node it does not know is not added (false): only a seed's
    /// `CLUSTER SLOTS` can name it.
    pub fn moved(&mut self, slot: u16, addr: SocketAddr) -> bool {
        if self.owner(slot) == Some(addr) {
            return true;
        }
        self.stale = true;
        if !self.trusts(addr) {
            return false;
        }
        let i = match self.nodes.iter().position(|&n| n == addr) {
            Some(i) => i,
            // A seed that the map did not list (16384 masters at most: one per slot).
            None if self.nodes.len() < SLOTS => {
                self.nodes.push(addr);
                self.nodes.len() - 1
            }
            None => return false,
        };
        if let Some(o) = self.owner.get_mut(usize::from(slot)) {
            *o = i as u16;
        }
        true
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
        let asked: SocketAddr = "127.0.0.9:7001".parse().unwrap();
        let mut t = Topology::with_seeds(vec![asked]);
        assert!(t.needs_refresh());
        assert_eq!(t.owner(0), None);
        t.rebuild(&ranges, asked).unwrap();
        assert!(!t.needs_refresh());
        assert_eq!(t.owner(0), Some("127.0.0.1:7000".parse().unwrap()));
        assert_eq!(t.owner(5461), Some("127.0.0.1:7001".parse().unwrap()));
        assert_eq!(t.owner(key_slot(b"foo")), Some("127.0.0.9:7002".parse().unwrap()));
        assert_eq!(t.nodes().len(), 3);
        // MOVED to the master the map names (a seed that does not serve
        // the slot): nothing new.
        assert!(t.moved(0, "127.0.0.1:7000".parse().unwrap()));
        assert!(!t.needs_refresh());
        // MOVED to another master of the map: the slot is its now, and the
        // map is out of date.
        let known: SocketAddr = "127.0.0.1:7001".parse().unwrap();
        assert!(t.moved(12182, known));
        assert_eq!(t.owner(12182), Some(known));
        assert_eq!(t.owner(12181), Some("127.0.0.9:7002".parse().unwrap()));
        assert!(t.needs_refresh());
        // A new map forgets nodes that serve nothing.
        t.rebuild(&ranges[..2], asked).unwrap();
        assert_eq!(t.owner(12182), None);
        assert_eq!(t.nodes().len(), 2);
        // Metadata of Redis 7 or none (Redis 6) alike.
        let old = Value::Array(vec![range(
            0,
            16383,
            vec![Value::Array(vec![Value::Bulk(b"::1".to_vec()), Value::Integer(7000)])],
        )]);
        let r = parse_slots(&old).unwrap();
        t.rebuild(&r, asked).unwrap();
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
        let seed: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let mut t = Topology::with_seeds(vec![seed]);
        assert_eq!(t.rebuild(&[], seed), Err(SlotsError::Empty));
        let outside = Range {
            start: 16000,
            end: 16384,
            host: "127.0.0.1".into(),
            port: 1,
        };
        assert!(matches!(t.rebuild(&[outside], seed), Err(SlotsError::Shape(_))));
        let named = parse_slots(&Value::Array(vec![range(0, 1, vec![node("redis-1", 7000, "a")])])).unwrap();
        assert_eq!(t.rebuild(&named, seed), Err(SlotsError::Hostname("redis-1".into())));
        assert!(t.needs_refresh());
    }

    /// The map is trusted as far as the configuration: a node that only a
    /// redirection named is never one to go to, and only a seed's map counts.
    #[test]
    fn trust_comes_from_the_seeds() {
        let seed: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let master: SocketAddr = "127.0.0.1:7001".parse().unwrap();
        let stranger: SocketAddr = "127.0.0.1:63998".parse().unwrap();
        let mut t = Topology::with_seeds(vec![seed]);
        assert!(t.trusts(seed) && t.is_seed(seed));
        assert!(!t.trusts(master) && !t.trusts(stranger));
        // A stranger's map, all slots to itself, changes nothing.
        let all = |host: &str, port| Range {
            start: 0,
            end: 16383,
            host: host.into(),
            port,
        };
        assert_eq!(
            t.rebuild(&[all("127.0.0.1", 63998)], stranger),
            Err(SlotsError::NotSeed(stranger))
        );
        assert!(t.needs_refresh());
        assert_eq!(t.owner(1), None);
        // The seed's map names the masters to go to.
        let half = |start, end, port| Range {
            start,
            end,
            host: "127.0.0.1".into(),
            port,
        };
        t.rebuild(&[half(0, 8191, 7000), half(8192, 16383, 7001)], seed)
            .unwrap();
        assert!(t.trusts(master) && !t.is_seed(master));
        // A master of the map is not a seed: its map is refused.
        assert_eq!(
            t.rebuild(&[all("127.0.0.1", 63998)], master),
            Err(SlotsError::NotSeed(master))
        );
        assert_eq!(t.owner(1), Some(seed));
        // MOVED to a stranger: not followed, not learned, the map out of date.
        assert!(!t.moved(1, stranger));
        assert_eq!(t.owner(1), Some(seed));
        assert!(!t.trusts(stranger));
        assert!(t.needs_refresh());
        // MOVED to a master of the map (or a seed) moves the slot.
        assert!(t.moved(1, master));
        assert_eq!(t.owner(1), Some(master));
        assert!(t.moved(9000, seed));
        assert_eq!(t.owner(9000), Some(seed));
        // A refresh from the seed that names the stranger makes it one to go to.
        t.rebuild(&[half(0, 8191, 7000), half(8192, 16383, 63998)], seed)
            .unwrap();
        assert!(t.trusts(stranger) && !t.trusts(master));
        assert!(!t.needs_refresh());
    }
}
