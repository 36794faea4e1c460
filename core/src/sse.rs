//! Server-sent events (the `text/event-stream` format): the lines the
//! gateway writes for a notification, a heartbeat and a reconnect, and the
//! channel names it accepts.

/// The longest channel name PostgreSQL keeps (NAMEDATALEN - 1).
pub const CHANNEL_MAX: usize = 63;

/// A channel name the gateway listens on: an identifier of ASCII letters,
/// digits, `_` and `$`, not starting with a digit or `$`, at most 63 bytes.
/// (It is sent quoted, so its letter case is kept.)
pub fn valid_channel(name: &[u8]) -> bool {
    name.len() <= CHANNEL_MAX && crate::sql::ascii_identifier(name)
}

/// One event: `event: NAME`, the payload as `data:` lines (split at CR LF,
/// LF or CR, as the format's readers split them), and the blank line.
pub fn event(name: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(name.len() + payload.len() + 24);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.push(b'\n');
    data_lines(&mut out, payload);
    out
}

/// The payload as `data:` lines, and the blank line that ends the event.
fn data_lines(out: &mut Vec<u8>, payload: &[u8]) {
    let mut rest = payload;
    loop {
        let end = rest.iter().position(|c| *c == b'\n' || *c == b'\r');
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(&rest[..end.unwrap_or(rest.len())]);
        out.push(b'\n');
        match end {
            None => break,
            Some(i) => {
                let skip = if rest[i] == b'\r' && rest.get(i + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                rest = &rest[i + skip..];
            }
        }
    }
    out.push(b'\n');
}

/// An entry of a Redis stream as an event: `id:`, `event:` when the entry
/// has a name that fits on the line (no line end in it), its data as
/// `data:` lines.
pub fn entry_event(id: &[u8], name: Option<&[u8]>, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(id.len() + data.len() + 32);
    out.extend_from_slice(b"id: ");
    out.extend_from_slice(id);
    out.push(b'\n');
    if let Some(n) = name.filter(|n| !n.is_empty() && !n.iter().any(|&b| b == b'\n' || b == b'\r')) {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(n);
        out.push(b'\n');
    }
    data_lines(&mut out, data);
    out
}

/// A comment line: readers ignore it; proxies see traffic.
pub const HEARTBEAT: &[u8] = b": heartbeat\n\n";

/// What subscribers get after the listening connection was lost and made
/// again: notifications sent in between are lost.
pub fn reconnect() -> Vec<u8> {
    event("reconnect", b"")
}

/// What subscribers get when the server cannot be reached (once per
/// outage): events sent there are not heard until it is back, which
/// `: subscribed` or `event: reconnect` tells.
pub fn unavailable() -> Vec<u8> {
    event("unavailable", b"")
}

/// The `retry:` field alone: how long (ms) a client waits before it comes
/// back. Readers take it without dispatching an event (it has no data).
pub fn retry(ms: u64) -> Vec<u8> {
    format!("retry: {ms}\n\n").into_bytes()
}

/// The longest id taken from a payload: a first word past it is data.
pub const ID_MAX: usize = 256;

/// A payload whose first word is its event's id (`pg_notify('c', id || ' '
/// || data)`): the id and the rest (after the one space). No id when the
/// first word is empty, longer than `ID_MAX`, or holds a control byte (a
/// line end would end the field early): the whole payload is the data.
pub fn split_id(payload: &[u8]) -> (Option<&[u8]>, &[u8]) {
    let end = payload.iter().position(|&b| b == b' ').unwrap_or(payload.len());
    let id = &payload[..end];
    if !valid_id(id) {
        return (None, payload);
    }
    (Some(id), payload.get(end + 1..).unwrap_or(&[]))
}

/// An id an `id:` line can carry: 1 to `ID_MAX` bytes, no space and no
/// control byte.
pub fn valid_id(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= ID_MAX && id.iter().all(|&b| b > b' ' && b != 0x7f)
}

/// What ids a replaying channel takes: those its replay's typed parameter
/// (`$sqldb_last_event_id::bigint`) would take as the last id of a client
/// that comes back, as far as the gateway can tell before the server
/// does. A notification whose first word is not one (any session may
/// notify a channel) is no event id: sent as one, it would become the
/// client's `Last-Event-ID`, which the replay then refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    /// An integer type: digits with an optional sign, from `min` to `max`.
    Integer { min: i64, max: i64 },
    /// `numeric`: digits with an optional sign and one decimal point.
    Numeric,
    /// `uuid`: 32 hex digits, in the forms PostgreSQL reads.
    Uuid,
    /// Any other type: any id an `id:` line can carry (`valid_id`).
    Any,
}

