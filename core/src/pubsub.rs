//! Redis publish/subscribe for `cache_subscribe` and `cache_publish`,
//! without any I/O: the channel names the gateway accepts, the commands a
//! subscribing connection sends, and a reader of what it receives.
//!
//! A subscribing connection (RESP2) receives arrays: `subscribe CHANNEL N`
//! and `unsubscribe CHANNEL N` confirm a command, `message CHANNEL PAYLOAD`
//! carries a publication. Before its first `SUBSCRIBE` it may get the
//! status or error of `AUTH`.

use crate::resp::{self, Value};

/// The longest channel name the gateway subscribes or publishes to.
pub const CHANNEL_MAX: usize = 256;

/// The longest message read from a subscribing connection (the whole
/// reply: the channel, the payload and the framing).
pub const MAX_MESSAGE: usize = 8 * 1024 * 1024;

/// A channel name of the gateway's: 1 to `CHANNEL_MAX` visible ASCII
/// characters (no space, no control character), so that it can be an
/// event name in a `text/event-stream` and a word in a log line.
pub fn valid_channel(name: &[u8]) -> bool {
    !name.is_empty() && name.len() <= CHANNEL_MAX && name.iter().all(|c| c.is_ascii_graphic())
}

/// `AUTH password`.
pub fn auth(out: &mut Vec<u8>, password: &[u8]) {
    resp::command(out, &[b"AUTH", password]);
}

/// `SUBSCRIBE channel...` (nothing for no channel).
pub fn subscribe<'a>(out: &mut Vec<u8>, channels: impl IntoIterator<Item = &'a [u8]>) {
    let channels: Vec<&[u8]> = channels.into_iter().collect();
    if channels.is_empty() {
        return;
    }
    let mut args: Vec<&[u8]> = Vec::with_capacity(channels.len() + 1);
    args.push(b"SUBSCRIBE");
    args.extend(channels);
    resp::command(out, &args);
}

/// `UNSUBSCRIBE channel`.
pub fn unsubscribe(out: &mut Vec<u8>, channel: &[u8]) {
    resp::command(out, &[b"UNSUBSCRIBE", channel]);
}

/// What a subscribing connection receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Push {
    /// A publication on a channel.
    Message { channel: Vec<u8>, payload: Vec<u8> },
    /// `SUBSCRIBE` took effect for a channel.
    Subscribed(Vec<u8>),
    /// `UNSUBSCRIBE` took effect for a channel.
    Unsubscribed(Vec<u8>),
    /// A status reply (`+OK` to `AUTH`).
    Status,
    /// An error reply (a wrong password, `NOAUTH`, a refused channel).
    Error(Vec<u8>),
}

/// Bytes that a subscribing connection cannot get: the connection is broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushError {
    /// Not RESP, or a reply longer than `MAX_MESSAGE`.
    NotResp,
    /// A reply of a kind a subscribing connection does not get.
    Unexpected(String),
}

impl std::fmt::Display for PushError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PushError::NotResp => write!(
                f,
                "redis sent bytes that are not RESP, or a message longer than {MAX_MESSAGE} bytes"
            ),
            PushError::Unexpected(what) => write!(f, "redis sent {what} to a subscribing connection"),
        }
    }
}

/// Reads the next whole reply at the start of `buf`: `Ok(None)` while it
/// is incomplete, else what it is and the bytes it took.
pub fn next(buf: &[u8]) -> Result<Option<(Push, usize)>, PushError> {
    let Some((v, used)) = resp::value(buf, MAX_MESSAGE).map_err(|_| PushError::NotResp)? else {
        return Ok(None);
    };
    let push = match v {
        Value::Status(_) => Push::Status,
        Value::Error(e) => Push::Error(e),
        Value::Array(items) => array(items)?,
        Value::Integer(_) => return Err(PushError::Unexpected("an integer".into())),
        Value::Bulk(_) | Value::Nil => return Err(PushError::Unexpected("a bulk string".into())),
    };
    Ok(Some((push, used)))
}

