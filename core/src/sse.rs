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
    out
}

/// A comment line: readers ignore it; proxies see traffic.
pub const HEARTBEAT: &[u8] = b": heartbeat\n\n";

/// What subscribers get after the listening connection was lost and made
/// again: notifications sent in between are lost.
pub fn reconnect() -> Vec<u8> {
    event("reconnect", b"")
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