impl IdKind {
    /// The kind of a type as a template writes it (`bigint`, `int4`,
    /// `pg_catalog.numeric`, `uuid` ...; letter case aside).
    pub fn of_type(ty: &str) -> IdKind {
        let ty = ty.to_ascii_lowercase();
        let ty = ty.strip_prefix("pg_catalog.").unwrap_or(&ty);
        match ty {
            "smallint" | "int2" => IdKind::Integer {
                min: i16::MIN.into(),
                max: i16::MAX.into(),
            },
            "integer" | "int" | "int4" => IdKind::Integer {
                min: i32::MIN.into(),
                max: i32::MAX.into(),
            },
            "bigint" | "int8" => IdKind::Integer {
                min: i64::MIN,
                max: i64::MAX,
            },
            "numeric" | "decimal" => IdKind::Numeric,
            "uuid" => IdKind::Uuid,
            _ => IdKind::Any,
        }
    }

    /// Whether `id` (a `valid_id`) is an id of this kind.
    pub fn takes(self, id: &[u8]) -> bool {
        if !valid_id(id) {
            return false;
        }
        match self {
            IdKind::Integer { min, max } => {
                let digits = match id.first() {
                    Some(b'+' | b'-') => &id[1..],
                    _ => id,
                };
                if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                    return false;
                }
                std::str::from_utf8(id)
                    .ok()
                    .and_then(|t| t.parse::<i64>().ok())
                    .is_some_and(|n| (min..=max).contains(&n))
            }
            IdKind::Numeric => {
                let unsigned = id.strip_prefix(b"-").or_else(|| id.strip_prefix(b"+")).unwrap_or(id);
                let mut parts = unsigned.splitn(2, |&b| b == b'.');
                let whole = parts.next().unwrap_or_default();
                let fraction = parts.next().unwrap_or_default();
                whole.len() + fraction.len() > 0 && whole.iter().chain(fraction).all(u8::is_ascii_digit)
            }
            IdKind::Uuid => uuid(id),
            IdKind::Any => true,
        }
    }
}

impl std::fmt::Display for IdKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdKind::Integer { min, max } => write!(f, "an integer from {min} to {max}"),
            IdKind::Numeric => f.write_str("a number"),
            IdKind::Uuid => f.write_str("a uuid"),
            IdKind::Any => f.write_str("up to 256 visible bytes"),
        }
    }
}

/// A uuid as PostgreSQL reads one: 32 hex digits, in braces or not, with a
/// hyphen after any group of four digits (but not at the end).
fn uuid(id: &[u8]) -> bool {
    let inner = match id.strip_prefix(b"{") {
        Some(rest) => match rest.strip_suffix(b"}") {
            Some(inner) => inner,
            None => return false,
        },
        None => id,
    };
    let mut digits = 0;
    let mut after_hyphen = false;
    for &b in inner {
        if b == b'-' {
            if digits == 0 || digits % 4 != 0 || after_hyphen {
                return false;
            }
            after_hyphen = true;
        } else if b.is_ascii_hexdigit() {
            digits += 1;
            after_hyphen = false;
        } else {
            return false;
        }
    }
    digits == 32 && !after_hyphen
}

