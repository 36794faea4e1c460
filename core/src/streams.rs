//! Redis streams, byte by byte: entry IDs (a client's `Last-Event-ID`),
//! the `XADD` of `cache_stream_add` and its answer, the `XREAD` of
//! `cache_stream` and the entries of its reply.

use std::fmt;

use crate::resp::{self, Value};

/// An entry ID, `ms-seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntryId {
    pub ms: u64,
    pub seq: u64,
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// The longest ID text taken from a client (two u64 and a dash).
pub const ID_MAX: usize = 41;

fn decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

/// A client's last ID: `ms-seq`, or `ms` alone, which is `ms-0` (what
/// `XREAD` makes of it too: the entries after `ms-0`). Anything else
/// (signs, spaces, `$`, `*`, numbers past u64) is None.
pub fn parse_id(s: &[u8]) -> Option<EntryId> {
    if s.len() > ID_MAX {
        return None;
    }
    match s.iter().position(|&b| b == b'-') {
        None => Some(EntryId {
            ms: decimal(s)?,
            seq: 0,
        }),
        Some(i) => Some(EntryId {
            ms: decimal(&s[..i])?,
            seq: decimal(&s[i + 1..])?,
        }),
    }
}

/// The highest entry ID. Nothing can come after it: Redis refuses a range
/// that starts right after it (`XRANGE key (<max> +`: "invalid start ID
/// for the interval").
pub const MAX_ID: EntryId = EntryId {
    ms: u64::MAX,
    seq: u64::MAX,
};

/// A client's last ID that a catch-up can read after: `parse_id`'s, but
/// the highest ID, which Redis refuses to read after, is None too (the
/// client's mistake, as any other bad ID).
pub fn parse_last_id(s: &[u8]) -> Option<EntryId> {
    parse_id(s).filter(|id| *id != MAX_ID)
}

/// `cache_stream_add`'s trimming when `maxlen=` is not given.
pub const DEFAULT_MAXLEN: u64 = 10_000;

/// The largest `MAXLEN` Redis takes (a signed 64-bit number).
pub const MAXLEN_MAX: u64 = i64::MAX as u64;

/// The `maxlen=N` argument of `cache_stream_add`: N from 1 to
/// `MAXLEN_MAX`. None when the argument is not `maxlen=` followed by such
/// a number (Redis would refuse every `XADD` of a larger one).
pub fn parse_maxlen_arg(arg: &[u8]) -> Option<u64> {
    let n = decimal(arg.strip_prefix(b"maxlen=")?)?;
    (1..=MAXLEN_MAX).contains(&n).then_some(n)
}

/// `XADD key MAXLEN ~ N * data <body> [event <e>]`: the bytes up to the
/// body go into `head` (the body, `body_len` bytes, is sent after them);
/// what follows the body is returned.
pub fn xadd(head: &mut Vec<u8>, key: &[u8], maxlen: u64, body_len: usize, event: Option<&[u8]>) -> Vec<u8> {
    resp::array_header(head, if event.is_some() { 10 } else { 8 });
    for a in [
        b"XADD" as &[u8],
        key,
        b"MAXLEN",
        b"~",
        maxlen.to_string().as_bytes(),
        b"*",
        b"data",
    ] {
        resp::bulk(head, a);
    }
    resp::bulk_header(head, body_len);
    let mut tail = b"\r\n".to_vec();
    if let Some(e) = event {
        resp::bulk(&mut tail, b"event");
        resp::bulk(&mut tail, e);
    }
    tail
}

/// The answer to a `cache_stream_add`: `{"id":"<id>"}`. Redis's IDs are
/// digits and one dash: nothing in them needs escaping.
pub fn id_json(id: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(id.len() + 9);
    out.extend_from_slice(b"{\"id\":\"");
    out.extend(id.iter().copied().filter(|b| b.is_ascii_digit() || *b == b'-'));
    out.extend_from_slice(b"\"}");
    out
}

/// `XREAD COUNT <count> BLOCK <ms> STREAMS k1 k2 ... id1 id2 ...`: one
/// read of many keys, each after its own ID (`$` for a key whose reader
/// starts with new entries).
/// Without `block_ms`, the read does not block (`BLOCK 0` would block
/// for ever).
pub fn xread(out: &mut Vec<u8>, count: usize, block_ms: Option<u64>, keys: &[(&[u8], &[u8])]) {
    resp::array_header(out, 4 + 2 * usize::from(block_ms.is_some()) + 2 * keys.len());
    resp::bulk(out, b"XREAD");
    resp::bulk(out, b"COUNT");
    resp::bulk(out, count.to_string().as_bytes());
    if let Some(ms) = block_ms {
        resp::bulk(out, b"BLOCK");
        resp::bulk(out, ms.to_string().as_bytes());
    }
    resp::bulk(out, b"STREAMS");
    for (k, _) in keys {
        resp::bulk(out, k);
    }
    for (_, id) in keys {
        resp::bulk(out, id);
    }
}

