//! The Redis protocol (RESP2) as the cache gateway needs it: commands out,
//! the header of one reply in. A reply header is looked at as bytes arrive:
//! an incomplete one is not an error, only "not yet".

/// Appends `*N\r\n`.
pub fn array_header(out: &mut Vec<u8>, n: usize) {
    out.push(b'*');
    decimal(out, n);
    out.extend_from_slice(b"\r\n");
}

/// Appends `n` in decimal (without a String in between: commands are
/// written for every request).
pub fn decimal(out: &mut Vec<u8>, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Appends `$LEN\r\n` (the bytes and their `\r\n` follow).
pub fn bulk_header(out: &mut Vec<u8>, len: usize) {
    out.push(b'$');
    decimal(out, len);
    out.extend_from_slice(b"\r\n");
}

/// Appends one bulk string.
pub fn bulk(out: &mut Vec<u8>, arg: &[u8]) {
    bulk_header(out, arg.len());
    out.extend_from_slice(arg);
    out.extend_from_slice(b"\r\n");
}

/// Appends a whole command.
pub fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    array_header(out, args.len());
    for a in args {
        bulk(out, a);
    }
}

/// The header of one reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply<'a> {
    /// Not all of the header is here yet.
    Incomplete,
    /// `+OK` and other simple strings.
    Status(&'a [u8]),
    /// `-ERR ...`
    Error(&'a [u8]),
    /// `:N`
    Integer(i64),
    /// `$N`: N bytes and `\r\n` follow the header (N is at most `MAX_BULK`).
    Bulk(u64),
    /// `$-1` or `*-1`: no value.
    Nil,
    /// A bulk longer than `MAX_BULK`: never a reply to a command of ours,
    /// and a length that must not be trusted.
    TooLong(u64),
    /// Anything else (arrays, garbage): not a reply we asked for.
    Invalid,
}

/// Longest header line accepted, its CRLF included: a longer reply header
/// is garbage.
pub const MAX_LINE: usize = 64 * 1024;

/// Longest bulk value accepted: Redis's own limit (`proto-max-bulk-len`,
/// 512 MB by default).
pub const MAX_BULK: u64 = 512 * 1024 * 1024;

/// Parses the reply header at the start of `buf`: the reply and how many
/// bytes its header line took (0 when incomplete or not a reply). Any
/// answer but `Incomplete` is final: more bytes after `buf` would not
/// change it.
///
/// A header line ends at its first CR or LF, which must be a CRLF: no
/// RESP header holds either byte, so a bare LF (`+OK\n`) or a CR followed
/// by anything else is invalid as soon as it is seen, whatever follows.
pub fn reply_header(buf: &[u8]) -> (Reply<'_>, usize) {
    let end = match line_end(buf) {
        LineEnd::Crlf(end) => end,
        LineEnd::Bare => return (Reply::Invalid, 0),
        // Once MAX_LINE bytes are here without a CRLF, none can end the line in time.
        LineEnd::NotYet if buf.len() >= MAX_LINE => return (Reply::Invalid, 0),
        LineEnd::NotYet => return (Reply::Incomplete, 0),
    };
    if end == 0 || end + 2 > MAX_LINE {
        return (Reply::Invalid, 0);
    }
    let line = &buf[1..end];
    let used = end + 2;
    let reply = match buf[0] {
        b'+' => Reply::Status(line),
        b'-' => Reply::Error(line),
        b':' => match parse_int(line) {
            Some(n) => Reply::Integer(n),
            None => Reply::Invalid,
        },
        b'$' | b'*' if line == b"-1" => Reply::Nil,
        b'$' => match parse_int(line) {
            Some(n) if n < 0 => Reply::Invalid,
            Some(n) if n as u64 > MAX_BULK => Reply::TooLong(n as u64),
            Some(n) => Reply::Bulk(n as u64),
            None => Reply::Invalid,
        },
        _ => Reply::Invalid,
    };
    match reply {
        Reply::Invalid | Reply::TooLong(_) => (reply, 0),
        _ => (reply, used),
    }
}

/// Where the first line of a buffer ends.
enum LineEnd {
    /// At this index, with CRLF.
    Crlf(usize),
    /// With a bare LF, or a CR that another byte follows.
    Bare,
    /// Not in the buffer (no CR or LF, or a CR as its last byte).
    NotYet,
}

fn line_end(buf: &[u8]) -> LineEnd {
    match buf.iter().position(|&b| b == b'\r' || b == b'\n') {
        None => LineEnd::NotYet,
        Some(i) if buf[i] == b'\n' => LineEnd::Bare,
        Some(i) => match buf.get(i + 1) {
            None => LineEnd::NotYet,
            Some(b'\n') => LineEnd::Crlf(i),
            Some(_) => LineEnd::Bare,
        },
    }
}

/// A RESP integer: an optional minus and 1 to 19 digits that fit an i64.
fn parse_int(s: &[u8]) -> Option<i64> {
    let (negative, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut n: i64 = 0;
    for &d in digits {
        let v = i64::from(d - b'0');
        n = n.checked_mul(10)?;
        n = if negative { n.checked_sub(v)? } else { n.checked_add(v)? };
    }
    Some(n)
}

/// A whole reply of any kind, arrays included (`CLUSTER SLOTS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Status(Vec<u8>),
    Error(Vec<u8>),
    Integer(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Value>),
}

/// How deep arrays may nest in a `Value` (`CLUSTER SLOTS` needs 4).
pub const MAX_DEPTH: usize = 8;

/// Bytes that are not one RESP reply, or one over the limits given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotResp;

/// What one element of a reply costs in memory beyond its bytes, as
/// `value` counts it: the `Value` that holds it.
pub const ELEMENT_COST: usize = std::mem::size_of::<Value>();

/// The memory a parsed reply may hold: its bytes and `ELEMENT_COST` per
/// element of an array (so `*N` followed by N tiny elements costs what its
/// `Value`s weigh, not what its bytes do).
fn element_cost(bytes: usize, in_array: bool) -> usize {
    bytes.saturating_add(if in_array { ELEMENT_COST } else { 0 })
}

/// Parses one whole reply at the start of `buf`: `Ok(None)` while it is
/// incomplete, else the value and the bytes it took. A reply longer than
/// `max` bytes, or whose values would hold more than `max` bytes of
/// memory (`ELEMENT_COST` per element besides its bytes), is refused as
/// soon as that is known: nothing past `max` is allocated.
///
/// It parses from the start at every call: a connection that gets large
/// replies in pieces asks `Scan` first whether a whole one is in.
pub fn value(buf: &[u8], max: usize) -> Result<Option<(Value, usize)>, NotResp> {
    let limit = &buf[..buf.len().min(max)];
    let mut budget = max;
    match value_at(limit, 0, &mut budget)? {
        Some(v) => Ok(Some(v)),
        None if buf.len() >= max => Err(NotResp),
        None => Ok(None),
    }
}

fn value_at(buf: &[u8], depth: usize, budget: &mut usize) -> Result<Option<(Value, usize)>, NotResp> {
    let end = match line_end(buf) {
        LineEnd::Crlf(end) => end,
        LineEnd::Bare => return Err(NotResp),
        LineEnd::NotYet if buf.len() >= MAX_LINE => return Err(NotResp),
        LineEnd::NotYet => return Ok(None),
    };
    if end == 0 {
        return Err(NotResp);
    }
    let line = &buf[1..end];
    let mut used = end + 2;
    *budget = budget.checked_sub(element_cost(line.len(), depth > 0)).ok_or(NotResp)?;
    let v = match buf[0] {
        b'+' => Value::Status(line.to_vec()),
        b'-' => Value::Error(line.to_vec()),
        b':' => Value::Integer(parse_int(line).ok_or(NotResp)?),
        b'$' | b'*' if line == b"-1" => Value::Nil,
        b'$' => {
            let n = usize::try_from(parse_int(line).ok_or(NotResp)?).map_err(|_| NotResp)?;
            let Some(total) = used.checked_add(n).and_then(|t| t.checked_add(2)) else {
                return Err(NotResp);
            };
            if buf.len() < total {
                return Ok(None);
            }
            if &buf[used + n..total] != b"\r\n" {
                return Err(NotResp);
            }
            *budget = budget.checked_sub(n).ok_or(NotResp)?;
            let v = Value::Bulk(buf[used..used + n].to_vec());
            used = total;
            v
        }
        b'*' => {
            let n = usize::try_from(parse_int(line).ok_or(NotResp)?).map_err(|_| NotResp)?;
            if depth >= MAX_DEPTH {
                return Err(NotResp);
            }
            // Each element takes 3 bytes and ELEMENT_COST at least: room
            // is made for no more than the bytes and the budget allow.
            let mut items = Vec::with_capacity(n.min(buf.len() / 3).min(*budget / ELEMENT_COST));
            for _ in 0..n {
                match value_at(&buf[used..], depth + 1, budget)? {
                    Some((v, len)) => {
                        items.push(v);
                        used += len;
                    }
                    None => return Ok(None),
                }
            }
            Value::Array(items)
        }
        _ => return Err(NotResp),
    };
    Ok(Some((v, used)))
}

/// Looks for the end of one reply as its bytes arrive, without keeping
/// any of it: each call goes on where the last one stopped, so a reply that
/// comes in many reads is looked at once (linear in its size), and
/// `value` parses it once it is whole. It counts what `value` would hold
/// (`ELEMENT_COST` per element besides its bytes) and refuses a reply past
/// `max` of either as soon as that is known.
#[derive(Debug, Default, Clone)]
pub struct Scan {
    /// The reply's bytes looked at.
    at: usize,
    /// The elements still to come of each array open, outermost first.
    open: Vec<usize>,
    /// A bulk's bytes still to come (its CRLF after them).
    bulk_left: Option<usize>,
    cost: usize,
}

impl Scan {
    /// Goes on over `buf`, the reply's bytes from its start (those of
    /// earlier calls included): `Ok(Some(len))` once a whole reply is in
    /// (its `len` bytes), `Ok(None)` while it is not.
    pub fn feed(&mut self, buf: &[u8], max: usize) -> Result<Option<usize>, NotResp> {
        loop {
            if let Some(left) = self.bulk_left {
                let here = buf.len().saturating_sub(self.at);
                if here < left.saturating_add(2) {
                    return Ok(None);
                }
                let end = self.at + left;
                if &buf[end..end + 2] != b"\r\n" {
                    return Err(NotResp);
                }
                self.at = end + 2;
                self.bulk_left = None;
                if let Some(len) = self.element_done() {
                    return Ok(Some(len));
                }
                continue;
            }
            let rest = buf.get(self.at..).unwrap_or_default();
            let end = match line_end(rest) {
                LineEnd::Crlf(end) => end,
                LineEnd::Bare => return Err(NotResp),
                LineEnd::NotYet if rest.len() >= MAX_LINE => return Err(NotResp),
                LineEnd::NotYet => return Ok(None),
            };
            if end == 0 {
                return Err(NotResp);
            }
            let line = &rest[1..end];
            self.cost = self
                .cost
                .saturating_add(element_cost(line.len(), !self.open.is_empty()));
            let kind = rest[0];
            let mut opened = false;
            self.at += end + 2;
            let n = match kind {
                b'+' | b'-' => None,
                b':' => parse_int(line).map(|_| None).ok_or(NotResp)?,
                b'$' | b'*' if line == b"-1" => None,
                b'$' | b'*' => Some(usize::try_from(parse_int(line).ok_or(NotResp)?).map_err(|_| NotResp)?),
                _ => return Err(NotResp),
            };
            match (kind, n) {
                (b'$', Some(n)) => {
                    self.cost = self.cost.saturating_add(n);
                    self.bulk_left = Some(n);
                }
                (b'*', Some(n)) if n > 0 => {
                    if self.open.len() >= MAX_DEPTH {
                        return Err(NotResp);
                    }
                    self.open.push(n);
                    opened = true;
                }
                _ => {}
            }
            // (A bulk's length counts at once: one past the bound is not waited for.)
            if self.cost > max || self.at > max || self.at.saturating_add(self.bulk_left.unwrap_or(0)) > max {
                return Err(NotResp);
            }
            if self.bulk_left.is_none() && !opened {
                if let Some(len) = self.element_done() {
                    return Ok(Some(len));
                }
            }
        }
    }

    /// An element ended: the reply's length when that was its last.
    fn element_done(&mut self) -> Option<usize> {
        while let Some(left) = self.open.last_mut() {
            *left -= 1;
            if *left > 0 {
                return None;
            }
            self.open.pop();
        }
        Some(self.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_as_rust_writes_them() {
        for n in [0, 1, 9, 10, 99, 100, 4096, 65535, 1 << 40, usize::MAX] {
            let mut out = b"x".to_vec();
            decimal(&mut out, n);
            assert_eq!(out, format!("x{n}").into_bytes());
        }
    }

    #[test]
    fn commands_are_resp_arrays_of_bulk_strings() {
        // RESP's request form: *<count>, then $<length> and the bytes of
        // each argument, every part ended by CRLF; bytes go as they are.
        let mut out = Vec::new();
        command(&mut out, &[b"GET", b"some key"]);
        assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$8\r\nsome key\r\n");
        let value = b"bin\0ary\r\nvalue".to_vec();
        let mut out = Vec::new();
        command(&mut out, &[b"SET", b"k", &value, b"EX", b"30"]);
        assert_eq!(
            out,
            b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$14\r\nbin\0ary\r\nvalue\r\n$2\r\nEX\r\n$2\r\n30\r\n"
        );
        let mut out = Vec::new();
        command(&mut out, &[b"SELECT", b"2"]);
        command(&mut out, &[b"DEL", b""]);
        assert_eq!(out, b"*2\r\n$6\r\nSELECT\r\n$1\r\n2\r\n*2\r\n$3\r\nDEL\r\n$0\r\n\r\n");
    }

    #[test]
    fn streamed_value_has_the_same_bytes() {
        // Header, then the value from elsewhere, then its CRLF: as a whole.
        let mut out = Vec::new();
        array_header(&mut out, 3);
        bulk(&mut out, b"SET");
        bulk(&mut out, b"key");
        bulk_header(&mut out, 5);
        out.extend_from_slice(b"hello\r\n");
        let mut whole = Vec::new();
        command(&mut whole, &[b"SET", b"key", b"hello"]);
        assert_eq!(out, whole);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nhello\r\n");
    }

    #[test]
    fn reply_headers() {
        assert_eq!(reply_header(b"+OK\r\n"), (Reply::Status(b"OK"), 5));
        assert_eq!(reply_header(b"-ERR wrong\r\nmore"), (Reply::Error(b"ERR wrong"), 12));
        assert_eq!(reply_header(b":1\r\n"), (Reply::Integer(1), 4));
        assert_eq!(reply_header(b":-3\r\n"), (Reply::Integer(-3), 5));
        assert_eq!(reply_header(b"$5\r\nhello\r\n"), (Reply::Bulk(5), 4));
        assert_eq!(reply_header(b"$0\r\n\r\n"), (Reply::Bulk(0), 4));
        assert_eq!(reply_header(b"$-1\r\n"), (Reply::Nil, 5));
        assert_eq!(reply_header(b"*-1\r\n"), (Reply::Nil, 5));
    }

    #[test]
    fn partial_headers_are_not_errors() {
        for part in [&b""[..], b"$", b"$12", b"$12\r", b"+O", b"-ERR x"] {
            assert_eq!(reply_header(part), (Reply::Incomplete, 0), "{part:?}");
        }
    }

    #[test]
    fn garbage_is_invalid() {
        for bad in [
            &b"\r\n"[..],
            b"hello\r\n",
            b"$abc\r\n",
            b"$-2\r\n",
            b":x\r\n",
            b"*2\r\n$1\r\na\r\n",
        ] {
            assert_eq!(reply_header(bad), (Reply::Invalid, 0), "{bad:?}");
        }
        assert_eq!(reply_header(&vec![b'+'; MAX_LINE + 1]), (Reply::Invalid, 0));
        for bad in [
            &b"$+5\r\n"[..],
            b": 1\r\n",
            b":1 \r\n",
            b"$\r\n",
            b":-\r\n",
            b"$99999999999999999999\r\n",
        ] {
            assert_eq!(reply_header(bad), (Reply::Invalid, 0), "{bad:?}");
        }
    }

    #[test]
    fn a_line_ends_with_crlf_only() {
        // A bare LF or CR is refused at once, whatever follows it.
        for bad in [
            &b"+OK\n"[..],
            b"$3\nabc\r\n",
            b"$3\n",
            b"\n",
            b"-ERR x\ny\r\n",
            b":1\n\r\n",
            b"$3\rabc\r\n",
            b"$3\rabc",
            b"+O\rK\r\n",
            b"\r\r\n",
        ] {
            assert_eq!(reply_header(bad), (Reply::Invalid, 0), "{bad:?}");
        }
        // A CR as the last byte is the start of a CRLF: not yet known.
        assert_eq!(reply_header(b"+OK\r"), (Reply::Incomplete, 0));
        assert_eq!(reply_header(b"$3\r"), (Reply::Incomplete, 0));
        // Bytes after the header line (a value) may hold anything.
        assert_eq!(reply_header(b"$3\r\na\nb\r\n"), (Reply::Bulk(3), 4));
    }

    #[test]
    fn lengths_are_bounded() {
        assert_eq!(reply_header(b"$536870912\r\n"), (Reply::Bulk(MAX_BULK), 12));
        assert_eq!(reply_header(b"$536870913\r\n"), (Reply::TooLong(MAX_BULK + 1), 0));
        assert_eq!(
            reply_header(b"$9223372036854775807\r\na"),
            (Reply::TooLong(i64::MAX as u64), 0)
        );
        assert_eq!(reply_header(b":9223372036854775807\r\n").0, Reply::Integer(i64::MAX));
        assert_eq!(reply_header(b":-9223372036854775808\r\n").0, Reply::Integer(i64::MIN));
        assert_eq!(reply_header(b":9223372036854775808\r\n").0, Reply::Invalid);
    }

    #[test]
    fn long_lines_are_invalid_however_they_arrive() {
        // The longest line accepted, whole or cut before its LF.
        let mut line = vec![b'+'; MAX_LINE - 2];
        line.extend_from_slice(b"\r\n");
        assert_eq!(reply_header(&line), (Reply::Status(&line[1..MAX_LINE - 2]), MAX_LINE));
        assert_eq!(reply_header(&line[..MAX_LINE - 1]), (Reply::Incomplete, 0));
        // One byte more: invalid, with or without its CRLF yet.
        let mut long = vec![b'+'; MAX_LINE - 1];
        assert_eq!(reply_header(&long), (Reply::Incomplete, 0));
        long.push(b'+');
        assert_eq!(reply_header(&long), (Reply::Invalid, 0));
        long.extend_from_slice(b"\r\n");
        assert_eq!(reply_header(&long), (Reply::Invalid, 0));
        let mut far = vec![b'+'; MAX_LINE + 10];
        far.extend_from_slice(b"\r\n");
        assert_eq!(reply_header(&far), (Reply::Invalid, 0));
    }

    #[test]
    fn whole_values() {
        let slots = b"*1\r\n*3\r\n:0\r\n:16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n*0\r\n";
        let want = Value::Array(vec![Value::Array(vec![
            Value::Integer(0),
            Value::Integer(16383),
            Value::Array(vec![
                Value::Bulk(b"127.0.0.1".to_vec()),
                Value::Integer(7000),
                Value::Bulk(b"id".to_vec()),
                Value::Array(vec![]),
            ]),
        ])]);
        assert_eq!(value(slots, 1 << 20), Ok(Some((want, slots.len()))));
        // Every cut short is incomplete, never an error.
        for cut in 0..slots.len() {
            assert_eq!(value(&slots[..cut], 1 << 20), Ok(None), "{cut}");
        }
        let mut more = slots.to_vec();
        more.extend_from_slice(b"+OK\r\n");
        assert_eq!(value(&more, 1 << 20).unwrap().unwrap().1, slots.len());
        assert_eq!(
            value(b"-ERR no\r\n", 64),
            Ok(Some((Value::Error(b"ERR no".to_vec()), 9)))
        );
        assert_eq!(value(b"$-1\r\n", 64), Ok(Some((Value::Nil, 5))));
        assert_eq!(
            value(b"$3\r\na\nb\r\n", 64),
            Ok(Some((Value::Bulk(b"a\nb".to_vec()), 9)))
        );
    }

    #[test]
    fn values_over_the_limits() {
        // Longer than allowed, whole or not yet.
        assert_eq!(value(b"$10\r\n0123456789\r\n", 10), Err(NotResp));
        assert_eq!(value(b"$10\r\n0123", 10), Ok(None));
        assert_eq!(value(b"$10\r\n01234", 10), Err(NotResp));
        // Nested deeper than MAX_DEPTH.
        let deep = b"*1\r\n".repeat(MAX_DEPTH + 1);
        assert_eq!(value(&deep, 1 << 20), Err(NotResp));
        for bad in [
            &b"$2\r\nabc\r\n"[..],
            b"*-2\r\n",
            b"$-2\r\n",
            b"*x\r\n",
            b"?\r\n",
            b"+OK\n",
            b"$9223372036854775807\r\n",
            b"*9223372036854775807\r\n:1\r\n",
        ] {
            assert!(matches!(value(bad, 1 << 20), Err(NotResp) | Ok(None)), "{bad:?}");
        }
        assert_eq!(value(b"$2\r\nabc\r\n", 64), Err(NotResp));
        assert_eq!(value(b"*-2\r\n", 64), Err(NotResp));
    }

    #[test]
    fn scans_find_what_value_parses() {
        let slots = b"*1\r\n*3\r\n:0\r\n:16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n*0\r\n";
        let mut more = slots.to_vec();
        more.extend_from_slice(b"+OK\r\n");
        // Byte by byte, and whole.
        let mut s = Scan::default();
        let mut found = None;
        for cut in 0..=more.len() {
            if let Some(n) = s.feed(&more[..cut], 1 << 20).unwrap() {
                found = Some((cut, n));
                break;
            }
        }
        assert_eq!(found, Some((slots.len(), slots.len())));
        assert_eq!(Scan::default().feed(&more, 1 << 20), Ok(Some(slots.len())));
        for one in [
            &b"+OK\r\n"[..],
            b"-ERR x\r\n",
            b":1\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"$3\r\na\nb\r\n",
        ] {
            assert_eq!(Scan::default().feed(one, 64), Ok(Some(one.len())), "{one:?}");
        }
        for bad in [
            &b"$2\r\nabc\r\n"[..],
            b"*-2\r\n",
            b"?\r\n",
            b"+OK\n",
            b":x\r\n",
            b"$10\r\n",
        ] {
            assert_eq!(Scan::default().feed(bad, 8), Err(NotResp), "{bad:?}");
        }
        let deep = b"*1\r\n".repeat(MAX_DEPTH + 1);
        assert_eq!(Scan::default().feed(&deep, 1 << 20), Err(NotResp));
    }

    #[test]
    fn many_small_elements_cost_what_they_hold() {
        // `*N` and N empty statuses: 3 bytes each, a Value each.
        let n = 100_000;
        let mut reply = format!("*{n}\r\n").into_bytes();
        reply.extend(b"+\r\n".repeat(n));
        let bytes = reply.len();
        let holds = n * (ELEMENT_COST + 1);
        assert!(holds > 4 * bytes);
        // Within a bound of bytes but not of what it holds: refused, by both.
        assert_eq!(value(&reply, 2 * bytes), Err(NotResp));
        assert_eq!(Scan::default().feed(&reply, 2 * bytes), Err(NotResp));
        // Refused long before its end when it comes in pieces.
        let mut s = Scan::default();
        let mut refused_at = None;
        for cut in (0..=bytes).step_by(4096) {
            if s.feed(&reply[..cut], bytes / 4).is_err() {
                refused_at = Some(cut);
                break;
            }
        }
        assert!(refused_at.is_some_and(|c| c < bytes / 2), "{refused_at:?}");
        assert!(matches!(value(&reply, 2 * holds), Ok(Some((Value::Array(a), len))) if a.len() == n && len == bytes));
        assert_eq!(Scan::default().feed(&reply, 2 * holds), Ok(Some(bytes)));
    }
}