/// An optional '-' and digits (leading zeros allowed).
fn integer(id: &[u8]) -> Option<(bool, &[u8])> {
    let (neg, digits) = match id.strip_prefix(b"-") {
        Some(rest) => (true, rest),
        None => (false, id),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let first = digits.iter().position(|&d| d != b'0').unwrap_or(digits.len());
    let digits = &digits[first..];
    // (-0 is 0.)
    Some((neg && !digits.is_empty(), digits))
}

/// The order of two ids: as numbers when both are integers (of any
/// length), else as bytes.
pub fn compare_ids(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let (Some((na, da)), Some((nb, db))) = (integer(a), integer(b)) else {
        // Redis stream entry IDs (`ms-seq`; `ms` alone is `ms-0`): by ms, then seq.
        if let (Some((am, asq)), Some((bm, bsq))) = (entry_id(a), entry_id(b)) {
            let num = |x: &[u8], y: &[u8]| x.len().cmp(&y.len()).then_with(|| x.cmp(y));
            return num(am, bm).then_with(|| num(asq, bsq));
        }
        return a.cmp(b);
    };
    let magnitude = da.len().cmp(&db.len()).then_with(|| da.cmp(db));
    match (na, nb) {
        (false, false) => magnitude,
        (true, true) => magnitude.reverse(),
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
    }
}

/// A Redis stream entry ID's two numbers (leading zeros dropped), for
/// `ms-seq` or `ms` alone (seq 0).
fn entry_id(id: &[u8]) -> Option<(&[u8], &[u8])> {
    fn digits(d: &[u8]) -> Option<&[u8]> {
        if d.is_empty() || !d.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let first = d.iter().position(|&c| c != b'0').unwrap_or(d.len());
        Some(&d[first..])
    }
    match id.iter().position(|&b| b == b'-') {
        None => Some((digits(id)?, &[])),
        Some(i) => Some((digits(&id[..i])?, digits(&id[i + 1..])?)),
    }
}

/// An event goes to a subscriber that was last sent `last`: ids above it do
/// (so does any id when nothing was sent yet).
pub fn is_after(id: &[u8], last: Option<&[u8]>) -> bool {
    last.is_none_or(|l| compare_ids(id, l) == std::cmp::Ordering::Greater)
}

/// `event` with an `id:` line first (the id is `valid_id`).
pub fn event_with_id(id: &[u8], name: &str, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(id.len() + 5);
    out.extend_from_slice(b"id: ");
    out.extend_from_slice(id);
    out.push(b'\n');
    out.extend_from_slice(&event(name, data));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_a_replay_takes() {
        let bigint = IdKind::of_type("bigint");
        assert_eq!(IdKind::of_type("INT8"), bigint);
        assert_eq!(IdKind::of_type("pg_catalog.int8"), bigint);
        for ok in [
            &b"17"[..],
            b"0",
            b"-5",
            b"+5",
            b"007",
            b"9223372036854775807",
            b"-9223372036854775808",
        ] {
            assert!(bigint.takes(ok), "{}", ok.escape_ascii());
        }
        for bad in [
            &b"zzz"[..],
            b"",
            b"1-2",
            b"--1",
            b"+-1",
            b"++1",
            b"1.5",
            b"9223372036854775808",
            b"99999999999999999999",
            b"1e3",
            b"1\n",
        ] {
            assert!(!bigint.takes(bad), "{}", bad.escape_ascii());
        }
        let int4 = IdKind::of_type("integer");
        assert!(int4.takes(b"2147483647") && !int4.takes(b"2147483648"));
        assert!(IdKind::of_type("int2").takes(b"-32768") && !IdKind::of_type("smallint").takes(b"32768"));
        let numeric = IdKind::of_type("numeric");
        for ok in [&b"1"[..], b"1.5", b"-0.25", b".5", b"5."] {
            assert!(numeric.takes(ok), "{}", ok.escape_ascii());
        }
        for bad in [&b"."[..], b"1.2.3", b"x", b"1e5", b"-"] {
            assert!(!numeric.takes(bad), "{}", bad.escape_ascii());
        }
        let uuid = IdKind::of_type("uuid");
        for ok in [
            &b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"[..],
            b"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
            b"{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
            b"a0eebc999c0b4ef8bb6d6bb9bd380a11",
            b"a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11",
        ] {
            assert!(uuid.takes(ok), "{}", ok.escape_ascii());
        }
        for bad in [
            &b"zzz"[..],
            b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1",
            b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11-",
            b"-a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            b"a0eebc99--9c0b-4ef8-bb6d-6bb9bd380a11",
            b"a0eeb-c99-9c0b-4ef8-bb6d-6bb9bd380a11",
            b"{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            b"g0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        ] {
            assert!(!uuid.takes(bad), "{}", bad.escape_ascii());
        }
        let any = IdKind::of_type("text");
        assert!(any.takes(b"zzz") && !any.takes(b"") && !any.takes(b"a\nb"));
        assert_eq!(IdKind::of_type("bigint[]"), IdKind::Any);
    }

    #[test]
    fn stream_ids_and_entries() {
        use std::cmp::Ordering::*;
        assert_eq!(compare_ids(b"9-0", b"10-0"), Less);
        assert_eq!(compare_ids(b"10-2", b"10-10"), Less);
        assert_eq!(compare_ids(b"10-3", b"10-3"), Equal);
        assert_eq!(compare_ids(b"11", b"10-99"), Greater);
        assert_eq!(compare_ids(b"10", b"10-0"), Equal);
        assert!(is_after(b"1700000000001-0", Some(b"1700000000000-7")));
        assert!(!is_after(b"5-1", Some(b"5-1")));
        assert_eq!(
            entry_event(b"1-2", Some(b"e"), b"a\nb"),
            b"id: 1-2\nevent: e\ndata: a\ndata: b\n\n"
        );
        assert_eq!(entry_event(b"1-2", None, b""), b"id: 1-2\ndata: \n\n");
        assert_eq!(entry_event(b"1-2", Some(b"x\ny"), b"d"), b"id: 1-2\ndata: d\n\n");
    }

    #[test]
    fn channels() {
        for ok in ["a", "orders", "Orders_2", "_x", "a$b", &"c".repeat(63)] {
            assert!(valid_channel(ok.as_bytes()), "{ok}");
        }
        for bad in ["", "1a", "$a", "a-b", "a b", "a\"b", "é", &"c".repeat(64), "a;b", "a\0"] {
            assert!(!valid_channel(bad.as_bytes()), "{bad:?}");
        }
    }

    #[test]
    fn one_line() {
        assert_eq!(event("orders", b"42"), b"event: orders\ndata: 42\n\n");
    }

    #[test]
    fn empty_payload_is_one_empty_data_line() {
        assert_eq!(event("c", b""), b"event: c\ndata: \n\n");
        assert_eq!(reconnect(), b"event: reconnect\ndata: \n\n");
        assert_eq!(unavailable(), b"event: unavailable\ndata: \n\n");
    }

    #[test]
    fn lines_split_at_every_kind_of_end() {
        assert_eq!(
            event("c", b"a\nb\r\nc\rd\n"),
            b"event: c\ndata: a\ndata: b\ndata: c\ndata: d\ndata: \n\n"
        );
        // No line of the payload can end the event early or start a field.
        let e = event("c", b"x\n\nevent: evil\ndata: y");
        assert_eq!(e, b"event: c\ndata: x\ndata: \ndata: event: evil\ndata: data: y\n\n");
    }

    #[test]
    fn retry_field() {
        assert_eq!(retry(2500), b"retry: 2500\n\n");
    }

    #[test]
    fn ids_are_the_first_word() {
        assert_eq!(split_id(b"42 hello world"), (Some(&b"42"[..]), &b"hello world"[..]));
        assert_eq!(split_id(b"42"), (Some(&b"42"[..]), &b""[..]));
        assert_eq!(split_id(b"42 "), (Some(&b"42"[..]), &b""[..]));
        assert_eq!(split_id(b"42  two"), (Some(&b"42"[..]), &b" two"[..]));
        assert_eq!(split_id(b"a-b:c x\ny"), (Some(&b"a-b:c"[..]), &b"x\ny"[..]));
        // No id: the whole payload is the data.
        assert_eq!(split_id(b""), (None, &b""[..]));
        assert_eq!(split_id(b" lead"), (None, &b" lead"[..]));
        assert_eq!(split_id(b"4\n2 x"), (None, &b"4\n2 x"[..]));
        assert_eq!(split_id(b"4\r2 x"), (None, &b"4\r2 x"[..]));
        assert_eq!(split_id(b"4\x002 x"), (None, &b"4\x002 x"[..]));
        let long = [b'7'; ID_MAX + 1];
        assert_eq!(split_id(&long).0, None);
        assert_eq!(split_id(&long[..ID_MAX]).0, Some(&long[..ID_MAX]));
    }

    #[test]
    fn ids_compare_as_numbers_when_both_are() {
        use std::cmp::Ordering::*;
        assert_eq!(compare_ids(b"9", b"10"), Less);
        assert_eq!(compare_ids(b"10", b"9"), Greater);
        assert_eq!(compare_ids(b"010", b"10"), Equal);
        assert_eq!(compare_ids(b"-5", b"3"), Less);
        assert_eq!(compare_ids(b"-5", b"-30"), Greater);
        assert_eq!(compare_ids(b"-0", b"0"), Equal);
        assert_eq!(compare_ids(b"0", b"-1"), Greater);
        let big = b"123456789012345678901234567890";
        assert_eq!(compare_ids(big, b"9223372036854775807"), Greater);
        // Else as bytes.
        assert_eq!(compare_ids(b"9", b"10a"), Greater);
        assert_eq!(compare_ids(b"1-0", b"1-1"), Less);
        assert_eq!(compare_ids(b"b", b"abc"), Greater);
        assert_eq!(compare_ids(b"-", b"-"), Equal);
        assert!(is_after(b"10", Some(b"9")));
        assert!(!is_after(b"9", Some(b"9")));
        assert!(!is_after(b"8", Some(b"9")));
        assert!(is_after(b"1", None));
    }

    #[test]
    fn integer_order_is_a_total_order_like_the_numbers() {
        let ns: [i64; 9] = [i64::MIN, -1000, -7, -1, 0, 1, 7, 1000, i64::MAX];
        for a in ns {
            for b in ns {
                let (sa, sb) = (a.to_string(), b.to_string());
                assert_eq!(compare_ids(sa.as_bytes(), sb.as_bytes()), a.cmp(&b), "{a} {b}");
            }
        }
    }

    #[test]
    fn event_with_its_id() {
        assert_eq!(
            event_with_id(b"7", "c", b"x\ny"),
            b"id: 7\nevent: c\ndata: x\ndata: y\n\n"
        );
    }
}