/// `XRANGE key (<after> + COUNT <count>`: the entries after an ID.
pub fn xrange_after(out: &mut Vec<u8>, key: &[u8], after: EntryId, count: usize) {
    let from = format!("({after}");
    resp::command(
        out,
        &[
            b"XRANGE",
            key,
            from.as_bytes(),
            b"+",
            b"COUNT",
            count.to_string().as_bytes(),
        ],
    );
}

/// `XREVRANGE key + - COUNT 1`: the stream's last entry (where a reader
/// that starts with new entries starts).
pub fn xlast(out: &mut Vec<u8>, key: &[u8]) {
    resp::command(out, &[b"XREVRANGE", key, b"+", b"-", b"COUNT", b"1"]);
}

/// The entries of a reply to `XRANGE` or `XREVRANGE`, as Redis gave them.
pub fn parse_range(v: Value) -> Result<Vec<Entry>, NotXread> {
    match v {
        Value::Array(items) => items.into_iter().map(entry).collect(),
        _ => Err(NotXread),
    }
}

/// One entry of a stream, as an event: its ID, its fields `data` and `event`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: EntryId,
    /// The field `data` (empty when the entry has none).
    pub data: Vec<u8>,
    pub event: Option<Vec<u8>>,
}

/// A reply to `XREAD` that is not one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotXread;

/// A key and its entries, in a reply to `XREAD`.
pub type KeyEntries = (Vec<u8>, Vec<Entry>);

/// The entries of an `XREAD` reply, by key, in the stream's order. Nil
/// (the block ran out) is none.
pub fn parse_xread(v: Value) -> Result<Vec<KeyEntries>, NotXread> {
    let streams = match v {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(a) => a,
        _ => return Err(NotXread),
    };
    let mut out = Vec::with_capacity(streams.len());
    for s in streams {
        let Value::Array(pair) = s else { return Err(NotXread) };
        let mut pair = pair.into_iter();
        let (Some(Value::Bulk(key)), Some(Value::Array(items)), None) = (pair.next(), pair.next(), pair.next()) else {
            return Err(NotXread);
        };
        let mut entries = Vec::with_capacity(items.len());
        for item in items {
            entries.push(entry(item)?);
        }
        out.push((key, entries));
    }
    Ok(out)
}

fn entry(item: Value) -> Result<Entry, NotXread> {
    let Value::Array(parts) = item else {
        return Err(NotXread);
    };
    let mut parts = parts.into_iter();
    let (Some(Value::Bulk(id)), Some(fields), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(NotXread);
    };
    let id = parse_id(&id).ok_or(NotXread)?;
    let mut e = Entry {
        id,
        data: Vec::new(),
        event: None,
    };
    // (An entry deleted while it was read has no fields: Nil.)
    let fields = match fields {
        Value::Array(f) => f,
        Value::Nil => Vec::new(),
        _ => return Err(NotXread),
    };
    let mut it = fields.into_iter();
    while let (Some(name), Some(value)) = (it.next(), it.next()) {
        let (Value::Bulk(name), Value::Bulk(value)) = (name, value) else {
            return Err(NotXread);
        };
        match name.as_slice() {
            b"data" => e.data = value,
            b"event" => e.event = Some(value),
            _ => {}
        }
    }
    Ok(e)
}