fn array(items: Vec<Value>) -> Result<Push, PushError> {
    let mut it = items.into_iter();
    let (Some(Value::Bulk(kind)), Some(Value::Bulk(channel)), Some(third), None) =
        (it.next(), it.next(), it.next(), it.next())
    else {
        return Err(PushError::Unexpected("an array that is not a message".into()));
    };
    match (kind.as_slice(), third) {
        (b"message", Value::Bulk(payload)) => Ok(Push::Message { channel, payload }),
        (b"subscribe", Value::Integer(_)) => Ok(Push::Subscribed(channel)),
        (b"unsubscribe", Value::Integer(_)) => Ok(Push::Unsubscribed(channel)),
        (k, _) => Err(PushError::Unexpected(format!(
            "a \"{}\" array",
            String::from_utf8_lossy(&k[..k.len().min(32)])
        ))),
    }
}

/// `PUBLISH`'s reply, as the body of `cache_publish`'s answer.
pub fn receivers_json(n: i64) -> Vec<u8> {
    format!("{{\"receivers\": {n}}}\n").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels() {
        for ok in ["a", "news:sports", "a.b-c_d", "{tag}x", "*", &"c".repeat(256)] {
            assert!(valid_channel(ok.as_bytes()), "{ok}");
        }
        for bad in ["", "a b", "a\nb", "a\rb", "é", &"c".repeat(257), "a\0", "\x7f"] {
            assert!(!valid_channel(bad.as_bytes()), "{bad:?}");
        }
    }

    #[test]
    fn commands() {
        let mut out = Vec::new();
        auth(&mut out, b"pw");
        subscribe(&mut out, [&b"a"[..], b"bc"]);
        subscribe(&mut out, []);
        unsubscribe(&mut out, b"a");
        assert_eq!(
            out,
            b"*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n*3\r\n$9\r\nSUBSCRIBE\r\n$1\r\na\r\n$2\r\nbc\r\n*2\r\n$11\r\nUNSUBSCRIBE\r\n$1\r\na\r\n"
        );
    }

    #[test]
    fn reads_in_any_pieces() {
        let stream: &[u8] = b"+OK\r\n*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n*3\r\n$7\r\nmessage\r\n$1\r\na\r\n$5\r\nx\r\ny!\r\n*3\r\n$11\r\nunsubscribe\r\n$1\r\na\r\n:0\r\n";
        let want = vec![
            Push::Status,
            Push::Subscribed(b"a".to_vec()),
            Push::Message {
                channel: b"a".to_vec(),
                payload: b"x\r\ny!".to_vec(),
            },
            Push::Unsubscribed(b"a".to_vec()),
        ];
        for cut in 1..stream.len() {
            let mut got = Vec::new();
            let mut buf = Vec::new();
            for piece in [&stream[..cut], &stream[cut..]] {
                buf.extend_from_slice(piece);
                while let Some((p, used)) = next(&buf).unwrap() {
                    got.push(p);
                    buf.drain(..used);
                }
            }
            assert_eq!(got, want, "cut at {cut}");
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn errors_and_hostile_replies() {
        assert_eq!(
            next(b"-WRONGPASS invalid\r\n").unwrap(),
            Some((Push::Error(b"WRONGPASS invalid".to_vec()), 20))
        );
        assert!(matches!(next(b":1\r\n"), Err(PushError::Unexpected(_))));
        assert!(matches!(next(b"$1\r\na\r\n"), Err(PushError::Unexpected(_))));
        assert!(matches!(
            next(b"*2\r\n$7\r\nmessage\r\n$1\r\na\r\n"),
            Err(PushError::Unexpected(_))
        ));
        assert!(matches!(
            next(b"*3\r\n$4\r\npong\r\n$1\r\na\r\n$1\r\nb\r\n"),
            Err(PushError::Unexpected(_))
        ));
        assert!(matches!(
            next(b"*3\r\n$7\r\nmessage\r\n$1\r\na\r\n:1\r\n"),
            Err(PushError::Unexpected(_))
        ));
        assert_eq!(next(b"garbage\r\n"), Err(PushError::NotResp));
        // A message announced longer than the limit fails before it arrives.
        let mut big = b"*3\r\n$7\r\nmessage\r\n$1\r\na\r\n$".to_vec();
        big.extend_from_slice((MAX_MESSAGE + 1).to_string().as_bytes());
        big.extend_from_slice(b"\r\n");
        big.resize(MAX_MESSAGE + 100, b'x');
        assert_eq!(next(&big), Err(PushError::NotResp));
        assert_eq!(next(b"*3\r\n$7\r\nmess"), Ok(None));
    }

    #[test]
    fn receivers() {
        assert_eq!(receivers_json(3), b"{\"receivers\": 3}\n");
    }
}