/// The value of the query argument `name` in `args` (the first one),
/// %-decoded and `+` as a space.
pub fn query_arg(args: &[u8], name: &[u8]) -> Option<Vec<u8>> {
    let raw = args
        .split(|&b| b == b'&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix(b"="))?;
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'%' if i + 2 < raw.len() && hex(raw[i + 1]).is_some() && hex(raw[i + 2]).is_some() => {
                out.push(hex(raw[i + 1])? * 16 + hex(raw[i + 2])?);
                i += 3;
                continue;
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    Some(out)
}

#[cfg(test)]
mod tests {

    #[test]
    fn query_args() {
        assert_eq!(query_arg(b"a=1&event=x%41+y&event=z", b"event"), Some(b"xA y".to_vec()));
        assert_eq!(query_arg(b"events=1&xevent=2", b"event"), None);
        assert_eq!(query_arg(b"event=%4", b"event"), Some(b"%4".to_vec()));
    }
    use super::*;

    #[test]
    fn ids() {
        assert_eq!(
            parse_id(b"1700000000000-3"),
            Some(EntryId {
                ms: 1_700_000_000_000,
                seq: 3
            })
        );
        assert_eq!(parse_id(b"17"), Some(EntryId { ms: 17, seq: 0 }));
        for bad in [
            &b""[..],
            b"-",
            b"1-",
            b"-1",
            b"1-2-3",
            b"$",
            b"*",
            b" 1",
            b"+1",
            b"1-x",
            b"99999999999999999999999",
        ] {
            assert_eq!(parse_id(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(
            parse_id(b"18446744073709551615-18446744073709551615")
                .unwrap()
                .to_string(),
            "18446744073709551615-18446744073709551615"
        );
    }

    #[test]
    fn last_ids_redis_reads_after() {
        assert_eq!(parse_last_id(b"18446744073709551615-18446744073709551615"), None);
        assert_eq!(parse_last_id(b"x"), None);
        for ok in [
            &b"0"[..],
            b"0-0",
            b"18446744073709551615",
            b"18446744073709551615-18446744073709551614",
        ] {
            assert_eq!(parse_last_id(ok), parse_id(ok), "{}", String::from_utf8_lossy(ok));
            assert!(parse_last_id(ok).is_some());
        }
    }

    #[test]
    fn maxlen_arg() {
        assert_eq!(parse_maxlen_arg(b"maxlen=5"), Some(5));
        assert_eq!(parse_maxlen_arg(b"maxlen=9223372036854775807"), Some(i64::MAX as u64));
        for bad in [
            &b"maxlen=0"[..],
            b"maxlen=",
            b"maxlen=-1",
            b"maxlen=1k",
            b"max=5",
            b"5",
            b"maxlen=9223372036854775808",
            b"maxlen=18446744073709551615",
        ] {
            assert_eq!(parse_maxlen_arg(bad), None);
        }
    }

    #[test]
    fn xadd_around_the_body() {
        let mut head = Vec::new();
        let tail = xadd(&mut head, b"k", 10, 3, Some(b"ev"));
        let mut all = head.clone();
        all.extend_from_slice(b"abc");
        all.extend_from_slice(&tail);
        let mut want = Vec::new();
        resp::command(
            &mut want,
            &[
                b"XADD", b"k", b"MAXLEN", b"~", b"10", b"*", b"data", b"abc", b"event", b"ev",
            ],
        );
        assert_eq!(all, want);
        let mut head = Vec::new();
        let tail = xadd(&mut head, b"k", 1, 0, None);
        head.extend_from_slice(&tail);
        let mut want = Vec::new();
        resp::command(&mut want, &[b"XADD", b"k", b"MAXLEN", b"~", b"1", b"*", b"data", b""]);
        assert_eq!(head, want);
        assert_eq!(id_json(b"1-2"), b"{\"id\":\"1-2\"}");
    }

    #[test]
    fn xread_of_several_keys() {
        let mut out = Vec::new();
        xread(&mut out, 100, Some(5000), &[(b"a", b"1-0"), (b"b", b"$")]);
        let mut want = Vec::new();
        resp::command(
            &mut want,
            &[
                b"XREAD", b"COUNT", b"100", b"BLOCK", b"5000", b"STREAMS", b"a", b"b", b"1-0", b"$",
            ],
        );
        assert_eq!(out, want);
    }

    #[test]
    fn ranges() {
        let mut out = Vec::new();
        xrange_after(&mut out, b"k", EntryId { ms: 5, seq: 1 }, 100);
        let mut want = Vec::new();
        resp::command(&mut want, &[b"XRANGE", b"k", b"(5-1", b"+", b"COUNT", b"100"]);
        assert_eq!(out, want);
        let mut out = Vec::new();
        xread(&mut out, 7, None, &[(b"a", b"1-0")]);
        let mut want = Vec::new();
        resp::command(&mut want, &[b"XREAD", b"COUNT", b"7", b"STREAMS", b"a", b"1-0"]);
        assert_eq!(out, want);
        let bulk = |s: &str| Value::Bulk(s.as_bytes().to_vec());
        assert_eq!(parse_range(Value::Array(vec![])), Ok(vec![]));
        let got = parse_range(Value::Array(vec![Value::Array(vec![
            bulk("3-4"),
            Value::Array(vec![bulk("data"), bulk("x")]),
        ])]))
        .unwrap();
        assert_eq!(got[0].id, EntryId { ms: 3, seq: 4 });
        assert_eq!(parse_range(Value::Nil), Err(NotXread));
    }

    #[test]
    fn xread_replies() {
        assert_eq!(parse_xread(Value::Nil), Ok(Vec::new()));
        let bulk = |s: &str| Value::Bulk(s.as_bytes().to_vec());
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("k"),
            Value::Array(vec![
                Value::Array(vec![bulk("1-1"), Value::Array(vec![bulk("data"), bulk("a\nb")])]),
                Value::Array(vec![
                    bulk("1-2"),
                    Value::Array(vec![
                        bulk("other"),
                        bulk("x"),
                        bulk("event"),
                        bulk("e"),
                        bulk("data"),
                        bulk(""),
                    ]),
                ]),
                Value::Array(vec![bulk("2-0"), Value::Nil]),
            ]),
        ])]);
        let got = parse_xread(reply).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, b"k");
        let e = &got[0].1;
        assert_eq!(
            e[0],
            Entry {
                id: EntryId { ms: 1, seq: 1 },
                data: b"a\nb".to_vec(),
                event: None
            }
        );
        assert_eq!(
            e[1],
            Entry {
                id: EntryId { ms: 1, seq: 2 },
                data: Vec::new(),
                event: Some(b"e".to_vec())
            }
        );
        assert_eq!(e[2].id, EntryId { ms: 2, seq: 0 });
        assert_eq!(parse_xread(Value::Integer(1)), Err(NotXread));
        assert_eq!(
            parse_xread(Value::Array(vec![Value::Array(vec![bulk("k")])])),
            Err(NotXread)
        );
    }
}
